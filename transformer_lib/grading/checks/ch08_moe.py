"""The checks' kernel half for the chapter 8 exercises: a new worked example by hand (routing, the
balancing loss with K = 2 and the assignments a capacity drops), the capacity-limited forward pass
with batched dispatch, and the gradient of the balancing loss on the router's logits in closed form.

What runs in the student's kernel (the inputs, visible and hidden, the calls of the student's
functions, and what the kernel must measure: how often, and on how many rows, the student calls each
expert, and whether the gradient was computed with complex numbers). The experts handed to the
student are plain closures over their weight tensors: each call is one product of the expert's
weights with the rows it is given, counted in this module's functions, not on the objects. The
judges are in :mod:`transformer_lib.grading.judges.ch08_moe`. Chapter 8.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves

from .._calls import EagerDispatchMode, call
from .._harness import StudentError, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_hand_routing", "check_hand_balance", "check_moe_capacity", "check_balancing_grad"]


# ---------------------------------------------------------------- 8.1 the worked example, by hand

def _record_values(name: str, values: dict[str, Any]) -> None:
    run_check(name, None, [{"what": name}], lambda fn, case: dict(values))


def check_hand_routing(indices: Any, weights: Any) -> None:
    """The example's top-2 experts of each token (4×2, most probable first) and their renormalised
    weights to 3 decimals. Chapter 8."""
    _record_values("hand_routing", {"indices": indices, "weights": weights})


def check_hand_balance(f: Any, P: Any, loss: Any, kept: Any) -> None:
    """The example's shares f_e, mean probabilities P_e (3 decimals), balancing loss and the
    assignments kept with a capacity of 2 per expert. Chapter 8."""
    _record_values("hand_balance", {"f": f, "P": P, "loss": loss, "kept": kept})


# ---------------------------------------------------------------- 8.2 the forward pass with a capacity

def _expert_weights(g: torch.Generator, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weights of one expert, a small tanh MLP (m, d) -> (m, d)."""
    w1 = torch.randn(d, 2 * d, generator=g, dtype=torch.float64) / d ** 0.5
    b1 = 0.1 * torch.randn(2 * d, generator=g, dtype=torch.float64)
    w2 = torch.randn(2 * d, d, generator=g, dtype=torch.float64) / (2 * d) ** 0.5
    return w1, b1, w2


def _moe_case(x: torch.Tensor, W_g: torch.Tensor, k: int, capacity: int, gens: list[torch.Generator]) -> dict:
    """A case of the forward pass: the experts' weights stacked (E, …), as data."""
    w1, b1, w2 = (torch.stack(ws) for ws in zip(*(_expert_weights(g, x.shape[1]) for g in gens)))
    return dict(x=x, W_g=W_g, k=k, capacity=capacity, w1=w1, b1=b1, w2=w2,
                what="moe_capacity(x, W_g, experts, k, capacity)")


def _run_moe(fn: Callable, case: dict) -> dict:
    """Call the student's forward pass with experts that count, in this function's variables, how
    often they are called and on how many rows (each call: one product of the expert's weights with
    those rows); an expert called on something other than an (m, d) tensor stops the run and says
    what it got (a shape, or None for a non-tensor)."""
    d = case["x"].shape[1]
    n_experts = case["w1"].shape[0]
    calls, rows = [0] * n_experts, [0] * n_experts
    misuse: list[Any] = []

    def make(e: int) -> Callable[[Any], torch.Tensor]:
        w1, b1, w2 = case["w1"][e].clone(), case["b1"][e].clone(), case["w2"][e].clone()

        def expert(x: Any) -> torch.Tensor:
            if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != d:
                misuse.append(list(x.shape) if isinstance(x, torch.Tensor) else None)
                raise ValueError("an expert takes a (m, d) tensor")
            calls[e] += 1
            rows[e] += int(x.shape[0])
            return torch.tanh(x @ w1 + b1) @ w2
        return expert

    experts = [make(e) for e in range(n_experts)]
    try:
        result = call(fn, case["x"].clone(), case["W_g"].clone(), experts, case["k"], case["capacity"])
    except (StudentError, ValueError):  # (a ValueError reaches here only while a student works)
        if misuse:
            return {"misuse": [misuse[0]]}
        raise
    return {"result": result, "calls": calls, "rows": rows, "misuse": misuse[:1]}


