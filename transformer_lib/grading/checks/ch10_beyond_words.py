"""Checks for the appendix exercises (Exercises 10): cross-sectional attention from given
projections, patchify, the [CLS] token with positions, and linear attention in O(n).

Each check computes its reference inside the function; no helper here computes an answer.
Chapter 10.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .._checktools import (CheckFailed, as_array, call, check_finite, check_shape, close, fail, ok, record,
                           seeded, unpack_pair)

__all__ = ["check_cross_section_attention", "check_patchify", "check_vit_tokens", "check_linear_attention"]

_ATTENTION = ("scaled_dot_product_attention", "multi_head_attention")
_PATCHES = ("unfold", "im2col", "conv", "pixel_unshuffle")


# ------------------------------------------------------------------------ 10.1 cross-sectional attention

def check_cross_section_attention(fn: Callable, X_t: torch.Tensor | None = None, X_r: torch.Tensor | None = None,
                                  W_Q: torch.Tensor | None = None, W_K: torch.Tensor | None = None,
                                  W_V: torch.Tensor | None = None) -> None:
    """``fn(X_t (n_t, d), X_r (n_r, d), W_Q (d, d_k), W_K (d, d_k), W_V (d, d_v)) -> (Z (n_t, d_v),
    A (n_t, n_r))``: the targets X_t attend to the reference firms X_r. Chapter 10."""
    X_t = seeded(30, 4, 5) if X_t is None else X_t
    X_r = seeded(31, 6, 5) if X_r is None else X_r
    W_Q = seeded(32, 5, 3) if W_Q is None else W_Q
    W_K = seeded(33, 5, 3) if W_K is None else W_K
    W_V = seeded(34, 5, 2) if W_V is None else W_V
    atol = 1e-6
    d_k = W_Q.shape[1]
    q, k, v = X_t @ W_Q, X_r @ W_K, X_r @ W_V
    expected_z = F.scaled_dot_product_attention(q, k, v).numpy()

    def weights(keys: torch.Tensor, scale: float, dim: int = -1) -> np.ndarray:
        return torch.softmax(q @ keys.transpose(-2, -1) * scale, dim=dim).numpy()
    expected_a = weights(k, 1 / math.sqrt(d_k))
    result = call(fn, X_t.clone(), X_r.clone(), W_Q.clone(), W_K.clone(), W_V.clone(),
                  what="cross_section_attention(X_t, X_r, W_Q, W_K, W_V)", banned=_ATTENTION)
    z, a = unpack_pair(result, "cross_section_attention", ("Z", "A"))
    z, a = as_array(z, "Z"), as_array(a, "A")
    record("cross_section_attention", {"Z": z, "A": a}, atol=atol, rtol=atol)
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
    if z.shape == (n_t, X_r.shape[-1]) and close(z, expected_a @ X_r.numpy(), atol, atol):
        fail("Z averages the raw reference features X_r: the values are X_r W_V", expected_z, z)
    check_shape(z, expected_z.shape, "Z", "one row per target, d_v columns")
    if not close(z, expected_z, atol, atol):
        fail(f"Z differs from A (X_r W_V) (atol {atol})", expected_z, z)
    ok(f"cross-sectional attention: {n_t} targets over {n_r} reference firms match softmax(QKᵀ/√d_k)V "
       f"(torch's scaled_dot_product_attention, atol {atol})")


# ------------------------------------------------------------------------ 10.2 patchify

def check_patchify(fn: Callable, images: torch.Tensor | None = None, p: int | None = None) -> None:
    """``fn(images (b, C, H, W), p) -> (b, (H/p)(W/p), C·p·p)``: row-major patches, each flattened
    channel, then pixel row, then pixel column. Chapter 10."""
    images = seeded(40, 2, 3, 8, 8) if images is None else images
    p = 4 if p is None else p
    b, c, h, w = images.shape
    rows, cols = h // p, w // p
    expected = F.unfold(images, kernel_size=p, stride=p).transpose(1, 2).numpy()   # torch's im2col order
    got = as_array(call(fn, images.clone(), p, what=f"patchify(images, p={p})", banned=_PATCHES), "patchify")
    record("patchify", {"patches": got})
    grid = images.reshape(b, c, rows, p, cols, p)
    variants = {
        "the patches are in column-major order: read them row by row, left to right, then the next "
        "row of patches (patch (a, b) is token a·(W/p) + b)":
            grid.permute(0, 4, 2, 1, 3, 5).reshape(b, rows * cols, c * p * p),
        "inside a patch the channel must come first (C, row, column), not last (row, column, C)":
            grid.permute(0, 2, 4, 3, 5, 1).reshape(b, rows * cols, c * p * p),
        "inside a patch the pixels are flattened column by column: flatten row by row (C, row, column)":
            grid.permute(0, 2, 4, 1, 5, 3).reshape(b, rows * cols, c * p * p),
        "the image was cut into rows of W numbers, not into p × p squares: reshape to "
        "(b, C, H/p, p, W/p, p) and move the two patch-grid axes in front":
            images.reshape(b, c, rows * cols, p * p).permute(0, 2, 1, 3).reshape(b, rows * cols, c * p * p),
    }
    if got.shape == (b, c * p * p, rows * cols) and got.shape != expected.shape:
        fail("the result is (b, C·p·p, L): one row per patch is wanted, (b, L, C·p·p)", expected.shape, got.shape)
    check_shape(got, expected.shape, "patchify(images)", "(b, number of patches, C·p·p)")
    for hint, variant in variants.items():
        if close(got, variant.numpy(), 0, 0) and not close(got, expected, 0, 0):
            fail(hint, expected, got)
    if not close(got, expected, 0, 0):
        fail("the patches differ from torch's F.unfold (im2col) order", expected, got)
    ok(f"patchify: {tuple(images.shape)} with p = {p} gives {tuple(expected.shape)}, "
       "in the order of F.unfold (exact)")


# ------------------------------------------------------------------------ 10.3 [CLS] and positions

def check_vit_tokens(fn: Callable, patches: torch.Tensor | None = None, W_E: torch.Tensor | None = None,
                     cls: torch.Tensor | None = None, pos: torch.Tensor | None = None) -> None:
    """``fn(patches (b, L, P), W_E (P, d), cls (d,), pos (1 + L, d)) -> (b, 1 + L, d)``:
    [CLS] at position 0, then the embedded patches, plus the position of every token. Chapter 10."""
    patches = seeded(50, 2, 4, 6) if patches is None else patches
    W_E = seeded(51, 6, 3) if W_E is None else W_E
    cls = seeded(52, 3) if cls is None else cls
    pos = seeded(53, 5, 3) if pos is None else pos
    atol = 1e-9
    b, L = patches.shape[:2]
    embedded = patches @ W_E
    cls_row = cls.expand(b, 1, -1)
    expected = (torch.cat([cls_row, embedded], dim=1) + pos).numpy()
    got = as_array(call(fn, patches.clone(), W_E.clone(), cls.clone(), pos.clone(),
                        what="vit_tokens(patches, W_E, cls, pos)"), "vit_tokens")
    record("vit_tokens", {"tokens": got}, atol=atol, rtol=atol)
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
    ok(f"ViT tokens: [CLS] at position 0, {L} embedded patches, positions added: {tuple(expected.shape)}")


# ------------------------------------------------------------------------ 10.4 linear attention

class _NoQuadratic(TorchFunctionMode):
    """Note every torch result with an (n, m) or (m, n) pair of axes, and every way out of torch."""

    def __init__(self, n: int, m: int, found: list[str]) -> None:
        super().__init__()
        self.pairs, self.found = {(n, m), (m, n)}, found
        self.elements = 0  # entries of every torch result: the work done, up to a constant

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if name in {"numpy", "tolist", "__array__", "item", "__dlpack__"}:
            self.found.append(f"leaves torch ({name}): compute with torch operations")
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            self.elements += t.numel() if isinstance(t, torch.Tensor) else 0
            if isinstance(t, torch.Tensor) and any(tuple(t.shape[i:i + 2]) in self.pairs for i in range(t.dim() - 1)):
                self.found.append(f"builds a tensor of shape {tuple(t.shape)} ({name}), the n × m matrix "
                                  "φ(Q)φ(K)ᵀ that linear attention avoids: compute φ(K)ᵀV (d_k × d_v) first")
                break
        return out


def _work_growth(fn: Callable) -> float:
    """How many times more numbers ``fn``'s torch operations produce for n = m = 128 than for 32."""
    counts = []
    for size in (32, 128):
        q, k, v = seeded(63, size, 4), seeded(64, size, 4), seeded(65, size, 3)
        mode = _NoQuadratic(size, size, [])
        with mode:
            call(fn, q, k, v, what="linear_attention(Q, K, V)", banned=_ATTENTION + ("softmax",))
        counts.append(max(1, mode.elements))
    return counts[1] / counts[0]


