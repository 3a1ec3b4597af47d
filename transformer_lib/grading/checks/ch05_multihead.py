"""Checks for the chapter 5 exercises: splitting and merging heads, multi-head attention from a
single-head function, and the parameter counts of multi-head and grouped-query attention.

Each check computes its reference inside the function; no helper here computes an answer.
Chapter 5.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .._checktools import (CheckFailed, _ATTENTIONS, as_array, call, check_finite, check_shape, close,
                           fail, ok, record, seeded, unpack_pair)

__all__ = ["check_split_heads", "check_merge_heads", "check_multi_head_attention",
           "check_params_per_head", "check_mha_params", "check_gqa_params"]

_MHA_BANNED = _ATTENTIONS + ("multi_head_attention",)  # F.scaled_dot_product_attention, nn.MultiheadAttention


# ------------------------------------------------------------------------ 5.1 split / merge heads
def _split_hints(x: torch.Tensor, h: int) -> dict[str, np.ndarray]:
    """What the usual wrong splits return, for the messages. Chapter 5."""
    *lead, n, d = x.shape
    d_k = d // h
    return {
        "reshaped straight to (…, h, n, d_k) without the transpose: that cuts the memory of x in order, "
        "so a 'head' holds pieces of several tokens. Reshape to (…, n, h, d_k) first, then swap the "
        "n and h axes (transpose(-3, -2))": x.reshape(*lead, h, n, d_k).numpy(),
        "head i must hold the consecutive columns i·d_k … (i+1)·d_k − 1 of every token; yours takes every "
        "h-th column (reshape to (…, n, h, d_k), not (…, n, d_k, h))":
            x.reshape(*lead, n, d_k, h).permute(*range(len(lead)), -1, -3, -2).numpy(),
    }


def check_split_heads(fn: Callable, x: torch.Tensor | None = None, n_heads: int = 3) -> None:
    """``fn(x (…, n, d), n_heads) -> (…, h, n, d/h)``, head i = columns i·d_k … (i+1)·d_k − 1. Chapter 5."""
    x = seeded(50, 5, 12) if x is None else x
    *lead, n, d = x.shape
    d_k = d // n_heads
    expected = torch.stack([x[..., i * d_k:(i + 1) * d_k] for i in range(n_heads)], dim=-3).numpy()
    got = as_array(call(fn, x.clone(), n_heads, what="split_heads(x, n_heads)"), "split_heads(x)")
    record("split_heads", {"out": got}, atol=0.0, rtol=0.0)
    if got.shape == (*lead, n, n_heads, d_k) != expected.shape:
        raise CheckFailed(f"split_heads(x) has shape (…, n, h, d_k) = {got.shape}: transpose so the head "
                          f"axis comes before the token axis, (…, h, n, d_k) = {expected.shape}")
    check_shape(got, expected.shape, "split_heads(x)", "(…, h, n, d_k): one (n, d_k) block per head")
    if not close(got, expected, 0.0, 0.0):
        for hint, variant in _split_hints(x, n_heads).items():
            if close(got, variant, 0.0, 0.0):
                fail(f"split_heads: {hint}", expected, got)
        fail("split_heads: head i must be x[..., i·d_k:(i+1)·d_k] exactly", expected, got)
    ok(f"split_heads: x {tuple(x.shape)} -> {expected.shape}, head i = columns i·d_k … of every token "
       f"(h = {n_heads})")


def check_merge_heads(fn: Callable, x: torch.Tensor | None = None) -> None:
    """``fn(x (…, h, n, d_k)) -> (…, n, h·d_k)``, the inverse of ``split_heads``. Chapter 5."""
    x = seeded(51, 3, 5, 4) if x is None else x
    *lead, h, n, d_k = x.shape
    expected = torch.cat([x[..., i, :, :] for i in range(h)], dim=-1).numpy()
    got = as_array(call(fn, x.clone(), what="merge_heads(x)"), "merge_heads(x)")
    record("merge_heads", {"out": got}, atol=0.0, rtol=0.0)
    check_shape(got, expected.shape, "merge_heads(x)", "(…, n, h·d_k): one row per token")
    if not close(got, expected, 0.0, 0.0):
        hints = {
            "merged in the wrong order: reshaping (…, h, n, d_k) straight to (…, n, h·d_k) strings the "
            "heads' rows together instead of putting each token's heads side by side. Transpose back to "
            "(…, n, h, d_k) first, then reshape": x.reshape(*lead, n, h * d_k).numpy(),
            "merged in the wrong order: the columns of head i must be consecutive (i·d_k … (i+1)·d_k − 1), "
            "not interleaved with the other heads'":
                x.permute(*range(len(lead)), -2, -1, -3).reshape(*lead, n, h * d_k).numpy(),
        }
        for hint, variant in hints.items():
            if close(got, variant, 0.0, 0.0):
                fail(f"merge_heads: {hint}", expected, got)
        fail("merge_heads: token t's row must be [head 0's row t | head 1's row t | …]", expected, got)
    ok(f"merge_heads: x {tuple(x.shape)} -> {expected.shape}, each token's heads side by side in order")


# --------------------------------------------------------------- 5.2 multi-head attention
@contextlib.contextmanager
def _noted(owner: object, name: str, used: list[str], what: str) -> Iterator[None]:
    """Note every call of ``owner.name`` while the block runs (a Python-level switch that torch's
    ``DisableTorchFunction`` does not bypass). Chapter 5."""
    original = getattr(owner, name)

    def noted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        used.append(what)
        return original(*args, **kwargs)

    setattr(owner, name, noted)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _reference_mha(X: torch.Tensor, W_Q, W_K, W_V, W_O, h: int) -> tuple[np.ndarray, np.ndarray]:
    """torch.nn.MultiheadAttention with the book's matrices copied in (transposed). Chapter 5."""
    d = X.shape[-1]
    ref = nn.MultiheadAttention(d, h, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([W_Q.T, W_K.T, W_V.T]))
        ref.out_proj.weight.copy_(W_O.T)
        out, weights = ref(X, X, X, need_weights=True, average_attn_weights=False)
    return out.numpy(), weights.numpy()


