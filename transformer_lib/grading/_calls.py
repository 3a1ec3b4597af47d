"""The kernel side of the checks: calling the student's code under a watch.

:func:`call` calls the student's function and turns what it returned into plain data
(:func:`~transformer_lib.grading._harness.capture`) **inside** one watched region, so that
nothing of the student's code runs unwatched: not the call, not a method the recorder would call
on the result, not the work counters of the checks around it. The region notes

- every torch function whose name holds a banned fragment, at two levels: the Python name
  (``torch.softmax``, ``F.scaled_dot_product_attention``, a ``c_call`` of ``torch._C``) and the
  ATen operator that really runs (``aten._log_softmax`` inside ``F.cross_entropy``,
  ``aten._scaled_dot_product_flash_attention_for_cpu`` inside ``nn.MultiheadAttention``);
- row lookups, where the check asks for it; every call into the course library (the grading
  package too, but for the check's own fresh copy); every thread that runs Python code;
- any code of the notebook that runs while the result is read (a method of a subclass, a
  rebound ``torch.Tensor.detach``): the result must be plain data.

Before and after, it asks the watch the kernel has carried since its start
(:mod:`~transformer_lib.grading._watch`) whether anything was noted. Every finding carries
where, in the notebook's code, it happened (line and text), for the class report.
"""
from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
import threading
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ._harness import _PENDING, capture, notebook_code, recording, watched
from .protocol import BUILTIN_ERRORS, StudentError, typename

_LIBRARY = f"{os.sep}transformer_lib{os.sep}"  # the course library's files, the grading package included
_OWN: set[int] = set()  # ids of the namespaces of this check cell's own copy of the checks (set by its loader)
_LOOKUPS = {"embedding", "embedding_bag", "index_select", "gather", "take", "take_along_dim",
            "masked_select", "select", "narrow", "unbind", "__iter__", "split", "chunk", "tensor_split",
            "unsafe_split", "unsafe_chunk", "split_with_sizes", "unfold", "as_strided",
            "numpy", "__array__", "tolist", "item", "__dlpack__"}  # row access, or leaving torch
# Other names of what a banned name computes: its ATen operators, where their names differ, and
# functions that compute it under another name (the last entry of a cumulative logsumexp).
_ALIASES = {"scaled_dot_product_attention": ("_scaled_dot_product", "_fused_sdp"),
            "multi_head_attention": ("_native_multi_head_attention", "_scaled_dot_product"),
            "dual": ("_make_dual", "_unpack_dual"), "logsumexp": ("logcumsumexp",)}


def _fragments(banned: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f for b in banned for f in (b, *_ALIASES.get(b, ())))


