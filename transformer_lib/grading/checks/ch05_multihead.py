"""Checks for the chapter 5 exercises: the fused projection of grouped-query attention split into
heads without a copy, grouped-query attention built from a single-head function, and what the
grouping saves in work and in memory.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, the
calls of the student's functions, and the facts measured there: whether the heads share the
input's memory, whether torch's multi-head layer or any torch function ran). Below it: the
judges, which compute their references from the inputs and run in the grader. Chapter 5.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .._calls import call
from .._harness import StudentError, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_split_qkv", "check_gqa_attention", "check_gqa_flops", "check_longest_context"]

_MHA_BANNED = ("scaled_dot_product_attention", "multi_head_attention")  # also nn.MultiheadAttention


def _lead(g: torch.Generator) -> tuple[int, ...]:
    """Leading (batch) dimensions of a hidden input: none, one or two."""
    return tuple(draw(g, 1, 3) for _ in range(draw(g, 0, 2)))


_KINDS = {"gqa": "groups of query heads", "mqa": "one key/value head", "mha": "a key/value head per query head"}


def _grouping(g: torch.Generator, kind: str) -> tuple[int, int]:
    """(h, n_kv) of a hidden case: groups of several heads, one key/value head, or one per head."""
    if kind == "mqa":
        return draw(g, 2, 6), 1
    if kind == "mha":
        h = draw(g, 1, 4)
        return h, h
    n_kv = draw(g, 2, 3)
    return n_kv * draw(g, 2, 3), n_kv


# ---------------------------------------------------------------- 5.1 the fused projection, split

def _run_split(fn: Callable, case: dict) -> dict:
    """The student's (q, k, v), and two facts measured here: whether each part shares the memory of
    the fused tensor handed in (a view, no copy), and whether that tensor is unchanged."""
    fused = case["fused"].clone()
    before, base = fused.clone(), fused.untyped_storage().data_ptr()  # the memory handed in (set_ cannot move it)
    def views(result: Any) -> dict:  # measured on the live result, inside the watch
        parts = list(result) if type(result) in (tuple, list) else []
        return {"result": result,
                "views": [type(p) is torch.Tensor and p.untyped_storage().data_ptr() == base for p in parts]}

    out = call(fn, fused, case["n_heads"], case["n_kv_heads"], after=views)
    return {**out, "input_unchanged": bool(torch.equal(fused, before))}


def check_split_qkv(fn: Callable, fused: torch.Tensor | None = None, n_heads: int = 4, n_kv_heads: int = 2,
                    hidden: int = 0) -> None:
    """``fn(fused (…, n, (h + 2g)·d_k), h, g) -> (q (…, h, n, d_k), k (…, g, n, d_k), v (…, g, n, d_k))``:
    the output of one fused projection ``X [W_Q | W_K | W_V]`` split into heads, each part a view of
    ``fused`` (no copy). Chapter 5."""
    if hidden:
        gen = hidden_generator("split_qkv", hidden)
        cases = []
        for kind, d_k in (("gqa", draw(gen, 2, 5)), ("mqa", draw(gen, 1, 4)), ("mha", 1)):
            h, n_kv = _grouping(gen, kind)
            cases.append(dict(fused=randn(gen, *_lead(gen), draw(gen, 1, 7), (h + 2 * n_kv) * d_k),
                              n_heads=h, n_kv_heads=n_kv, inputs=_KINDS[kind] + ", d_k = 1" * (d_k == 1)))
    else:
        width = (n_heads + 2 * n_kv_heads) * 3
        cases = [dict(fused=seeded(50, 2, 5, width) if fused is None else fused, n_heads=n_heads,
                      n_kv_heads=n_kv_heads)]
        if fused is None:   # and one key/value head for six query heads, no batch
            cases.append(dict(fused=seeded(51, 4, (6 + 2) * 2), n_heads=6, n_kv_heads=1))
    for case in cases:
        case["what"] = "split_qkv(fused, n_heads, n_kv_heads)"
    run_check("split_qkv", fn, cases, _run_split, hidden)


# ---------------------------------------------------------------- 5.2 grouped-query attention

@contextlib.contextmanager
def _noted(owner: object, name: str, used: list[str]) -> Iterator[None]:
    """Note every call of ``owner.name`` while the block runs (a Python-level switch that torch's
    ``DisableTorchFunction`` does not bypass)."""
    original = getattr(owner, name)

    def noted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        used.append(name)
        return original(*args, **kwargs)

    setattr(owner, name, noted)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _run_gqa(fn: Callable, case: dict) -> dict:
    """The student's (out, weights), or the fact that torch's multi-head layer did the work."""
    used: list[str] = []
    with _noted(F, "multi_head_attention_forward", used):
        try:
            result = call(fn, case["X"].clone(), case["W_Q"].clone(), case["W_K"].clone(), case["W_V"].clone(),
                          case["W_O"].clone(), case["n_heads"], case["n_kv_heads"], banned=_MHA_BANNED)
        except StudentError as err:
            if used or "multi_head_attention" in err.detail:
                return {"torch_layer": True}
            raise
    return {"torch_layer": True} if used else {"result": result}


def _gqa_case(g: torch.Generator | None, lead: tuple[int, ...], n: int, h: int, n_kv: int, d_k: int,
              seed: int = 0) -> dict:
    d = h * d_k
    widths = {"W_Q": d, "W_K": n_kv * d_k, "W_V": n_kv * d_k, "W_O": d}
    if g is None:
        return dict(X=seeded(seed, *lead, n, d), n_heads=h, n_kv_heads=n_kv,
                    **{w: seeded(seed + i, d, c, scale=0.6) for i, (w, c) in enumerate(widths.items(), start=1)})
    return dict(X=randn(g, *lead, n, d), n_heads=h, n_kv_heads=n_kv,
                **{w: randn(g, d, c, scale=0.6) for w, c in widths.items()})


def check_gqa_attention(fn: Callable, hidden: int = 0) -> None:
    """``fn(X (…, n, d), W_Q (d, d), W_K, W_V (d, g·d_k), W_O (d, d), h, g) -> (out (…, n, d),
    weights (…, h, n, n))``: grouped-query attention, query head i reading key/value head
    ``i // (h/g)``. Chapter 5."""
    if hidden:
        gen = hidden_generator("gqa_attention", hidden)
        cases = [dict(_gqa_case(gen, _lead(gen), draw(gen, 1, 7), *_grouping(gen, kind), draw(gen, 1, 4)),
                      inputs=_KINDS[kind]) for kind in ("gqa", "mqa", "mha")]
    else:
        cases = [_gqa_case(None, (), 5, 4, 2, 3, seed=52)]
    for case in cases:
        case["what"] = "gqa_attention(X, W_Q, W_K, W_V, W_O, n_heads, n_kv_heads)"
    run_check("gqa_attention", fn, cases, _run_gqa, hidden)


