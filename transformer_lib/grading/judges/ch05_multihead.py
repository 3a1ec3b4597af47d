"""The judges of the checks for the chapter 5 exercises: the fused projection of grouped-query
attention split into heads without a copy, grouped-query attention built from a single-head
function, and what the grouping saves in work and in memory.

The judges compute their references from the inputs and run in the grader. The inputs and the
calls of the student's functions are in the kernel half,
:mod:`transformer_lib.grading.checks.ch05_multihead`. Chapter 5.
"""
from __future__ import annotations

import math
import re
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from ..checks.ch05_multihead import _MHA_BANNED
from ..protocol import CheckFailed, typename
from .common import as_array, check_finite, check_shape, close, fail, judge, pair


# ---------------------------------------------------------------- 5.1 the fused projection, split

def _heads(block: torch.Tensor, count: int) -> torch.Tensor:
    """``(…, n, count·d_k) -> (…, count, n, d_k)``, head i = columns i·d_k … (i+1)·d_k − 1 (by slicing)."""
    d_k = block.shape[-1] // count
    return torch.stack([block[..., i * d_k:(i + 1) * d_k] for i in range(count)], dim=-3)


def _split_reference(fused: torch.Tensor, h: int, n_kv: int) -> list[torch.Tensor]:
    d_k = fused.shape[-1] // (h + 2 * n_kv)
    q, k, v = fused.split([h * d_k, n_kv * d_k, n_kv * d_k], dim=-1)
    return [_heads(q, h), _heads(k, n_kv), _heads(v, n_kv)]


def _split_hints(fused: torch.Tensor, h: int, n_kv: int) -> dict[str, list[np.ndarray | None]]:
    """What the usual wrong splits return, part by part, for the messages."""
    *lead, n, width = fused.shape
    d_k = width // (h + 2 * n_kv)
    q, k, v = fused.split([h * d_k, n_kv * d_k, n_kv * d_k], dim=-1)

    def straight(block, count):  # noqa: ANN001, ANN202
        return block.reshape(*lead, count, n, d_k).numpy()

    def strided(block, count):  # noqa: ANN001, ANN202
        return block.reshape(*lead, n, d_k, count).permute(*range(len(lead)), -1, -3, -2).numpy()

    ref = [p.numpy() for p in _split_reference(fused, h, n_kv)]
    hints = {
        "reshaped straight to (…, heads, n, d_k): a reshape cuts the memory in order, and in memory each "
        "token's numbers come together, so your 'head' holds pieces of several tokens. Which axes must the "
        "reshape make, and which step then puts the heads in front?":
            [straight(q, h), straight(k, n_kv), straight(v, n_kv)],
        "head i must hold the consecutive columns i·d_k … (i+1)·d_k − 1 of its block; yours takes every "
        "h-th column: in the reshape, the axis that counts heads comes before the one within a head":
            [strided(q, h), strided(k, n_kv), strided(v, n_kv)],
        "k and v are swapped: the fused projection is X [W_Q | W_K | W_V], keys before values":
            [ref[0], ref[2], ref[1]],
    }
    return hints


@judge("split_qkv", compare=("result",),
       ok=lambda cases, outs: "split_qkv: " + ", ".join(
           f"fused {tuple(c['fused'].shape)} -> {c['n_heads']} query heads, {c['n_kv_heads']} key/value heads"
           for c in cases) + "; q, k and v are views of fused (no copy)")
