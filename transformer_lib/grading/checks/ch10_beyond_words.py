"""Checks for the appendix exercises 10.1 and 10.2: cross-sectional attention from given
projections, and the [CLS] token with positions. Attention in O(n) (10.3 and 10.4) is checked
in ``ch10_efficient.py``.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, and
the calls of the student's functions). Below it: the judges, which compute their references
from the inputs and run in the grader. Chapter 10.
"""
from __future__ import annotations

from typing import Callable

import torch

from .._calls import call
from .._harness import draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_cross_section_attention", "check_vit_tokens"]

_ATTENTION = ("scaled_dot_product_attention", "multi_head_attention")


# ------------------------------------------------------------------------ 10.1 cross-sectional attention

def check_cross_section_attention(fn: Callable, X_t: torch.Tensor | None = None, X_r: torch.Tensor | None = None,
                                  W_Q: torch.Tensor | None = None, W_K: torch.Tensor | None = None,
                                  W_V: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(X_t (n_t, d), X_r (n_r, d), W_Q (d, d_k), W_K (d, d_k), W_V (d, d_v)) -> (Z (n_t, d_v),
    A (n_t, n_r))``: the targets X_t attend to the reference firms X_r. Chapter 10."""
    if hidden:
        g = hidden_generator("cross_section_attention", hidden)
        cases = []
        for n_t, n_r, scale in [(draw(g, 5, 9), draw(g, 2, 4), 1.0),      # more targets than reference firms
                                (draw(g, 3, 6), draw(g, 7, 12), 20.0),    # large features: a stable softmax
                                (draw(g, 1, 3), draw(g, 1, 3), 1.0)]:     # a single target or firm
            d, d_k, d_v = draw(g, 2, 7), draw(g, 1, 6), draw(g, 1, 5)
            cases.append(dict(X_t=randn(g, n_t, d, scale=scale), X_r=randn(g, n_r, d, scale=scale),
                              W_Q=randn(g, d, d_k), W_K=randn(g, d, d_k), W_V=randn(g, d, d_v)))
    else:
        cases = [dict(X_t=seeded(30, 4, 5) if X_t is None else X_t, X_r=seeded(31, 6, 5) if X_r is None else X_r,
                      W_Q=seeded(32, 5, 3) if W_Q is None else W_Q, W_K=seeded(33, 5, 3) if W_K is None else W_K,
                      W_V=seeded(34, 5, 2) if W_V is None else W_V)]
    for case in cases:
        case["what"] = "cross_section_attention(X_t, X_r, W_Q, W_K, W_V)"
    run_check("cross_section_attention", fn, cases, lambda f, c: {"result": call(
        f, *(c[key].clone() for key in ("X_t", "X_r", "W_Q", "W_K", "W_V")), banned=_ATTENTION)}, hidden)


# ------------------------------------------------------------------------ 10.2 [CLS] and positions

def check_vit_tokens(fn: Callable, patches: torch.Tensor | None = None, W_E: torch.Tensor | None = None,
                     cls: torch.Tensor | None = None, pos: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(patches (b, L, P), W_E (P, d), cls (d,), pos (1 + L, d)) -> (b, 1 + L, d)``:
    [CLS] at position 0, then the embedded patches, plus the position of every token. Chapter 10."""
    if hidden:
        g = hidden_generator("vit_tokens", hidden)
        cases = []
        one = draw(g, 2, 5)
        for b, L, P, d in [(draw(g, 2, 3), draw(g, 9, 16), draw(g, 2, 6), draw(g, 7, 10)),
                           (1, 1, one, one)]:                           # one image of one patch; P = d
            cases.append(dict(patches=randn(g, b, L, P), W_E=randn(g, P, d), cls=randn(g, d), pos=randn(g, 1 + L, d)))
    else:
        cases = [dict(patches=seeded(50, 2, 4, 6) if patches is None else patches,
                      W_E=seeded(51, 6, 3) if W_E is None else W_E, cls=seeded(52, 3) if cls is None else cls,
                      pos=seeded(53, 5, 3) if pos is None else pos)]
    for case in cases:
        case["what"] = "vit_tokens(patches, W_E, cls, pos)"
    run_check("vit_tokens", fn, cases, lambda f, c: {"tokens": call(
        f, *(c[key].clone() for key in ("patches", "W_E", "cls", "pos")))}, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import math  # noqa: E402

import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .._judging import as_array, check_finite, check_shape, close, fail, judge, pair  # noqa: E402


@judge("cross_section_attention", compare=("result",), atol=1e-6, rtol=1e-6, bans=_ATTENTION,
       ok=lambda cases, outs: "cross-sectional attention: " + ", ".join(
           f"{c['X_t'].shape[0]} targets over {c['X_r'].shape[0]} reference firms" for c in cases)
       + " match softmax(QKᵀ/√d_k)V (torch's scaled_dot_product_attention, atol 1e-6)")
def _cross_section_attention(case: dict, out: dict) -> None:
    X_t, X_r, W_Q, W_K, W_V = (case[key] for key in ("X_t", "X_r", "W_Q", "W_K", "W_V"))
    atol = 1e-6
    d_k = W_Q.shape[1]
    q, k, v = X_t @ W_Q, X_r @ W_K, X_r @ W_V
    expected_z = F.scaled_dot_product_attention(q, k, v).numpy()

    def weights(keys: torch.Tensor, scale: float, dim: int = -1) -> np.ndarray:
        return torch.softmax(q @ keys.transpose(-2, -1) * scale, dim=dim).numpy()
    expected_a = weights(k, 1 / math.sqrt(d_k))
    z, a = pair(out["result"], "cross_section_attention", ("Z", "A"))
    z, a = as_array(z, "Z"), as_array(a, "A")
    n_t, n_r = X_t.shape[-2], X_r.shape[-2]
    if a.shape == (n_t, n_t) and n_t != n_r:
        fail("A is targets × targets: the keys and values come from the reference firms X_r "
             "(cross-attention), only the queries from the targets X_t", expected_a, a)
    if a.shape == (n_r, n_t) and n_t != n_r:
        fail("A has one row per reference firm: the queries are the targets X_t, so A is "
             "(n_targets, n_reference) with A[i, j] = weight of target i on reference firm j", expected_a, a)
    check_shape(a, expected_a.shape, "A", "one row per target, one column per reference firm")
    check_finite(a, "A", "subtract the row maximum before exponentiating (or use torch.softmax)")
    for hint, variant in {
        f"did you forget to divide the scores by √d_k = √{d_k}?": weights(k, 1.0),
        f"divide the scores by √d_k = {math.sqrt(d_k):g}, not by d_k = {d_k}": weights(k, 1 / d_k),
        "the columns of A sum to 1, not the rows: the softmax runs over the reference firms (dim=-1), "
        "each target distributes its attention over them": weights(k, 1 / math.sqrt(d_k), dim=-2),
    }.items():
        if close(a, variant, atol, atol) and not close(a, expected_a, atol, atol):
            fail(hint, expected_a, a)
    if not close(a, expected_a, atol, atol):
        fail(f"A differs from softmax((X_t W_Q)(X_r W_K)ᵀ/√d_k) (atol {atol})", expected_a, a)
    if z.shape == (n_t, X_r.shape[-1]) and close(z, expected_a @ X_r.numpy(), atol, atol) \
            and not close(z, expected_z, atol, atol):
        fail("Z averages the raw reference features X_r: the values are X_r W_V", expected_z, z)
    check_shape(z, expected_z.shape, "Z", "one row per target, d_v columns")
    if not close(z, expected_z, atol, atol):
        fail(f"Z differs from A (X_r W_V) (atol {atol})", expected_z, z)


@judge("vit_tokens", compare=("tokens",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "ViT tokens: [CLS] at position 0, embedded patches, positions added: " + ", ".join(
           str((c["patches"].shape[0], 1 + c["patches"].shape[1], c["W_E"].shape[1])) for c in cases))
def _vit_tokens(case: dict, out: dict) -> None:
    patches, W_E, cls, pos = (case[key] for key in ("patches", "W_E", "cls", "pos"))
    atol = 1e-9
    b, L = patches.shape[:2]
    embedded = patches @ W_E
    cls_row = cls.expand(b, 1, -1)
    expected = (torch.cat([cls_row, embedded], dim=1) + pos).numpy()
    got = as_array(out["tokens"], "vit_tokens")
    if got.shape == (b, L, W_E.shape[1]):
        fail("there is no [CLS] token: put cls in front of the patches, (b, 1 + L, d)", expected.shape, got.shape)
    check_shape(got, expected.shape, "vit_tokens", "(b, 1 + L, d): [CLS] then the L patches")
    variants = {
        "[CLS] is at the end: it goes in front, at position 0 (token 0 is read by the classifier)":
            torch.cat([embedded, cls_row], dim=1) + pos,
        "[CLS] is at the end and the positions follow it: [CLS] goes in front, at position 0":
            torch.cat([embedded + pos[:L], cls_row + pos[L]], dim=1),
        "the positions were added before [CLS] was put in front, so patch i got position i instead of "
        "i + 1 and [CLS] none: concatenate first, then add pos (1 + L rows)":
            torch.cat([cls_row, embedded + pos[:L]], dim=1),
        "[CLS] got no position: pos has 1 + L rows, row 0 is [CLS]'s":
            torch.cat([cls_row, embedded + pos[1:]], dim=1),
        "the patches were not embedded: multiply them by W_E": None if patches.shape[-1] != W_E.shape[1]
        else torch.cat([cls_row, patches], dim=1) + pos,
    }
    for hint, variant in variants.items():
        if variant is not None and close(got, variant.numpy(), atol, atol) and not close(got, expected, atol, atol):
            fail(hint, expected, got)
    if not close(got, expected, atol, atol):
        fail(f"the tokens differ from [cls; patches @ W_E] + pos (atol {atol})", expected, got)
