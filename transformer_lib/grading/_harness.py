"""The kernel side of the checks: inputs, calling the student's code under a watch, recording.

A check has two halves (see :mod:`transformer_lib.grading.checks`). This module serves the half
that runs in the student's kernel. :func:`run_check` calls the student's function on each input
(a *case*) through :func:`~transformer_lib.grading._calls.call`, which returns what came back
converted by :func:`capture` into plain data. Then:

- **under grading**, it only writes the cases and outcomes to a record file
  (:func:`~transformer_lib.grading.protocol.write`); the
  grader judges them. Nothing here compares or knows an expected value;
- **while a student works**, it judges at once with the check's judge and raises
  :class:`CheckFailed` naming the misconception, or prints one ``✓`` line.

Hidden cases are drawn from :func:`hidden_generator`, seeded for each grading run and check cell,
the same in the instructor's run. Under grading the seed, the record folder and the names of the
record files reach the check cell alone: its loader asks the kernel's watch for them
(:func:`configure`, :mod:`~transformer_lib.grading._watch`), which hands each cell's out once,
so that no code of the notebook holds them before the check runs. (``TRANSFORMER_LIB_GRADING_*``
in the environment stand in for them where checks are run in-process, by the course's tests.)
"""
from __future__ import annotations

import hashlib
import linecache
import os
import sys
from typing import Any, Callable

import numpy as np
import torch

from .protocol import RECORD_ENV, SEED_ENV, CheckFailed, Opaque, StudentError, record_name, typename, write

MAX_RECORDED = 100_000  # numbers kept of one value the student's code returns
MAX_ITEMS = 20_000  # list items and dict entries kept of one value
_GRADING: dict[str, Any] = {}  # record, seed, nonce: set by the check cell's loader under grading
_PENDING: list[Any] = []  # what the kernel's watch noted before this check cell (a StudentError; set by the loader)


def configure(secrets: dict[str, str] | None) -> None:
    """Record under grading, with the check cell's ``secrets`` (``record``: the folder, ``seed``:
    of its hidden inputs, ``nonce``: the start of its record files' names). Called by the loader."""
    if secrets:
        _GRADING.update(record=str(secrets["record"]), seed=str(secrets["seed"]), nonce=str(secrets["nonce"]), seq=0)


def watched() -> bool:
    """True in a check cell the grader runs, whose secrets came from the kernel's watch."""
    return bool(_GRADING)


def recording() -> bool:
    """True in a kernel the grader runs: the checks record, and judge nothing."""
    return bool(_GRADING or os.environ.get(RECORD_ENV))


# ---------------------------------------------------------------- inputs

def seeded(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """A float64 tensor of N(0, scale²) entries from its own generator: a check's visible input."""
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def hidden_generator(check: str, hidden: int) -> torch.Generator:
    """The generator of the hidden cases of ``check`` (call number ``hidden`` in a cell), seeded from the
    grading run's seed: new inputs for every grading run, the same in the instructor's run."""
    seed = _GRADING["seed"] if _GRADING else os.environ.get(SEED_ENV, "0")
    key = f"{seed}/{check}/{int(hidden)}".encode()
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1)


