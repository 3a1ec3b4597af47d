"""Checks for the chapter 5 exercises: splitting and merging heads, multi-head attention from a
single-head function, and the parameter counts of multi-head and grouped-query attention.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, the
calls of the student's functions, and the watch that notes torch's multi-head layer or a layer
built to count its parameters). Below it: the judges, which compute their references from the
inputs and run in the grader. Chapter 5.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .._harness import StudentError, call, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_split_heads", "check_merge_heads", "check_multi_head_attention",
           "check_params_per_head", "check_mha_params", "check_gqa_params"]

_MHA_BANNED = ("scaled_dot_product_attention", "multi_head_attention")  # also nn.MultiheadAttention


def _lead(g: torch.Generator) -> tuple[int, ...]:
    """Leading (batch) dimensions of a hidden input: none, one or two."""
    return tuple(draw(g, 1, 3) for _ in range(draw(g, 0, 2)))


# ---------------------------------------------------------------- 5.1 split / merge heads

def check_split_heads(fn: Callable, x: torch.Tensor | None = None, n_heads: int = 3, hidden: int = 0) -> None:
    """``fn(x (…, n, d), n_heads) -> (…, h, n, d/h)``, head i = columns i·d_k … (i+1)·d_k − 1. Chapter 5."""
    if hidden:
        g = hidden_generator("split_heads", hidden)
        shapes = [(draw(g, 2, 6), draw(g, 2, 5)),  # h, d_k
                  (1, draw(g, 2, 9)),  # one head: nothing to split
                  (draw(g, 2, 8), 1)]  # heads of width 1
        cases = [dict(x=randn(g, *_lead(g), draw(g, 1, 7), h * d_k), n_heads=h) for h, d_k in shapes]
    else:
        cases = [dict(x=seeded(50, 5, 12) if x is None else x, n_heads=n_heads)]
    for case in cases:
        case["what"] = "split_heads(x, n_heads)"
    run_check("split_heads", fn, cases, lambda f, c: {"out": call(f, c["x"].clone(), c["n_heads"])}, hidden)


def check_merge_heads(fn: Callable, x: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(x (…, h, n, d_k)) -> (…, n, h·d_k)``, the inverse of ``split_heads``. Chapter 5."""
    if hidden:
        g = hidden_generator("merge_heads", hidden)
        shapes = [(draw(g, 2, 6), draw(g, 2, 7), draw(g, 1, 5)),  # h, n, d_k
                  (1, draw(g, 2, 7), draw(g, 1, 5)),  # one head
                  (draw(g, 2, 6), 1, draw(g, 1, 5))]  # one token
        cases = [dict(x=randn(g, *_lead(g), h, n, d_k)) for h, n, d_k in shapes]
    else:
        cases = [dict(x=seeded(51, 3, 5, 4) if x is None else x)]
    for case in cases:
        case["what"] = "merge_heads(x)"
    run_check("merge_heads", fn, cases, lambda f, c: {"out": call(f, c["x"].clone())}, hidden)


# ---------------------------------------------------------------- 5.2 multi-head attention

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


def _run_mha(fn: Callable, case: dict) -> dict:
    """The student's (out, weights), or the fact that torch's multi-head layer did the work."""
    used: list[str] = []
    with _noted(F, "multi_head_attention_forward", used):
        try:
            result = call(fn, case["X"].clone(), case["W_Q"].clone(), case["W_K"].clone(), case["W_V"].clone(),
                          case["W_O"].clone(), case["n_heads"], banned=_MHA_BANNED)
        except StudentError as err:
            if used or "multi_head_attention" in err.detail:
                return {"torch_layer": True}
            raise
    return {"torch_layer": True} if used else {"result": result}


def _mha_case(g: torch.Generator, lead: tuple[int, ...], h: int, d_k: int) -> dict:
    d = h * d_k
    return dict(X=randn(g, *lead, draw(g, 1, 7), d), **{w: randn(g, d, d, scale=0.6)
                                                        for w in ("W_Q", "W_K", "W_V", "W_O")}, n_heads=h)


def check_multi_head_attention(fn: Callable, X: torch.Tensor | None = None, n_heads: int = 2,
                               seed: int = 52, hidden: int = 0) -> None:
    """``fn(X (…, n, d), W_Q, W_K, W_V, W_O (d, d), n_heads) -> (out (…, n, d), weights (…, h, n, n))``,
    compared with ``torch.nn.MultiheadAttention`` holding the same weights. Chapter 5."""
    if hidden:
        g = hidden_generator("multi_head_attention", hidden)
        cases = [_mha_case(g, (draw(g, 1, 3),), draw(g, 2, 4), draw(g, 2, 4)),
                 _mha_case(g, (), draw(g, 3, 5), draw(g, 1, 3)),
                 _mha_case(g, _lead(g), 1, draw(g, 1, 4))]
    else:
        X = seeded(seed, 5, 8) if X is None else X
        d = X.shape[-1]
        cases = [dict(X=X, **{w: seeded(seed + i, d, d, scale=0.6)
                              for i, w in enumerate(("W_Q", "W_K", "W_V", "W_O"), start=1)}, n_heads=n_heads)]
    for case in cases:
        case["what"] = "multi_head_attention(X, W_Q, W_K, W_V, W_O, n_heads)"
    run_check("multi_head_attention", fn, cases, _run_mha, hidden)


