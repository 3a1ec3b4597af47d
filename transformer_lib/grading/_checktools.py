"""Helpers shared by the check functions: conversion, comparison, messages, records, bans.

A check converts the student's result with :func:`as_array` (float64 NumPy), records it with
:func:`record` (a plain ``.npz`` file, only when the grader asks for it through the
``TRANSFORMER_LIB_GRADING_RECORD_DIR`` environment variable), compares it with a reference
using explicit tolerances, and on failure raises :class:`CheckFailed` (an ``AssertionError``)
through :func:`fail`, naming the likely misconception and showing expected vs actual. The
student's function is run through :func:`call`, which switches off the course library and
the torch functions an exercise asks the student to write.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

RECORD_ENV = "TRANSFORMER_LIB_GRADING_RECORD_DIR"
TOKEN_ENV = "TRANSFORMER_LIB_GRADING_TOKEN"  # set by the grader for each kernel it starts
_MAX_SHOWN = 400  # characters of an array shown in a message
MAX_RECORDED = 100_000  # numbers recorded per check call


def failure_name(token: str) -> str:
    """The class name of the checks' own failures in a kernel whose grading token is ``token``.

    The grader shows a student the message of an exception only if its class has this name;
    anything else a cell raises (an AssertionError of the student's code too) is reported by
    its type alone, so that no message the student's code makes up reaches the feedback.
    """
    return f"AssertionError_{token}" if token else "AssertionError"


class CheckFailed(AssertionError):
    """A failure found by a check itself. Outside grading it shows as a plain AssertionError."""


CheckFailed.__name__ = CheckFailed.__qualname__ = failure_name(os.environ.get(TOKEN_ENV, ""))


def typename(value: Any) -> str:
    """The type of ``value`` for a message; a class the notebook defined is not named (its name
    could carry any text)."""
    if value is None:
        return "None (did you forget to return the result?)"
    kind = type(value)
    module = str(getattr(kind, "__module__", ""))
    known = module.split(".")[0] in {"builtins", "numpy", "torch"} and \
        getattr(sys.modules.get(module), kind.__name__, None) is kind
    return kind.__name__ if known else "an object"


def as_array(value: Any, what: str) -> np.ndarray:
    """The student's value as a float64 array; CheckFailed naming ``what`` if impossible."""
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            raise CheckFailed(f"{what}: expected a real tensor, got dtype {value.dtype}")
        return value.detach().cpu().to(torch.float64).numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise CheckFailed(f"{what}: expected a tensor (or numbers), got {typename(value)}") from None
    return arr


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


def record(name: str, arrays: dict[str, Any], atol: float = 0.0, rtol: float = 0.0) -> None:
    """Save the student's results for the grader (a no-op outside grading).

    The grader compares them, outside the student's kernel, with the instructor's results,
    using ``2·(atol + rtol·|instructor|)``. Only plain numeric arrays are written
    (``np.savez``; the grader loads them with ``allow_pickle=False``).
    """
    folder = os.environ.get(RECORD_ENV)
    if not folder:
        return
    path = Path(folder)
    seq = len(list(path.glob("*.npz")))
    data = {key: np.asarray(value, dtype=np.float64) for key, value in arrays.items()}
    if sum(a.size for a in data.values()) > MAX_RECORDED:  # far too large to be right: not worth saving
        data = {key: np.zeros(0) for key in data}
    data["__tolerance__"] = np.array([atol, rtol], dtype=np.float64)
    np.savez(path / f"{seq:02d}-{name}.npz", **data)


_SOFTMAXES = ("softmax", "logsumexp")  # also log_softmax, nn.Softmax, torch.special.softmax, Tensor.softmax
_ATTENTIONS = ("scaled_dot_product_attention",)
_LOOKUPS = {"embedding", "embedding_bag", "index_select", "gather", "take", "take_along_dim",
            "masked_select", "select", "narrow", "unbind", "__iter__", "split", "chunk", "tensor_split",
            "unsafe_split", "unsafe_chunk", "split_with_sizes", "unfold", "as_strided",
            "numpy", "__array__", "tolist", "item", "__dlpack__"}  # row access, or leaving torch
_LIBRARY = f"{os.sep}transformer_lib{os.sep}"  # the course library's files (the grading package excepted)
_GRADING = f"{_LIBRARY}grading{os.sep}"


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

    def __init__(self, banned: tuple[str, ...], lookups: bool, used: list[str]) -> None:
        super().__init__()
        self.banned, self.lookups, self.used = banned, lookups, used

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if any(fragment in name for fragment in self.banned):
            self.used.append(f"torch's {name}, which this exercise asks you to write from scratch, from basic "
                             "tensor operations: it is switched off during this check")
        elif self.lookups and _looks_up_values(name, args):
            how = "indexing (W_E[ids])" if name == "__getitem__" else f"torch's {name} on W_E"
            self.used.append(f"{how}, a row lookup (or a way out of torch): compute one_hot(ids) @ W_E "
                             "instead, a matrix product (the point is that it equals the lookup)")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _watch_calls(banned: tuple[str, ...], used: list[str]) -> Iterator[None]:
    """Note every call into the course library, and every direct call of a ``banned`` torch function
    (even with torch's function modes switched off), while the block runs."""
    def library(frame) -> bool:  # noqa: ANN001
        path = frame.f_code.co_filename if frame is not None else ""
        return _LIBRARY in path and _GRADING not in path

    def hook(frame, event, arg):  # noqa: ANN001, ANN202
        if event == "call" and library(frame) and not library(frame.f_back) and frame.f_code.co_name != "<module>":
            path = frame.f_code.co_filename  # a call into the library from outside it (importing it is fine)
            used.append(f"the course library ({os.path.basename(path)[:-3]}.{frame.f_code.co_name}); write "
                        "it from torch operations: the library is switched off while the checks run")
        elif event == "c_call" and any(fragment in getattr(arg, "__name__", "") for fragment in banned):
            used.append(f"torch's {arg.__name__}, which this exercise asks you to write from scratch")
    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield
    finally:
        if sys.getprofile() is not hook:
            used.append("sys.setprofile, which switched off the check's watch on library calls")
        sys.setprofile(previous)


def call(fn: Any, *args: Any, what: str, banned: tuple[str, ...] = (), lookups: bool = False,
         **kwargs: Any) -> Any:
    """Call the student's function with the course library, the ``banned`` torch functions and
    (with ``lookups``) row lookups switched off; a NotImplementedError becomes a clear failure."""
    if not callable(fn):
        raise CheckFailed(f"{what}: expected a function, got {typename(fn)}")
    used: list[str] = []
    try:
        with _Watch(banned, lookups, used), _watch_calls(banned, used):
            result = fn(*args, **kwargs)
    except NotImplementedError:
        raise CheckFailed(f"{what} is not implemented yet: replace `raise NotImplementedError()` "
                          "with your code") from None
    except Exception:
        if used:  # e.g. .numpy() on a tensor that requires grad: name what was switched off
            raise CheckFailed(f"{what} uses {used[0]}") from None
        raise
    if used:
        raise CheckFailed(f"{what} uses {used[0]}")
    return result


def seeded(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """A float64 tensor of N(0, scale²) entries from its own generator: a check's default input."""
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def ok(message: str) -> None:
    """Print the one-line success message of a check."""
    print(f"✓ {message}")


def unpack_pair(result: Any, what: str, names: tuple[str, str]) -> tuple[Any, Any]:
    """Split a ``(first, second)`` result; CheckFailed if it is not a pair."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise CheckFailed(f"{what} must return a pair ({names[0]}, {names[1]}), got {typename(result)}")
    return result[0], result[1]
