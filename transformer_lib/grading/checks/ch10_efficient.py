"""Checks for the appendix exercises on attention in O(n) (Exercises 10.3 and 10.4):
sliding-window attention in O(n·w) and causal linear attention with running sums in O(n).

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, the
calls of the student's functions and what the kernel must measure while they run: the work their
torch operations do, counted at the dispatch level at two sizes, the first tensor with an n × m
pair of axes, and any way out of torch). Below it: the judges, which compute their references
from the inputs, decide the growth rule and run in the grader. Chapter 10.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from .._calls import call
from .._harness import draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_sliding_window", "check_causal_linear_attention"]

_ATTENTION = ("scaled_dot_product_attention", "multi_head_attention")
_LINEAR_BANS = _ATTENTION + ("softmax",)


# ------------------------------------------------------------------------ 10.3 and 10.4: work in O(n)

_LEAVING = ("numpy", "tolist", "__array__", "item", "__dlpack__")  # ways out of torch


def _pair(t: torch.Tensor, pairs: set[tuple[int, int]]) -> bool:
    return any(tuple(t.shape[i:i + 2]) in pairs for i in range(t.dim() - 1))


class _Results(TorchFunctionMode):
    """Note the first torch result the student's code gets with an (n, m) or (m, n) pair of axes,
    and the first way out of torch (``.numpy()``, ``.tolist()``, …)."""

    def __init__(self, pairs: set[tuple[int, int]], seen: dict[str, Any]) -> None:
        super().__init__()
        self.pairs, self.seen = pairs, seen

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if name in _LEAVING and self.seen["left"] is None:
            self.seen["left"] = name
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and self.seen["made"] is None and _pair(t, self.pairs):
                self.seen["made"], self.seen["made_by"] = list(t.shape), name
        return out


class _Work(TorchDispatchMode):
    """Count the work of every aten operation (what torch runs, also inside einsum, matmul and every
    composite function): its FLOPs where torch's FlopCounterMode knows them (mm, bmm, …), plus the
    entries it reads and writes (a view reads and writes nothing). Note the first operation that
    makes a tensor with an (n, m) or (m, n) pair of axes."""

    def __init__(self, pairs: set[tuple[int, int]], seen: dict[str, Any]) -> None:
        super().__init__()
        self.pairs, self.seen, self.work = pairs, seen, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        schema, packet = getattr(func, "_schema", None), getattr(func, "_overloadpacket", func)
        view = schema is not None and any(r.alias_info is not None and not r.alias_info.is_write
                                          for r in schema.returns)
        if not view:
            flops = flop_registry.get(packet)
            try:
                self.work += int(flops(*args, **kwargs, out_val=out)) if flops is not None else 0
            except Exception:  # noqa: BLE001 - an argument form the formula does not know: its entries still count
                pass
            self.work += sum(t.numel() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
            self.work += sum(t.numel() for t in outs)
        for t in outs:
            if self.seen["inside"] is None and _pair(t, self.pairs):
                self.seen["inside"], self.seen["inside_op"] = list(t.shape), getattr(packet, "__name__", "")
        return out


def _run_measured(fn: Callable, case: dict, banned: tuple[str, ...], *extra: Any) -> dict:
    """The student's function at the case's two sizes (``extra`` arguments the same at both), with
    the work done at each."""
    seen: dict[str, Any] = dict(left=None, made=None, made_by=None, inside=None, inside_op=None)
    out: dict[str, Any] = {}
    work = []
    for size in ("", "2"):
        q, k, v = (case[key + size].clone() for key in ("q", "k", "v"))
        n, m = q.shape[-2], k.shape[-2]
        counter = _Work({(n, m), (m, n)}, seen)
        # einsum contracts its operands in the order written wherever the check runs (the optional
        # package opt_einsum, where installed, would choose the order)
        with counter, _Results({(n, m), (m, n)}, seen), torch.backends.opt_einsum.flags(enabled=False):
            out["Z" + size] = call(fn, q, k, v, *extra, banned=banned)
        work.append(counter.work)
    return dict(out, work=work, **seen)


def _sized_case(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Generator | None, what: str,
                scale: float = 1.0) -> dict:
    """A case: Q, K, V and, for the growth of the work, Q, K, V with 4 times the queries and keys."""
    lead, (n, d_k), (m, d_v) = q.shape[:-2], q.shape[-2:], v.shape[-2:]
    big = [(4 * n, d_k), (4 * m, d_k), (4 * m, d_v)]
    if g is None:
        q2, k2, v2 = (seeded(63 + i, *lead, s, d, scale=1.5 if i < 2 else 1.0) for i, (s, d) in enumerate(big))
    else:
        q2, k2, v2 = (randn(g, *lead, s, d, scale=scale) for s, d in big)
    return dict(q=q, k=k, v=v, q2=q2, k2=k2, v2=v2, what=what)


_PRIMES = (23, 29, 31, 37, 41, 43, 47, 53, 59, 61)  # n and m: no product of the other axes equals them
_CAUSAL_WHAT = "causal_linear_attention(Q, K, V)"


def check_sliding_window(fn: Callable, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
                         v: torch.Tensor | None = None, w: int = 3, hidden: int = 0) -> None:
    """``fn(Q (…, n, d_k), K (…, n, d_k), V (…, n, d_v), w) -> (…, n, d_v)``: softmax attention in
    which query i sees only the keys with |i − j| ≤ w, without an n × n tensor and with work
    (counted at the dispatch level) that grows like n·w, not n². Chapter 10."""
    if hidden:
        g = hidden_generator("sliding_window", hidden)
        cases = []
        for dims, w_, scale, kind in [(0, draw(g, 1, 5), 1.0, "unbatched, another window"),
                                      (1, 1, 2.0, "one leading dimension, w = 1, larger queries and keys"),
                                      (2, draw(g, 2, 5), 1.0, "two leading dimensions")]:
            lead = [draw(g, 1, 3) for _ in range(dims)]
            n, d_k, d_v = _PRIMES[draw(g, 0, len(_PRIMES) - 1)], draw(g, 2, 8), draw(g, 1, 8)
            case = _sized_case(randn(g, *lead, n, d_k, scale=scale), randn(g, *lead, n, d_k, scale=scale),
                               randn(g, *lead, n, d_v), g, f"sliding_window(Q, K, V, w={w_})", scale)
            cases.append(dict(case, w=w_, inputs=kind))
    else:
        cases = [dict(_sized_case(seeded(66, 37, 4, scale=1.5) if q is None else q,
                                  seeded(67, 37, 4, scale=1.5) if k is None else k,
                                  seeded(68, 37, 3) if v is None else v, None, f"sliding_window(Q, K, V, w={w})"),
                      w=w)]
    run_check("sliding_window", fn, cases, lambda f, c: _run_measured(f, c, _ATTENTION, c["w"]), hidden)


def check_causal_linear_attention(fn: Callable, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
                                  v: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(Q (…, n, d_k), K (…, n, d_k), V (…, n, d_v)) -> (…, n, d_v)``: linear attention with
    φ = elu + 1 in which query i sees the keys j ≤ i, equal to the masked quadratic form without an
    n × n tensor, and with work (counted at the dispatch level) that grows like n, not n². Chapter 10."""
    if hidden:
        g = hidden_generator("causal_linear_attention", hidden)
        cases = []
        for dims, d_k, scale, kind in [(0, 1, 1.0, "one key dimension, d_k = 1"),
                                       (1, draw(g, 2, 8), 1.0, "one leading dimension"),
                                       (2, draw(g, 2, 8), 3.0, "two leading dimensions, large queries and keys")]:
            lead = [draw(g, 2, 3) for _ in range(dims)]
            n, d_v = _PRIMES[draw(g, 0, len(_PRIMES) - 1)], draw(g, 1, 8)
            case = _sized_case(randn(g, *lead, n, d_k, scale=scale), randn(g, *lead, n, d_k, scale=scale),
                               randn(g, *lead, n, d_v), g, _CAUSAL_WHAT, scale)
            cases.append(dict(case, inputs=kind))
    elif q is not None:
        cases = [_sized_case(q, k, v, None, _CAUSAL_WHAT)]
    else:
        cases = [_sized_case(seeded(60, 53, 4, scale=1.5), seeded(61, 53, 4, scale=1.5), seeded(62, 53, 3), None,
                             _CAUSAL_WHAT),
                 _sized_case(seeded(69, 2, 3, 29, 5, scale=1.5), seeded(70, 2, 3, 29, 5, scale=1.5),
                             seeded(71, 2, 3, 29, 2), None, _CAUSAL_WHAT)]
    run_check("causal_linear_attention", fn, cases, lambda f, c: _run_measured(f, c, _LINEAR_BANS), hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import math  # noqa: E402
import re  # noqa: E402

import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .._harness import CheckFailed  # noqa: E402
from .._judging import as_array, check_finite, check_shape, close, fail, judge  # noqa: E402



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