# ---------------------------------------------------------------- 5.3 what the grouping saves

class _NoTorch(TorchFunctionMode):
    """Note every torch function a counting answer calls (building a layer needs torch.empty)."""

    def __init__(self, used: list[str]) -> None:
        super().__init__()
        self.used = used

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.used.append(getattr(func, "__name__", "torch"))
        return func(*args, **(kwargs or {}))


def _run_count(fn: Callable, case: dict) -> dict:
    """The student's number, and the first torch function (or ``register_parameter``: a layer's
    parameters) it used, if any: the answer is a formula in the arguments."""
    used: list[str] = []
    with _NoTorch(used), _noted(nn.Module, "register_parameter", used):
        value = call(fn, *case["args"])
    return {"value": value, "torch": used[0] if used else None}


def _check_counts(name: str, fn: Callable, cases: list[tuple[int, ...]], hidden: int) -> None:
    for case in cases:
        h, n_kv = case[-2:] if name == "gqa_flops" else case[3:5]
        d = case[1] if name == "gqa_flops" else case[2]
        if d % h or h % n_kv:
            raise ValueError(f"cases: expected h | d and n_kv | h, got {case}")
    kinds = [c[-1] if isinstance(c[-1], str) else "" for c in cases]
    cases = [c[:-1] if isinstance(c[-1], str) else c for c in cases]
    run_check(name, fn, [dict(args=list(c), what=f"{name}({', '.join(map(str, c))})", inputs=kind)
                         for c, kind in zip(cases, kinds)], _run_count, hidden)