def where(frame: Any = None) -> tuple[int, str]:
    """The line number and text of the innermost frame of the notebook's code (0, "" if none)."""
    frame = frame if frame is not None else sys._getframe(1)
    while frame is not None and not notebook_code(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return 0, ""
    return frame.f_lineno, linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()[:200]


def _noted(code: str, detail: str = "", frame: Any = None) -> StudentError:
    err = StudentError(code, detail)
    err.where = where(frame if frame is not None else sys._getframe(1))
    return err


def _own(frame: Any) -> bool:
    """Code of the checks themselves: this check cell's copy (under grading), else the package's."""
    if _OWN:
        return id(frame.f_globals) in _OWN
    return str(frame.f_globals.get("__name__", "")).startswith("transformer_lib.grading")


def _looks_up_values(name: str, args: tuple) -> bool:
    """True for a row lookup (``W_E[ids]``, ``F.embedding``, ``index_select``, ``gather``, ``unbind``,
    iterating, splitting, …) into a table that is not one-hot, or for taking it out of torch
    (``.numpy()``, ``.tolist()``): indexing ``torch.eye(C)`` to build one-hot rows is fine."""
    if name == "__getitem__" and len(args) == 2:
        parts = args[1] if isinstance(args[1], tuple) else (args[1],)
        if not any(isinstance(p, (int, list)) or (isinstance(p, torch.Tensor) and not p.is_floating_point())
                   for p in parts):
            return False
        args = args[:1]
    elif name not in _LOOKUPS:
        return False
    return any(isinstance(t, torch.Tensor) and t.is_floating_point() and bool(((t != 0) & (t != 1)).any())
               for t in args)


class _Watch(TorchFunctionMode):
    """Note the banned torch functions and (optionally) the row lookups a student's function uses."""

    def __init__(self, banned: tuple[str, ...], lookups: bool, used: list[StudentError]) -> None:
        super().__init__()
        self.banned, self.lookups, self.used = _fragments(banned), lookups, used

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if any(fragment in name for fragment in self.banned):
            self.used.append(_noted("banned", name))
        elif self.lookups and _looks_up_values(name, args):
            self.used.append(_noted("lookup", name))
        return func(*args, **(kwargs or {}))


class EagerDispatchMode(TorchDispatchMode):
    """The base of the checks' dispatch modes: as `transformer_lib._torch_state.EagerDispatchMode`
    (torch would wrap ``__torch_dispatch__`` in ``torch._disable_dynamo``, whose first call imports
    ``torch._dynamo``, 2 s in every graded kernel), but defined here: the checks rely on no module of
    the library outside this package, which a notebook could have patched before the check ran."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class _Aten(EagerDispatchMode):
    """Note every ATen operator that a banned name runs as, however it was reached."""

    def __init__(self, banned: tuple[str, ...], used: list[StudentError]) -> None:
        super().__init__()
        self.fragments = _fragments(banned)
        self.used = used

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(getattr(func, "_overloadpacket", func), "__name__", "")
        if any(fragment in name for fragment in self.fragments):
            self.used.append(_noted("banned", f"aten.{name}"))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _watch_calls(banned: tuple[str, ...], used: list[StudentError]) -> Iterator[list[str]]:
    """Note every call into the course library, every direct call of a ``banned`` torch function
    (even with torch's function modes switched off), every thread that runs Python code while the
    block runs, and, once the block's phase is ``capture``, every call of the notebook's code. The
    hook is set for this thread and for every thread started meanwhile."""
    main, phase = threading.get_ident(), ["call"]

    def library(frame) -> bool:  # noqa: ANN001
        return frame is not None and _LIBRARY in frame.f_code.co_filename and not _own(frame)

    def hook(frame, event, arg):  # noqa: ANN001, ANN202
        if threading.get_ident() != main:
            used.append(_noted("thread", frame=frame))
        elif event == "call" and phase[0] == "capture" and notebook_code(frame.f_code.co_filename):
            used.append(_noted("capture", frame=frame))
        elif event == "call" and library(frame) and not library(frame.f_back) and frame.f_code.co_name != "<module>":
            used.append(_noted("library", f"{os.path.basename(frame.f_code.co_filename)[:-3]}."
                                          f"{frame.f_code.co_name}", frame))
        elif event == "c_call" and any(fragment in getattr(arg, "__name__", "") for fragment in banned):
            used.append(_noted("banned", arg.__name__, frame))
        elif event == "c_call" and getattr(arg, "__name__", "") in ("fork", "_fork"):  # torch.jit.fork: another thread
            used.append(_noted("thread", frame=frame))
    previous = sys.getprofile()
    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        yield phase
    finally:
        if sys.getprofile() is not hook:
            used.append(StudentError("unwatched"))
        threading.setprofile(None)
        sys.setprofile(previous)


_BROADCAST = "must match the size of tensor"
_MATMUL = ("cannot be multiplied", "size for first two dimensions of batch2", "size mismatch", "must be a matrix")


def shape_mistake(err: BaseException) -> str | None:
    """The common shape mistake behind ``err``, raised by the notebook's code, as a key of
    :data:`~transformer_lib.grading.judges.common.SHAPE_HINTS` ("one_hot", "keepdim", "transpose", "matmul",
    "broadcast"), read off torch's message and the notebook's line that raised; None if it is none."""
    text = str(err) if isinstance(err, RuntimeError) else ""
    if _BROADCAST not in text and not any(m in text for m in _MATMUL):
        return None
    line, tb = "", err.__traceback__
    while tb is not None:
        if notebook_code(tb.tb_frame.f_code.co_filename):
            line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    if re.search(r"one_hot\((?![^)]*num_classes)", line):
        return "one_hot"
    if re.search(r"\.T\b", line):
        return "transpose"
    if _BROADCAST in text and re.search(r"\.(sum|max|amax|mean|logsumexp|norm)\((?![^)]*keepdim)", line):
        return "keepdim"
    return "broadcast" if _BROADCAST in text else "matmul"


def ask_watch() -> StudentError | None:
    """What the kernel's watch noted so far (:mod:`~transformer_lib.grading._watch`), as the error
    to record, or None. The question is an attribute read that raises an audit event in C, so that
    no Python function the notebook could replace stands between the check and the watch."""
    box: list[bool] = []

    def _grading_watch_query(box: list = box) -> None:
        return None

    try:
        _grading_watch_query.__code__  # noqa: B018 - the read is the question
    except Exception as err:  # noqa: BLE001 - the watch's answer: Tampered, or another hook that raised
        what, _, rest = str(err).partition("|")
        line, _, text = rest.partition("|")
        found = StudentError("tampered", what[:200])
        found.where = (int(line) if line.isdigit() else 0, text[:200])
        return found
    if not box and watched():  # under grading the watch always answers
        return StudentError("tampered", "the kernel's watch did not answer")
    return None


def _forget_dropped_hook() -> None:
    """Ask the watch to forget its last finding if that is a ``sys.setprofile`` since the last question
    (nothing else): an interrupt that lands in the check's profile hook makes CPython switch the hook
    off, which raises that event with the notebook's code on top. Called by :func:`call` only (the
    watch answers no other caller); whatever else was noted stays for the next question."""
    box: list[bool] = []

    def _grading_watch_forget(box: list = box) -> None:
        return None

    try:
        _grading_watch_forget.__code__  # noqa: B018 - the read is the request
    except Exception:  # noqa: BLE001, S110 - another hook that raised: nothing is forgotten
        pass


def call(fn: Any, *args: Any, banned: tuple[str, ...] = (), lookups: bool = False,
         after: Callable[[Any], Any] | None = None, **kwargs: Any) -> Any:
    """Call the student's function with the course library, the ``banned`` torch functions and
    (with ``lookups``) row lookups switched off; ``after(result)``, if given, runs in the same
    region (what the check measures on the live result). Returns the result as plain data, read
    inside the region. Raises :class:`StudentError` when there is nothing to judge; while a student
    works, an error of their own code is raised as it is, with its traceback."""
    if not callable(fn):
        raise StudentError("not_callable", typename(fn))
    found = _PENDING[0] if _PENDING else ask_watch()
    if found is not None:
        raise found
    used: list[StudentError] = []
    error: StudentError | None = None
    try:
        with _Watch(banned, lookups, used), _Aten(banned, used), _watch_calls(_fragments(banned), used) as phase:
            result = fn(*args, **kwargs)
            if after is not None:
                result = after(result)
            phase[0] = "capture"
            result = capture(result)
    except NotImplementedError:
        error = StudentError("not_implemented")
    except KeyboardInterrupt:  # the cell's time limit (the cell fails): if the interrupt landed in the profile
        _forget_dropped_hook()   # hook, CPython switched it off, which the watch saw as the notebook's sys.setprofile
        raise
    except StudentError as err:  # the result is an object of the notebook's (see capture)
        error = err
    except BaseException as err:  # noqa: B036 - SystemExit too: the check goes on to its record
        mistake = shape_mistake(err) if not used else None
        if not recording() and isinstance(err, Exception) and not used:
            if mistake is None:
                raise
            raise StudentError("shape", mistake) from err   # judged in turn; the traceback stays its cause
        name = type(err).__name__
        error = StudentError("shape", mistake) if mistake else \
            StudentError("raised", name if name in BUILTIN_ERRORS else "")
    found = ask_watch()  # asked even if the call raised: what it noted belongs to this call
    if used or found is not None or error is not None:
        raise (used[0] if used else found if found is not None else error) from None
    return result
