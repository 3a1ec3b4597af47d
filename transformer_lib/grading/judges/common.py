"""The grader's side of the checks: judges, comparisons and the messages a student reads.

Each chapter's judges module (``judges/chNN_<topic>.py``) registers one judge per check with
:func:`judge`: a function ``(case, out)`` that computes its own reference from the case's inputs
(from first principles or from ``torch``), compares what the student's code returned and, on a
failure, raises :class:`CheckFailed` naming the likely misconception (through :func:`fail`,
which shows expected against actual). Under grading it runs in the grader's process, on the
records of the instructor's run (the inputs) and of the submission (the outcomes); the
student's outcomes must also equal the instructor's on the outputs the judge names in
``compare``. While a student works, :func:`judge_here` runs it in their kernel.

A failure on a hidden test is shown by :func:`render` without the expected value, without the
student's value and with every number masked: a hidden test's inputs never leave the grader.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..protocol import CheckFailed, Opaque, typename

__all__ = ["CheckFailed", "Judge", "JUDGES", "judge", "judge_here", "verdict", "render", "fail", "show", "close",
           "check_shape", "check_finite", "as_array", "pair", "truth", "number", "error_message"]

_MAX_SHOWN = 400  # characters of an array shown in a message
_SEE_TRACEBACK = "; run the check cell in your notebook to see the traceback"
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+−]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?")


@dataclass
class Judge:
    """How the outcomes of one check are judged; ``bans`` are the torch functions the exercise
    switches off (listed in its exercise box; the grader also refuses them in the source)."""

    name: str
    fn: Callable[[dict, dict], None]
    compare: tuple[str, ...] = ()
    atol: float = 0.0
    rtol: float = 0.0
    ok: Callable[[list[dict], list[dict]], str] | str = "passed"
    bans: tuple[str, ...] = field(default_factory=tuple)


JUDGES: dict[str, Judge] = {}


def judge(name: str, *, compare: tuple[str, ...] = (), atol: float = 0.0, rtol: float = 0.0,
          ok: Callable[[list[dict], list[dict]], str] | str = "passed", bans: tuple[str, ...] = ()) -> Callable:
    """Register the decorated function as the judge of check ``name``."""
    def register(fn: Callable[[dict, dict], None]) -> Callable[[dict, dict], None]:
        JUDGES[name] = Judge(name, fn, compare, atol, rtol, ok, tuple(bans))
        return fn
    return register


# ---------------------------------------------------------------- verdicts

_ERRORS = {
    "not_implemented": "{what} is not implemented yet: replace `raise NotImplementedError()` with your code",
    "not_callable": "{what}: expected a function, got {detail}",
    "banned": "{what} uses torch's {detail}, which this exercise asks you to write from scratch, from basic "
              "tensor operations: it is switched off during this check",
    "library": "{what} uses the course library ({detail}); write it from torch operations: the library is "
               "switched off while the checks run",
    "lookup": "{what} uses a row lookup or a way out of torch ({detail} on a table that is not one-hot): "
              "compute one_hot(ids) @ W_E instead, a matrix product (the point is that it equals the lookup)",
    "thread": "{what} runs code in another thread, which the checks do not allow",
    "unwatched": "{what} switched off the check's watch (sys.setprofile)",
    "capture": "{what} ran code of its own while the check read its result (a method of a class of yours, or of "
               "torch's replaced): return plain tensors, arrays, numbers, lists or dicts",
    "tampered": "{what}: the grader's watch noted code of this notebook doing what no exercise needs (replacing "
                "torch's or Python's functions, reaching frames or the interpreter, files, threads); this check "
                "and the ones after it score 0",
    "raised": "your code raised {detail} while the check ran" + _SEE_TRACEBACK,
    "shape": "your code raised {detail} while the check ran: {hint}",
}
_ERROR_HINTS = {"NameError": " (is every name the check uses defined? Run your solution cells first)"}
# The shape mistakes the kernel names (``_calls.shape_mistake``): its key, and the message.
SHAPE_HINTS = {
    "one_hot": "a matrix product whose sizes do not fit; one_hot without num_classes makes as many columns as "
               "the largest id + 1, not one per row of the table",
    "keepdim": "two tensors do not broadcast; a reduction (sum, max, mean, amax) drops the dimension it "
               "reduces, so the row sums need keepdim=True to broadcast against the rows",
    "transpose": "a matrix product whose sizes do not fit; .T reverses every dimension of a batched tensor: "
                 "transpose(-2, -1) swaps the last two",
    "matmul": "a matrix product whose inner sizes do not fit: check which dimensions of each operand meet "
              "(with batch dimensions in front, and n and m not the same)",
    "broadcast": "two tensors do not broadcast: compare their shapes dimension by dimension, from the right",
}


def error_message(out: dict, what: str) -> str:
    """The message for an outcome in which the student's code returned nothing to judge."""
    code = out.get("error") if isinstance(out.get("error"), str) else ""
    detail = out.get("detail") if isinstance(out.get("detail"), str) else ""
    detail = re.sub(r"[^A-Za-z0-9_.]", "", detail)[:60]  # a name, never text the notebook chose
    if code == "raised":
        return _ERRORS["raised"].format(detail=detail or "an exception", what=what) + _ERROR_HINTS.get(detail, "")
    if code == "shape":
        return _ERRORS["shape"].format(detail="RuntimeError", hint=SHAPE_HINTS.get(detail, SHAPE_HINTS["broadcast"]))
    return _ERRORS.get(code, "{what} returned nothing the check could judge").format(what=what, detail=detail)


