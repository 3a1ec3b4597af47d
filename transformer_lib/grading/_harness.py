"""The kernel side of the checks: inputs, calling the student's code under a watch, recording.

A check has two halves (see :mod:`transformer_lib.grading.checks`). This module serves the half
that runs in the student's kernel. :func:`run_check` calls the student's function on each input
(a *case*) through :func:`call` and keeps what comes back, converted by :func:`capture` into
plain data. Then:

- **under grading** (``TRANSFORMER_LIB_GRADING_RECORD_DIR`` set), it only writes the cases and
  outcomes to a record file (:func:`write`); the grader judges them. Nothing here compares or
  knows an expected value;
- **while a student works**, it judges at once with the check's judge and raises
  :class:`CheckFailed` naming the misconception, or prints one ``✓`` line.

Hidden cases are drawn from :func:`hidden_generator`, seeded for each grading run
(``TRANSFORMER_LIB_GRADING_SEED``), the same in the instructor's run.
"""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import sys
import threading
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

RECORD_ENV = "TRANSFORMER_LIB_GRADING_RECORD_DIR"
SEED_ENV = "TRANSFORMER_LIB_GRADING_SEED"
TOKEN_ENV = "TRANSFORMER_LIB_GRADING_TOKEN"  # set by the grader for each kernel it starts (to find its processes)
MAX_RECORDED = 100_000  # numbers kept of one value the student's code returns
_BUILTIN_ERRORS = {name for name, value in vars(builtins).items()
                   if isinstance(value, type) and issubclass(value, BaseException)}


class CheckFailed(AssertionError):
    """A failure found by a check: its message names the likely misconception. A notebook shows it
    as the AssertionError the exercise notebooks promise."""


CheckFailed.__name__ = CheckFailed.__qualname__ = "AssertionError"


class StudentError(Exception):
    """The student's code did not return a value to judge: ``code`` says why (``raised``,
    ``not_implemented``, ``banned``, ``library``, ``lookup``, ``thread``, ``not_callable``),
    ``detail`` gives a name (an exception type, a function) for the message."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(code, detail)
        self.code, self.detail = code, detail


def recording() -> bool:
    """True in a kernel the grader runs: the checks record, and judge nothing."""
    return bool(os.environ.get(RECORD_ENV))


# ---------------------------------------------------------------- inputs

def seeded(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """A float64 tensor of N(0, scale²) entries from its own generator: a check's visible input."""
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def hidden_generator(check: str, hidden: int) -> torch.Generator:
    """The generator of the hidden cases of ``check`` (call number ``hidden`` in a cell), seeded from the
    grading run's seed: new inputs for every grading run, the same in the instructor's run."""
    key = f"{os.environ.get(SEED_ENV, '0')}/{check}/{int(hidden)}".encode()
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1)