def _mha_variants(X, W_Q, W_K, W_V, W_O, h: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Outputs of the usual wrong multi-head attentions, for the messages. Chapter 5."""
    *lead, n, d = X.shape
    d_k = d // h

    def heads(scale: float, split_ok: bool = True):
        def split(M):
            return (M.reshape(*lead, n, h, d_k).transpose(-3, -2) if split_ok
                    else M.reshape(*lead, h, n, d_k))
        q, k, v = split(X @ W_Q), split(X @ W_K), split(X @ W_V)
        a = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
        z = (a @ v).transpose(-3, -2).reshape(*lead, n, d)
        return z, a

    z_d, a_d = heads(1 / math.sqrt(d))
    z_1, a_1 = heads(1 / math.sqrt(d_k))
    z_s, a_s = heads(1 / math.sqrt(d_k), split_ok=False)
    return {
        f"each head divides its scores by √d_k = √{d_k} (the width of its own queries and keys), "
        f"not by √d = √{d}": ((z_d @ W_O).numpy(), a_d.numpy()),
        "the output is missing W_O: concatenate the heads, then multiply by W_O":
            (z_1.numpy(), a_1.numpy()),
        "the heads mix tokens: head i is the columns i·d_k … (i+1)·d_k − 1 of Q, K and V for every token "
        "(reshaping (n, d) straight to (h, n, d_k) does not do that)": ((z_s @ W_O).numpy(), a_s.numpy()),
    }


def check_multi_head_attention(fn: Callable, X: torch.Tensor | None = None, n_heads: int = 2,
                               seed: int = 52) -> None:
    """``fn(X (…, n, d), W_Q, W_K, W_V, W_O (d, d), n_heads) -> (out (…, n, d), weights (…, h, n, n))``,
    compared with ``torch.nn.MultiheadAttention`` holding the same weights. Chapter 5."""
    X = seeded(seed, 5, 8) if X is None else X
    d, h = X.shape[-1], n_heads
    W_Q, W_K, W_V, W_O = (seeded(seed + i, d, d, scale=0.6) for i in range(1, 5))
    out_ref, w_ref = _reference_mha(X, W_Q, W_K, W_V, W_O, h)
    used: list[str] = []
    with _noted(F, "multi_head_attention_forward", used, "torch's multi_head_attention_forward"):
        result = call(fn, X.clone(), W_Q.clone(), W_K.clone(), W_V.clone(), W_O.clone(), h,
                      what="multi_head_attention(X, W_Q, W_K, W_V, W_O, n_heads)", banned=_MHA_BANNED)
    if used:
        raise CheckFailed(f"multi_head_attention uses {used[0]} (torch.nn.MultiheadAttention): build it from "
                          "the single-head function; torch's multi-head layer is switched off during this check")
    out, weights = unpack_pair(result, "multi_head_attention", ("out", "weights"))
    out, weights = as_array(out, "out"), as_array(weights, "weights")
    atol = 1e-6
    record("multi_head_attention", {"out": out, "weights": weights}, atol=atol, rtol=atol)
    if weights.shape == w_ref.shape[:-3] + w_ref.shape[-2:] and h > 1:
        raise CheckFailed(f"weights has shape {weights.shape}, one (n, n) matrix: return every head's "
                          f"weights, shape (…, h, n, n) = {w_ref.shape}, not their average or one head's")
    check_shape(weights, w_ref.shape, "weights", "(…, h, n, n): one n×n pattern per head")
    check_shape(out, out_ref.shape, "out", "(…, n, d): the concatenated heads times W_O")
    check_finite(out, "out", "the softmax should subtract the row maximum")
    if not (close(out, out_ref, atol, atol) and close(weights, w_ref, atol, atol)):
        for hint, (v_out, v_w) in _mha_variants(X, W_Q, W_K, W_V, W_O, h).items():
            if close(out, v_out, atol, atol) or close(weights, v_w, atol, atol):
                fail(hint, out_ref, out)
        if not close(weights, w_ref, atol, atol):
            fail(f"weights differ from torch.nn.MultiheadAttention's per-head weights (atol {atol}): head i "
                 "uses the columns i·d_k … (i+1)·d_k − 1 of X W_Q and X W_K", w_ref, weights)
        fail(f"out differs from torch.nn.MultiheadAttention with the same weights (atol {atol}): "
             "concatenate the heads in order, then multiply by W_O", out_ref, out)
    ok(f"multi_head_attention = torch.nn.MultiheadAttention for X {tuple(X.shape)}, h = {h}: output and "
       f"per-head weights (atol {atol})")


# --------------------------------------------------------------- 5.3 the parameter counts
class _NoTorch(TorchFunctionMode):
    """Note every torch function a counting answer calls (building a layer needs torch.empty). Chapter 5."""

    def __init__(self, used: list[str]) -> None:
        super().__init__()
        self.used = used

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.used.append(getattr(func, "__name__", "a torch function"))
        return func(*args, **(kwargs or {}))


def _count(fn: Callable, args: tuple[int, ...], what: str) -> float:
    """The student's count for ``args``, computed without torch; a Python number. Chapter 5."""
    label = f"{what}({', '.join(map(str, args))})"
    used: list[str] = []
    with _NoTorch(used), _noted(nn.Module, "register_parameter", used, "a layer's parameters"):
        value = call(fn, *args, what=label)
    if used:
        raise CheckFailed(f"{label} calls torch ({used[0]}): derive the count as a formula in the "
                          "arguments; building a layer and counting its parameters is switched off here")
    arr = as_array(value, label)
    if arr.shape != ():
        raise CheckFailed(f"{label} must return one number, got an array of shape {arr.shape}")
    return float(arr)


def _check_counts(fn: Callable, cases: list[tuple[int, ...]], what: str, reference: Callable,
                  hints: dict[str, Callable]) -> None:
    got = {case: _count(fn, case, what) for case in cases}
    record(what, {"counts": np.array(list(got.values()))}, atol=0.0, rtol=0.0)
    for case, value in got.items():
        expected = reference(*case)
        if value != expected:
            label = f"{what}({', '.join(map(str, case))})"
            for hint, variant in hints.items():
                if value == variant(*case) != expected:
                    fail(f"{label}: {hint}", expected, value)
            fail(f"{label} is not the number of weights (no biases)", expected, value)


def _valid(cases: list[tuple[int, ...]]) -> None:
    for case in cases:
        if case[0] % case[1] or (len(case) == 3 and case[1] % case[2]):
            raise ValueError(f"cases: expected h | d (and n_kv | h), got {case}")


def check_params_per_head(fn: Callable, cases: list[tuple[int, int]] | None = None) -> None:
    """``fn(d, h)`` = weights of one head's W_Q, W_K, W_V: 3·d·(d/h). Chapter 5."""
    cases = [(512, 8)] if cases is None else cases
    _valid(cases)
    _check_counts(fn, cases, "params_per_head", lambda d, h: 3 * d * (d // h), {
        "that is a full-width head (3·d·d); a head projects d → d_k = d/h": lambda d, h: 3 * d * d,
        "that is one of the three matrices: count W_Q, W_K and W_V of the head": lambda d, h: d * (d // h),
        "each matrix maps d inputs to d_k = d/h outputs: d·(d/h) numbers, not (d/h)²":
            lambda d, h: 3 * (d // h) ** 2,
        "that includes W_O; the question is the head's W_Q, W_K and W_V": lambda d, h: 3 * d * (d // h) + d * d})
    ok(f"params_per_head: 3·d·(d/h) weights per head for (d, h) in {cases}")


def check_mha_params(fn: Callable, cases: list[tuple[int, int]] | None = None) -> None:
    """``fn(d, h)`` = weights of multi-head attention: h·3·d·(d/h) + d² = 4d². Chapter 5."""
    cases = [(512, 8)] if cases is None else cases
    _valid(cases)
    _check_counts(fn, cases, "mha_params", lambda d, h: h * 3 * d * (d // h) + d * d, {
        "heads have width d/h: h full-width heads would be h times larger, but the layer has 4d² "
        "weights whatever h is": lambda d, h: h * 4 * d * d,
        "h full-width heads (h·3·d²) plus W_O: each head has width d_k = d/h":
            lambda d, h: h * 3 * d * d + d * d,
        "that leaves out W_O (d × d)": lambda d, h: 3 * d * d,
        "that is one head's share; all h heads together hold 3d², plus W_O": lambda d, h: 4 * d * d // h,
        "that counts the biases too (4d); the question asks for the weights only":
            lambda d, h: 4 * d * d + 4 * d})
    ok(f"mha_params: 4d² weights for every h, (d, h) in {cases}")


def check_gqa_params(fn: Callable, cases: list[tuple[int, int, int]] | None = None) -> None:
    """``fn(d, h, n_kv)`` = weights of grouped-query attention: 2d² + 2·d·n_kv·(d/h). Chapter 5."""
    cases = [(4096, 32, 8)] if cases is None else cases
    _valid(cases)
    _check_counts(fn, cases, "gqa_params", lambda d, h, g: 2 * d * d + 2 * d * g * (d // h), {
        "that is multi-head attention (4d²): with n_kv key/value heads W_K and W_V have n_kv·d_k columns":
            lambda d, h, g: 4 * d * d,
        "the key/value heads have width d_k = d/h: W_K and W_V are d × (n_kv·d/h)":
            lambda d, h, g: 2 * d * d + 2 * d * g,
        "n_kv is the number of key/value heads, not the group size h/n_kv":
            lambda d, h, g: 2 * d * d + 2 * d * (h // g) * (d // h),
        "W_Q and W_O stay d × d: only W_K and W_V shrink": lambda d, h, g: 4 * d * g * (d // h),
        "that leaves out W_O (d × d)": lambda d, h, g: d * d + 2 * d * g * (d // h)})
    ok(f"gqa_params: 2d² + 2·d·n_kv·d_k weights for (d, h, n_kv) in {cases}")