def _same(got: Any, ref: Any, atol: float, rtol: float) -> bool:
    """``got`` equals ``ref`` (numbers within ``2·(atol + rtol·|ref|)``, everything else exactly)."""
    if isinstance(ref, (torch.Tensor, np.ndarray)) or isinstance(ref, (int, float)) and not isinstance(ref, bool):
        if isinstance(got, bool) or not isinstance(got, (torch.Tensor, np.ndarray, int, float)):
            return False
        g = got.double().numpy() if isinstance(got, torch.Tensor) else np.asarray(got, dtype=np.float64)
        r = ref.double().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref, dtype=np.float64)
        return g.shape == r.shape and bool(np.all(np.abs(g - r) <= 2 * (atol + rtol * np.abs(r))))
    if isinstance(ref, list):
        return isinstance(got, list) and len(got) == len(ref) and all(_same(g, r, atol, rtol) for g, r in zip(got, ref))
    return type(got) is type(ref) and got == ref


def verdict(name: str, case: dict, out: dict, reference: dict | None = None) -> None:
    """Judge one outcome: raise CheckFailed unless the student's code returned a value, the judge
    accepts it and (given the instructor's outcome ``reference``) it equals the instructor's on the
    judge's ``compare`` outputs."""
    spec = JUDGES.get(name)
    if spec is None:
        raise CheckFailed(f"no judge for the check {name!r}")
    if "error" in out:
        raise CheckFailed(error_message(out, case.get("what", name)))
    spec.fn(case, out)
    for key in spec.compare if reference is not None else ():
        if not _same(out.get(key), reference.get(key), spec.atol, spec.rtol):
            raise CheckFailed(f"{case.get('what', name)}: the result {key!r} differs from the reference "
                              "solution's on this test")


def judge_here(name: str, cases: list[dict], outs: list[dict], hidden: int = 0,
               causes: list[BaseException | None] | None = None) -> str:
    """Judge a check call in the kernel (while a student works); the ``✓`` line to print. A failure
    shows the student's own error behind it (``causes``: a named shape mistake's) in its traceback."""
    for i, (case, out) in enumerate(zip(cases, outs)):
        try:
            verdict(name, case, out)
        except CheckFailed as err:
            cause = causes[i] if causes else None
            raise CheckFailed(render(str(err), bool(hidden), case.get("inputs"))) from cause
    ok = JUDGES[name].ok
    return ok(cases, outs) if callable(ok) else ok


