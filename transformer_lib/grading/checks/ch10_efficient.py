"""The checks' kernel half for the appendix exercises on attention in O(n) (Exercises 10.3 and 10.4):
sliding-window attention in O(n·w) and causal linear attention with running sums in O(n).

What runs in the student's kernel (the inputs, visible and hidden, the calls of the student's
functions and what the kernel must measure while they run: the work their torch operations do,
counted at the dispatch level at two sizes, the first tensor with an n × m pair of axes, and any way
out of torch). The judges are in :mod:`transformer_lib.grading.judges.ch10_efficient`. Chapter 10.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from .._calls import EagerDispatchMode, call
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


class _Work(EagerDispatchMode):
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