def _split_qkv(case: dict, out: dict) -> None:
    fused, h, n_kv = case["fused"], case["n_heads"], case["n_kv_heads"]
    ref = _split_reference(fused, h, n_kv)
    parts = out["result"]
    if not isinstance(parts, list) or len(parts) != 3:
        raise CheckFailed(f"split_qkv must return three tensors (q, k, v), got {typename(parts)}")
    got = [as_array(p, name) for p, name in zip(parts, "qkv")]
    *lead, n, width = fused.shape
    d_k = width // (h + 2 * n_kv)
    if n_kv != h and got[1].shape == (*lead, h, n, d_k):
        raise CheckFailed(f"k has {h} heads: in grouped-query attention the fused projection holds h = {h} query "
                          f"heads but only g = {n_kv} key heads and g value heads; work out d_k from the width "
                          "with that in mind")
    for name, g_part, r in zip("qkv", got, ref):
        if g_part.shape == (*lead, n, r.shape[-3], d_k) != r.shape:
            raise CheckFailed(f"{name} has shape (…, n, heads, d_k) = {g_part.shape}: transpose so the head axis "
                              f"comes before the token axis, (…, heads, n, d_k) = {tuple(r.shape)}")
        check_shape(g_part, tuple(r.shape), name, "(…, heads, n, d_k): one (n, d_k) block per head")
    if not all(close(g_part, r.numpy(), 0.0, 0.0) for g_part, r in zip(got, ref)):
        for hint, variant in _split_hints(fused, h, n_kv).items():
            if all(close(g_part, v, 0.0, 0.0) for g_part, v in zip(got, variant)):
                fail(f"split_qkv: {hint}", ref[0].numpy(), got[0])
        name, g_part, r = next((nm, gp, r) for nm, gp, r in zip("qkv", got, ref) if not close(gp, r.numpy(), 0, 0))
        fail(f"split_qkv: {name} differs: the fused columns are [q heads | k heads | v heads], each head "
             "d_k consecutive columns", r.numpy(), g_part)
    if out.get("input_unchanged") is not True:
        raise CheckFailed("split_qkv changed the tensor it was given: read fused, do not write into it")
    if out.get("views") != [True, True, True]:
        copies = [name for name, view in zip("qkv", out.get("views") or [False] * 3) if not view]
        raise CheckFailed(f"{', '.join(copies)} {'is a copy' if len(copies) == 1 else 'are copies'} of the numbers, "
                          "not a view of fused: torch.stack, torch.cat, clone and contiguous copy memory. Slicing "
                          "the columns, reshape and transpose only change how the same memory is read")


# ---------------------------------------------------------------- 5.2 grouped-query attention

