"""Helpers shared by the check functions: conversion, comparison, messages, records.

A check converts the student's result with :func:`as_array` (float64 NumPy), records it with
:func:`record` (a plain ``.npz`` file, only when the grader asks for it through the
``TRANSFORMER_LIB_GRADING_RECORD_DIR`` environment variable), compares it with a reference
using explicit tolerances, and on failure raises ``AssertionError`` through :func:`fail`,
naming the likely misconception and showing expected vs actual.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

RECORD_ENV = "TRANSFORMER_LIB_GRADING_RECORD_DIR"
_MAX_SHOWN = 400  # characters of an array shown in a message
MAX_RECORDED = 100_000  # numbers recorded per check call


def as_array(value: Any, what: str) -> np.ndarray:
    """The student's value as a float64 array; AssertionError naming ``what`` if impossible."""
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            raise AssertionError(f"{what}: expected a real tensor, got dtype {value.dtype}")
        return value.detach().cpu().to(torch.float64).numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise AssertionError(f"{what}: expected a tensor (or numbers), got "
                             f"{type(value).__name__}") from None
    return arr


def show(a: Any) -> str:
    """A short, rounded rendering of an array for messages."""
    text = np.array2string(np.round(np.asarray(a, dtype=np.float64), 4), separator=", ",
                           threshold=40, edgeitems=3, max_line_width=100)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + " …"


def fail(misconception: str, expected: Any, actual: Any) -> None:
    """Raise AssertionError: the misconception, then expected vs actual."""
    raise AssertionError(f"{misconception}\n  expected: {show(expected)}\n  got:      {show(actual)}")


def close(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> bool:
    """Same shape and ``|actual - expected| <= atol + rtol·|expected|`` everywhere (no nan)."""
    return actual.shape == expected.shape and bool(
        np.all(np.abs(actual - expected) <= atol + rtol * np.abs(expected)))


def check_shape(actual: np.ndarray, shape: tuple[int, ...], what: str, hint: str = "") -> None:
    """AssertionError if ``actual`` does not have ``shape``."""
    if actual.shape != tuple(shape):
        raise AssertionError(f"{what} has the wrong shape{': ' + hint if hint else ''}\n"
                             f"  expected shape: {tuple(shape)}\n  got shape:      {actual.shape}")


def check_finite(actual: np.ndarray, what: str, hint: str) -> None:
    """AssertionError if ``actual`` holds nan or inf."""
    if not np.all(np.isfinite(actual)):
        bad = int(np.size(actual) - np.isfinite(actual).sum())
        raise AssertionError(f"{what} contains {bad} nan/inf value(s): {hint}\n  got: {show(actual)}")


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


_SOFTMAXES = ("softmax",)  # also log_softmax, nn.Softmax, torch.special.softmax, Tensor.softmax
_ATTENTIONS = ("scaled_dot_product_attention",)


class _Forbid(TorchFunctionMode):
    """Refuse every torch function whose name contains one of ``fragments``, however it is reached."""

    def __init__(self, fragments: tuple[str, ...], exercise: str) -> None:
        super().__init__()
        self.fragments, self.exercise = fragments, exercise

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if any(fragment in name for fragment in self.fragments):
            raise AssertionError(f"{self.exercise} asks you to write this from scratch (exp, sum, amax, "
                                 f"matmul): torch's {name} is switched off during this check")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def forbid(fragments: tuple[str, ...], exercise: str) -> Iterator[None]:
    """Switch off the library functions an exercise asks the student to write, while it runs."""
    with _Forbid(fragments, exercise):
        yield


def call(fn: Any, *args: Any, what: str, **kwargs: Any) -> Any:
    """Call the student's function; a NotImplementedError becomes a clear AssertionError."""
    if not callable(fn):
        raise AssertionError(f"{what}: expected a function, got {type(fn).__name__}")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise AssertionError(f"{what} is not implemented yet: replace `raise NotImplementedError()` "
                             "with your code") from None


def ok(message: str) -> None:
    """Print the one-line success message of a check."""
    print(f"✓ {message}")


def unpack_pair(result: Any, what: str, names: tuple[str, str]) -> tuple[Any, Any]:
    """Split a ``(first, second)`` result; AssertionError if it is not a pair."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError(f"{what} must return a pair ({names[0]}, {names[1]}), "
                             f"got {type(result).__name__}")
    return result[0], result[1]
