"""The checks' kernel half for the chapter 3 exercises: RMSNorm from scratch, LayerNorm's gain and
shift folded into the MLP that reads it, and the collapse of a stack of value-only attention layers
with value biases.

What runs in the student's kernel (the inputs, visible and hidden, and the calls of the student's
functions). The judges are in :mod:`transformer_lib.grading.judges.ch03_block`. Chapter 3.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .._calls import call
from .._harness import draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_rms_norm", "check_fold_norm", "check_value_layer", "check_collapse_stack"]

_NORMS = ("layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm")  # torch's own norms


# ---------------------------------------------------------------- 3.1 RMSNorm

def _rms_case(g: torch.Generator, lead: tuple[int, ...], eps: float) -> dict:
    d = draw(g, 2, 12)
    x = randn(g, *lead, d, scale=2.0)
    tokens = [tuple(draw(g, 0, k - 1) for k in lead) for _ in range(2)]
    x[tokens[0]] = 3.0 + 0.1 * randn(g, d)  # far from zero on average: centring it would show
    x[tokens[1]] = 0.3 * math.sqrt(eps) * randn(g, d)  # mean square ≈ 0.1 ε: where ε goes shows
    return dict(x=x, gamma=randn(g, d), eps=eps)


def check_rms_norm(fn: Callable, x: torch.Tensor | None = None, gamma: torch.Tensor | None = None,
                   eps: float = 1e-6, hidden: int = 0) -> None:
    """``fn(x (…, d), gamma (d,), eps) -> (…, d)`` must equal ``γ ⊙ x / √(mean(x²) + ε)`` over the last
    axis (``torch.nn.functional.rms_norm``); torch's norm functions are switched off while ``fn`` runs.
    The inputs hold a token far from zero and a token of tiny size. Chapter 3."""
    if hidden:
        g = hidden_generator("rms_norm", hidden)
        cases = [_rms_case(g, (draw(g, 2, 6),), 1e-3),
                 _rms_case(g, tuple(draw(g, 1, 4) for _ in range(draw(g, 2, 3))), 1e-6)]
    else:
        if x is None:
            x = 2.0 * seeded(30, 2, 5, 8)
            x[0, 1] = 3.0 + 0.1 * seeded(31, 8)  # a token far from zero on average
            x[1, 2] = 3e-4 * seeded(32, 8)  # a token of tiny size: mean square ≈ ε / 10
        d = x.shape[-1]
        cases = [dict(x=x, gamma=1.0 + 0.5 * seeded(33, d) if gamma is None else gamma, eps=eps)]
        if eps == 1e-6:   # and another ε, which the tiny token feels
            cases.append(dict(cases[0], eps=1e-3))
    for case in cases:
        case["what"] = "rms_norm(x, gamma, eps)"
    run_check("rms_norm", fn, cases, lambda f, c: {"out": call(f, c["x"].clone(), c["gamma"].clone(), c["eps"],
                                                                  banned=_NORMS)}, hidden)


# ---------------------------------------------------------------- 3.2 LayerNorm's γ and β folded into the MLP

def _fold_case(g: torch.Generator | None, d: int, d_ff: int) -> dict:
    if g is None:
        return dict(gamma=1.0 + 0.5 * seeded(40, d), beta=seeded(41, d), W1=seeded(42, d, d_ff, scale=1 / math.sqrt(d)),
                    b1=seeded(43, d_ff, scale=0.5))
    return dict(gamma=randn(g, d), beta=randn(g, d), W1=randn(g, d, d_ff, scale=1 / math.sqrt(d)),
                b1=randn(g, d_ff, scale=0.5))


def check_fold_norm(fn: Callable, hidden: int = 0) -> None:
    """``fn(gamma (d,), beta (d,), W1 (d, d_ff), b1 (d_ff,)) -> (W1' (d, d_ff), b1' (d_ff,))`` such that
    ``x̂ W1' + b1' = (γ ⊙ x̂ + β) W1 + b1`` for every standardised token x̂: the MLP after a LayerNorm
    without its own γ and β. Chapter 3."""
    if hidden:
        g = hidden_generator("fold_norm", hidden)
        square = draw(g, 2, 8)
        d = draw(g, 2, 8)
        cases = [_fold_case(g, d, 4 * d), _fold_case(g, square, square), _fold_case(g, draw(g, 2, 8), draw(g, 1, 3))]
    else:
        cases = [_fold_case(None, 6, 6)]
    for case in cases:
        case["what"] = "fold_norm(gamma, beta, W1, b1)"
    run_check("fold_norm", fn, cases, lambda f, c: {"result": call(
        f, c["gamma"].clone(), c["beta"].clone(), c["W1"].clone(), c["b1"].clone())}, hidden)


# ---------------------------------------------------------------- 3.3 the collapse of a stack, with value biases

def _stochastic(g: torch.Generator, n: int, scale: float) -> torch.Tensor:
    return torch.softmax(randn(g, n, n, scale=scale), dim=-1)


def check_value_layer(fn: Callable, hidden: int = 0) -> None:
    """``fn(A (n, n), W_V (d, d_v), b_V (d_v,), Y (n, d)) -> (n, d_v)``: one value-only attention layer
    with a value bias, ``A (Y W_V + 1 b_Vᵀ)``. Chapter 3."""
    if hidden:
        g = hidden_generator("value_layer", hidden)
        cases = []
        for square in (True, False):  # d = d_v (W_V left out would fit), then any d, d_v
            n, d = draw(g, 1, 8), draw(g, 1, 6)
            d_v = d if square else draw(g, 1, 5)
            cases.append(dict(A=_stochastic(g, n, 2.0), W_V=randn(g, d, d_v), b_V=randn(g, d_v), Y=randn(g, n, d)))
    else:
        A = torch.softmax(seeded(50, 4, 4, scale=2.0), dim=-1)
        cases = [dict(A=A, W_V=seeded(52, 3, 2), b_V=seeded(53, 2), Y=seeded(51, 4, 3))]
    for case in cases:
        case["what"] = "value_layer(A, W_V, b_V, Y)"
    run_check("value_layer", fn, cases, lambda f, c: {"out": call(
        f, c["A"].clone(), c["W_V"].clone(), c["b_V"].clone(), c["Y"].clone())}, hidden)


def _stack_case(g: torch.Generator, n: int, widths: list[int]) -> dict:
    L = len(widths) - 1
    return dict(As=[_stochastic(g, n, 2.0) for _ in range(L)],
                W_Vs=[randn(g, widths[i], widths[i + 1], scale=0.8) for i in range(L)],
                b_Vs=[randn(g, widths[i + 1]) for i in range(L)])


def check_collapse_stack(fn: Callable, hidden: int = 0) -> None:
    """``fn(As, W_Vs, b_Vs) -> (A_star, W_V_star, b_V_star)`` such that one value-only layer with a bias
    reproduces the stack of ``L = len(As)`` such layers, layer 1 first. Chapter 3."""
    if hidden:
        g = hidden_generator("collapse_stack", hidden)
        cases = [_stack_case(g, draw(g, 2, 6), [draw(g, 1, 5) for _ in range(draw(g, 4, 6))]),  # 3 to 5 layers
                 _stack_case(g, draw(g, 2, 6), [draw(g, 3, 5)] * 3),  # two square layers: orders can be confused
                 _stack_case(g, draw(g, 1, 5), [draw(g, 1, 5) for _ in range(2)])]  # one layer
    else:
        g = torch.Generator().manual_seed(60)
        cases = [_stack_case(g, 5, [4, 4, 4, 4]),   # three square layers: a wrong order shows by name
                 _stack_case(g, 4, [3, 4, 2, 3, 2])]   # four layers of changing widths
    for case in cases:
        case["what"] = f"collapse_stack(As, W_Vs, b_Vs) for {len(case['As'])} layer(s)"
    run_check("collapse_stack", fn, cases, lambda f, c: {"result": call(
        f, [A.clone() for A in c["As"]], [W.clone() for W in c["W_Vs"]], [b.clone() for b in c["b_Vs"]])}, hidden)
