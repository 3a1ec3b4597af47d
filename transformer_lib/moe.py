"""Mixture of Experts: a router picks, per token, K of E expert MLPs and mixes their outputs.

``y_i = Σ_{e ∈ TopK(r_i)} w_ie · MLP_e(x_i)`` with ``r_i = softmax(x_i W_g)`` and ``w_i`` the
top-K router probabilities renormalised to sum to 1. Parameters grow with E, the compute
per token with K.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib._checks import (require_ids, require_instance, require_int, require_positive,
                                     require_tensor, require_width)
from transformer_lib.block import MLP, TransformerBlock

__all__ = ["Router", "MoELayer", "load_balancing_loss", "moe_block", "moe_balancing_loss"]


class Router(nn.Module):
    """Linear gate, softmax over experts, top-k with renormalised weights.

    ``forward(x (…, d_model))`` flattens the leading dimensions into T tokens and returns
    ``weights (T, k)`` (top-k probabilities rescaled to sum to 1 per token), ``indices (T, k)``
    (chosen experts, most probable first) and ``probs (T, E)`` (the full softmax). Chapter 8.
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        require_int("d_model", d_model)
        require_int("n_experts", n_experts)
        require_int("top_k", top_k)
        if top_k > n_experts:
            raise ValueError(f"top_k: expected at most n_experts={n_experts}, got {top_k}")
        self.d_model, self.n_experts, self.top_k = d_model, n_experts, top_k
        self.gate = nn.Linear(d_model, n_experts, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(…, d_model) -> weights (T, k), indices (T, k), probs (T, E)``. Chapter 8."""
        require_width("x", x, self.d_model)
        probs = F.softmax(self.gate(x.reshape(-1, self.d_model)), dim=-1)
        top, indices = probs.topk(self.top_k, dim=-1)
        weights = top / top.sum(dim=-1, keepdim=True)
        return weights, indices, probs

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_experts={self.n_experts}, top_k={self.top_k}"


def load_balancing_loss(router_probs: Tensor, expert_index: Tensor, n_experts: int) -> Tensor:
    """Switch Transformer auxiliary loss ``E · Σ_e f_e · P_e`` -> scalar.

    ``router_probs (T, E)``: softmax outputs; ``expert_index (T,)`` or ``(T, k)``: chosen
    experts. ``f_e`` is the fraction of the T·k assignments sent to expert e, ``P_e`` the mean
    router probability of e. Equal to 1 when assignments are spread evenly, up to E when one
    expert gets everything with probability 1; differentiable through ``router_probs``.
    Chapter 8.
    """
    require_int("n_experts", n_experts)
    require_tensor("router_probs", router_probs)
    if router_probs.dim() != 2 or router_probs.shape[1] != n_experts:
        raise ValueError(f"router_probs: expected shape (T, {n_experts}), got {tuple(router_probs.shape)}")
    require_ids("expert_index", expert_index, n_experts, "n_experts")
    index = expert_index if expert_index.dim() == 2 else expert_index.reshape(-1, 1)
    if expert_index.dim() not in (1, 2) or index.shape[0] != router_probs.shape[0]:
        raise ValueError(
            f"expert_index: expected shape ({router_probs.shape[0]},) or ({router_probs.shape[0]}, k), "
            f"got {tuple(expert_index.shape)}"
        )
    counts = torch.bincount(index.reshape(-1), minlength=n_experts).to(router_probs.dtype)
    f = counts / index.numel()
    p = router_probs.mean(dim=0)
    return n_experts * (f * p).sum()


class MoELayer(nn.Module):
    """A drop-in replacement for the MLP: E expert MLPs and a top-k router.

    ``forward(x (…, d_model)) -> (out (…, d_model), aux)`` where aux holds ``router_probs
    (T, E)``, ``expert_index (T, k)``, ``expert_weights (T, k)``, ``tokens_per_expert (E,)``
    (assignments routed to each expert), ``kept (T, k)`` (False where capacity dropped the
    assignment) and ``load_balancing_loss`` (scalar). Dispatch is batched: the tokens sent to
    an expert are gathered, processed in one call, scaled by their router weight and added
    back with ``index_add_``.

    ``capacity_factor``: None for no limit; otherwise each expert takes at most
    ``ceil(capacity_factor · T · k / E)`` assignments (T: every token of the input, computed
    exactly by :meth:`capacity`), filled in priority order (every token's first choice, in token
    order, then the second choices, …). A dropped assignment contributes 0 and the remaining
    weights are not renormalised; a token with every assignment dropped gets output 0, so
    inside a residual block it passes through unchanged.

    With ``return_aux=False`` forward returns only ``out`` and keeps aux in ``self.last_aux``
    (how :func:`moe_block` uses it). Chapter 8.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int | None,
        n_experts: int,
        top_k: int = 2,
        capacity_factor: float | None = None,
        activation: str = "gelu",
        bias: bool = True,
        return_aux: bool = True,
    ) -> None:
        super().__init__()
        if capacity_factor is not None:
            require_positive("capacity_factor", capacity_factor)
        self.router = Router(d_model, n_experts, top_k)
        self.experts = nn.ModuleList(MLP(d_model, d_ff, activation, bias) for _ in range(n_experts))
        self.d_model, self.n_experts, self.top_k = d_model, n_experts, top_k
        self.capacity_factor, self.return_aux = capacity_factor, return_aux
        self.last_aux: dict[str, Any] | None = None

    def capacity(self, n_tokens: int) -> int | None:
        """Maximum assignments per expert for ``n_tokens`` tokens (None: unlimited), computed
        exactly: the factor counts as the decimal it is written as (1.1 as 11/10), so
        ``ceil(1.1 · 100 · 2 / 4)`` is 55, where float arithmetic gives 55.00000000000001 and 56.
        ``forward`` passes every token of its input (b·n for ``(b, n, d_model)``). Chapter 8."""
        require_int("n_tokens", n_tokens)
        if self.capacity_factor is None:
            return None
        factor = Fraction(str(float(self.capacity_factor)))
        return math.ceil(factor * n_tokens * self.top_k / self.n_experts)

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, dict[str, Any]]:
        """``(…, d_model) -> (…, d_model)`` (and the aux dict). Chapter 8."""
        require_width("x", x, self.d_model)
        if x.numel() == 0:
            raise ValueError(f"x: expected at least one token, got shape {tuple(x.shape)}")
        flat = x.reshape(-1, self.d_model)
        n_tokens = flat.shape[0]
        weights, indices, probs = self.router(flat)
        # assignments in priority order: all first choices (token order), then second choices, ...
        expert_of = indices.T.reshape(-1)                                      # (k·T,)
        token_of = torch.arange(n_tokens, device=x.device).repeat(self.top_k)  # (k·T,)
        weight_of = weights.T.reshape(-1)                                      # (k·T,)
        one_hot = F.one_hot(expert_of, self.n_experts)                         # (k·T, E)
        slot = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1               # rank within its expert
        cap = self.capacity(n_tokens)
        keep = torch.ones_like(expert_of, dtype=torch.bool) if cap is None else slot < cap
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            sel = (expert_of == e) & keep
            if not sel.any():
                continue
            tokens = token_of[sel]
            y = expert(flat[tokens]) * weight_of[sel, None].to(flat.dtype)
            out.index_add_(0, tokens, y)
        aux = {
            "router_probs": probs,
            "expert_index": indices,
            "expert_weights": weights,
            "tokens_per_expert": one_hot.sum(dim=0),
            "kept": keep.reshape(self.top_k, n_tokens).T,
            "load_balancing_loss": load_balancing_loss(probs, indices, self.n_experts),
        }
        out = out.reshape(x.shape)
        self.last_aux = aux
        return (out, aux) if self.return_aux else out

    def param_counts(self) -> dict[str, int]:
        """Parameters: ``total``, ``active`` per token (router + k experts), ``router``, ``per_expert``. Chapter 8."""
        per_expert = sum(p.numel() for p in self.experts[0].parameters())
        router = sum(p.numel() for p in self.router.parameters())
        return {"total": router + self.n_experts * per_expert, "active": router + self.top_k * per_expert,
                "router": router, "per_expert": per_expert}

    def extra_repr(self) -> str:
        return f"capacity_factor={self.capacity_factor}, return_aux={self.return_aux}"


