"""The checks' kernel half for the chapter 2 exercises: the practice problem by hand, the stable
softmax, attention from scratch and the √d_k questions. The mask that moves with the tokens (2.5) is
checked in ``ch02_permutation.py``.

What runs in the student's kernel (the inputs, visible and hidden, and the calls of the student's
functions). The judges are in :mod:`transformer_lib.grading.judges.ch02_attention`. Chapter 2.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .._calls import call
from .._harness import draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_hand_qkv", "check_hand_scores", "check_hand_weights", "check_stable_softmax",
           "check_attention", "check_masked_attention", "check_score_std", "check_score_range",
           "check_variance_divided_by_dk"]

_SOFTMAXES = ("softmax", "logsumexp")  # also log_softmax, nn.Softmax, torch.special.softmax, Tensor.softmax
_ATTENTIONS = ("scaled_dot_product_attention",)


# ---------------------------------------------------------------- 2.1 by hand: the values are recorded

def _record_values(name: str, values: dict[str, Any]) -> None:
    run_check(name, None, [{"what": name}], lambda fn, case: dict(values))


def check_hand_qkv(Q: Any, K: Any, V: Any) -> None:
    """The practice problem's ``Q = X W_Q``, ``K = X W_K``, ``V = X W_V`` (3×2 each). Chapter 2."""
    _record_values("hand_qkv", {"Q": Q, "K": K, "V": V})


def check_hand_scores(S: Any, S_symmetric: Any = None) -> None:
    """The practice problem's raw scores ``S = Q Kᵀ`` (3×3), and the answer to "is S symmetric?"."""
    _record_values("hand_scores", {"S": S, "S_symmetric": S_symmetric})


def check_hand_weights(A: Any, Z: Any, A_row_sum: Any = None) -> None:
    """The practice problem's ``A = softmax(S/√d_k)`` to 3 decimals (within 0.0005), ``Z = A V`` to
    3 decimals (within 0.001) and what each row of A sums to. Chapter 2."""
    _record_values("hand_weights", {"A": A, "Z": Z, "A_row_sum": A_row_sum})


# ---------------------------------------------------------------- 2.2 the stable softmax

def check_stable_softmax(fn: Callable, x: torch.Tensor | None = None, dim: int = -1, hidden: int = 0) -> None:
    """``fn(x, dim)`` must equal ``torch.softmax(x, dim)``, also for entries of ±1000. Chapter 2."""
    if hidden:
        g = hidden_generator("stable_softmax", hidden)
        shape = (draw(g, 1, 3), draw(g, 2, 6), draw(g, 2, 6))
        cases = [dict(x=(400 * randn(g, *shape)).float(), dim=draw(g, -3, 2)),
                 dict(x=-1e4 + randn(g, draw(g, 2, 5), draw(g, 2, 5)), dim=draw(g, 0, 1))]
    else:
        cases = [dict(x=torch.tensor([[1.0, 2.0, 3.0], [1000.0, 999.0, -5.0]]) if x is None else x, dim=dim)]
    for case in cases:
        case["what"] = "stable_softmax(x, dim)"
    run_check("stable_softmax", fn, cases, lambda f, c: {"out": call(f, c["x"].clone(), dim=c["dim"],
                                                                        banned=_SOFTMAXES)}, hidden)


# ---------------------------------------------------------------- 2.3 attention from scratch

def _run_attention(fn: Callable, case: dict) -> dict:
    kwargs = {} if case.get("mask") is None else {"mask": case["mask"].clone()}
    return {"result": call(fn, case["q"].clone(), case["k"].clone(), case["v"].clone(), banned=_ATTENTIONS,
                           **kwargs)}


def _inputs(q: torch.Tensor, k: torch.Tensor) -> str:
    """The kind of a case's inputs, for the ✓ line and a hidden test's message: batched or not, n = m or not."""
    kind = ["batched" if q.dim() > 2 else "no batch dimension", "n = m" if q.shape[-2] == k.shape[-2] else "n ≠ m"]
    return ", ".join(kind + ["d_k = 1"] * (q.shape[-1] == 1))


