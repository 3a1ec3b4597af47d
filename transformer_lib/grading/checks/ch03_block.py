"""Checks for the chapter 3 exercises: LayerNorm from scratch, the position-wise MLP, and the
linear collapse identity of two value-only attention layers.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, and
the calls of the student's functions). Below it: the judges, which compute their references
from the inputs and run in the grader. Chapter 3.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .._harness import call, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_layer_norm", "check_mlp", "check_value_layer", "check_collapse"]

_NORMS = ("layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm")  # torch's own norms


# ---------------------------------------------------------------- 3.1 LayerNorm

def _layer_norm_case(g: torch.Generator, lead: tuple[int, ...], eps: float, gamma_positive: bool) -> dict:
    d = draw(g, 2, 12)
    x = 4 * randn(g, *lead, d) - 1
    flat = tuple(draw(g, 0, k - 1) for k in lead)
    x[flat] = 0.5 + randn(g, 1) + 1e-3 * randn(g, d)  # a nearly flat token: σ ≈ 1e-3
    gamma = torch.rand(d, generator=g, dtype=torch.float64) + 0.5 if gamma_positive else randn(g, d)
    return dict(x=x, gamma=gamma, beta=randn(g, d), eps=eps)


def check_layer_norm(fn: Callable, x: torch.Tensor | None = None, gamma: torch.Tensor | None = None,
                     beta: torch.Tensor | None = None, eps: float = 1e-5, hidden: int = 0) -> None:
    """``fn(x (…, d), gamma (d,), beta (d,), eps) -> (…, d)`` must equal
    ``torch.nn.functional.layer_norm``; torch's norm functions are switched off while ``fn``
    runs. The inputs hold a nearly constant token, so that ε outside the square root shows.
    Chapter 3."""
    if hidden:
        g = hidden_generator("layer_norm", hidden)
        cases = [_layer_norm_case(g, (draw(g, 2, 6),), 1e-3, gamma_positive=False),
                 _layer_norm_case(g, tuple(draw(g, 1, 4) for _ in range(draw(g, 2, 3))), 1e-5, gamma_positive=True)]
    else:
        if x is None:
            x = 2.0 * seeded(30, 2, 5, 8) + 1.0
            x[1, 2] = 3.0 + 1e-3 * seeded(31, 8)  # a nearly flat token: σ ≈ 1e-3
        d = x.shape[-1]
        cases = [dict(x=x, gamma=1.0 + 0.5 * seeded(32, d) if gamma is None else gamma,
                      beta=seeded(33, d) if beta is None else beta, eps=eps)]
    for case in cases:
        case["what"] = "layer_norm(x, gamma, beta, eps)"
    run_check("layer_norm", fn, cases, lambda f, c: {"out": call(
        f, c["x"].clone(), c["gamma"].clone(), c["beta"].clone(), c["eps"], banned=_NORMS)}, hidden)


# ---------------------------------------------------------------- 3.2 the position-wise MLP

def _run_mlp(fn: Callable, case: dict) -> dict:
    """The student's output, and (to see whether tokens mix) the outputs for each token alone."""
    X, args = case["X"], tuple(case[k].clone() for k in ("W1", "b1", "W2", "b2")) + (case["activation"],)
    out = call(fn, X.clone(), *args)
    per_token = None
    if X.ndim >= 2 and X.shape[-2] > 1:
        try:
            per_token = [call(fn, X[..., i:i + 1, :].clone(), *(a.clone() if isinstance(a, torch.Tensor) else a
                                                                 for a in args)) for i in range(X.shape[-2])]
        except Exception:  # noqa: BLE001 - a measurement: nothing to compare when one token alone fails
            per_token = None
    return {"out": out, "per_token": per_token}


def _mlp_cases(X: torch.Tensor, d_ff: int, activations: tuple[str, ...], g: torch.Generator | None) -> list[dict]:
    d = X.shape[-1]
    if g is None:
        W1, b1 = seeded(41, d, d_ff, scale=1 / math.sqrt(d)), seeded(42, d_ff, scale=0.5)
        W2, b2 = seeded(43, d_ff, d, scale=1 / math.sqrt(d_ff)), seeded(44, d, scale=0.5)
    else:
        W1, b1 = randn(g, d, d_ff, scale=1 / math.sqrt(d)), randn(g, d_ff, scale=0.5)
        W2, b2 = randn(g, d_ff, d, scale=1 / math.sqrt(d_ff)), randn(g, d, scale=0.5)
    W1, b1, W2, b2 = (t.to(X.dtype) for t in (W1, b1, W2, b2))
    return [dict(X=X, W1=W1, b1=b1, W2=W2, b2=b2, activation=activation,
                 what=f"mlp(X, W1, b1, W2, b2, {activation!r})") for activation in activations]