def draw(gen: torch.Generator, low: int, high: int) -> int:
    """A whole number from ``low`` to ``high`` (both included)."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """A float64 tensor of N(0, scale²) entries drawn from ``gen``."""
    return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)


# ---------------------------------------------------------------- what came back

class Opaque:
    """A value that is not data (a function, an object of the notebook's): only a description of it
    is recorded. Its description never carries text the notebook chose."""

    def __init__(self, description: str) -> None:
        self.description = description

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.description == self.description


def typename(value: Any) -> str:
    """The type of ``value`` for a message; a class the notebook defined is not named."""
    if value is None:
        return "None (did you forget to return the result?)"
    if isinstance(value, Opaque):
        return value.description
    kind = type(value)
    module = str(getattr(kind, "__module__", ""))
    known = module.split(".")[0] in {"builtins", "numpy", "torch"} and \
        getattr(sys.modules.get(module), kind.__name__, None) is kind
    return kind.__name__ if known else "an object"


def capture(value: Any, depth: int = 0) -> Any:
    """``value`` as plain data to record: tensors (detached, on the CPU, dtype kept) and NumPy
    arrays of numbers, Python numbers, bools, strings of at most 100 characters, None, lists of
    those (tuples become lists); anything else becomes an :class:`Opaque` description."""
    if isinstance(value, torch.Tensor):
        if value.is_complex() or value.dtype not in _DTYPES:
            return Opaque(f"a tensor of dtype {value.dtype}")
        if value.numel() > MAX_RECORDED:
            return Opaque(f"a tensor of {value.numel()} numbers, too many to record")
        return value.detach().cpu().as_subclass(torch.Tensor).clone()
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            return Opaque(f"a NumPy array of dtype {arr.dtype}")
        return arr.copy() if arr.size <= MAX_RECORDED else Opaque("a NumPy array too large to record")
    if value is None or isinstance(value, (bool, int, float)):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            return float(value)
        return value
    if isinstance(value, str):
        return value[:100]
    if isinstance(value, (list, tuple)) and depth < 4:
        if len(value) > 1000:
            return Opaque(f"a {type(value).__name__} of {len(value)} items, too many to record")
        return [capture(v, depth + 1) for v in value]
    return Opaque(typename(value))


_DTYPES = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool}


# ---------------------------------------------------------------- the watch

_LIBRARY = f"{os.sep}transformer_lib{os.sep}"  # the course library's files (the grading package excepted)
_GRADING = f"{_LIBRARY}grading{os.sep}"
_LOOKUPS = {"embedding", "embedding_bag", "index_select", "gather", "take", "take_along_dim",
            "masked_select", "select", "narrow", "unbind", "__iter__", "split", "chunk", "tensor_split",
            "unsafe_split", "unsafe_chunk", "split_with_sizes", "unfold", "as_strided",
            "numpy", "__array__", "tolist", "item", "__dlpack__"}  # row access, or leaving torch


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
        self.banned, self.lookups, self.used = banned, lookups, used

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if any(fragment in name for fragment in self.banned):
            self.used.append(StudentError("banned", name))
        elif self.lookups and _looks_up_values(name, args):
            self.used.append(StudentError("lookup", name))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _watch_calls(banned: tuple[str, ...], used: list[StudentError]) -> Iterator[None]:
    """Note every call into the course library, every direct call of a ``banned`` torch function
    (even with torch's function modes switched off), and every thread that runs Python code while
    the block runs: the hook is set for this thread and for every thread started meanwhile."""
    main = threading.get_ident()

    def library(frame) -> bool:  # noqa: ANN001
        path = frame.f_code.co_filename if frame is not None else ""
        return _LIBRARY in path and _GRADING not in path

    def hook(frame, event, arg):  # noqa: ANN001, ANN202
        if threading.get_ident() != main:
            used.append(StudentError("thread"))
        elif event == "call" and library(frame) and not library(frame.f_back) and frame.f_code.co_name != "<module>":
            used.append(StudentError("library", f"{os.path.basename(frame.f_code.co_filename)[:-3]}."
                                                f"{frame.f_code.co_name}"))
        elif event == "c_call" and any(fragment in getattr(arg, "__name__", "") for fragment in banned):
            used.append(StudentError("banned", arg.__name__))
    previous = sys.getprofile()
    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        yield
    finally:
        if sys.getprofile() is not hook:
            used.append(StudentError("unwatched"))
        threading.setprofile(None)
        sys.setprofile(previous)


def call(fn: Any, *args: Any, banned: tuple[str, ...] = (), lookups: bool = False, **kwargs: Any) -> Any:
    """Call the student's function with the course library, the ``banned`` torch functions and
    (with ``lookups``) row lookups switched off. Raises :class:`StudentError` when there is nothing
    to judge; while a student works, an error of their own code is raised as it is, with its
    traceback."""
    if not callable(fn):
        raise StudentError("not_callable", typename(fn))
    used: list[StudentError] = []
    try:
        with _Watch(banned, lookups, used), _watch_calls(banned, used):
            result = fn(*args, **kwargs)
    except NotImplementedError:
        raise StudentError("not_implemented") from None
    except Exception as err:
        if used:  # e.g. .numpy() on a tensor that requires grad: name what was switched off
            raise used[0] from None
        if not recording():
            raise
        name = type(err).__name__
        raise StudentError("raised", name if name in _BUILTIN_ERRORS else "") from None
    if used:
        raise used[0]
    return result


# ---------------------------------------------------------------- records

def pack(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` (captured data) as JSON, its arrays moved to ``arrays`` (read back by
    :func:`transformer_lib.grading.records.unpack`)."""
    if isinstance(value, torch.Tensor):
        key = f"a{len(arrays)}"
        arrays[key] = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
        return {"$tensor": key, "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, (np.ndarray, np.generic)):
        key = f"a{len(arrays)}"
        arrays[key] = np.asarray(value)
        return {"$array": key}
    if isinstance(value, Opaque):
        return {"$opaque": value.description}
    if isinstance(value, dict):
        return {"$dict": {str(k): pack(v, arrays) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return [pack(v, arrays) for v in value]
    return value


def write(folder: str, name: str, cases: list[dict], outs: list[dict], hidden: int) -> None:
    """Write one check call (its cases and the student's outcomes) as ``NNN-name.npz``: the arrays,
    and the rest as JSON in the uint8 array ``__meta__`` (no pickles: the grader reads it with
    ``allow_pickle=False``)."""
    arrays: dict[str, np.ndarray] = {}
    meta = {"check": name, "hidden": int(hidden),
            "cases": [pack(c, arrays) for c in cases], "outs": [pack(o, arrays) for o in outs]}
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    seq = len([f for f in os.listdir(folder) if f.endswith(".npz")])
    np.savez(os.path.join(folder, f"{seq:03d}-{name}.npz"), **arrays)


def _capture_case(case: dict) -> dict:
    """A case as data; a function or model in it is left out (the judge rebuilds it from the rest)."""
    return {k: capture(v) for k, v in case.items() if not callable(v) or isinstance(v, torch.Tensor)}


# ---------------------------------------------------------------- one check

def run_check(name: str, fn: Any, cases: list[dict], run: Callable[[Any, dict], dict], hidden: int = 0) -> None:
    """Run ``run(fn, case)`` (the student's function on one case, returning what to judge) for every
    case; record the inputs and outcomes under grading, else judge them here. Either way the judge
    sees them as captured data (:func:`capture`), never the live objects."""
    outs = []
    for case in cases:
        try:
            out = run(fn, case)
        except StudentError as err:
            out = {"error": err.code, "detail": err.detail}
        outs.append({k: v if k in ("error", "detail") else capture(v) for k, v in out.items()})
    cases = [_capture_case(c) for c in cases]
    if recording():
        write(os.environ[RECORD_ENV], name, cases, outs, hidden)
        return
    from ._judging import judge_here

    print(f"✓ {judge_here(name, cases, outs, hidden)}")
