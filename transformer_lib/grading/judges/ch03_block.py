"""The judges of the checks for the chapter 3 exercises: RMSNorm from scratch, LayerNorm's gain and
shift folded into the MLP that reads it, and the collapse of a stack of value-only attention layers
with value biases.

The judges compute their references from the inputs and run in the grader. The inputs and the calls
of the student's functions are in the kernel half, :mod:`transformer_lib.grading.checks.ch03_block`.
Chapter 3.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .._harness import seeded
from ..checks.ch03_block import _NORMS
from ..protocol import CheckFailed, typename
from .common import as_array, check_finite, check_shape, close, fail, judge, pair


def _first_match(got: np.ndarray, variants: dict[str, np.ndarray], atol: float) -> str | None:
    return next((hint for hint, v in variants.items() if close(got, v, atol, atol)), None)


def _nan_like(shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, np.nan)


# ---------------------------------------------------------------- 3.1 RMSNorm

@judge("rms_norm", compare=("out",), atol=1e-6, rtol=1e-6, bans=_NORMS,
       ok=lambda cases, outs: "rms_norm matches torch.nn.functional.rms_norm on inputs of shape "
                              + ", ".join(str(tuple(c["x"].shape)) for c in cases) + " with random γ, eps="
                              + ", ".join(format(c["eps"], "g") for c in cases)
                              + " (atol 1e-6), a token far from zero and a tiny one included")
def _rms_norm(case: dict, out: dict) -> None:
    x, gamma, eps, atol = case["x"].double(), case["gamma"].double(), case["eps"], 1e-6
    d = x.shape[-1]
    expected = F.rms_norm(x, (d,), gamma, eps).numpy()
    got = as_array(out["out"], "rms_norm(x, gamma, eps)")
    check_shape(got, expected.shape, "rms_norm(x)", "RMSNorm keeps the shape of its input (…, d)")
    check_finite(got, "rms_norm(x)", "add ε to the mean square inside the square root, √(mean(x²) + ε), so that a "
                 "token of zeros does not divide by zero")
    if close(got, expected, atol, atol):
        return

    def scaled(dims: tuple[int, ...] = (-1,), centre: bool = False, root: bool = True, eps_outside: bool = False,
               divisor: int | None = None) -> np.ndarray:
        y = x - x.mean(dim=dims, keepdim=True) if centre else x
        sq = (y**2).sum(dim=dims, keepdim=True) / (math.prod(x.shape[k] for k in dims) if divisor is None
                                                   else divisor)
        scale = (sq.sqrt() + eps if eps_outside else (sq + eps).sqrt()) if root else sq + eps
        return (y / scale).numpy()

    g = gamma.numpy()
    variants = {
        "RMSNorm does not subtract the mean: that is LayerNorm. It divides each token by its root mean square "
        "√(mean(x²) + ε) and keeps the token's mean direction": scaled(centre=True) * g,
        "the root mean square is √(mean(x²) + ε), over the raw values: dividing by the standard deviation "
        "(x − μ)² centres them first": (x / ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True)
                                         .add(eps).sqrt()).numpy() * g,
        "ε belongs inside the square root: x/√(mean(x²) + ε), not x/(√mean(x²) + ε) (it matters for a "
        "token of tiny size)": scaled(eps_outside=True) * g,
        "the mean square divides the sum of squares by d (a mean, over the token's features), not the sum "
        "itself": scaled(divisor=1) * g,
        "the square root is missing: divide by √(mean(x²) + ε), the root mean square": scaled(root=False) * g,
        "γ is missing: RMSNorm(x) = γ ⊙ x/√(mean(x²) + ε)": scaled(),
    }
    if x.ndim >= 2:
        variants["the statistics run over the first (batch) axis: RMSNorm takes each token's mean square over its "
                 "own features (dim=-1, keepdim=True)"] = scaled(dims=(0,)) * g
    if x.ndim >= 3:
        variants["the statistics run over the sequence axis (dim=-2): RMSNorm takes each token's mean square over "
                 "its own features (dim=-1)"] = scaled(dims=(x.ndim - 2,)) * g
    hint = _first_match(got, variants, atol)
    worst = np.unravel_index(np.argmax(np.abs(got - expected).max(axis=-1)), expected.shape[:-1])
    where = f"\n  the token that differs most, x[{', '.join(map(str, worst))}], is shown" if worst else ""
    fail((hint or f"rms_norm differs from γ ⊙ x/√(mean(x²) + ε) over the last axis (atol {atol})") + where,
         expected[worst], got[worst])


# ---------------------------------------------------------------- 3.2 LayerNorm's γ and β folded into the MLP

def _standardised(d: int, rows: int = 7) -> torch.Tensor:
    """Random standardised tokens x̂ (mean 0, mean square 1 over their d features): what a LayerNorm
    without γ and β hands the MLP."""
    x = seeded(44, rows, d, scale=2.0) + 1.0
    return F.layer_norm(x, (d,), eps=0.0)


@judge("fold_norm",
       ok=lambda cases, outs: "x̂ W1' + b1' = (γ ⊙ x̂ + β) W1 + b1 on standardised tokens, for (d, d_ff) in "
                              + ", ".join(str(tuple(c["W1"].shape)) for c in cases) + " (atol 1e-9)")
def _fold_norm(case: dict, out: dict) -> None:
    gamma, beta, W1, b1 = (case[k].double() for k in ("gamma", "beta", "W1", "b1"))
    atol = 1e-9
    d, d_ff = W1.shape
    w_new, b_new = pair(out["result"], case["what"], ("W1_folded", "b1_folded"))
    w_new, b_new = as_array(w_new, "W1_folded"), as_array(b_new, "b1_folded")
    check_shape(w_new, (d, d_ff), "W1_folded", "it replaces W1, so it has W1's shape (d, d_ff)")
    if b_new.shape == (1, d_ff):
        b_new = b_new[0]
    check_shape(b_new, (d_ff,), "b1_folded", "it replaces b1: one bias per hidden unit, (d_ff,)")
    x_hat = _standardised(d)
    expected = ((gamma * x_hat + beta) @ W1 + b1).numpy()  # the MLP's pre-activations after the full LayerNorm
    got = x_hat.numpy() @ w_new + b_new
    if close(got, expected, atol, atol):
        return
    g, b, W, c = gamma.numpy(), beta.numpy(), W1.numpy(), b1.numpy()
    if not close(w_new, g[:, None] * W, atol, atol):
        hint = _first_match(w_new, {
            "γ scales the columns of W1 here: with tokens as rows, x̂ W1 reads feature k through row k of W1, so "
            "γ_k scales row k: diag(γ) W1, that is gamma[:, None] * W1": W * g[None, :] if d == d_ff else
            _nan_like(W.shape),
            "W1 is unchanged: the gain γ must go into W1, as diag(γ) W1": W,
        }, atol)
        if hint:
            fail(hint + " (pre-activations on standardised tokens shown)", expected, got)
    hint = _first_match(b_new, {
        "β is added to every feature before W1, so it reaches the hidden layer as β W1: b1' = β W1 + b1 "
        "(b1 alone leaves β out)": c,
        "b1' = β W1 + b1: the MLP's own bias b1 is still there": b @ W,
        "β passes through W1 before it reaches the hidden layer: b1' = β W1 + b1, not β + b1":
            b + c if d == d_ff else _nan_like(c.shape),
        "β is not scaled by γ: LN(x) = γ ⊙ x̂ + β, so only x̂ meets γ; b1' = β W1 + b1": (g * b) @ W + c,
    }, atol)
    fail((hint or "one layer with (W1_folded, b1_folded) does not give the MLP the pre-activations "
          "(γ ⊙ x̂ + β) W1 + b1") + " (pre-activations on standardised tokens shown)", expected, got)


# ---------------------------------------------------------------- 3.3 the collapse of a stack

def _value_path(A: torch.Tensor, W: torch.Tensor, b: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """One value-only layer with a bias, entry by entry: row i averages the rows of Y W_V + b_V."""
    values = Y @ W + b
    return torch.stack([sum(A[i, j] * values[j] for j in range(A.shape[-1])) for i in range(A.shape[-2])])


@judge("value_layer", compare=("out",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "value_layer computes A (Y W_V + 1 b_Vᵀ): each output row averages the value rows, "
                              "shape " + ", ".join(str((c["A"].shape[0], c["W_V"].shape[-1])) for c in cases))
def _value_layer(case: dict, out: dict) -> None:
    Ad, Wd, bd, Yd, atol = case["A"].double(), case["W_V"].double(), case["b_V"].double(), case["Y"].double(), 1e-9
    expected = _value_path(Ad, Wd, bd, Yd).numpy()
    got = as_array(out["out"], "value_layer")
    check_shape(got, expected.shape, "value_layer(A, W_V, b_V, Y)", "one row per token, d_v columns")
    if not close(got, expected, atol, atol):
        hint = _first_match(got, {
            "row i of the output averages the value rows with the weights of row i of A: A (Y W_V + b_V), "
            "not Aᵀ": (Ad.T @ (Yd @ Wd + bd)).numpy(),
            "the value bias b_V is missing: each value row is Y W_V + b_V": (Ad @ Yd @ Wd).numpy(),
            "the value projection W_V was left out": (Ad @ Yd + bd).numpy()
            if Yd.shape[-1] == Wd.shape[-1] else _nan_like(expected.shape)}, atol)
        fail(hint or f"value_layer differs from A (Y W_V + 1 b_Vᵀ) (atol {atol})", expected, got)


def _chain(mats: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.eye(width, dtype=torch.float64)
    for M in mats:
        out = out @ M
    return out


def _stack_variants(As: list, Ws: list, bs: list) -> dict[str, tuple]:
    """Reference (A*, W*, b*) and the usual wrong ones, for the messages."""
    n, d0 = As[0].shape[-1], Ws[0].shape[0]
    L = len(As)
    a_star = _chain(As[::-1], n)  # A_L … A_1: layer 1 mixes first, so it stands next to X
    w_star = _chain(Ws, d0)  # W_1 … W_L: tokens are rows, so the value maps multiply on the right
    b_star = sum(bs[l] @ _chain(Ws[l + 1:], Ws[l].shape[1]) for l in range(L))
    return {
        "": (a_star, w_star, b_star),
        "A_star = A_L ⋯ A_2 A_1: layer 1 mixes first, so A_1 stands next to X; yours multiplies the layers' "
        "weights in the wrong order": (_chain(As, n), w_star, b_star),
        "W_V_star = W_V1 W_V2 ⋯ W_VL: with tokens as rows the value maps multiply on the right, so W_V1 comes "
        "first": (a_star, _chain(Ws[::-1], d0) if all(W.shape[0] == W.shape[1] == d0 for W in Ws) else None, b_star),
        "b_V_star: the bias of layer l is added after W_Vl and then passes through every later value map: "
        "b_V_star = Σ_l b_l W_V(l+1) ⋯ W_VL (a plain sum of the biases leaves the later maps out)":
            (a_star, w_star, sum(bs) if len({b.shape for b in bs}) == 1 else None),
        "b_V_star: only the last layer's bias is there; the earlier biases pass through the later value maps "
        "(the weights A do not change a bias row, since A 1 = 1)": (a_star, w_star, bs[-1]),
        "b_V_star: the bias of layer l is added after W_Vl, so it does not pass through W_Vl itself, only "
        "through the later maps": (a_star, w_star, sum(bs[l] @ _chain(Ws[l:], d0) for l in range(L))
                                   if all(W.shape[0] == W.shape[1] == d0 for W in Ws) else None),
    }


@judge("collapse_stack", compare=("result",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "one layer with A_star (row-stochastic), W_V_star and b_V_star reproduces stacks of "
                              + ", ".join(str(len(c["As"])) for c in cases) + " layers on a random X (atol 1e-9)")
def _collapse_stack(case: dict, out: dict) -> None:
    As, Ws, bs = ([t.double() for t in case[k]] for k in ("As", "W_Vs", "b_Vs"))
    n, d0, d_last, atol = As[0].shape[-1], Ws[0].shape[0], Ws[-1].shape[1], 1e-9
    parts = out["result"]
    if not isinstance(parts, list) or len(parts) != 3:
        raise CheckFailed(f"collapse_stack must return three tensors (A_star, W_V_star, b_V_star), got "
                          f"{typename(parts)}")
    a_star, w_star, b_star = (as_array(p, name) for p, name in zip(parts, ("A_star", "W_V_star", "b_V_star")))
    check_shape(a_star, (n, n), "A_star", "one n × n mixing matrix, like each layer's A")
    check_shape(w_star, (d0, d_last), "W_V_star", "it maps a token's d features to the last layer's d_v")
    if b_star.shape == (1, d_last):
        b_star = b_star[0]
    check_shape(b_star, (d_last,), "b_V_star", "one bias per output feature, like each layer's b_V")
    check_finite(a_star, "A_star", "A_star should be finite")
    X = seeded(64, n, d0)
    Y = X
    for A, W, b in zip(As, Ws, bs):
        Y = _value_path(A, W, b, Y)  # layer 1 first
    expected = Y.numpy()
    variants = _stack_variants(As, Ws, bs)
    rows = a_star.sum(axis=-1)
    if np.any(a_star < -atol) or not np.allclose(rows, 1.0, atol=1e-6):
        fail("A_star must be row-stochastic (entries ≥ 0, rows summing to 1), like any product of row-stochastic "
             "matrices (row sums shown)", np.ones_like(rows), rows)
    got = a_star @ X.numpy() @ w_star + b_star
    if close(got, expected, 1e-6, 1e-6):
        return
    for hint, (va, vw, vb) in variants.items():
        if hint and all(v is not None for v in (va, vw, vb)) and close(a_star, va.numpy(), atol, atol) \
                and close(w_star, vw.numpy(), atol, atol) and close(b_star, vb.numpy(), atol, atol):
            fail(hint + " (outputs on a random X shown)", expected, got)
    fail("one layer with (A_star, W_V_star, b_V_star) does not reproduce the stack, layer 1 first "
         "(outputs on a random X shown)", expected, got)
