"""The judges of the checks for the appendix exercises on attention in O(n) (Exercises 10.3 and 10.4):
sliding-window attention in O(n·w) and causal linear attention with running sums in O(n).

The judges compute their references from the inputs, decide the growth rule and run in the grader.
The inputs and the calls of the student's functions are in the kernel half,
:mod:`transformer_lib.grading.checks.ch10_efficient`. Chapter 10.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..checks.ch10_efficient import _ATTENTION, _LEAVING, _LINEAR_BANS
from ..protocol import CheckFailed
from .common import as_array, check_finite, check_shape, close, fail, judge


def _name(value: Any) -> str:
    """A function's name the kernel recorded, as a name (never other text)."""
    return re.sub(r"[^A-Za-z0-9_.]", "", value)[:40] if isinstance(value, str) else "?"


def _shape(value: Any) -> tuple | None:
    return tuple(value) if isinstance(value, list) and all(isinstance(s, int) for s in value) else None


def _elu1(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x + 1, torch.exp(x))


def _form(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, phi: Callable[[torch.Tensor], torch.Tensor], *,
          seen: str = "j <= i", normaliser: str | None = None, dim: int = -1) -> np.ndarray:
    """The quadratic form (φ(Q)φ(K)ᵀ masked / sums) V: query i over the keys ``seen`` ("j <= i", "j < i",
    "j >= i" or "all"), each row divided by its sum over the keys ``normaliser`` sees (the same keys if
    None, no division if "none"; over the queries with ``dim=-2``)."""
    n, m = q.shape[-2], k.shape[-2]
    i, j = torch.arange(n)[:, None], torch.arange(m)[None, :]
    masks = {"j <= i": j <= i, "j < i": j < i, "j >= i": j >= i, "all": (j >= 0) & (i >= 0)}
    kernel = phi(q) @ phi(k).transpose(-2, -1)
    numerator = kernel * masks[seen]
    normaliser = seen if normaliser is None else normaliser
    if normaliser == "none":
        return (numerator @ v).numpy()
    return (numerator / (kernel * masks[normaliser]).sum(dim, keepdim=True) @ v).numpy()


def _work_verdict(case: dict, out: dict, matrix: str, fix: str, inside_hint: str,
                  loop: str = "A loop over the queries still compares each query with every key.") -> None:
    """Fail a function that leaves torch, builds an n × m tensor (``matrix`` names it), or does work
    that grows like n·m, or not at all, from the case's smaller size to its larger one (``fix``
    says what to do instead)."""
    what = case["what"]
    if out.get("left") in _LEAVING:
        raise CheckFailed(f"{what} leaves torch ({out['left']}): compute with torch operations")
    made = _shape(out.get("made"))
    if made is not None:
        raise CheckFailed(f"{what} builds a tensor of shape {made} ({_name(out.get('made_by'))}), {matrix}: {fix}")
    inside = _shape(out.get("inside"))
    built = (f" Inside a torch function you call, {_name(out.get('inside_op'))} makes a tensor of shape {inside}, an "
             f"n × m matrix{inside_hint}") if inside is not None else ""
    (n1, m1), (n2, m2) = (case["q"].shape[-2], case["k"].shape[-2]), (case["q2"].shape[-2], case["k2"].shape[-2])
    work = out.get("work")
    if not (isinstance(work, list) and len(work) == 2 and all(isinstance(w, int) and w >= 0 for w in work)):
        raise CheckFailed(f"{what}: the check could not measure the work of your function")
    linear, quadratic = (n2 + m2) / (n1 + m1), (n2 * m2) / (n1 * m1)
    growth = work[1] / max(1, work[0])
    if growth > math.sqrt(linear * quadratic):   # O(n) grows like n + m, O(n·m) like n·m
        how = built or " " + loop
        raise CheckFailed(f"{what} does O(n·m) work: with {n2 / n1:g} times more queries and keys its torch "
                          f"operations did {growth:.0f} times more work ({linear:g} times for O(n), {quadratic:g} for "
                          f"O(n·m)).{how} {fix[0].upper() + fix[1:]}.")
    if inside is not None:
        raise CheckFailed(f"{what} builds an n × m tensor, {matrix}.{built}")
    if growth < math.sqrt(linear):   # constant work grows 1-fold: the work at the smaller size is not the function's
        raise CheckFailed(f"{what}: with {n2 / n1:g} times more queries and keys its torch operations did only "
                          f"{growth:.1f} times the work, where work in O(n) grows {linear:g}-fold: "
                          "compute the same thing, the same way, for every input size")