# ---------------------------------------------------------------- 5.3 the parameter counts

class _NoTorch(TorchFunctionMode):
    """Note every torch function a counting answer calls (building a layer needs torch.empty)."""

    def __init__(self, used: list[str]) -> None:
        super().__init__()
        self.used = used

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.used.append(getattr(func, "__name__", "torch"))
        return func(*args, **(kwargs or {}))


def _run_count(fn: Callable, case: dict) -> dict:
    """The student's count, and the first torch function (or ``register_parameter``: a layer's
    parameters) it used, if any: a count is a formula in the arguments."""
    used: list[str] = []
    with _NoTorch(used), _noted(nn.Module, "register_parameter", used):
        value = call(fn, *case["args"])
    return {"value": value, "torch": used[0] if used else None}


def _check_counts(name: str, fn: Callable, cases: list[tuple[int, ...]], hidden: int) -> None:
    for case in cases:
        if case[0] % case[1] or (len(case) == 3 and case[1] % case[2]):
            raise ValueError(f"cases: expected h | d (and n_kv | h), got {case}")
    run_check(name, fn, [dict(args=list(c), what=f"{name}({', '.join(map(str, c))})") for c in cases],
              _run_count, hidden)


def _heads(g: torch.Generator) -> list[tuple[int, int]]:
    """(d, h) pairs of hidden counting tests: any h, one head, heads of width 1, a small layer."""
    h, d_k, one, width_1, small, small_k = (draw(g, 2, 64), draw(g, 2, 128), draw(g, 2, 1024), draw(g, 2, 64),
                                            draw(g, 2, 4), draw(g, 2, 3))
    return [(h * d_k, h), (one, 1), (width_1, width_1), (small * small_k, small)]


def check_params_per_head(fn: Callable, cases: list[tuple[int, int]] | None = None, hidden: int = 0) -> None:
    """``fn(d, h)`` = weights of one head's W_Q, W_K, W_V: 3·d·(d/h). Chapter 5."""
    if hidden:
        cases = _heads(hidden_generator("params_per_head", hidden))
    _check_counts("params_per_head", fn, [(512, 8)] if cases is None else cases, hidden)


def check_mha_params(fn: Callable, cases: list[tuple[int, int]] | None = None, hidden: int = 0) -> None:
    """``fn(d, h)`` = weights of multi-head attention: h·3·d·(d/h) + d² = 4d². Chapter 5."""
    if hidden:
        cases = _heads(hidden_generator("mha_params", hidden))
    _check_counts("mha_params", fn, [(512, 8)] if cases is None else cases, hidden)