def draw(gen: torch.Generator, low: int, high: int) -> int:
    """A whole number from ``low`` to ``high`` (both included)."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """A float64 tensor of N(0, scale²) entries drawn from ``gen``."""
    return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)


# ---------------------------------------------------------------- what came back

def capture(value: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """``value`` as plain data to record: tensors (detached, on the CPU, dtype kept) and NumPy
    arrays of numbers, Python numbers, bools, strings of at most 100 characters, None, lists of
    those (tuples become lists) and dicts of them with string keys. Only these exact types are read
    (with torch's and NumPy's own methods, never one a class could override): a subclass, or any
    other object, becomes an :class:`Opaque` description."""
    budget = [MAX_ITEMS] if budget is None else budget
    kind = type(value)
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        if _TENSOR.is_complex(value) or value.dtype not in _DTYPES:
            return Opaque(f"a tensor of dtype {value.dtype}")
        if _TENSOR.numel(value) > MAX_RECORDED:
            return Opaque(f"a tensor of {_TENSOR.numel(value)} numbers, too many to record")
        return _TENSOR.clone(_TENSOR.cpu(_TENSOR.detach(value))).as_subclass(torch.Tensor)
    if kind is np.ndarray or kind in _NUMPY_SCALARS:
        arr = np.array(value, copy=True, subok=False)
        if arr.dtype.kind not in "biuf":
            return Opaque(f"a NumPy array of dtype {arr.dtype}")
        return arr if arr.size <= MAX_RECORDED else Opaque("a NumPy array too large to record")
    if value is None or kind is bool or kind is int or kind is float:
        if kind is int and abs(value) >= 2**63:
            return float(value)
        return value
    if kind is str:
        return value[:100]
    if (kind is list or isinstance(value, tuple) and (kind is tuple or kind.__module__ == "torch.return_types")) \
            and depth < 4:
        budget[0] -= len(value)
        if len(value) > 1000 or budget[0] < 0:
            return Opaque(f"a {kind.__name__} of {len(value)} items, too many to record")
        items = tuple.__iter__(value) if kind is not list else list.__iter__(value)
        return [capture(v, depth + 1, budget) for v in items]
    if kind is torch.Size:
        return [int(n) for n in tuple.__iter__(value)]
    if kind is dict and depth < 4 and all(type(k) is str for k in dict.keys(value)):
        budget[0] -= len(value)
        if len(value) > 1000 or budget[0] < 0:
            return Opaque(f"a dict of {len(value)} entries, too many to record")
        return {k[:100]: capture(v, depth + 1, budget) for k, v in dict.items(value)}
    _refuse_own_class(kind)
    return Opaque(typename(value))


def _refuse_own_class(kind: type) -> None:
    """Raise StudentError ``capture`` if ``kind`` (or a class it derives from) is the notebook's: a
    result must be plain data, not an object whose methods the notebook wrote."""
    for cls in type.mro(kind):
        for member in dict(cls.__dict__).values():
            code = member.__code__ if type(member) is type(_refuse_own_class) else None
            if code is not None and notebook_code(code.co_filename):
                err = StudentError("capture", f"an object of the notebook's class {cls.__name__[:40]}")
                err.where = (code.co_firstlineno, linecache.getline(code.co_filename, code.co_firstlineno).strip()[:200])
                raise err


_ROOTS = tuple(sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
                      | {os.path.realpath(p) for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)}
                      | {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}))  # the library


def notebook_code(filename: str) -> bool:
    """True for code of the notebook (a cell's file), not of Python, its packages or the library."""
    return not filename.startswith(("<frozen ", *_ROOTS))  # (code run from a string is the notebook's)


_TENSOR = torch._C.TensorBase  # its methods: a class cannot replace them (torch.Tensor's, it can)
_NUMPY_SCALARS = frozenset(t for t in np.sctypeDict.values() if isinstance(t, type))
_DTYPES = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool}


# ---------------------------------------------------------------- records

def _record_path(name: str) -> str:
    """Where the next record goes: under grading exactly the names the grader expects of this cell,
    in order (:func:`~transformer_lib.grading.protocol.record_name`); in-process, the next free number."""
    if _GRADING:
        _GRADING["seq"] += 1
        return os.path.join(_GRADING["record"], record_name(_GRADING["nonce"], _GRADING["seq"] - 1))
    folder = os.environ[RECORD_ENV]
    return os.path.join(folder, f"{len([f for f in os.listdir(folder) if f.endswith('.npz')]):03d}-{name}.npz")


def _capture_case(case: dict) -> dict:
    """A case as data; a function or model in it is left out (the judge rebuilds it from the rest)."""
    return {k: capture(v) for k, v in case.items() if not callable(v) or type(v) is torch.Tensor}


# ---------------------------------------------------------------- one check

def run_check(name: str, fn: Any, cases: list[dict], run: Callable[[Any, dict], dict], hidden: int = 0) -> None:
    """Run ``run(fn, case)`` (the student's function on one case, returning what to judge) for every
    case; record the inputs and outcomes under grading, else judge them here. Either way the judge
    sees them as captured data (:func:`capture`), never the live objects."""
    outs, causes = [], []
    for case in cases:
        causes.append(None)
        try:
            out = run(fn, case)
            if _PENDING:  # a check that calls nothing of the student's (the values are recorded) fails too
                raise _PENDING[0]
        except StudentError as err:
            out = {"error": err.code, "detail": err.detail, "where": list(err.where)}
            causes[-1] = err.__cause__  # the student's own error behind a named shape mistake
        outs.append({k: v if k in ("error", "detail", "where") else capture(v) for k, v in out.items()})
    cases = [_capture_case(c) for c in cases]
    if recording():
        write(_record_path(name), name, cases, outs, hidden)
        return
    from .judges import judge_here  # while a student works: never under grading, where it is absent

    print(f"✓ {judge_here(name, cases, outs, hidden, causes)}")
