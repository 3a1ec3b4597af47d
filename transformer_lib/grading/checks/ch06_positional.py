"""Checks for the chapter 6 exercises: ALiBi's slopes for any number of heads (BLOOM's rule for
a head count that is not a power of two), the permutation that turns a checkpoint written for
interleaved RoPE into one for rotate-half RoPE, and a test written by the student that tells
relative position encodings from absolute ones.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, the
calls of the student's functions, and the encoders the student's test is run on: plain closures
over the data that defines each, tables of angles, gains and added vectors for the positions
0 … 511, drawn at random for the hidden tests, some changed only beyond some position, so that
reading an encoder costs as much as testing it). Below it: the judges, which compute their
references in float64 and run in the grader; the judge of the test reads from the tables whether
the encoder is relative. Chapter 6.
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


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import numpy as np  # noqa: E402

from .._harness import CheckFailed  # noqa: E402
from .._judging import as_array, check_shape, close, fail, judge, truth  # noqa: E402


# ---------------------------------------------------------------- ALiBi's slopes

def _geometric(h: int, first: int = 1) -> np.ndarray:
    """The slopes 2^(−8i/h) for i = first, …, first + h − 1."""
    return 2.0 ** (-8.0 * np.arange(first, first + h, dtype=np.float64) / h)


def _bloom(H: int) -> np.ndarray:
    """BLOOM's slopes for H heads: the p slopes of the largest power of two p ≤ H, then every other
    slope of 2p heads (1st, 3rd, …) until there are H."""
    p = 1 << (H.bit_length() - 1)
    return np.concatenate([_geometric(p), _geometric(2 * p)[0::2][: H - p]])


@judge("alibi_slopes", compare=("slopes",), atol=0.0, rtol=1e-12,
       ok=lambda cases, outs: "ALiBi slopes, BLOOM's rule, for H in " + str([c["H"] for c in cases])
                              + " (rtol 1e-12)")
def _alibi_slopes(case: dict, out: dict) -> None:
    H, what = case["H"], case["what"]
    got = as_array(out["slopes"], what).reshape(-1) if not isinstance(out["slopes"], (int, float)) \
        else np.asarray([out["slopes"]], dtype=np.float64)
    expected = _bloom(H)
    check_shape(got, expected.shape, what, "one slope per head")
    if close(got, expected, 0.0, 1e-12):
        return
    p = 1 << (H.bit_length() - 1)
    hints = {"h runs from 1 to H: the first slope is 2^(−8/H), not 2^0 = 1": np.concatenate(
        [_geometric(p, 0), _geometric(2 * p, 0)[0::2][: H - p]])}
    if p < H:
        hints.update({
            f"2^(−8h/H) is the rule for a power of two: for H = {H} BLOOM takes the {p} slopes of {p} heads, "
            f"then every other slope of {2 * p} heads": _geometric(H),
            f"the {H - p} extra slopes are every other slope of {2 * p} heads (the 1st, 3rd, 5th, …), not the "
            f"first {H - p} of them": np.concatenate([_geometric(p), _geometric(2 * p)[: H - p]]),
            f"the extra slopes start with the first slope of {2 * p} heads, 2^(−8/{2 * p}): the 2nd, 4th, … "
            f"repeat slopes of {p} heads": np.concatenate([_geometric(p), _geometric(2 * p)[1::2][: H - p]]),
            f"these are the first {H} slopes of {2 * p} heads: BLOOM starts from the largest power of two below "
            f"H, {p}, and fills in with every other slope of {2 * p}": _geometric(2 * p)[:H],
            "keep BLOOM's order: the slopes of the power of two first, then the extra ones (the order says "
            "which head gets which slope)": np.sort(expected)[::-1],
        })
    for hint, variant in hints.items():
        if close(got, variant, 0.0, 1e-9):
            fail(f"{what}: {hint}", expected, got)
    if close(got, expected, 0.0, 1e-6):
        fail(f"{what} is right only to about 1e-7: compute in float64, the precision the check asks for "
             "(rtol 1e-12)", expected, got)
    fail(f"{what} differs from BLOOM's slopes (rtol 1e-12)", expected, got)


# ---------------------------------------------------------------- interleaved to rotate-half

def _sigma(d_k: int) -> np.ndarray:
    """σ: the even coordinates of a head, then the odd ones."""
    return np.concatenate([np.arange(0, d_k, 2), np.arange(1, d_k, 2)])


def _per_head(perm: np.ndarray, n_heads: int) -> np.ndarray:
    return np.concatenate([h * len(perm) + perm for h in range(n_heads)])


def _converted(W: torch.Tensor, n_heads: int) -> np.ndarray:
    """The conversion of Meta's checkpoints to Hugging Face's layout, on nn.Linear's (out, in)
    weight Wᵀ: each head's rows (pair index, pair member) reordered to (member, pair index)."""
    d, width = W.shape
    d_k = width // n_heads
    weight = W.T.reshape(n_heads, d_k // 2, 2, d).transpose(1, 2).reshape(width, d)
    return weight.T.numpy()


@judge("rope_permutation", compare=("W",),
       ok=lambda cases, outs: "each head's columns reordered by σ (evens, then odds), so rotate-half RoPE on X·W' "
                              "scores like interleaved RoPE on X·W: W " + ", ".join(
           f"{tuple(c['W'].shape)} with {c['n_heads']} head{'s' * (c['n_heads'] > 1)}" for c in cases))
def _rope_permutation(case: dict, out: dict) -> None:
    W, H, what = case["W"], case["n_heads"], case["what"]
    d_k = W.shape[1] // H
    expected = W.numpy()[:, _per_head(_sigma(d_k), H)]
    if not np.array_equal(expected, _converted(W, H)):  # two derivations of one permutation
        raise CheckFailed("the check's two references disagree: tell the course staff")
    got = as_array(out["W"], what)
    check_shape(got, expected.shape, what, "the same matrix with its columns in another order")
    if np.array_equal(got, expected):
        return
    w = W.numpy()
    hints = {
        "W is unchanged: reorder the columns of each head by σ = (0, 2, …, d_k − 2, 1, 3, …, d_k − 1)": w,
        "σ acts inside each head: permute the d_k columns of every head on their own, not all H·d_k columns "
        "at once": w[:, _sigma(W.shape[1])],
        "that is σ⁻¹, the way back (rotate-half to interleaved): the new column j is the old column σ_j, "
        "new[:, j] = W[:, σ[j]]": w[:, _per_head(np.argsort(_sigma(d_k)), H)],
        "the even coordinates come first: σ = (0, 2, 4, …, then 1, 3, 5, …)":
            w[:, _per_head(np.concatenate([np.arange(1, d_k, 2), np.arange(0, d_k, 2)]), H)],
    }
    if W.shape[0] == W.shape[1]:
        hints["σ reorders the columns of W (the output coordinates of Q = XW), not its rows"] = \
            w[_per_head(_sigma(d_k), H), :]
    for hint, variant in hints.items():
        if got.shape == variant.shape and np.array_equal(got, variant):
            fail(f"{what}: {hint}", expected, got)
    if close(got, expected, 1e-9, 1e-9):
        raise CheckFailed(f"{what}: the columns must be moved, not recomputed (exact values of W expected)")
    fail(f"{what} is not W with each head's columns reordered by σ", expected, got)


# ---------------------------------------------------------------- the relative-position test

def _relative(case: dict) -> bool:
    """Whether the encoder of ``case`` is relative, read off its tables: angles linear in the position
    (pair by pair), one gain for every position, nothing added."""
    angles, gain, added = (np.asarray(case[key], dtype=np.float64) for key in ("angles", "gain", "added"))
    p = np.arange(len(angles), dtype=np.float64)[:, None]
    linear = angles[0] + p * (angles[1] - angles[0])
    return bool(np.allclose(angles, linear, atol=1e-9, rtol=0) and np.allclose(gain, gain[0], atol=1e-12, rtol=0)
                and not np.any(added))


def _kind(case: dict) -> str:
    """The encoder of ``case`` in words, for the message."""
    kind = case["kind"]
    return {"sinusoidal added": "sinusoidal encodings added to x",
            "position²": "the angle grows like position²",
            "capped": f"the rotation stops at position {case['cap']}",
            "scaled": "the vectors are scaled by the position",
            "kicked": f"RoPE's angle table is changed at one position, {case['kick']}",
            }.get(kind, "RoPE" if kind == "rope" else f"RoPE ({kind.split(', ')[-1]})")


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
    if out.get("misuse") == "range":
        raise CheckFailed(f"your test must call encode with positions from 0 to {_POSITIONS - 1}, got positions "
                          f"from {out.get('low')} to {out.get('high')}")
    if truth(out.get("verdict"), "is_relative(encode, d)") == _relative(case):
        return
    if _relative(case):
        raise CheckFailed("your test rejects a relative encoding (RoPE): shift the positions of "
                          "the query and of the key by the *same* amount and compare the scores "
                          "with a tolerance (rounding differs by about 1e-12)")
    raise CheckFailed(f"your test accepts an encoding whose scores depend on more than m − n (in it, "
                      f"{_kind(case)}): compare the score of every pair of positions (m, n) with that of "
                      f"(m + 1, n + 1), up to position {_POSITIONS - 1}, not a sample of pairs")