def check_mlp(fn: Callable, X: torch.Tensor | None = None, d_ff: int = 12,
              activations: tuple[str, ...] = ("relu", "gelu"), hidden: int = 0) -> None:
    """``fn(X (…, n, d), W1 (d, d_ff), b1 (d_ff,), W2 (d_ff, d), b2 (d,), activation) -> (…, n, d)``,
    the book's row convention ``σ(X W1 + b1) W2 + b2``, for ReLU and GELU (exact, erf form); also
    checks that it acts on each token separately. Chapter 3."""
    if hidden:
        g = hidden_generator("mlp", hidden)
        X1 = randn(g, draw(g, 2, 8), draw(g, 2, 8))
        X2 = randn(g, *(draw(g, 1, 3) for _ in range(draw(g, 1, 2))), draw(g, 2, 5), draw(g, 1, 6))
        cases = _mlp_cases(X1, draw(g, 8, 32), ("relu", "gelu"), g)
        cases += _mlp_cases(X2, draw(g, 1, 10), ("gelu", "relu"), g)
    else:
        cases = _mlp_cases(seeded(40, 2, 5, 4) if X is None else X, d_ff, tuple(activations), None)
    run_check("mlp", fn, cases, _run_mlp, hidden)


# ---------------------------------------------------------------- 3.3 the collapse identity

def _stochastic(g: torch.Generator, n: int, scale: float) -> torch.Tensor:
    return torch.softmax(randn(g, n, n, scale=scale), dim=-1)