def _gqa_reference(X: torch.Tensor, W_Q, W_K, W_V, W_O, h: int, n_kv: int, scale: float | None = None,  # noqa: ANN001
                   interleaved: bool = False, out_proj: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Grouped-query attention: torch's scaled_dot_product_attention with ``enable_gqa`` for the output
    (with the default scale), the weights from the softmax of the scores; variants for the messages."""
    *lead, n, d = X.shape
    d_k = d // h
    q = (X @ W_Q).reshape(*lead, n, h, d_k).transpose(-3, -2)
    k = (X @ W_K).reshape(*lead, n, n_kv, d_k).transpose(-3, -2)
    v = (X @ W_V).reshape(*lead, n, n_kv, d_k).transpose(-3, -2)
    index = torch.arange(h) % n_kv if interleaved else torch.arange(h) // (h // n_kv)
    k_all, v_all = k.index_select(-3, index), v.index_select(-3, index)
    scale = 1 / math.sqrt(d_k) if scale is None else scale
    a = torch.softmax(q @ k_all.transpose(-2, -1) * scale, dim=-1)
    if scale == 1 / math.sqrt(d_k) and not interleaved:
        z = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    else:
        z = a @ v_all
    z = z.transpose(-3, -2).reshape(*lead, n, d)
    return (z @ W_O if out_proj else z).numpy(), a.numpy()


@judge("gqa_attention", compare=("result",), atol=1e-6, rtol=1e-6, bans=_MHA_BANNED,
       ok=lambda cases, outs: "gqa_attention = torch's scaled_dot_product_attention(enable_gqa=True) for " + ", ".join(
           f"X {tuple(c['X'].shape)}, h = {c['n_heads']}, g = {c['n_kv_heads']}" for c in cases)
       + ": output and per-head weights (atol 1e-6)")
def _gqa_attention(case: dict, out: dict) -> None:
    if out.get("torch_layer"):
        raise CheckFailed("gqa_attention uses torch's multi_head_attention_forward (torch.nn.MultiheadAttention): "
                          "build it from the single-head function; torch's multi-head layer is switched off here")
    X, h, n_kv, atol = case["X"], case["n_heads"], case["n_kv_heads"], 1e-6
    weights_ = [case[w] for w in ("W_Q", "W_K", "W_V", "W_O")]
    out_ref, w_ref = _gqa_reference(X, *weights_, h, n_kv)
    got, weights = pair(out["result"], "gqa_attention", ("out", "weights"))
    got, weights = as_array(got, "out"), as_array(weights, "weights")
    if weights.shape == (*w_ref.shape[:-3], n_kv, *w_ref.shape[-2:]) and n_kv != h:
        raise CheckFailed(f"weights has {n_kv} patterns, one per key/value head: every one of the h = {h} query "
                          f"heads has its own scores, so weights has shape (…, h, n, n) = {w_ref.shape}")
    check_shape(weights, w_ref.shape, "weights", "(…, h, n, n): one n×n pattern per query head")
    check_shape(got, out_ref.shape, "out", "(…, n, d): the concatenated heads times W_O")
    check_finite(got, "out", "the softmax should subtract the row maximum")
    if close(got, out_ref, atol, atol) and close(weights, w_ref, atol, atol):
        return
    d = X.shape[-1]
    variants = {
        f"query head i reads key/value head i // (h/g) = i // {h // n_kv}: the heads of one group are "
        "consecutive (heads 0 … h/g − 1 share key head 0); yours cycles through the key heads (i mod g)":
            _gqa_reference(X, *weights_, h, n_kv, interleaved=True),
        f"each head divides its scores by √d_k = √{d // h} (the width of its own queries and keys), "
        f"not by √d = √{d}": _gqa_reference(X, *weights_, h, n_kv, scale=1 / math.sqrt(d)),
        "the output is missing W_O: concatenate the heads, then multiply by W_O":
            _gqa_reference(X, *weights_, h, n_kv, out_proj=False),
    }
    for hint, (v_out, v_w) in variants.items():
        if close(got, v_out, atol, atol) and close(weights, v_w, atol, atol):
            fail(hint, out_ref, got)
    if not close(weights, w_ref, atol, atol):
        fail(f"weights differ from softmax(q_i k_jᵀ/√d_k) with query head i reading key head i // (h/g) "
             f"(atol {atol})", w_ref, weights)
    fail(f"out differs from torch's grouped-query attention with the same weights (atol {atol}): each query "
         "head averages the values of its group's value head; concatenate the heads in order, then "
         "multiply by W_O", out_ref, got)


# ---------------------------------------------------------------- 5.3 what the grouping saves

def _measured_flops(n: int, d: int, h: int, n_kv: int, **variant: bool) -> int:
    """The FLOPs torch's own counter sees in one forward pass of grouped-query attention on ``n``
    tokens, run on the meta device (nothing is computed or allocated). The variants, for the
    messages: scores for the key/value heads only, no output projection."""
    d_k = d // h
    heads = n_kv if variant.get("scores_per_kv_head") else h
    with torch.device("meta"):
        X, W_Q, W_O, concat = torch.empty(n, d), torch.empty(d, d), torch.empty(d, d), torch.empty(n, d)
        W_K, W_V = torch.empty(d, n_kv * d_k), torch.empty(d, n_kv * d_k)
        with FlopCounterMode(display=False) as counter:
            q = (X @ W_Q).reshape(n, h, d_k).transpose(0, 1)[:heads]
            k, v = ((X @ W).reshape(n, n_kv, d_k).transpose(0, 1) for W in (W_K, W_V))
            k, v = (t.repeat_interleave(heads // n_kv, dim=0) for t in (k, v))
            torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
            if not variant.get("no_out_proj"):
                concat @ W_O
    return int(counter.get_total_flops())


def _counts(reference: Callable, hints: dict[str, Callable], integer: bool = False) -> Callable[[dict, dict], None]:
    def judge_count(case: dict, out: dict) -> None:
        args, label = case["args"], case["what"]
        used = out.get("torch")
        if used:
            name = re.sub(r"[^A-Za-z0-9_.]", "", str(used))[:60]  # a name, never text the notebook chose
            name = "a layer's parameters" if name == "register_parameter" else name or "torch"
            raise CheckFailed(f"{label} calls torch ({name}): derive the number as a formula in the arguments; "
                              "building a layer (or running one) to count is switched off here")
        arr = as_array(out["value"], label)
        if arr.shape != ():
            raise CheckFailed(f"{label} must return one number, got an array of shape {arr.shape}")
        value, expected = float(arr), reference(*args)
        if integer and value != math.floor(value):
            raise CheckFailed(f"{label} must be a whole number of tokens: a cache holds whole tokens, so round "
                              "down (// or math.floor)")
        if value != expected:   # the number asked for is never shown
            hint = next((h for h, variant in hints.items() if value == variant(*args) != expected), "not right")
            raise CheckFailed(f"{label}: {hint}\n  got: {value:,.10g}")
    return judge_count


def _ok_counts(rule: str, names: str) -> Callable[[list[dict], list[dict]], str]:
    return lambda cases, outs: f"{rule} for {names} in {[tuple(c['args']) for c in cases]}"


judge("gqa_flops", compare=("value",),
      ok=_ok_counts("gqa_flops = the FLOPs torch's FlopCounterMode counts, 4nd² + 4nd·g·d_k + 4n²d",
                    "(n, d, h, g)"))(
    _counts(_measured_flops, {
        "that is multi-head attention (8nd² + 4n²d): with g key/value heads W_K and W_V have g·d_k columns, "
        "so their projections cost 2·n·d·g·d_k each": lambda n, d, h, g: _measured_flops(n, d, h, h),
        "the key/value heads are fewer, but every one of the h query heads still computes its own n×n scores "
        "and its own weighted average": lambda n, d, h, g: _measured_flops(n, d, h, g, scores_per_kv_head=True),
        "that counts multiply-adds; a multiply-add is 2 FLOPs (an (a×b)·(b×c) product costs 2abc)":
            lambda n, d, h, g: _measured_flops(n, d, h, g) // 2,
        "that leaves out the output projection W_O (2nd²)": lambda n, d, h, g: _measured_flops(n, d, h, g,
                                                                                              no_out_proj=True)}))


def _cache_bytes(n: int, layers: int, d: int, h: int, n_kv: int, size: int, window: int, n_global: int,
                 numbers: int = 2) -> int:
    """Bytes of the KV cache after ``n`` tokens: keys and values (``numbers``), g heads of width d_k,
    every token in the global layers, the last ``window`` tokens in the others."""
    return numbers * n_kv * (d // h) * size * (n_global * n + (layers - n_global) * min(n, window))


def _longest(budget: int, layers: int, d: int, h: int, n_kv: int, size: int, window: int, n_global: int,
             numbers: int = 2) -> int:
    """The largest n with cache(n) ≤ budget: every layer grows up to the window, then the global ones
    only; checked by comparing two whole numbers."""
    shape = (layers, d, h, n_kv, size, window, n_global, numbers)
    per, full = _cache_bytes(1, *shape) // layers, _cache_bytes(window, *shape)
    n = window + (budget - full) // (per * n_global) if budget >= full else budget // (per * layers)
    assert _cache_bytes(n, *shape) <= budget < _cache_bytes(n + 1, *shape)
    return n


def _context_ok(cases: list[dict], outs: list[dict]) -> str:
    """The ✓ line: the regimes the cases held (past the window or inside it)."""
    past = [c["args"][0] >= _cache_bytes(c["args"][6], *c["args"][1:]) for c in cases]
    return (f"longest_context: the KV cache of the global layers grows with every token, that of the sliding-window "
            f"layers up to the window, for {len(cases)} models: {sum(past)} with a budget past the window, "
            f"{len(past) - sum(past)} with one that runs out inside it, (budget, L, d, h, g, bytes, window, global) "
            f"in {[tuple(c['args']) for c in cases]}")


judge("longest_context", compare=("value",), ok=_context_ok)(
    _counts(_longest, {
        "the cache holds keys and values: 2 numbers per head, coordinate, layer and token":
            lambda *a: _longest(*a, numbers=1),
        "that is the cache of multi-head attention: only g key/value heads are cached, not h":
            lambda b, L, d, h, g, s, w, G: _longest(b, L, d, h, h, s, w, G),
        "the budget is in bytes: each number takes bytes_per_number of them":
            lambda b, L, d, h, g, s, w, G: _longest(b, L, d, h, g, 1, w, G),
        "a sliding-window layer keeps the last window tokens only: past the window, only the global layers' "
        "caches grow": lambda b, L, d, h, g, s, w, G: _longest(b, L, d, h, g, s, w, L),
        "a sliding-window layer still caches its last window tokens: its keys and values count too":
            lambda b, L, d, h, g, s, w, G: b // _cache_bytes(1, G, d, h, g, s, w, G),
        "when the budget runs out before the window fills, every layer's cache grows with each token":
            lambda b, L, d, h, g, s, w, G: w + (b - _cache_bytes(w, L, d, h, g, s, w, G)) // (
                _cache_bytes(1, G, d, h, g, s, w, G)),
        "round down: a context one token longer than the budget allows does not fit":
            lambda *a: _longest(*a) + 1}, integer=True))