def _attention_case(g: torch.Generator, masked: bool) -> dict:
    lead = tuple(draw(g, 1, 3) for _ in range(draw(g, 0, 2)))
    n, m, d_k, d_v = draw(g, 1, 7), draw(g, 1, 8), draw(g, 1, 9), draw(g, 1, 6)
    case = dict(q=randn(g, *lead, n, d_k, scale=1.5), k=randn(g, *lead, m, d_k, scale=1.5), v=randn(g, *lead, m, d_v))
    case["inputs"] = _inputs(case["q"], case["k"])
    if masked:
        mask = torch.rand(n, m, generator=g) > 0.5
        mask[torch.arange(n), torch.randint(0, m, (n,), generator=g)] = True  # every query sees some key
        case["mask"] = mask
    return case


def check_attention(fn: Callable, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
                    v: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(Q (…, n, d_k), K (…, m, d_k), V (…, m, d_v)) -> (Z (…, n, d_v), A (…, n, m))``. Chapter 2."""
    if hidden:
        g = hidden_generator("attention", hidden)
        cases = [_attention_case(g, masked=False) for _ in range(3)]
    else:
        cases = [dict(q=seeded(10, 2, 3, 8, scale=1.5) if q is None else q,     # batched, n ≠ m
                      k=seeded(11, 2, 5, 8, scale=1.5) if k is None else k, v=seeded(12, 2, 5, 3) if v is None else v)]
        cases[0]["inputs"] = _inputs(cases[0]["q"], cases[0]["k"])
    for case in cases:
        case["what"] = "attention(Q, K, V)"
    run_check("attention", fn, cases, _run_attention, hidden)


def check_masked_attention(fn: Callable, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
                           v: torch.Tensor | None = None, mask: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(Q, K, V, mask=mask)`` with a bool mask (True = may attend), e.g. causal. Chapter 2."""
    if hidden:
        g = hidden_generator("masked_attention", hidden)
        cases = [_attention_case(g, masked=True) for _ in range(3)]
    else:
        q = seeded(20, 2, 4, 4, scale=1.5) if q is None else q
        k = seeded(21, 2, 6, 4, scale=1.5) if k is None else k
        v = seeded(22, 2, 6, 3) if v is None else v
        n, m = q.shape[-2], k.shape[-2]   # causal with m − n cached keys before the queries
        mask = torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n) if mask is None else mask
        cases = [dict(q=q, k=k, v=v, mask=mask, inputs=_inputs(q, k))]
    for case in cases:
        case["what"] = "attention(Q, K, V, mask)"
    run_check("masked_attention", fn, cases, _run_attention, hidden)


# ---------------------------------------------------------------- 2.4 the d_k = 256 questions

def _check_numbers(name: str, fn: Callable, d_ks: list[int] | None, hidden: int) -> None:
    if hidden:
        g = hidden_generator(name, hidden)
        d_ks = [1, draw(g, 2, 63), draw(g, 64, 5000)]
    cases = [dict(d_k=d, what=f"{name}({d})", **({"inputs": "d_k = 1"} if d == 1 else {}))
             for d in ([1, 64, 256] if d_ks is None else d_ks)]
    run_check(name, fn, cases, lambda f, c: {"value": call(f, c["d_k"])}, hidden)


def check_score_std(fn: Callable, d_ks: list[int] | None = None, hidden: int = 0) -> None:
    """``fn(d_k)`` = standard deviation of the raw score qᵀk, tried for several d_k. Chapter 2."""
    _check_numbers("score_std", fn, d_ks, hidden)


def check_score_range(fn: Callable, d_ks: list[int] | None = None, hidden: int = 0) -> None:
    """``fn(d_k)`` = ``(low, high)``, mean ± 2 standard deviations of qᵀk, tried for several d_k. Chapter 2."""
    _check_numbers("score_range", fn, d_ks, hidden)


def check_variance_divided_by_dk(fn: Callable, d_ks: list[int] | None = None, hidden: int = 0) -> None:
    """``fn(d_k)`` = Var(qᵀk / d_k), tried for several d_k. Chapter 2."""
    _check_numbers("variance_divided_by_dk", fn, d_ks, hidden)