def check_gqa_params(fn: Callable, cases: list[tuple[int, int, int]] | None = None, hidden: int = 0) -> None:
    """``fn(d, h, n_kv)`` = weights of grouped-query attention: 2d² + 2·d·n_kv·(d/h). Chapter 5."""
    if hidden:
        g = hidden_generator("gqa_params", hidden)
        n_kv, group, d_k = draw(g, 2, 8), draw(g, 2, 8), draw(g, 2, 128)
        one, same, small = draw(g, 2, 32), draw(g, 2, 32), draw(g, 2, 4)
        cases = [(n_kv * group * d_k, n_kv * group, n_kv),  # groups of several heads
                 (one * draw(g, 1, 64), one, 1),  # one key/value head (multi-query attention)
                 (same * draw(g, 1, 64), same, same),  # as many key/value heads as heads (multi-head)
                 (small * 2 * draw(g, 1, 3), small * 2, 2)]
    _check_counts("gqa_params", fn, [(4096, 32, 8)] if cases is None else cases, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import math  # noqa: E402
import re  # noqa: E402

import numpy as np  # noqa: E402

from .._harness import CheckFailed  # noqa: E402
from .._judging import as_array, check_finite, check_shape, close, fail, judge, pair  # noqa: E402


# ---------------------------------------------------------------- 5.1 split / merge heads

def _split_hints(x: torch.Tensor, h: int) -> dict[str, np.ndarray]:
    """What the usual wrong splits return, for the messages."""
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


@judge("split_heads", compare=("out",),
       ok=lambda cases, outs: "split_heads: " + ", ".join(
           f"x {tuple(c['x'].shape)} -> h = {c['n_heads']} heads" for c in cases)
       + ", head i = columns i·d_k … of every token")
def _split_heads(case: dict, out: dict) -> None:
    x, h = case["x"], case["n_heads"]
    *lead, n, d = x.shape
    d_k = d // h
    expected = torch.stack([x[..., i * d_k:(i + 1) * d_k] for i in range(h)], dim=-3).numpy()
    got = as_array(out["out"], "split_heads(x)")
    if got.shape == (*lead, n, h, d_k) != expected.shape:
        raise CheckFailed(f"split_heads(x) has shape (…, n, h, d_k) = {got.shape}: transpose so the head "
                          f"axis comes before the token axis, (…, h, n, d_k) = {expected.shape}")
    check_shape(got, expected.shape, "split_heads(x)", "(…, h, n, d_k): one (n, d_k) block per head")
    if not close(got, expected, 0.0, 0.0):
        for hint, variant in _split_hints(x, h).items():
            if close(got, variant, 0.0, 0.0):
                fail(f"split_heads: {hint}", expected, got)
        fail("split_heads: head i must be x[..., i·d_k:(i+1)·d_k] exactly", expected, got)


@judge("merge_heads", compare=("out",),
       ok=lambda cases, outs: "merge_heads: " + ", ".join(f"x {tuple(c['x'].shape)}" for c in cases)
       + " -> (…, n, h·d_k), each token's heads side by side in order")
def _merge_heads(case: dict, out: dict) -> None:
    x = case["x"]
    *lead, h, n, d_k = x.shape
    expected = torch.cat([x[..., i, :, :] for i in range(h)], dim=-1).numpy()
    got = as_array(out["out"], "merge_heads(x)")
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


# ---------------------------------------------------------------- 5.2 multi-head attention

def _reference_mha(X: torch.Tensor, W_Q, W_K, W_V, W_O, h: int) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """torch.nn.MultiheadAttention with the book's matrices copied in (transposed)."""
    *lead, n, d = X.shape
    ref = nn.MultiheadAttention(d, h, bias=False, batch_first=True, dtype=torch.float64)
    batch = X.reshape(-1, n, d)  # the layer takes one batch axis: the leading axes are flattened into it
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([W_Q.T, W_K.T, W_V.T]))
        ref.out_proj.weight.copy_(W_O.T)
        out, weights = ref(batch, batch, batch, need_weights=True, average_attn_weights=False)
    return out.reshape(*lead, n, d).numpy(), weights.reshape(*lead, h, n, n).numpy()