def check_moe_capacity(fn: Callable, x: torch.Tensor | None = None, n_experts: int = 4, k: int = 2,
                       capacity: int = 3, hidden: int = 0) -> None:
    """``fn(x (T, d), W_g (d, E), experts, k, capacity) -> (y (T, d), kept (T, k))``: top-k routing with
    at most ``capacity`` assignments per expert, served in priority order (every first choice in token
    order, then every second choice, …); each expert called once, on its kept tokens only. Chapter 8."""
    if hidden:
        g = hidden_generator("moe_capacity", hidden)
        E = draw(g, 4, 7)
        T1, k1 = draw(g, 10, 16), draw(g, 2, 3)
        shapes = [(T1, draw(g, 3, 6), E, k1, draw(g, 2, T1 * k1 // E)),       # the capacity bites
                  (draw(g, 5, 10), draw(g, 2, 5), draw(g, 2, 4), 1, 1),        # one expert a token, one place each
                  (draw(g, 3, 6), draw(g, 2, 4), draw(g, 3, 5), 2, 100)]      # room for every assignment
        cases = [_moe_case(randn(g, T, d, scale=1.5), randn(g, d, n), k_, c, [g] * n) for T, d, n, k_, c in shapes]
    else:
        x = seeded(81, 10, 6) if x is None else x
        cases = [_moe_case(x, seeded(82, x.shape[1], n_experts, scale=1.5), k, capacity,
                           [torch.Generator().manual_seed(83 + e) for e in range(n_experts)])]
    run_check("moe_capacity", fn, cases, _run_moe, hidden)


# ---------------------------------------------------------------- 8.3 the gradient on the router's logits

_AUTOGRAD = ("backward", "dual")  # every way autograd runs: backward passes, forward-mode dual numbers


class _Complex(EagerDispatchMode):
    """Note whether any operation makes a complex tensor (a complex-step derivative)."""

    def __init__(self, seen: list[bool]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if not self.seen and any(isinstance(t, torch.Tensor) and t.is_complex() for t in tree_leaves(out)):
            self.seen.append(True)
        return out


def _run_grad(fn: Callable, case: dict) -> dict:
    seen: list[bool] = []
    with _Complex(seen):
        grad = call(fn, case["logits"].clone(), case["expert_index"].clone(), banned=_AUTOGRAD)
    return {"grad": grad, "complex": bool(seen)}


def check_balancing_grad(fn: Callable, logits: torch.Tensor | None = None, k: int = 2, hidden: int = 0) -> None:
    """``fn(logits (T, E), expert_index (T, k)) -> (T, E)``: the gradient of the balancing loss
    ``E · Σ_e f_e · P_e`` (P from the softmax of the logits, f counted from expert_index) with
    respect to the logits, in closed form, without autograd. Chapter 8."""
    if hidden:
        g = hidden_generator("balancing_grad", hidden)
        cases = []
        for T, E, k_, scale in [(draw(g, 8, 20), draw(g, 4, 8), draw(g, 2, 3), 2.0), (draw(g, 3, 9), 2, 1, 1.0),
                                (draw(g, 5, 12), draw(g, 3, 6), 1, 4.0)]:
            z = randn(g, T, E, scale=scale)
            index = z[:, : E - 1].topk(k_, -1).indices if k_ == 1 else z.topk(k_, -1).indices  # k = 1: the last idle
            # each token's logits shifted by up to ±1e7, which the softmax (and the closed form) does not see: a
            # finite difference rounds z + h to 2e-9 there and misses 1e-12 (the check can only judge values)
            z = z + 1e7 * (2 * torch.rand(T, 1, generator=g, dtype=torch.float64) - 1)
            cases.append(dict(logits=z, expert_index=index))
    else:
        z = seeded(84, 12, 4, scale=1.5) if logits is None else logits
        cases = [dict(logits=z, expert_index=z.topk(k, -1).indices)]
    for case in cases:
        case["what"] = "balancing_grad(logits, expert_index)"
    run_check("balancing_grad", fn, cases, _run_grad, hidden)