def _shapes(g: torch.Generator) -> list[tuple[int, int, int]]:
    """(d, h, n_kv) of hidden counting tests: groups, one key/value head, one per head, heads of width 1."""
    n_kv, group, d_k = draw(g, 2, 8), draw(g, 2, 8), draw(g, 2, 128)
    mqa, mha, width_1 = draw(g, 2, 32), draw(g, 2, 16), 2 * draw(g, 1, 8)
    return [(n_kv * group * d_k, n_kv * group, n_kv), (mqa * draw(g, 1, 64), mqa, 1),
            (mha * draw(g, 1, 64), mha, mha), (width_1, width_1, 2)]


def check_gqa_flops(fn: Callable, cases: list[tuple[int, int, int, int]] | None = None, hidden: int = 0) -> None:
    """``fn(n, d, h, n_kv)`` = matrix-multiply FLOPs of one grouped-query attention layer on ``n``
    tokens (a multiply-add is 2 FLOPs; no mask, no batch). Chapter 5."""
    if hidden:
        g = hidden_generator("gqa_flops", hidden)
        cases = [(n, *s) for n, s in zip((draw(g, 2, 8192), draw(g, 2, 4096), draw(g, 1, 512), 1), _shapes(g))]
    _check_counts("gqa_flops", fn, [(2048, 4096, 32, 8), (100, 512, 8, 2)] if cases is None else cases, hidden)


def check_longest_context(fn: Callable, cases: list[tuple[int, ...]] | None = None, hidden: int = 0) -> None:
    """``fn(budget_bytes, n_layers, d, h, n_kv, bytes_per_number, window, n_global)`` = the most tokens
    whose KV cache fits in ``budget_bytes``: ``n_global`` layers cache the keys and values of every
    token, the other ``n_layers − n_global`` (sliding-window layers) those of the last ``window``
    tokens at most. Chapter 5."""
    if hidden:
        g = hidden_generator("longest_context", hidden)
        (d, h, n_kv), (d1, h1, _), (d2, h2, g2) = _shapes(g)[:3]
        layers, window = 2 * draw(g, 2, 24), 2 ** draw(g, 8, 13)
        per_layer = 2 * n_kv * (d // h) * 2 * window          # bytes of one full window, 16-bit numbers
        cases = [((layers * per_layer * draw(g, 2, 64)) | 1, layers, d, h, n_kv, 2, window, layers // 2),
                 (per_layer * draw(g, layers // 4, layers - 1) - 1, layers, d, h, n_kv, 2, window, layers // 2),
                 (draw(g, 10**9, 2**36), draw(g, 2, 96), d1, h1, 1, 1, 2 ** draw(g, 6, 12), 1),
                 (draw(g, 10**8, 2**34), 12, d2, h2, g2, 4, 2 ** draw(g, 6, 12), 12)]
        kinds = ["half the layers sliding, the window filled", "a budget that runs out before the window fills",
                 "one global layer, 8-bit numbers, one key/value head", "no sliding-window layer, 32-bit numbers"]
        cases = [c + (kind,) for c, kind in zip(cases, kinds)]
    visible = [(10**8 + 7, 32, 2048, 16, 2, 4, 8192, 2, ""),           # 32-bit; the budget ends inside the window
               (24 * 2**30 + 1, 48, 4096, 32, 4, 2, 4096, 24, "")]     # every second layer slides; odd budget
    _check_counts("longest_context", fn, visible if cases is None else cases, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import math  # noqa: E402
import re  # noqa: E402

import numpy as np  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from .._harness import CheckFailed, typename  # noqa: E402
from .._judging import as_array, check_finite, check_shape, close, fail, judge, pair  # noqa: E402


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
