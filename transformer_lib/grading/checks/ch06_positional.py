"""Checks for the chapter 6 exercises: the sinusoidal table, a RoPE rotation (rotate-half
pairing), and a test written by the student that tells relative position encodings from
absolute ones.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, the
calls of the student's functions, and the encoders the student's test is run on: plain closures,
one formula for every kind, their parameters drawn at random for the hidden tests). Below it: the
judges, which compute their references in float64 from the chapter's formulas and run in the
grader; the judge of the test knows from the case's kind whether the encoder is relative. Chapter 6.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .._harness import call, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_sinusoidal", "check_rope", "check_relative_test"]


def _even(g: torch.Generator, low: int, high: int) -> int:
    """An even number from ``low`` to ``high`` (both even)."""
    return 2 * draw(g, low // 2, high // 2)


# ---------------------------------------------------------------- sinusoidal encodings

def check_sinusoidal(fn: Callable, sizes: list[tuple[int, int]] | None = None, hidden: int = 0) -> None:
    """``fn(n, d)`` = the sinusoidal table ``(n, d)``: ``p[i, 2k] = sin(i / 10000^(2k/d))``,
    ``p[i, 2k+1] = cos(…)``, positions from 0, float64. Chapter 6."""
    if hidden:
        g = hidden_generator("sinusoidal", hidden)
        sizes = [(draw(g, 5, 60), _even(g, 6, 32)),  # an ordinary table
                 (1, 2),  # one position, one pair
                 (draw(g, 2, 20), 2),  # one pair: one frequency
                 (draw(g, 100, 300), _even(g, 40, 64))]  # far positions, many frequencies
    cases = [dict(n=n, d=d, what=f"sinusoidal({n}, {d})") for n, d in ([(4, 8)] if sizes is None else sizes)]
    run_check("sinusoidal", fn, cases, lambda f, c: {"P": call(f, c["n"], c["d"])}, hidden)


# ---------------------------------------------------------------- RoPE

def check_rope(fn: Callable, x: torch.Tensor | None = None, positions: torch.Tensor | None = None,
               hidden: int = 0) -> None:
    """``fn(x (…, n, d), positions (n,))`` = x with pair ``(k, k + d/2)`` of row i rotated by the
    angle ``positions[i] / 10000^(2k/d)`` (rotate-half layout, LLaMA's). Chapter 6."""
    if hidden:
        g = hidden_generator("rope", hidden)
        n = draw(g, 4, 8)
        far = torch.randint(1, 4096, (n,), generator=g)
        far[0], far[draw(g, 1, n - 1)] = 0, draw(g, 1000, 4095)  # position 0 and a far position
        m = draw(g, 2, 6)
        cases = [dict(x=randn(g, draw(g, 1, 3), n, _even(g, 4, 16)), positions=far),  # positions up to 4095
                 dict(x=randn(g, draw(g, 1, 3), draw(g, 1, 3), m, _even(g, 2, 12)),
                      positions=torch.randint(0, 21, (m,), generator=g)),  # unsorted, repeated, two leading axes
                 dict(x=randn(g, draw(g, 1, 5), 2), positions=None)]  # one pair per row
        cases[2]["positions"] = torch.randint(0, 200, (cases[2]["x"].shape[0],), generator=g)
    else:
        cases = [dict(x=seeded(60, 2, 5, 8) if x is None else x,
                      positions=torch.tensor([0, 1, 2, 7, 30]) if positions is None else positions)]
    for case in cases:
        case["what"] = "rope(x, positions)"
    run_check("rope", fn, cases, lambda f, c: {"out": call(f, c["x"].clone(), c["positions"].clone())}, hidden)


# ---------------------------------------------------------------- the relative-position test

def _encoder(case: dict, misuse: list[dict]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The encoding ``(x (n, d), positions (n,)) -> (n, d)`` of ``case``: every kind is the same
    formula, rotate pairs (k, k + d/2) by ``gamma · min(p, cap)^power · θ_k``, scale by
    ``1 + slope·p``, add ``amp`` times the sinusoidal table; RoPE has gamma 1, power 1, no cap,
    slope 0, amp 0. A call with the wrong kind of arguments is noted in ``misuse`` (and raises)."""
    base, gamma, power = float(case["base"]), float(case["gamma"]), float(case["power"])
    cap, slope, amp = float(case["cap"]), float(case["slope"]), float(case["amp"])

    def encode(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point() or x.shape[-1] % 2:
            misuse.append(dict(misuse="x", tensor=isinstance(x, torch.Tensor),
                               shape=list(x.shape) if isinstance(x, torch.Tensor) else None))
            raise TypeError("encode(x, positions): x must be a float (n, d) tensor")
        positions = torch.as_tensor(positions)
        if positions.shape != (x.shape[0],) or positions.is_floating_point():
            misuse.append(dict(misuse="positions", tensor=True, shape=list(positions.shape),
                               floating=positions.is_floating_point()))
            raise TypeError("encode(x, positions): positions must be integers, one per row of x")
        x, p, half = x.to(torch.float64), positions.to(torch.float64)[:, None], x.shape[-1] // 2
        theta = base ** (-torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half))
        angle = gamma * p.clamp(max=cap) ** power * theta
        x1, x2 = x[:, :half], x[:, half:]
        y = torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], -1)
        table = torch.stack([torch.sin(p * theta), torch.cos(p * theta)], -1).flatten(-2)
        return y * (1 + slope * p) + amp * table
    return encode


def _run_relative(fn: Callable, case: dict) -> dict:
    misuse: list[dict] = []
    with torch.random.fork_rng(devices=[]):
        try:
            verdict = call(fn, _encoder(case, misuse), case["d"])
        except Exception:  # a StudentError, or (while the student works) their own error
            if not misuse:
                raise
            return misuse[0]
    return misuse[0] if misuse else {"verdict": verdict}


def _encoding(kind: str, d: int, base: float = 10000.0, **parameters: float) -> dict:
    case = dict(kind=kind, d=d, base=base, gamma=1.0, power=1.0, cap=math.inf, slope=0.0, amp=0.0)
    case.update(parameters)
    case["what"] = "is_relative(encode, d)"
    return case


def _shuffled(g: torch.Generator, cases: list[dict]) -> list[dict]:
    return [cases[i] for i in torch.randperm(len(cases), generator=g).tolist()]


def check_relative_test(fn: Callable, d: int = 8, hidden: int = 0) -> None:
    """``fn(encode, d) -> bool``: True iff the scores ``encode(q, m)ᵀ encode(k, n)`` depend on the
    positions only through ``m − n``. Run on RoPE (must be True) and on encodings that are not
    relative (must be False); the hidden ones have random parameters. Chapter 6."""
    if hidden == 1:
        g = hidden_generator("relative_test", hidden)
        d = _even(g, 2, 16)

        def base() -> float:
            return float(draw(g, 50, 30000))
        cases = _shuffled(g, [
            _encoding("rope", d, base()), _encoding("rope", d, base()),
            _encoding("position²", d, base(), power=2.0, gamma=draw(g, 1, 20) / 10),
            _encoding("capped", d, base(), cap=float(draw(g, 40, 400))),  # relative below the cap and above it
            _encoding("scaled", d, base(), slope=draw(g, 1, 100) / 100)])
    elif hidden:
        g = hidden_generator("relative_test", hidden)
        d = _even(g, 10, 32)
        cases = _shuffled(g, [_encoding("rope", d, float(draw(g, 50, 30000))),
                              _encoding("sinusoidal added", d, float(draw(g, 50, 30000)), amp=draw(g, 5, 20) / 10)])
    else:
        cases = [_encoding("rope", d), _encoding("sinusoidal added", d, amp=1.0)]
    run_check("relative_test", fn, cases, _run_relative, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import numpy as np  # noqa: E402

from .._harness import CheckFailed, typename  # noqa: E402
from .._judging import as_array, check_finite, check_shape, close, fail, judge  # noqa: E402


# ---------------------------------------------------------------- sinusoidal encodings

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


@judge("sinusoidal", compare=("P",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "sinusoidal table: sin in even, cos in odd columns, frequencies 10000^(−2k/d), "
                              f"positions from 0 (n, d in {[(c['n'], c['d']) for c in cases]})")
def _sinusoidal(case: dict, out: dict) -> None:
    n, d, what = case["n"], case["d"], case["what"]
    got = as_array(out["P"], what)
    check_shape(got, (n, d), what, "one row per position, one column per coordinate")
    check_finite(got, what, "every entry is a sine or a cosine")
    expected = _table(n, d)
    if close(got, expected, 1e-9, 1e-9):
        return
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


# ---------------------------------------------------------------- RoPE

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


@judge("rope", compare=("out",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "RoPE: pairs (k, k + d/2) of each row rotated by +position·θ_k (x "
                              + ", ".join(str(tuple(c["x"].shape)) for c in cases) + ")")
def _rope_judge(case: dict, out: dict) -> None:
    x, positions, what = case["x"], case["positions"], case["what"]
    got = as_array(out["out"], what)
    check_shape(got, tuple(x.shape), what, "RoPE rotates each vector: the output has x's shape")
    check_finite(got, what, "a rotation of finite numbers is finite")
    expected = _rope(x, positions)
    if close(got, expected, 1e-9, 1e-9):
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


# ---------------------------------------------------------------- the relative-position test

def _relative(case: dict) -> bool:
    """Whether the encoder of ``case`` is relative: a rotation by an angle linear in the position,
    nothing added, nothing scaled (RoPE, any base)."""
    return (case["power"] == 1.0 and case["cap"] == math.inf and case["slope"] == 0.0
            and case["amp"] == 0.0)


def _kind(case: dict) -> str:
    """The encoder of ``case`` in words, for the message."""
    if case["amp"]:
        return "sinusoidal encodings added to x"
    if case["power"] != 1.0:
        return "the angle grows like position²"
    if case["cap"] != math.inf:
        return f"the rotation stops at position {case['cap']:g}"
    if case["slope"]:
        return "the vectors are scaled by the position"
    return "RoPE"


def _shape(shape: object) -> str:
    return f" of shape {tuple(int(s) for s in shape)}" if isinstance(shape, list) else ""


@judge("relative_test",
       ok=lambda cases, outs: "the relative-position test accepts RoPE and rejects encodings that are not "
                              f"relative (d = {cases[0]['d']}: "
                              + ", ".join(_kind(c) for c in cases) + ")")
def _relative_test(case: dict, out: dict) -> None:
    if out.get("misuse") == "x":
        raise CheckFailed("your test must call encode(x, positions) with x a float (n, d) tensor, got "
                          + (f"a tensor{_shape(out.get('shape'))}" if out.get("tensor") else "something else")
                          + " (float, two axes, an even number of columns)")
    if out.get("misuse") == "positions":
        raise CheckFailed("your test must call encode(x, positions) with integer positions of shape (n,), "
                          f"one per row of x, got {'float ' if out.get('floating') is True else ''}positions"
                          f"{_shape(out.get('shape'))}")
    verdict = out.get("verdict")
    if isinstance(verdict, torch.Tensor) and verdict.numel() == 1 and verdict.dtype == torch.bool:
        verdict = bool(verdict)
    elif isinstance(verdict, np.ndarray) and verdict.size == 1 and verdict.dtype == bool:
        verdict = bool(verdict)
    if not isinstance(verdict, bool):
        raise CheckFailed(f"is_relative(encode, d) must return True or False, got {typename(verdict)}")
    if verdict == _relative(case):
        return
    if _relative(case):
        raise CheckFailed("your test rejects a relative encoding (RoPE): shift the positions of "
                          "the query and of the key by the *same* amount and compare the scores "
                          "with a tolerance (rounding differs by about 1e-12)")
    raise CheckFailed(f"your test accepts an encoding whose scores depend on more than m − n (in it, "
                      f"{_kind(case)}): compare the scores of many position pairs (m, n) with those of "
                      "(m + s, n + s), for shifts s and positions well beyond the first few")