def check_value_layer(fn: Callable, A: torch.Tensor | None = None, W_V: torch.Tensor | None = None,
                      Y: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(A (n, n), W_V (d, d_v), Y (n, d)) -> (n, d_v)``: one value-only attention layer
    ``A Y W_V``, each output row the A-weighted average of the value rows. Chapter 3."""
    if hidden:
        g = hidden_generator("value_layer", hidden)
        cases = []
        for square in (True, False):  # d = d_v (W_V left out would fit), then any d, d_v
            n, d = draw(g, 1, 8), draw(g, 1, 6)
            cases.append(dict(A=_stochastic(g, n, 2.0), W_V=randn(g, d, d if square else draw(g, 1, 5)),
                              Y=randn(g, n, d)))
    else:
        n = 4 if A is None else A.shape[-1]
        A = torch.softmax(seeded(50, n, n, scale=2.0), dim=-1) if A is None else A
        Y = seeded(51, n, 3) if Y is None else Y
        cases = [dict(A=A, W_V=seeded(52, Y.shape[-1], 2) if W_V is None else W_V, Y=Y)]
    for case in cases:
        case["what"] = "value_layer(A, W_V, Y)"
    run_check("value_layer", fn, cases, lambda f, c: {"out": call(f, c["A"].clone(), c["W_V"].clone(),
                                                                     c["Y"].clone())}, hidden)


def check_collapse(fn: Callable, A1: torch.Tensor | None = None, W_V1: torch.Tensor | None = None,
                   A2: torch.Tensor | None = None, W_V2: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(A1, W_V1, A2, W_V2) -> (A_star, W_V_star)`` such that one value-only layer with them
    reproduces the two layers ``Y -> A2 (A1 Y W_V1) W_V2``, with ``A_star`` row-stochastic.
    Chapter 3."""
    if hidden:
        g = hidden_generator("collapse", hidden)
        cases = []
        for square in (True, False):  # square value maps (the orders can be confused), then rectangular ones
            n, d = draw(g, 2, 8), draw(g, 1, 6)
            d1, d2 = (d, d) if square else (draw(g, 1, 6), draw(g, 1, 6))
            cases.append(dict(A1=_stochastic(g, n, 3.0), W_V1=randn(g, d, d1), A2=_stochastic(g, n, 1.0),
                              W_V2=randn(g, d1, d2)))
    else:
        n = 5 if A1 is None else A1.shape[-1]
        W_V1 = seeded(62, 4, 4) if W_V1 is None else W_V1
        cases = [dict(A1=torch.softmax(seeded(60, n, n, scale=2.0), dim=-1) if A1 is None else A1, W_V1=W_V1,
                      A2=torch.softmax(seeded(61, n, n, scale=2.0), dim=-1) if A2 is None else A2,
                      W_V2=seeded(63, W_V1.shape[-1], 4) if W_V2 is None else W_V2)]
    for case in cases:
        case["what"] = "collapse(A1, W_V1, A2, W_V2)"
    run_check("collapse", fn, cases, lambda f, c: {"result": call(
        f, c["A1"].clone(), c["W_V1"].clone(), c["A2"].clone(), c["W_V2"].clone())}, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .._judging import as_array, check_finite, check_shape, close, fail, judge, pair  # noqa: E402


def _first_match(got: np.ndarray, variants: dict[str, np.ndarray], atol: float) -> str | None:
    return next((hint for hint, v in variants.items() if close(got, v, atol, atol)), None)


@judge("layer_norm", compare=("out",), atol=1e-6, rtol=1e-6, bans=_NORMS,
       ok=lambda cases, outs: "layer_norm matches torch.nn.functional.layer_norm on inputs of shape "
                              + ", ".join(str(tuple(c["x"].shape)) for c in cases)
                              + " with random γ, β, eps=" + ", ".join(format(c["eps"], "g") for c in cases)
                              + " (atol 1e-6)")
def _layer_norm(case: dict, out: dict) -> None:
    x, gamma, beta, eps, atol = case["x"], case["gamma"], case["beta"], case["eps"], 1e-6
    d = x.shape[-1]
    expected = F.layer_norm(x.double(), (d,), gamma.double(), beta.double(), eps).numpy()
    got = as_array(out["out"], "layer_norm(x, gamma, beta, eps)")
    check_shape(got, expected.shape, "layer_norm(x)", "LayerNorm keeps the shape of its input (…, d)")
    check_finite(got, "layer_norm(x)", "add ε to the variance inside the square root, √(σ² + ε), so that "
                 "a token with equal features does not divide by zero")
    if close(got, expected, atol, atol):
        return

    xd, g, b = x.double(), gamma.double(), beta.double()

    def standardise(dims, unbiased: bool = False, eps_outside: bool = False) -> torch.Tensor:
        mu = xd.mean(dim=dims, keepdim=True)
        var = ((xd - mu) ** 2).sum(dim=dims, keepdim=True) / (
            math.prod(xd.shape[k] for k in dims) - (1 if unbiased else 0))
        scale = torch.sqrt(var) + eps if eps_outside else torch.sqrt(var + eps)
        return (xd - mu) / scale

    last = (xd.ndim - 1,)
    variants = {
        "the variance must be the biased one, dividing by d (torch.var(..., unbiased=False) or "
        "((x - μ)²).mean(-1)), not by d − 1": standardise(last, unbiased=True) * g + b,
        "ε belongs inside the square root: (x − μ)/√(σ² + ε), not (x − μ)/(σ + ε) (it matters for a "
        "token whose features are nearly equal)": standardise(last, eps_outside=True) * g + b,
        "γ and β are missing: LN(x) = γ ⊙ (x − μ)/√(σ² + ε) + β": standardise(last),
        "β is missing: LN(x) = γ ⊙ (x − μ)/√(σ² + ε) + β": standardise(last) * g,
        "γ is missing: LN(x) = γ ⊙ (x − μ)/√(σ² + ε) + β": standardise(last) + b,
        "γ and β are swapped: γ multiplies, β is added": standardise(last) * b + g,
    }
    if xd.ndim >= 2:
        variants["the statistics run over the batch/first axis: LayerNorm takes the mean and the variance "
                 "of each token over its own features (dim=-1, keepdim=True)"] = standardise((0,)) * g + b
    if xd.ndim >= 3:
        variants["the statistics run over the sequence axis (dim=-2): LayerNorm takes the mean and the "
                 "variance of each token over its own features (dim=-1)"] = standardise((xd.ndim - 2,)) * g + b
        variants["the statistics run over the whole sequence (dims -2 and -1): LayerNorm normalises each "
                 "token separately, over its features only (dim=-1)"] = standardise((xd.ndim - 2, xd.ndim - 1)) * g + b
    hint = _first_match(got, {k: v.numpy() for k, v in variants.items()}, atol)
    worst = np.unravel_index(np.argmax(np.abs(got - expected).max(axis=-1)), expected.shape[:-1])
    where = f"\n  the token that differs most, x[{', '.join(map(str, worst))}], is shown" if worst else ""
    fail((hint or f"layer_norm differs from γ ⊙ (x − μ)/√(σ² + ε) + β with μ, σ² over the last axis "
          f"(atol {atol})") + where, expected[worst], got[worst])


@judge("mlp", compare=("out",), atol=1e-6, rtol=1e-6,
       ok=lambda cases, outs: "mlp matches nn.Linear → " + "/".join(dict.fromkeys(c["activation"] for c in cases))
                              + " → nn.Linear, " + ", ".join(dict.fromkeys(
                                  f"d = {c['X'].shape[-1]} → d_ff = {c['W1'].shape[-1]} → d on X of shape "
                                  f"{tuple(c['X'].shape)}" for c in cases)) + " (atol 1e-6)")
def _mlp(case: dict, out: dict) -> None:
    X, activation, what, atol = case["X"], case["activation"], case["what"], 1e-6
    Xd, W1d, b1d, W2d, b2d = (case[k].double() for k in ("X", "W1", "b1", "W2", "b2"))
    d, d_ff = W1d.shape
    lin1 = torch.nn.Linear(d, d_ff).double()  # an independent reference: torch.nn layers
    lin2 = torch.nn.Linear(d_ff, d).double()
    with torch.no_grad():
        lin1.weight.copy_(W1d.T), lin1.bias.copy_(b1d), lin2.weight.copy_(W2d.T), lin2.bias.copy_(b2d)
        act = {"relu": torch.nn.ReLU(), "gelu": torch.nn.GELU()}[activation]
        expected = torch.nn.Sequential(lin1, act, lin2)(Xd).numpy()
    got = as_array(out["out"], what)
    check_shape(got, expected.shape, what, "the MLP returns one vector of width d per token: d → d_ff → d")
    check_finite(got, what, "the MLP should be finite for finite inputs")
    if close(got, expected, atol, atol):
        return
    sigma = {"relu": torch.relu, "gelu": F.gelu}[activation]
    hidden = Xd @ W1d + b1d
    variants = {
        "no activation: the nonlinearity σ goes between the two layers, σ(X W1 + b1) W2 + b2":
            hidden @ W2d + b2d,
        "the activation belongs between the two layers, not after the second: σ(X W1 + b1) W2 + b2":
            sigma(hidden @ W2d + b2d),
        "the activation is applied twice: only the hidden layer gets σ, σ(X W1 + b1) W2 + b2 (the "
        "output is not passed through σ)": sigma(sigma(hidden) @ W2d + b2d),
        "the bias b1 goes inside the activation: σ(X W1 + b1), not σ(X W1) + b1":
            (sigma(Xd @ W1d) + b1d) @ W2d + b2d,
        "GELU here is the exact one, u·Φ(u) with the error function (F.gelu's default), not the tanh "
        "approximation": F.gelu(hidden, approximate="tanh") @ W2d + b2d,
        f"the activation is {'GELU' if activation == 'relu' else 'ReLU'}, but `activation` asked for "
        f"{activation!r}": (F.gelu(hidden) if activation == "relu" else torch.relu(hidden)) @ W2d + b2d,
    }
    hint = _first_match(got, {k: v.numpy() for k, v in variants.items()}, atol)
    if hint is None and got.ndim >= 2 and isinstance(out.get("per_token"), list):
        try:
            per_token = np.concatenate([as_array(t, what) for t in out["per_token"]], axis=-2)
        except (ValueError, IndexError, AssertionError):  # parts of other shapes: nothing to compare
            per_token = None
        if per_token is not None and per_token.shape == got.shape and not close(per_token, got, atol, atol):
            hint = ("the result for a token depends on the other tokens: a position-wise MLP applies the "
                    "same network to each token (each row of X) separately")
    fail(hint or f"{what} differs from σ(X W1 + b1) W2 + b2 (atol {atol})", expected, got)


@judge("value_layer", compare=("out",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "value_layer computes A Y W_V: each output row averages the value rows, shape "
                              + ", ".join(str((c["A"].shape[0], c["W_V"].shape[-1])) for c in cases))
def _value_layer(case: dict, out: dict) -> None:
    Ad, Wd, Yd, atol = case["A"].double(), case["W_V"].double(), case["Y"].double(), 1e-9
    n = Ad.shape[-1]
    values = Yd @ Wd
    expected = np.stack([sum(float(Ad[i, j]) * values[j] for j in range(n)).numpy() for i in range(n)])
    got = as_array(out["out"], "value_layer")
    check_shape(got, expected.shape, "value_layer(A, W_V, Y)", "one row per token, d_v columns: A Y W_V")
    if not close(got, expected, atol, atol):
        hint = _first_match(got, {
            "row i of the output averages the value rows with the weights of row i of A: A (Y W_V), "
            "not Aᵀ": (Ad.T @ values).numpy(),
            "the value projection W_V was left out: the layer computes A Y W_V": (Ad @ Yd).numpy()
            if Yd.shape[-1] == Wd.shape[-1] else np.full(expected.shape, np.nan)}, atol)
        fail(hint or f"value_layer differs from A Y W_V (atol {atol})", expected, got)


@judge("collapse", compare=("result",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "one layer with A_star (row-stochastic) and W_V_star reproduces the two layers on a "
                              "random X for A of shape " + ", ".join(str(tuple(c["A1"].shape)) for c in cases)
                              + " (atol 1e-6)")
def _collapse(case: dict, out: dict) -> None:
    A1d, A2d, W1d, W2d = (case[k].double() for k in ("A1", "A2", "W_V1", "W_V2"))
    n, atol = A1d.shape[-1], 1e-9
    a_star, w_star = pair(out["result"], case["what"], ("A_star", "W_V_star"))
    a_star, w_star = as_array(a_star, "A_star"), as_array(w_star, "W_V_star")
    X = seeded(64, n, W1d.shape[0])
    two_layers = (A2d @ ((A1d @ X) @ W1d)) @ W2d  # layer 1, then layer 2
    check_shape(a_star, (n, n), "A_star", "one n × n mixing matrix, like A1 and A2")
    check_shape(w_star, (W1d.shape[0], W2d.shape[1]), "W_V_star",
                "it maps a token's d features to the d_v of the second layer, like W_V1 then W_V2")
    check_finite(a_star, "A_star", "A_star should be finite")
    order = {"A_star = A2 A1: layer 1 mixes first, so A1 stands next to X (A2 (A1 X)); A1 A2 is row-"
             "stochastic too, but it mixes in the wrong order": (A1d @ A2d).numpy(),
             "the attention matrices compose by a matrix product (A2 @ A1), not entry by entry":
                 (A1d * A2d).numpy(),
             "the attention matrices compose by a matrix product (A2 @ A1), not by a sum": (A1d + A2d).numpy()}
    rows = a_star.sum(axis=-1)
    if np.any(a_star < -atol) or not np.allclose(rows, 1.0, atol=1e-6):
        hint = _first_match(a_star, order, atol)
        fail(hint or "A_star must be row-stochastic (entries ≥ 0, rows summing to 1), like any product of "
             "row-stochastic matrices (row sums shown)", np.ones_like(rows), rows)
    one_layer = a_star @ X.numpy() @ w_star
    if close(one_layer, two_layers.numpy(), 1e-6, 1e-6):
        return
    hint = _first_match(a_star, order, atol)
    if hint is None and close(a_star, (A2d @ A1d).numpy(), atol, atol):
        hint = _first_match(w_star, {
            "W_V_star = W_V1 @ W_V2: with tokens as rows the value maps multiply on the right, X W_V1 W_V2, "
            "so W_V1 comes first (in the column convention it is V2 V1)":
                (W2d @ W1d).numpy() if W2d.shape[1] == W1d.shape[0] else np.full(w_star.shape, np.nan),
            "the value maps compose by a matrix product (W_V1 @ W_V2), not entry by entry":
                (W1d * W2d).numpy() if W1d.shape == W2d.shape else np.full(w_star.shape, np.nan)}, atol)
        hint = hint or "A_star is right, but W_V_star does not reproduce the value path X W_V1 W_V2"
    fail(hint or "one layer with (A_star, W_V_star) does not reproduce the two layers A2 (A1 X W_V1) W_V2 "
         "(outputs on a random X shown)", two_layers.numpy(), one_layer)