def check_linear_attention(fn: Callable, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
                           v: torch.Tensor | None = None) -> None:
    """``fn(Q (…, n, d_k), K (…, m, d_k), V (…, m, d_v)) -> (…, n, d_v)`` with φ = elu + 1, in O(n):
    equal to the quadratic form ``(φ(Q)φ(K)ᵀ / row sums) V`` without an n × m tensor, and with work (the
    entries its torch operations produce) that grows like n + m, not n·m. Chapter 10."""
    q = seeded(60, 48, 4, scale=1.5) if q is None else q
    k = seeded(61, 64, 4, scale=1.5) if k is None else k
    v = seeded(62, 64, 3) if v is None else v
    atol, rtol = 1e-9, 1e-7
    n, m = q.shape[-2], k.shape[-2]

    def form(phi: Callable[[torch.Tensor], torch.Tensor], normalise: bool = True, dim: int = -1) -> np.ndarray:
        kernel = phi(q) @ phi(k).transpose(-2, -1)
        return ((kernel / kernel.sum(dim, keepdim=True) if normalise else kernel) @ v).numpy()
    elu1 = lambda x: torch.where(x > 0, x + 1, torch.exp(x))  # noqa: E731
    expected = form(elu1)
    found: list[str] = []
    with _NoQuadratic(n, m, found):
        out = call(fn, q.clone(), k.clone(), v.clone(), what="linear_attention(Q, K, V)",
                   banned=_ATTENTION + ("softmax",))
    got = as_array(out, "linear_attention")
    if found:
        raise CheckFailed(f"linear_attention(Q, K, V) {found[0]}")
    growth = _work_growth(fn)
    if growth > 8:  # O(n) grows 4 times here, O(n·m) 16 times
        raise CheckFailed(f"linear_attention(Q, K, V) does O(n·m) work: with 4 times more queries and keys its "
                          f"torch operations produced {growth:.0f} times more numbers (4 times for O(n)). A loop "
                          "over the queries still compares each query with every key: compute φ(K)ᵀV (d_k × d_v) "
                          "and Σ_j φ(k_j) once, then one product per query")
    record("linear_attention", {"Z": got}, atol=atol, rtol=rtol)
    check_shape(got, expected.shape, "linear_attention(Q, K, V)", "one row per query, d_v columns: (…, n, d_v)")
    check_finite(got, "linear_attention(Q, K, V)", "the normaliser φ(q_i)ᵀ Σ_j φ(k_j) vanished for some "
                 "query: φ must be elu(x) + 1, which is always positive, not relu(x) or elu(x) without the + 1")
    for hint, variant in {
        "φ must be elu(x) + 1: without the + 1 the features can be negative": lambda: form(F.elu),
        "φ must be elu(x) + 1, not relu(x)": lambda: form(F.relu),
        "φ must be elu(x) + 1, not exp(x) (that is softmax attention without the scale)": lambda: form(torch.exp),
        "divide by the normaliser φ(q_i)ᵀ Σ_j φ(k_j): the weights of each query must sum to 1":
            lambda: form(elu1, normalise=False),
        "the normaliser sums over the keys (Σ_j φ(k_j)), one number per query, not over the queries":
            lambda: form(elu1, dim=-2),
    }.items():
        variant = variant()
        if close(got, variant, atol, rtol) and not close(got, expected, atol, rtol):
            fail(hint, expected, got)
    if not close(got, expected, atol, rtol):
        fail(f"linear attention differs from (φ(Q)φ(K)ᵀ / row sums) V with φ = elu + 1 (atol {atol})", expected, got)
    ok(f"linear attention for Q {tuple(q.shape)}, K {tuple(k.shape)}, V {tuple(v.shape)} equals the quadratic "
       f"form (rtol {rtol}) without building an n × m tensor, and its work grows {growth:.0f}-fold for 4-fold n, m")