def _mha_variants(X, W_Q, W_K, W_V, W_O, h: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:  # noqa: ANN001
    """Outputs of the usual wrong multi-head attentions, for the messages."""
    *lead, n, d = X.shape
    d_k = d // h

    def heads(scale: float, split_ok: bool = True):  # noqa: ANN202
        def split(M):  # noqa: ANN001, ANN202
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


@judge("multi_head_attention", compare=("result",), atol=1e-6, rtol=1e-6, bans=_MHA_BANNED,
       ok=lambda cases, outs: "multi_head_attention = torch.nn.MultiheadAttention for " + ", ".join(
           f"X {tuple(c['X'].shape)}, h = {c['n_heads']}" for c in cases) + ": output and per-head weights "
                                                                               "(atol 1e-6)")
def _multi_head_attention(case: dict, out: dict) -> None:
    if out.get("torch_layer"):
        raise CheckFailed("multi_head_attention uses torch's multi_head_attention_forward "
                          "(torch.nn.MultiheadAttention): build it from the single-head function; torch's "
                          "multi-head layer is switched off during this check")
    X, h, atol = case["X"], case["n_heads"], 1e-6
    W_Q, W_K, W_V, W_O = (case[w] for w in ("W_Q", "W_K", "W_V", "W_O"))
    out_ref, w_ref = _reference_mha(X, W_Q, W_K, W_V, W_O, h)
    got, weights = pair(out["result"], "multi_head_attention", ("out", "weights"))
    got, weights = as_array(got, "out"), as_array(weights, "weights")
    if weights.shape == w_ref.shape[:-3] + w_ref.shape[-2:] and h > 1:
        raise CheckFailed(f"weights has shape {weights.shape}, one (n, n) matrix: return every head's "
                          f"weights, shape (…, h, n, n) = {w_ref.shape}, not their average or one head's")
    check_shape(weights, w_ref.shape, "weights", "(…, h, n, n): one n×n pattern per head")
    check_shape(got, out_ref.shape, "out", "(…, n, d): the concatenated heads times W_O")
    check_finite(got, "out", "the softmax should subtract the row maximum")
    if not (close(got, out_ref, atol, atol) and close(weights, w_ref, atol, atol)):
        for hint, (v_out, v_w) in _mha_variants(X, W_Q, W_K, W_V, W_O, h).items():
            if close(got, v_out, atol, atol) or (close(weights, v_w, atol, atol)
                                                  and not close(weights, w_ref, atol, atol)):
                fail(hint, out_ref, got)
        if not close(weights, w_ref, atol, atol):
            fail(f"weights differ from torch.nn.MultiheadAttention's per-head weights (atol {atol}): head i "
                 "uses the columns i·d_k … (i+1)·d_k − 1 of X W_Q and X W_K", w_ref, weights)
        fail(f"out differs from torch.nn.MultiheadAttention with the same weights (atol {atol}): "
             "concatenate the heads in order, then multiply by W_O", out_ref, got)


# ---------------------------------------------------------------- 5.3 the parameter counts

def _counts(reference: Callable, hints: dict[str, Callable]) -> Callable[[dict, dict], None]:
    def judge_count(case: dict, out: dict) -> None:
        args, label = case["args"], case["what"]
        used = out.get("torch")
        if used:
            name = re.sub(r"[^A-Za-z0-9_.]", "", str(used))[:60]  # a name, never text the notebook chose
            name = "a layer's parameters" if name == "register_parameter" else name or "torch"
            raise CheckFailed(f"{label} calls torch ({name}): derive the count as a formula in the "
                              "arguments; building a layer and counting its parameters is switched off here")
        arr = as_array(out["value"], label)
        if arr.shape != ():
            raise CheckFailed(f"{label} must return one number, got an array of shape {arr.shape}")
        value, expected = float(arr), reference(*args)
        if value != expected:
            for hint, variant in hints.items():
                if value == variant(*args) != expected:
                    fail(f"{label}: {hint}", expected, value)
            fail(f"{label} is not the number of weights (no biases)", expected, value)
    return judge_count


def _ok_counts(rule: str, names: str) -> Callable[[list[dict], list[dict]], str]:
    return lambda cases, outs: f"{rule} for {names} in {[tuple(c['args']) for c in cases]}"


judge("params_per_head", compare=("value",), ok=_ok_counts("params_per_head: 3·d·(d/h) weights per head", "(d, h)"))(
    _counts(lambda d, h: 3 * d * (d // h), {
        "that is a full-width head (3·d·d); a head projects d → d_k = d/h": lambda d, h: 3 * d * d,
        "that is one of the three matrices: count W_Q, W_K and W_V of the head": lambda d, h: d * (d // h),
        "each matrix maps d inputs to d_k = d/h outputs: d·(d/h) numbers, not (d/h)²":
            lambda d, h: 3 * (d // h) ** 2,
        "that includes W_O; the question is the head's W_Q, W_K and W_V": lambda d, h: 3 * d * (d // h) + d * d}))
judge("mha_params", compare=("value",), ok=_ok_counts("mha_params: 4d² weights for every h", "(d, h)"))(
    _counts(lambda d, h: h * 3 * d * (d // h) + d * d, {
        "heads have width d/h: h full-width heads would be h times larger, but the layer has 4d² "
        "weights whatever h is": lambda d, h: h * 4 * d * d,
        "h full-width heads (h·3·d²) plus W_O: each head has width d_k = d/h":
            lambda d, h: h * 3 * d * d + d * d,
        "that leaves out W_O (d × d)": lambda d, h: 3 * d * d,
        "that is one head's share; all h heads together hold 3d², plus W_O": lambda d, h: 4 * d * d // h,
        "that counts the biases too (4d); the question asks for the weights only":
            lambda d, h: 4 * d * d + 4 * d}))
judge("gqa_params", compare=("value",),
      ok=_ok_counts("gqa_params: 2d² + 2·d·n_kv·d_k weights", "(d, h, n_kv)"))(
    _counts(lambda d, h, g: 2 * d * d + 2 * d * g * (d // h), {
        "that is multi-head attention (4d²): with n_kv key/value heads W_K and W_V have n_kv·d_k columns":
            lambda d, h, g: 4 * d * d,
        "the key/value heads have width d_k = d/h: W_K and W_V are d × (n_kv·d/h)":
            lambda d, h, g: 2 * d * d + 2 * d * g,
        "n_kv is the number of key/value heads, not the group size h/n_kv":
            lambda d, h, g: 2 * d * d + 2 * d * (h // g) * (d // h),
        "W_Q and W_O stay d × d: only W_K and W_V shrink": lambda d, h, g: 4 * d * g * (d // h),
        "that leaves out W_O (d × d)": lambda d, h, g: d * d + 2 * d * g * (d // h)}))
