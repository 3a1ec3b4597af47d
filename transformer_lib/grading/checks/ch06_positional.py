"""Checks for the chapter 6 exercises: the sinusoidal table, a RoPE rotation (rotate-half
pairing), and a test written by the student that tells relative position encodings from
absolute ones.

Each check computes its reference inside the function, in float64, from the formulas of the
chapter; the encoders the student's test is run on are built here from ``torch`` alone. Chapter 6.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .._checktools import CheckFailed, as_array, call, check_finite, check_shape, close, fail, ok, record, \
    seeded, typename

__all__ = ["check_sinusoidal", "check_rope", "check_relative_test"]


# ------------------------------------------------------------------ sinusoidal encodings

def _table(n: int, d: int, *, first: int = 0, exponent: str = "2k/d", swap: bool = False) -> np.ndarray:
    """The sinusoidal table ``(n, d)`` in float64, or one of its usual wrong variants."""
    pos = np.arange(first, first + n, dtype=np.float64)[:, None]
    out = np.zeros((n, d))
    for col in range(d):
        k = col // 2
        power = {"2k/d": 2 * k / d, "k/d": k / d, "j/d": col / d}[exponent]
        angle = pos[:, 0] / 10000.0 ** power
        even = col % 2 == 0
        out[:, col] = np.sin(angle) if even != swap else np.cos(angle)
    return out


def check_sinusoidal(fn: Callable, sizes: list[tuple[int, int]] | None = None) -> None:
    """``fn(n, d)`` = the sinusoidal table ``(n, d)``: ``p[i, 2k] = sin(i / 10000^(2k/d))``,
    ``p[i, 2k+1] = cos(…)``, positions from 0, float64. Chapter 6."""
    sizes = [(4, 8)] if sizes is None else sizes
    for n, d in sizes:
        what = f"sinusoidal({n}, {d})"
        got = as_array(call(fn, n, d, what=what), what)
        record(f"sinusoidal_{n}_{d}", {"P": got}, atol=1e-9, rtol=1e-9)
        check_shape(got, (n, d), what, "one row per position, one column per coordinate")
        check_finite(got, what, "every entry is a sine or a cosine")
        expected = _table(n, d)
        if close(got, expected, 1e-9, 1e-9):
            continue
        hints = {
            "sin and cos are swapped: the even columns 2k hold the sine, the odd columns 2k + 1 the "
            "cosine": _table(n, d, swap=True),
            "the exponent uses the pair index k as k/d: pair k turns at 1 / 10000^(2k/d) (2k, the even "
            "column index, over d)": _table(n, d, exponent="k/d"),
            "the exponent uses the column index j for both columns of a pair: the sine and the cosine "
            "of pair k share one frequency, 1 / 10000^(2k/d)": _table(n, d, exponent="j/d"),
            "positions start at 1: the first token is position 0, so row 0 is [0, 1, 0, 1, …]":
                _table(n, d, first=1),
        }
        for hint, variant in hints.items():
            if close(got, variant, 1e-6, 1e-6):
                fail(f"{what}: {hint}", expected, got)
        if close(got, expected, 1e-5, 1e-5):
            fail(f"{what} is right only to about 1e-6: compute it in float64 (torch.float64), "
                 "the precision the check asks for (atol 1e-9)", expected, got)
        fail(f"{what} differs from p[i, 2k] = sin(i / 10000^(2k/d)), p[i, 2k+1] = cos(i / 10000^(2k/d)) "
             "(atol 1e-9)", expected, got)
    ok(f"sinusoidal table: sin in even, cos in odd columns, frequencies 10000^(−2k/d), positions "
       f"from 0 (n, d in {sizes})")


# ------------------------------------------------------------------ RoPE

def _rope(x: torch.Tensor, positions: torch.Tensor, *, interleaved: bool = False, sign: float = 1.0,
          exponent: str = "2k/d") -> np.ndarray:
    """RoPE in float64, ``(…, n, d)`` -> ``(…, n, d)``, or one of its usual wrong variants."""
    d = x.shape[-1]
    k = torch.arange(d // 2, dtype=torch.float64)
    power = 2 * k / d if exponent == "2k/d" else k / d
    angle = sign * positions.to(torch.float64)[:, None] / 10000.0 ** power        # (n, d/2)
    cos, sin = angle.cos(), angle.sin()
    x = x.to(torch.float64)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out = torch.stack([y1, y2], -1).flatten(-2) if interleaved else torch.cat([y1, y2], -1)
    return out.numpy()


def check_rope(fn: Callable, x: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> None:
    """``fn(x (…, n, d), positions (n,))`` = x with pair ``(k, k + d/2)`` of row i rotated by the
    angle ``positions[i] / 10000^(2k/d)`` (rotate-half layout, LLaMA's). Chapter 6."""
    x = seeded(60, 2, 5, 8) if x is None else x
    positions = torch.tensor([0, 1, 2, 7, 30]) if positions is None else positions
    what = "rope(x, positions)"
    got = as_array(call(fn, x.clone(), positions.clone(), what=what), what)
    record("rope", {"X": got}, atol=1e-9, rtol=1e-9)
    check_shape(got, tuple(x.shape), what, "RoPE rotates each vector: the output has x's shape")
    check_finite(got, what, "a rotation of finite numbers is finite")
    expected = _rope(x, positions)
    if close(got, expected, 1e-9, 1e-9):
        ok(f"RoPE: pairs (k, k + d/2) of each row rotated by +position·θ_k (x {tuple(x.shape)})")
        return
    hints = {
        "the pairs are neighbours (2k, 2k + 1), the interleaved layout: here pair k is (k, k + d/2), "
        "the two halves of the vector (LLaMA's rotate-half)": _rope(x, positions, interleaved=True),
        "the rotation goes the wrong way: the first half becomes x1·cos − x2·sin and the second "
        "x2·cos + x1·sin (a rotation by +angle)": _rope(x, positions, sign=-1.0),
        "the frequencies use k/d: pair k turns at θ_k = 1 / 10000^(2k/d)": _rope(x, positions, exponent="k/d"),
        "the rows are not rotated: row i turns by the angle positions[i]·θ_k": x.to(torch.float64).numpy(),
    }
    for hint, variant in hints.items():
        if close(got, variant, 1e-6, 1e-6):
            fail(f"{what}: {hint}", expected, got)
    norms = np.linalg.norm(got, axis=-1)
    if not close(norms, np.linalg.norm(x.to(torch.float64).numpy(), axis=-1), 1e-6, 1e-6):
        fail(f"{what} changes the length of the vectors: a rotation keeps the norm of every row "
             "(norms shown)", np.linalg.norm(expected, axis=-1), norms)
    if close(got, expected, 1e-5, 1e-5):
        fail(f"{what} is right only to about 1e-6: compute in float64, the precision the check asks "
             "for (atol 1e-9)", expected, got)
    fail(f"{what} differs from rotating pair (k, k + d/2) of row i by positions[i] / 10000^(2k/d) "
         "(atol 1e-9)", expected, got)


# ------------------------------------------------------------------ the relative-position test

def _rotate(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (k, k + d/2) of the rows of x ``(n, d)`` by ``angle`` ``(n, d/2)``."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], -1)


def _frequencies(d: int, base: float = 10000.0) -> torch.Tensor:
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def _encoder(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """An encoding ``(x (n, d), positions (n,)) -> (n, d)``: relative (RoPE) or not."""
    def encode(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
            raise CheckFailed("your test must call encode(x, positions) with x a float (n, d) tensor, got "
                              f"{typename(x)}" + (f" of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor)
                                                  else ""))
        positions = torch.as_tensor(positions)
        if positions.shape != (x.shape[0],) or positions.is_floating_point():
            raise CheckFailed(f"your test must call encode(x, positions) with integer positions of shape "
                              f"({x.shape[0]},), one per row of x, got shape {tuple(positions.shape)}")
        x, p, d = x.to(torch.float64), positions.to(torch.float64)[:, None], x.shape[-1]
        if kind == "rope":
            return _rotate(x, p * _frequencies(d))
        if kind == "rope, base 100":
            return _rotate(x, p * _frequencies(d, 100.0))
        if kind == "sinusoidal added":
            pe = torch.zeros_like(x)
            pe[:, 0::2] = torch.sin(p * _frequencies(d)[: (d + 1) // 2])
            pe[:, 1::2] = torch.cos(p * _frequencies(d)[: d // 2])
            return x + pe
        if kind == "angle grows like position²":
            return _rotate(x, p ** 2 * _frequencies(d))
        if kind == "rotation stops at position 8":
            return _rotate(x, p.clamp(max=8) * _frequencies(d))
        if kind == "scaled by position":
            return x * (1 + p)
        raise ValueError(kind)
    return encode


_RELATIVE = {"rope": True, "rope, base 100": True, "sinusoidal added": False,
             "angle grows like position²": False, "rotation stops at position 8": False,
             "scaled by position": False}


def check_relative_test(fn: Callable, cases: list[str] | None = None, d: int = 8) -> None:
    """``fn(encode, d) -> bool``: True iff the scores ``encode(q, m)ᵀ encode(k, n)`` depend on the
    positions only through ``m − n``. Run on relative encodings (must be True) and absolute ones
    (must be False). Chapter 6."""
    cases = ["rope", "sinusoidal added"] if cases is None else cases
    for name in cases:
        with torch.random.fork_rng(devices=[]):
            verdict = call(fn, _encoder(name), d, what="is_relative(encode, d)")
        if not isinstance(verdict, (bool, np.bool_)) and not (isinstance(verdict, torch.Tensor)
                                                              and verdict.dtype == torch.bool
                                                              and verdict.numel() == 1):
            raise CheckFailed(f"is_relative(encode, d) must return True or False, got {typename(verdict)}")
        if bool(verdict) != _RELATIVE[name]:
            if _RELATIVE[name]:
                raise CheckFailed("your test rejects a relative encoding (RoPE): shift the positions of "
                                  "the query and of the key by the *same* amount and compare the scores "
                                  "with a tolerance (rounding differs by about 1e-12)")
            raise CheckFailed(f"your test accepts an encoding whose scores depend on more than m − n (it is "
                              f"{name}): compare the scores of many position pairs (m, n) with those of "
                              "(m + s, n + s), for shifts s and positions well beyond the first few")
    ok(f"the relative-position test accepts RoPE and rejects absolute encodings ({', '.join(cases)})")
