"""The checks' kernel half for the chapter 6 exercises: ALiBi's slopes for any number of heads (BLOOM's
rule for a head count that is not a power of two), the permutation that turns a checkpoint written
for interleaved RoPE into one for rotate-half RoPE, and a test written by the student that tells
relative position encodings from absolute ones.

What runs in the student's kernel (the inputs, visible and hidden, the calls of the student's
functions, and the encoders the student's test is run on: plain closures over the data that defines
each, tables of angles, gains and added vectors for the positions 0 … 511, drawn at random for the
hidden tests, some changed only beyond some position, so that reading an encoder costs as much as
testing it). The judges are in :mod:`transformer_lib.grading.judges.ch06_positional`. Chapter 6.
"""
from __future__ import annotations

from typing import Callable

import torch

from .._calls import call
from .._harness import draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_alibi_slopes", "check_rope_permutation", "check_relative_test"]


def _even(g: torch.Generator, low: int, high: int) -> int:
    """An even number from ``low`` to ``high`` (both even)."""
    return 2 * draw(g, low // 2, high // 2)


# ---------------------------------------------------------------- ALiBi's slopes

def _not_a_power_of_two(g: torch.Generator, low: int, high: int) -> int:
    while True:
        h = draw(g, low, high)
        if h & (h - 1):
            return h


def check_alibi_slopes(fn: Callable, heads: list[int] | None = None, hidden: int = 0) -> None:
    """``fn(H)`` = the H ALiBi slopes, float64 ``(H,)``: ``2^(−8h/H)`` for H a power of two, else
    BLOOM's rule (the slopes of the largest power of two p below H, then every other slope of 2p
    heads). Chapter 6."""
    if hidden:
        g = hidden_generator("alibi_slopes", hidden)
        heads = [1, _not_a_power_of_two(g, 3, 7), _not_a_power_of_two(g, 9, 31),
                 _not_a_power_of_two(g, 33, 100), 2 ** draw(g, 1, 6)]
    cases = [dict(H=h, what=f"alibi_slopes({h})") for h in ([8, 12] if heads is None else heads)]
    run_check("alibi_slopes", fn, cases, lambda f, c: {"slopes": call(f, c["H"])}, hidden)


# ---------------------------------------------------------------- interleaved to rotate-half

def check_rope_permutation(fn: Callable, W: torch.Tensor | None = None, n_heads: int = 2, hidden: int = 0) -> None:
    """``fn(W (d, H·d_k), H)`` = W with the columns of each head permuted by σ = (0, 2, …, d_k − 2,
    1, 3, …, d_k − 1), so that rotate-half RoPE on X·W' gives the scores interleaved RoPE gives on
    X·W. Chapter 6."""
    if hidden:
        g = hidden_generator("rope_permutation", hidden)
        shapes = [(draw(g, 2, 9), draw(g, 2, 4), _even(g, 4, 10)),   # several heads
                  (draw(g, 2, 6), 1, _even(g, 6, 12)),                # one head
                  (None, draw(g, 2, 3), _even(g, 4, 6)),              # square: d = H·d_k
                  (draw(g, 2, 5), draw(g, 2, 5), 2)]                  # one pair per head: σ is the identity
        kinds = ["several heads", "one head", "a square W", "d_k = 2, where σ is the identity"]
        cases = [dict(W=randn(g, H * dk if d is None else d, H * dk), n_heads=H, inputs=kind)
                 for (d, H, dk), kind in zip(shapes, kinds)]
    else:
        # d_k = 6, where σ ≠ σ⁻¹; and a square W, where rows and columns could be confused
        cases = [dict(W=seeded(63, 5, 12), n_heads=2), dict(W=seeded(64, 12, 12), n_heads=2)] if W is None else \
            [dict(W=W, n_heads=n_heads)]
    for case in cases:
        case["what"] = "to_rotate_half(W, n_heads)"
    run_check("rope_permutation", fn, cases, lambda f, c: {"W": call(f, c["W"].clone(), c["n_heads"])}, hidden)


# ---------------------------------------------------------------- the relative-position test

_POSITIONS = 512  # every encoder knows the positions 0 … 511


def _encoder(case: dict, misuse: list[dict]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The encoding ``(x (n, d), positions (n,)) -> (n, d)`` of ``case``, defined by its tables (one
    row per position): rotate the pairs (k, k + d/2) of row i by ``angles[p_i]``, scale by ``gain[p_i]``,
    add ``added[p_i]``. RoPE is the table ``angles[p] = p·θ``, gain 1, nothing added; the other kinds
    change a table, some of them only beyond some position. A call with the wrong kind of arguments is
    noted in ``misuse`` (and raises)."""
    angles, gain, added = case["angles"].clone(), case["gain"].clone(), case["added"].clone()

    def encode(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point() or x.shape[-1] != case["d"]:
            misuse.append(dict(misuse="x", tensor=isinstance(x, torch.Tensor),
                               shape=list(x.shape) if isinstance(x, torch.Tensor) else None))
            raise TypeError(f"encode(x, positions): x must be a float (n, {case['d']}) tensor")
        positions = torch.as_tensor(positions)
        if positions.shape != (x.shape[0],) or positions.is_floating_point() or positions.dtype == torch.bool:
            misuse.append(dict(misuse="positions", tensor=True, shape=list(positions.shape),
                               floating=positions.is_floating_point()))
            raise TypeError("encode(x, positions): positions must be integers, one per row of x")
        if len(positions) and not 0 <= int(positions.min()) <= int(positions.max()) < _POSITIONS:
            misuse.append(dict(misuse="range", low=int(positions.min()), high=int(positions.max())))
            raise IndexError(f"encode(x, positions): the positions run from 0 to {_POSITIONS - 1}")
        x, half = x.to(torch.float64), x.shape[-1] // 2
        angle, x1, x2 = angles[positions], x[:, :half], x[:, half:]
        y = torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], -1)
        return y * gain[positions][:, None] + added[positions]
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


def _encoding(kind: str, d: int, theta: torch.Tensor, *, power: float = 1.0, gamma: float = 1.0,
              cap: int = _POSITIONS, slope: float = 0.0, amp: float = 0.0,
              kick: tuple[int, int, float] | None = None) -> dict:
    """A case: the tables of an encoder over the positions 0 … 511. The angle of pair k at position p is
    ``gamma · min(p, cap)^power · theta_k`` (plus ``kick = (p, k, δ)``: δ more at one position and
    pair); the gain ``1 + slope·p``; ``amp`` times the sinusoidal table (frequencies theta) added."""
    p = torch.arange(_POSITIONS, dtype=torch.float64)[:, None]
    angles = gamma * p.clamp(max=cap) ** power * theta
    if kick is not None:
        angles[kick[0], kick[1]] += kick[2]
    table = torch.stack([torch.sin(p * theta), torch.cos(p * theta)], -1).flatten(-2)
    return dict(kind=kind, d=d, angles=angles, gain=1 + slope * p[:, 0], added=amp * table, cap=cap,
                kick=-1 if kick is None else kick[0], what="is_relative(encode, d)")


def _theta(d: int, base: float) -> torch.Tensor:
    """RoPE's frequencies ``base^(−2k/d)``."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def _shuffled(g: torch.Generator, cases: list[dict]) -> list[dict]:
    return [cases[i] for i in torch.randperm(len(cases), generator=g).tolist()]


def check_relative_test(fn: Callable, d: int = 8, hidden: int = 0) -> None:
    """``fn(encode, d) -> bool``: True iff the scores ``encode(q, m)ᵀ encode(k, n)`` depend on the
    positions (0 … 511) only through ``m − n``. Run on RoPE (must be True) and on encodings that are not
    relative (must be False), each defined by its tables of angles, gains and added vectors; the hidden
    ones have random tables, some changed only beyond some position. Chapter 6."""
    if hidden == 1:
        g = hidden_generator("relative_test", hidden)
        d = _even(g, 2, 16)

        def base() -> torch.Tensor:
            return _theta(d, float(draw(g, 50, 30000)))
        cases = _shuffled(g, [
            _encoding("rope", d, base()),
            _encoding("rope, random frequencies", d, torch.rand(d // 2, generator=g, dtype=torch.float64)),
            _encoding("position²", d, base(), power=2.0, gamma=draw(g, 1, 20) / 10),
            _encoding("capped", d, base(), cap=draw(g, 40, 400)),  # relative below the cap and above it
            _encoding("scaled", d, base(), slope=draw(g, 1, 100) / 100)])
    elif hidden:
        g = hidden_generator("relative_test", hidden)
        d = _even(g, 10, 32)

        def base() -> torch.Tensor:
            return _theta(d, float(draw(g, 50, 30000)))
        kick = (draw(g, 200, _POSITIONS - 1), draw(g, 0, d // 2 - 1), draw(g, 5, 50) / 100)
        cases = _shuffled(g, [_encoding("rope", d, base()),
                              _encoding("kicked", d, base(), kick=kick),   # RoPE but at one far position
                              _encoding("sinusoidal added", d, base(), amp=draw(g, 5, 20) / 10)])
    else:
        theta = _theta(d, 10000.0)
        cases = [_encoding("rope", d, theta), _encoding("sinusoidal added", d, theta, amp=1.0),
                 _encoding("position²", d, theta, power=2.0, gamma=0.5),
                 _encoding("capped", d, theta, cap=100),                   # relative below position 100 and above
                 _encoding("kicked", d, theta, kick=(300, 0, 0.3))]       # RoPE but at one far position
    run_check("relative_test", fn, cases, _run_relative, hidden)
