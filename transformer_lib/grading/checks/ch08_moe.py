"""Checks for the chapter 8 exercises: top-k routing with renormalised weights, the MoE forward
pass with batched dispatch, and the Switch load-balancing loss.

Each check computes its reference inside the function from ``torch`` operations; the experts the
forward pass is run with are small MLPs built here that count how often, and on how many tokens,
they are called. Chapter 8.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from .._checktools import (CheckFailed, as_array, call, check_shape, close, fail, ok, record, seeded,
                           typename, unpack_pair)

__all__ = ["check_top_k_routing", "check_moe_forward", "check_balancing_loss"]


def _reference_routing(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts (last axis), the k largest, renormalised."""
    probs = torch.softmax(logits, dim=-1)
    top, idx = probs.topk(k, dim=-1)
    return top / top.sum(-1, keepdim=True), idx


def _as_index(value: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.is_complex():
        raise CheckFailed(f"{what}: expected an integer tensor of expert indices (as torch.topk "
                          f"returns), got {typename(value)}"
                          + (f" of dtype {value.dtype}" if isinstance(value, torch.Tensor) else ""))
    got = value.detach().cpu().numpy()
    check_shape(got, shape, what, "one row per token, one column per chosen expert")
    return got


def check_top_k_routing(fn: Callable, logits: torch.Tensor | None = None, k: int = 2) -> None:
    """``fn(logits (T, E), k) -> (weights (T, k), indices (T, k))``: the k most probable experts of
    each token, most probable first, and their probabilities renormalised to sum to 1. Chapter 8."""
    logits = seeded(80, 7, 5, scale=1.5) if logits is None else logits
    T, E = logits.shape
    expected_w, expected_i = _reference_routing(logits, k)
    result = call(fn, logits.clone(), k, what="top_k_routing(logits, k)")
    weights, indices = unpack_pair(result, "top_k_routing(logits, k)", ("weights", "indices"))
    got_i = _as_index(indices, (T, k), "indices")
    got_w = as_array(weights, "weights")
    record("top_k_routing", {"weights": got_w, "indices": got_i.astype(np.float64)}, atol=1e-9, rtol=1e-9)
    check_shape(got_w, (T, k), "weights", "one row per token, one weight per chosen expert")
    probs = torch.softmax(logits, dim=-1)
    smallest = probs.topk(k, dim=-1, largest=False).indices.numpy()
    if k < E and np.array_equal(np.sort(got_i, 1), np.sort(smallest, 1)):
        fail("these are the k *least* probable experts: route each token to the k largest "
             "probabilities (torch.topk keeps the largest by default)", expected_i.numpy(), got_i)
    over_tokens = torch.softmax(logits, dim=0)
    tok_w, tok_i = over_tokens.topk(k, dim=-1)
    if k < E and np.array_equal(got_i, tok_i.numpy()) and not np.array_equal(got_i, expected_i.numpy()):
        fail("the experts come from a softmax over the token axis (dim=0): the router's softmax runs "
             "over the experts of each token (the last axis), so each row is a distribution over E "
             "experts", expected_i.numpy(), got_i)
    if not np.array_equal(np.sort(got_i, 1), np.sort(expected_i.numpy(), 1)):
        fail("the chosen experts are not the k most probable ones of each token", expected_i.numpy(), got_i)
    if not np.array_equal(got_i, expected_i.numpy()):
        fail("order each token's k experts from the most to the least probable (as torch.topk does)",
             expected_i.numpy(), got_i)
    if not close(got_w, expected_w.numpy(), 1e-9, 1e-9):
        if close(got_w, probs.gather(1, expected_i).numpy(), 1e-9, 1e-9):
            fail("the top-k weights are not renormalised: divide them by their sum so each token's "
                 "weights add up to 1 (row sums shown)", np.ones(T), got_w.sum(1))
        if close(got_w, (tok_w / tok_w.sum(-1, keepdim=True)).numpy(), 1e-9, 1e-9):
            fail("the weights come from a softmax over the token axis (dim=0): take it over the "
                 "experts (the last axis)", expected_w.numpy(), got_w)
        fail("the weights differ from the renormalised top-k softmax probabilities (atol 1e-9)",
             expected_w.numpy(), got_w)
    ok(f"top-{k} routing of {T} tokens over {E} experts: the most probable experts, in order, "
       "weights renormalised to sum to 1")


class _Expert:
    """A small MLP ``(m, d) -> (m, d)`` that records the number of rows of every call."""

    def __init__(self, d: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(d, 2 * d, generator=g, dtype=torch.float64) / d ** 0.5
        self.b1 = 0.1 * torch.randn(2 * d, generator=g, dtype=torch.float64)
        self.w2 = torch.randn(2 * d, d, generator=g, dtype=torch.float64) / (2 * d) ** 0.5
        self.calls: list[int] = []

    def __call__(self, x: Any) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise CheckFailed("call each expert on a (m, d) tensor: the rows of the tokens routed to "
                              f"it, got {typename(x)}" + (f" of shape {tuple(x.shape)}"
                                                         if isinstance(x, torch.Tensor) else ""))
        self.calls.append(x.shape[0])
        return torch.tanh(x @ self.w1 + self.b1) @ self.w2

    def _uncounted(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w1 + self.b1) @ self.w2


def check_moe_forward(fn: Callable, x: torch.Tensor | None = None, n_experts: int = 4, k: int = 2) -> None:
    """``fn(x (T, d), W_g (d, E), experts, k) -> y (T, d)``: ``y_i = Σ_{e ∈ top-k} w_ie · expert_e(x_i)``
    with renormalised weights, each expert called once on exactly the tokens routed to it. Chapter 8."""
    x = seeded(81, 10, 6) if x is None else x
    T, d = x.shape
    W_g = seeded(82, d, n_experts)
    experts = [_Expert(d, 83 + e) for e in range(n_experts)]
    weights, idx = _reference_routing(x @ W_g, k)
    expected = torch.zeros_like(x)
    for i in range(T):
        for j in range(k):
            expected[i] += weights[i, j] * experts[int(idx[i, j])]._uncounted(x[i:i + 1])[0]
    got_t = call(fn, x.clone(), W_g.clone(), list(experts), k, what="moe_forward(x, W_g, experts, k)")
    got = as_array(got_t, "y")
    record("moe_forward", {"y": got}, atol=1e-9, rtol=1e-9)
    check_shape(got, (T, d), "moe_forward(x, W_g, experts, k)", "one output row per token")
    routed = torch.bincount(idx.reshape(-1), minlength=n_experts).tolist()
    calls = [ex.calls for ex in experts]
    probs = torch.softmax(x @ W_g, -1)
    raw = probs.gather(1, idx)
    unnormalised = torch.zeros_like(x)
    overwrite = torch.zeros_like(x)
    for i in range(T):
        for j in range(k):
            out = experts[int(idx[i, j])]._uncounted(x[i:i + 1])[0]
            unnormalised[i] += raw[i, j] * out
    for e in range(n_experts):                    # later experts overwrite earlier ones
        token, slot = torch.where(idx == e)
        overwrite[token] = weights[token, slot, None] * experts[e]._uncounted(x[token])
    if close(got, unnormalised.numpy(), 1e-9, 1e-9):
        fail("the outputs are weighted by the raw top-k probabilities: renormalise them to sum to 1 "
             "over each token's k experts", expected.numpy(), got)
    if k > 1 and close(got, overwrite.numpy(), 1e-9, 1e-9):
        fail("each token keeps only one expert's output: add every expert's contribution to the "
             "token's row (index_add_ or +=), do not assign it", expected.numpy(), got)
    if not close(got, expected.numpy(), 1e-9, 1e-9):
        fail("y differs from Σ over each token's top-k experts of w_ie · expert_e(x_i) with "
             "renormalised weights (atol 1e-9)", expected.numpy(), got)
    for e, (made, want) in enumerate(zip(calls, routed)):
        if len(made) > 1:
            raise CheckFailed(f"expert {e} was called {len(made)} times: batch the dispatch, calling "
                              "each expert once on all the tokens routed to it (not once per token)")
        if sum(made) != want:
            raise CheckFailed(f"expert {e} processed {sum(made)} rows but {want} tokens are routed to it: "
                              "run each expert only on its own tokens (running every expert on every "
                              "token costs E/k times the compute a mixture of experts saves)")
    ok(f"MoE forward of {T} tokens, top-{k} of {n_experts} experts: equals the per-token sum, each "
       "expert called once on exactly its tokens")


def check_balancing_loss(fn: Callable, probs: torch.Tensor | None = None,
                         expert_index: torch.Tensor | None = None) -> None:
    """``fn(router_probs (T, E), expert_index (T, k), n_experts) -> scalar``
    ``E · Σ_e f_e · P_e`` with f_e the share of the T·k assignments and P_e the mean probability;
    differentiable through ``router_probs``. Chapter 8."""
    if probs is None:
        probs = torch.softmax(seeded(84, 12, 4, scale=1.5), -1)
    T, E = probs.shape
    expert_index = probs.topk(2, -1).indices if expert_index is None else expert_index
    k = expert_index.shape[1]
    leaf = probs.clone().requires_grad_(True)
    counts = torch.bincount(expert_index.reshape(-1), minlength=E).to(probs.dtype)
    f, P = counts / (T * k), probs.mean(0)
    expected = float(E * (f * P).sum())
    grad_expected = (E * f / T).expand(T, E).numpy()   # ∂L/∂p_ie = E f_e / T
    result = call(fn, leaf, expert_index.clone(), E, what="balancing_loss(router_probs, expert_index, n_experts)")
    if not isinstance(result, torch.Tensor) or result.numel() != 1:
        raise CheckFailed("balancing_loss must return a one-element torch.Tensor (a scalar you can "
                          f"backpropagate through), got {typename(result)}")
    got = float(result.detach())
    record("balancing_loss", {"loss": np.array([got])}, atol=1e-9, rtol=1e-9)
    variants = {
        f"the shares f_e are divided by T tokens instead of the T·k = {T * k} assignments (the loss "
        f"must be 1 at balance for every k, not k)": float(E * (counts / T * P).sum()),
        f"the factor E = {E} is missing: without it the balanced value is 1/E, not 1":
            float((f * P).sum()),
        "f_e must count the assignments (expert_index), not repeat the probabilities: E·Σ P_e² is the "
        "soft version": float(E * (P * P).sum()),
    }
    for hint, value in variants.items():
        if abs(got - value) < 1e-9 and abs(value - expected) > 1e-6:
            fail(hint, expected, got)
    if not abs(got - expected) < 1e-9:
        fail("the loss differs from E · Σ_e f_e · P_e (atol 1e-9)", expected, got)
    if not result.requires_grad:
        raise CheckFailed("the loss carries no gradient: compute P_e from router_probs with torch "
                          "operations (no .detach(), .item() or numpy), so the router can learn from it")
    grad, = torch.autograd.grad(result.reshape(()), leaf)
    if not close(grad.numpy(), grad_expected, 1e-9, 1e-9):
        fail("the gradient with respect to router_probs must be E·f_e/T (the counts f_e are constants, "
             "the gradient flows through P_e only)", grad_expected, grad.numpy())
    balanced_probs = torch.full((4 * E, E), 1.0 / E, dtype=probs.dtype)
    balanced_index = torch.stack([torch.arange(4 * E) % E, (torch.arange(4 * E) + 1) % E], 1)
    at_balance = call(fn, balanced_probs, balanced_index, E, what="balancing_loss at perfect balance")
    value = float(torch.as_tensor(at_balance).detach())
    if abs(value - 1) > 1e-9:
        fail("at perfect balance (every expert the same share, uniform probabilities) the loss must be 1",
             1.0, value)
    ok(f"balancing loss {got:.4f} = E·Σ f·P for T = {T}, E = {E}, k = {k}; 1 at balance; "
       "gradient E·f_e/T through the probabilities")
