"""The judges of the checks for the appendix exercises 10.1 and 10.2: cross-sectional attention from
given projections in which no firm is its own peer, and the [CLS] token with the positions of a
larger grid. Attention in O(n) (10.3 and 10.4) is checked in ``ch10_efficient.py``.

The judges compute their references from the inputs and run in the grader. The inputs and the calls
of the student's functions are in the kernel half,
:mod:`transformer_lib.grading.checks.ch10_beyond_words`. Chapter 10.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..checks.ch10_beyond_words import _ATTENTION, _CS_ARGS
from .common import as_array, check_finite, check_shape, close, fail, judge, pair


def _count(k: int, thing: str) -> str:
    return f"{k} {thing}" + "s" * (k != 1)


def _cs_ok(cases: list[dict], outs: list[dict]) -> str:
    facts = []
    for c in cases:
        own = (c["ids_t"][:, None] == c["ids_r"][None, :])
        alone = int((own.sum(-1) == c["ids_r"].shape[0]).sum())
        facts.append(f"{_count(c['X_t'].shape[0], 'target')} over {_count(c['X_r'].shape[0], 'reference firm')}, "
                     f"{int(own.sum())} of the targets among them"
                     + (f", {alone} with no other firm" if alone else ""))
    return ("cross-sectional attention: " + "; ".join(facts) + ": match softmax(QKᵀ/√d_k)V over the other "
            "firms (torch's scaled_dot_product_attention, atol 1e-6)")


@judge("cross_section_attention", compare=("result",), atol=1e-6, rtol=1e-6, bans=_ATTENTION, ok=_cs_ok)
def _cross_section_attention(case: dict, out: dict) -> None:
    X_t, X_r, W_Q, W_K, W_V, ids_t, ids_r = (case[key] for key in _CS_ARGS)
    atol = 1e-6
    d_k = W_Q.shape[1]
    q, k, v = X_t @ W_Q, X_r @ W_K, X_r @ W_V
    n_t, n_r = X_t.shape[-2], X_r.shape[-2]
    own = ids_t[:, None] == ids_r[None, :]                     # (n_t, n_r): the target's own firm
    peers = ~own.all(-1, keepdim=True)                         # (n_t, 1): a target with another firm
    expected_z = torch.where(peers, F.scaled_dot_product_attention(q, k, v, attn_mask=~own), 0.0).numpy()

    def weights(scale: float, leave_out: torch.Tensor | None = own, dim: int = -1, after: bool = False) -> np.ndarray:
        scores = q @ k.transpose(-2, -1) * scale
        if leave_out is not None and not after:
            scores = scores.masked_fill(leave_out, -math.inf)
        w = torch.softmax(scores, dim=dim).nan_to_num(0.0)
        return (w.masked_fill(leave_out, 0.0) if after else w).numpy()
    scale = 1 / math.sqrt(d_k)
    expected_a = weights(scale)
    z, a = pair(out["result"], "cross_section_attention", ("Z", "A"))
    z, a = as_array(z, "Z"), as_array(a, "A")
    if a.shape == (n_t, n_t) and n_t != n_r:
        fail("A is targets × targets: the keys and values come from the reference firms X_r "
             "(cross-attention), only the queries from the targets X_t", expected_a, a)
    if a.shape == (n_r, n_t) and n_t != n_r:
        fail("A has one row per reference firm: the queries are the targets X_t, so A is "
             "(n_targets, n_reference) with A[i, j] = weight of target i on reference firm j", expected_a, a)
    check_shape(a, expected_a.shape, "A", "one row per target, one column per reference firm")
    check_finite(a, "A", "a target whose reference firms hold no other firm has no peers: its row of A is zero "
                 "(a softmax over no scores at all is nan)")
    diagonal = torch.eye(n_t, n_r, dtype=torch.bool)
    for hint, variant in {
        "a firm is never its own peer: a target gives no weight to the reference firm with its own identifier":
            weights(scale, None),
        "the firm to leave out is the reference firm with the target's identifier, wherever it stands in X_r, "
        "not the one at the target's own position i": weights(scale, diagonal),
        "leave a target's own firm out before the softmax (score −∞), so that its weights over the other "
        "firms still sum to 1; zeroing it afterwards leaves the row short of 1": weights(scale, after=True),
        f"did you forget to divide the scores by √d_k = √{d_k}?": weights(1.0),
        f"divide the scores by √d_k = {math.sqrt(d_k):g}, not by d_k = {d_k}": weights(1 / d_k),
        "the columns of A sum to 1, not the rows: the softmax runs over the reference firms (dim=-1), "
        "each target distributes its attention over them": weights(scale, dim=-2),
    }.items():
        if close(a, variant, atol, atol) and not close(a, expected_a, atol, atol):
            fail(hint, expected_a, a)
    if not close(a, expected_a, atol, atol):
        fail(f"A differs from softmax((X_t W_Q)(X_r W_K)ᵀ/√d_k) over each target's other firms (atol {atol})",
             expected_a, a)
    if z.shape == (n_t, X_r.shape[-1]) and close(z, expected_a @ X_r.numpy(), atol, atol) \
            and not close(z, expected_z, atol, atol):
        fail("Z averages the raw reference features X_r: the values are X_r W_V", expected_z, z)
    check_shape(z, expected_z.shape, "Z", "one row per target, d_v columns")
    if not close(z, expected_z, atol, atol):
        fail(f"Z differs from A (X_r W_V) (atol {atol})", expected_z, z)


def _grid(case: dict) -> str:
    rows, (R, C) = case["patches"].shape[1] // case["cols"], case["pos"].shape[:2]
    return f"a {rows} × {case['cols']} grid on positions learned for {R} × {C}"


@judge("vit_tokens", compare=("tokens",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "ViT tokens: [CLS] first with no position, each patch plus the position of its row "
       "and column, for " + ", ".join(_grid(c) for c in cases))
def _vit_tokens(case: dict, out: dict) -> None:
    patches, W_E, cls, pos, cols, what = (case[key] for key in ("patches", "W_E", "cls", "pos", "cols", "what"))
    atol = 1e-9
    b, L = patches.shape[:2]
    rows, (R, C, d) = L // cols, pos.shape
    embedded = patches @ W_E
    cls_row = cls.expand(b, 1, -1)
    place = torch.arange(L)
    own = pos[place // cols, place % cols]                             # (L, d): row a, column b of the grid
    expected = torch.cat([cls_row, embedded + own], dim=1).numpy()
    got = as_array(out["tokens"], "vit_tokens")
    if got.shape == (b, L, d):
        fail(f"{what}: there is no [CLS] token: put cls in front of the patches, (b, 1 + L, d)",
             expected.shape, got.shape)
    check_shape(got, expected.shape, what, "(b, 1 + L, d): [CLS] then the L patches")
    variants = {
        "[CLS] is at the end: it goes in front, at position 0 (token 0 is read by the classifier)":
            torch.cat([embedded + own, cls_row], dim=1),
        "[CLS] got a position: it is not a patch and has no place in the grid, so nothing is added to it":
            torch.cat([cls_row + pos[0, 0], embedded + own], dim=1),
        "pos is a grid of R × C positions: the patch in row a, column b of these images takes pos[a, b]; the "
        "first L vectors of the flattened grid belong to the first rows of the larger grid, whatever the "
        "images' width": torch.cat([cls_row, embedded + pos.reshape(R * C, d)[:L]], dim=1),
        "the patches come in row-major order, left to right and then top to bottom: consecutive tokens are "
        "neighbours in a row, not in a column": torch.cat(
            [cls_row, embedded + pos[place % rows, place // rows]], dim=1) if rows <= R and cols <= C else None,
        "cols is the number of patches in a row: these images have L / cols rows of cols patches": torch.cat(
            [cls_row, embedded + pos[place // rows, place % rows]], dim=1) if cols <= R and rows <= C else None,
        "the patches were not embedded: multiply them by W_E": None if patches.shape[-1] != d
        else torch.cat([cls_row, patches + own], dim=1),
    }
    for hint, variant in variants.items():
        if variant is not None and close(got, variant.numpy(), atol, atol) and not close(got, expected, atol, atol):
            fail(f"{what}: {hint}", expected, got)
    if not close(got, expected, atol, atol):
        fail(f"{what}: the tokens differ from [cls; patches @ W_E + the positions of their places in the grid] "
             f"(atol {atol})", expected, got)