def _growth(outs: list[dict]) -> str:
    return ", ".join(f"{o['work'][1] / max(1, o['work'][0]):.1f}" for o in outs)


def _band(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int, *, scale: float | None = None,
          causal: bool = False, zero_padding: bool = False) -> np.ndarray:
    """Softmax attention of query i over the keys |i − j| ≤ w (or a usual wrong variant)."""
    n = q.shape[-2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = ((i - j).abs() <= w) & ((j <= i) if causal else True)
    scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if zero_padding:   # the 2w + 1 window, with the positions beyond the ends as zero keys (score 0, value 0)
        missing = (2 * w + 1 - allowed.sum(-1)).to(q.dtype)
        e = torch.exp(scores - scores.amax(-1, keepdim=True).clamp_min(0))
        pad = missing * torch.exp(-scores.amax(-1).clamp_min(0))
        return ((e @ v) / (e.sum(-1) + pad)[..., None]).numpy()
    return (torch.softmax(scores, -1) @ v).numpy()


@judge("sliding_window", compare=("Z", "Z2"), atol=1e-9, rtol=1e-9, bans=_ATTENTION,
       ok=lambda cases, outs: "sliding-window attention for " + ", ".join(
           f"Q {tuple(c['q'].shape)}, w = {c['w']}" for c in cases) + " equals exact attention under the band "
           f"|i − j| ≤ w without an n × n tensor; with 4 times the tokens its work grows {_growth(outs)}-fold "
           "(4 for O(n·w), 16 for O(n²))")
def _sliding_window(case: dict, out: dict) -> None:
    what, w = case["what"], case["w"]
    _work_verdict(case, out, "the n × n score matrix that a sliding window avoids",
                  "score each query against its 2w + 1 neighbouring keys only (pad K and V with w rows at both "
                  "ends, then take windows, or work block by block)", ".")
    for size in ("", "2"):
        q, k, v = case["q" + size], case["k" + size], case["v" + size]
        expected = _band(q, k, v, w)
        got = as_array(out["Z" + size], what)
        check_shape(got, expected.shape, what, "one row per query, d_v columns: (…, n, d_v)")
        check_finite(got, what, "a masked key must get the score −inf before the softmax, and every query "
                     "sees at least itself")
        for hint, variant in {
            "the window is two-sided: query i sees the keys i − w … i + w, on both sides": lambda: _band(
                q, k, v, w, causal=True),
            "|i − j| ≤ w includes the keys at distance exactly w: the window holds 2w + 1 keys": lambda: _band(
                q, k, v, w - 1),
            "the window reaches one key too far: |i − j| ≤ w holds 2w + 1 keys": lambda: _band(q, k, v, w + 1),
            f"did you forget to divide the scores by √d_k = √{q.shape[-1]}?": lambda: _band(q, k, v, w, scale=1.0),
            "near the ends the window is shorter: the padding beyond the first and last token must get weight 0 "
            "(score −inf before the softmax), not the score 0 of a zero key": lambda: _band(
                q, k, v, w, zero_padding=True),
            "each query attends to every key: only the keys with |i − j| ≤ w count": lambda: _band(
                q, k, v, q.shape[-2]),
        }.items():
            variant = variant()
            if close(got, variant, 1e-9, 1e-9) and not close(got, expected, 1e-9, 1e-9):
                fail(f"{what}: {hint}", expected, got)
        if not close(got, expected, 1e-9, 1e-9):
            fail(f"{what} differs from softmax attention masked to |i − j| ≤ w (atol 1e-9)", expected, got)


def _causal_ok(cases: list[dict], outs: list[dict]) -> str:
    shapes = ", ".join(f"Q, K {tuple(c['q'].shape)}, V {tuple(c['v'].shape)}" for c in cases)
    return (f"causal linear attention for {shapes} equals the masked quadratic form, query i over the keys "
            f"j ≤ i (rtol 1e-7), without an n × n tensor; with 4 times the tokens its work grows "
            f"{_growth(outs)}-fold (4 for O(n), 16 for O(n²))")


@judge("causal_linear_attention", compare=("Z", "Z2"), atol=1e-9, rtol=1e-7, bans=_LINEAR_BANS, ok=_causal_ok)
def _causal_linear_attention(case: dict, out: dict) -> None:
    what, atol, rtol = case["what"], 1e-9, 1e-7
    _work_verdict(case, out, "the n × n matrix φ(Q)φ(K)ᵀ that running sums avoid",
                  "keep the sums over the keys so far, Σ_{j ≤ i} φ(k_j)v_jᵀ and Σ_{j ≤ i} φ(k_j), and extend "
                  "them by one key per position instead of building them anew",
                  ": a torch.einsum of three operands contracts two of them at a time, left to right.",
                  loop="A loop over the positions still sums every earlier key again for each query.")
    for size in ("", "2"):
        q, k, v = case["q" + size], case["k" + size], case["v" + size]
        expected = _form(q, k, v, _elu1)
        got = as_array(out["Z" + size], what)
        on = f"{what} for Q of shape {tuple(q.shape)}"
        check_shape(got, expected.shape, on, "one row per query, d_v columns: (…, n, d_v)")
        check_finite(got, on, "the normaliser φ(q_i)ᵀ Σ_{j ≤ i} φ(k_j) vanished for some query i. The sums "
                     "include key i itself (query 0 sees key 0), and φ = elu(x) + 1 is positive, unlike "
                     "relu(x) or elu(x)")
        for hint, variant in {
            "query i may see only the keys j ≤ i: the sums run over the keys up to position i, not over all "
            "of them (that is linear attention without the causal mask)": lambda: _form(q, k, v, _elu1, seen="all"),
            "query i sees the keys before it, j ≤ i, not the ones after it": lambda: _form(q, k, v, _elu1,
                                                                                           seen="j >= i"),
            "the normaliser sums over the same keys as the numerator, j ≤ i, not over all of them":
                lambda: _form(q, k, v, _elu1, normaliser="all"),
            "divide by the normaliser φ(q_i)ᵀ Σ_{j ≤ i} φ(k_j): the weights of each query must sum to 1":
                lambda: _form(q, k, v, _elu1, normaliser="none"),
            "the normaliser sums over the keys, one number per query, not over the queries":
                lambda: _form(q, k, v, _elu1, dim=-2),
            "φ must be elu(x) + 1: without the + 1 the features can be negative": lambda: _form(q, k, v, F.elu),
            "φ must be elu(x) + 1, not relu(x)": lambda: _form(q, k, v, F.relu),
            "φ must be elu(x) + 1, not exp(x) (that is causal softmax attention without the scale)":
                lambda: _form(q, k, v, torch.exp),
        }.items():
            variant = variant()
            if close(got, variant, atol, rtol) and not close(got, expected, atol, rtol):
                fail(f"{on}: {hint}", expected, got)
        if not close(got, expected, atol, rtol):
            lead = " (the leading dimensions are a batch: sum over the positions, axis -2, only)" if q.dim() > 2 else ""
            fail(f"{on} differs from the masked quadratic form (φ(Q)φ(K)ᵀ, keys j ≤ i, / row sums) V with "
                 f"φ = elu + 1 (atol {atol}, rtol {rtol}){lead}", expected, got)