def moe_block(
    d_model: int,
    n_heads: int,
    n_experts: int,
    top_k: int = 2,
    d_ff: int | None = None,
    capacity_factor: float | None = None,
    **block_kwargs: Any,
) -> TransformerBlock:
    """A ``TransformerBlock`` whose ``mlp`` is a :class:`MoELayer` (``return_aux=False``).

    ``(batch, n, d_model) -> (batch, n, d_model)``; after a forward pass the router statistics
    and the balancing loss are in ``block.mlp.last_aux``. ``block_kwargs`` go to
    ``TransformerBlock`` (``activation`` and ``bias`` also to the experts). Chapter 8.
    """
    block = TransformerBlock(d_model, n_heads, d_ff, **block_kwargs)
    block.mlp = MoELayer(
        d_model, d_ff, n_experts, top_k, capacity_factor,
        activation=block_kwargs.get("activation", "gelu"), bias=block_kwargs.get("bias", True), return_aux=False,
    )
    return block


def moe_balancing_loss(model: nn.Module) -> Tensor:
    """Mean of the balancing losses of every :class:`MoELayer` in ``model`` -> scalar.

    Read from each layer's ``last_aux`` after a forward pass (a ``GPT`` built with
    ``n_experts`` holds one per block); add ``α ·`` this to the training loss.
    Differentiable through the routers. Chapter 8.
    """
    require_instance("model", model, nn.Module, "a torch.nn.Module")
    layers = [m for m in model.modules() if isinstance(m, MoELayer)]
    if not layers:
        raise ValueError("model: expected at least one MoELayer, got none")
    if any(m.last_aux is None for m in layers):
        raise ValueError("model: expected a forward pass before the balancing loss, got an MoELayer "
                         "that has not run")
    return torch.stack([m.last_aux["load_balancing_loss"] for m in layers]).mean()
