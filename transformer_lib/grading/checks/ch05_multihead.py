"""The checks' kernel half for the chapter 5 exercises: the fused projection of grouped-query attention
split into heads without a copy, grouped-query attention built from a single-head function, and what
the grouping saves in work and in memory.

What runs in the student's kernel (the inputs, visible and hidden, the calls of the student's
functions, and the facts measured there: whether the heads share the input's memory, whether torch's
multi-head layer or any torch function ran). The judges are in
:mod:`transformer_lib.grading.judges.ch05_multihead`. Chapter 5.
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