def render(message: str, hidden: bool, kind: Any = None) -> str:
    """The message a student reads. For a hidden test only its first line, numbers masked, under
    a heading that names the kind of input (``kind``: the case's ``inputs``, written by the check,
    such as "batched, n ≠ m") and says so: neither the inputs nor the expected value nor the
    student's own value. It sends the student to try such an input, not to the visible check."""
    if not hidden:
        return message
    first = (message.strip().splitlines() or ["the result is wrong"])[0]
    first = _NUMBER.sub("#", first.replace(_SEE_TRACEBACK, ""))
    if "your code raised" in first:
        first += "; call your function on such an input in your notebook to see the traceback"
    inputs = f"other inputs: {kind}" if isinstance(kind, str) and kind else "other inputs"
    return f"a hidden test ({inputs}) fails: {first}"


# ---------------------------------------------------------------- comparisons and messages

def show(a: Any) -> str:
    """A short, rounded rendering of an array for messages."""
    text = np.array2string(np.round(np.asarray(a, dtype=np.float64), 4), separator=", ",
                           threshold=40, edgeitems=3, max_line_width=100)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + " …"


def fail(misconception: str, expected: Any, actual: Any) -> None:
    """Raise CheckFailed: the misconception, then expected vs actual."""
    raise CheckFailed(f"{misconception}\n  expected: {show(expected)}\n  got:      {show(actual)}")


def close(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> bool:
    """Same shape and ``|actual - expected| <= atol + rtol·|expected|`` everywhere (no nan)."""
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return actual.shape == expected.shape and bool(
        np.all(np.abs(actual - expected) <= atol + rtol * np.abs(expected)))


def check_shape(actual: np.ndarray, shape: tuple[int, ...], what: str, hint: str = "") -> None:
    """CheckFailed if ``actual`` does not have ``shape``."""
    if actual.shape != tuple(shape):
        raise CheckFailed(f"{what} has the wrong shape{': ' + hint if hint else ''}\n"
                          f"  expected shape: {tuple(shape)}\n  got shape:      {actual.shape}")


def check_finite(actual: np.ndarray, what: str, hint: str) -> None:
    """CheckFailed if ``actual`` holds nan or inf."""
    if not np.all(np.isfinite(actual)):
        bad = int(np.size(actual) - np.isfinite(actual).sum())
        raise CheckFailed(f"{what} contains {bad} nan/inf value(s): {hint}\n  got: {show(actual)}")


def as_array(value: Any, what: str) -> np.ndarray:
    """The student's value as a float64 array; CheckFailed naming ``what`` if it is not numbers."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).numpy()
    if isinstance(value, Opaque) or value is None or isinstance(value, str):
        raise CheckFailed(f"{what}: expected a tensor (or numbers), got {typename(value)}")
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise CheckFailed(f"{what}: expected a tensor (or numbers), got {typename(value)}") from None


def pair(result: Any, what: str, names: tuple[str, ...]) -> tuple:
    """Split a ``(first, second, …)`` result; CheckFailed if it does not have ``len(names)`` parts."""
    if not isinstance(result, list) or len(result) != len(names):
        raise CheckFailed(f"{what} must return {'a pair' if len(names) == 2 else f'{len(names)} values'} "
                          f"({', '.join(names)}), got {typename(result)}")
    return tuple(result)


def truth(answer: Any, what: str) -> bool:
    """A yes/no answer as a bool: ``True``/``False`` (also a NumPy or one-element torch bool)."""
    if isinstance(answer, torch.Tensor) and answer.numel() == 1 and answer.dtype == torch.bool:
        return bool(answer)
    if isinstance(answer, (bool, np.bool_)) or (isinstance(answer, np.ndarray) and answer.dtype == bool
                                                and answer.size == 1):
        return bool(answer)
    raise CheckFailed(f"{what} must be True or False (got {typename(answer)})")


def number(value: Any, what: str, integer: bool = False) -> float:
    """One number: a Python int or float, a NumPy scalar or a one-element tensor."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.size != 1 if isinstance(value, np.ndarray) else \
            isinstance(value, torch.Tensor) and value.numel() != 1:
        raise CheckFailed(f"{what} must be one number, got an array of shape {tuple(value.shape)}")
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.reshape(-1)[0].item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckFailed(f"{what}: expected a number, got {typename(value)}")
    if integer and isinstance(value, float) and not value.is_integer():
        raise CheckFailed(f"{what}: expected a whole number, got {value!r}")
    return value
