"""The judges of the checks for the chapter 6 exercises: ALiBi's slopes for any number of heads
(BLOOM's rule for a head count that is not a power of two), the permutation that turns a checkpoint
written for interleaved RoPE into one for rotate-half RoPE, and a test written by the student that
tells relative position encodings from absolute ones.

The judges compute their references in float64 and run in the grader; the judge of the test reads
from the tables whether the encoder is relative. The inputs and the calls of the student's functions
are in the kernel half, :mod:`transformer_lib.grading.checks.ch06_positional`. Chapter 6.
"""
from __future__ import annotations

import numpy as np
import torch

from ..checks.ch06_positional import _POSITIONS
from ..protocol import CheckFailed
from .common import as_array, check_shape, close, fail, judge, truth


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
