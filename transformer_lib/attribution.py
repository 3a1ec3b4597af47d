"""Direct logit attribution: the logits split into what each component of a GPT writes.

In a pre-norm GPT with residuals the last state of the stream is a sum of writes: the
embedding, every head's output times its rows of W_O, every attention's output bias b_O and
every MLP's output. The final norm is not linear, but with its scale σ (the standard
deviation, or the root mean square, of that last state) frozen at its value in the run it
is: ``LN(Σ c) = Σ γ ⊙ (c − mean c)/σ + β``. Pushed through the unembedding, each write gives
its share of a token's logit, and the shares add up to the logit. The activations come from
`transformer_lib.patching.run_with_cache`. Chapters 4 and 7.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from transformer_lib._checks import require_instance, require_tensor
from transformer_lib.block import LayerNorm, RMSNorm
from transformer_lib.model import GPT

__all__ = ["Attribution", "direct_logit_attribution"]


class Attribution(NamedTuple):
    """``labels``: c components (``"embed"``, ``"L{l}H{h}"`` for each head, ``"L{l} b_O"``,
    ``"L{l} MLP"``, ``"norm_f bias"``); ``values`` ``(c, b, n)``: each component's direct
    contribution to the logit of the given token at every position. ``values.sum(0)`` is
    that logit. Chapter 4, through `direct_logit_attribution`."""

    labels: list[str]
    values: Tensor


def _frozen_norm(norm: nn.Module, final: Tensor) -> Callable[[Tensor], Tensor]:
    """The final norm as a linear map, its scale taken from the state ``final`` ``(b, n, d)``
    it read: ``(b, n, …, d) -> (b, n, …, d)``, without the norm's bias."""
    if isinstance(norm, nn.Identity):
        return lambda c: c
    if isinstance(norm, LayerNorm):
        scale = torch.sqrt(final.var(dim=-1, unbiased=False) + norm.eps)            # (b, n)
        centre = True
    elif isinstance(norm, RMSNorm):
        scale, centre = torch.sqrt((final * final).mean(dim=-1) + norm.eps), False
    else:
        raise TypeError(f"model.norm_f: expected a LayerNorm, an RMSNorm or none, "
                        f"got {type(norm).__name__}")

    def read(c: Tensor) -> Tensor:
        c = c - c.mean(dim=-1, keepdim=True) if centre else c
        return c / scale.view(*scale.shape, *[1] * (c.ndim - 2)) * norm.weight
    return read


def direct_logit_attribution(cache: dict[str, Tensor], model: nn.Module,
                             token_ids: Tensor) -> Attribution:
    """Each component's direct contribution to the logit of ``token_ids`` ``(b, n)`` at every
    position, from a `run_with_cache` cache of a pre-norm `GPT` with residuals. The final state
    is the sum of the embedding, every head's write, every attention bias b_O and every MLP's
    write; with the final norm's scale frozen at its value in that run the norm is linear, so
    component c contributes ``W_U[t] · (γ ⊙ (c − mean c) / σ)`` (no centring for RMSNorm) and
    the norm's bias ``W_U[t] · β``: the values sum to the logits. Chapter 4."""
    require_instance("model", model, GPT, "a GPT")
    if not (model.config.norm_first and model.residual):
        raise ValueError("model: expected a pre-norm GPT with residuals (the stream is then a "
                         f"sum of writes), got norm_first={model.config.norm_first}, "
                         f"residual={model.residual}")
    L = model.config.n_layers
    missing = [k for k in ("blocks.0.hook_resid_pre", f"blocks.{L - 1}.hook_resid_post")
               if k not in require_instance("cache", cache, dict, "a dict")]
    if missing:
        raise ValueError(f"cache: expected the cache of run_with_cache(model, …), missing {missing}")
    final = cache[f"blocks.{L - 1}.hook_resid_post"]                             # (b, n, d)
    require_tensor("token_ids", token_ids)
    if token_ids.shape != final.shape[:2] or token_ids.dtype != torch.long:
        raise ValueError(f"token_ids: expected integer ids of shape {tuple(final.shape[:2])} "
                         f"(the cached batch), got {tuple(token_ids.shape)} {token_ids.dtype}")
    unembed = model.lm_head.weight[token_ids]                                    # (b, n, d)
    read = _frozen_norm(model.norm_f, final)

    def logit(c: Tensor) -> Tensor:         # (b, n, d) -> (b, n); (b, n, h, d) -> (b, n, h)
        return (read(c) * (unembed if c.ndim == 3 else unembed[:, :, None])).sum(-1)

    labels, parts = ["embed"], [logit(cache["blocks.0.hook_resid_pre"])]
    for l, block in enumerate(model.blocks):
        labels += [f"L{l}H{h}" for h in range(block.attn.n_heads)]
        parts += list(logit(cache[f"blocks.{l}.attn.hook_result"]).unbind(-1))
        if block.attn.out_proj.bias is not None:
            labels.append(f"L{l} b_O")
            parts.append(logit(block.attn.out_proj.bias.expand_as(final)))
        labels.append(f"L{l} MLP")
        parts.append(logit(cache[f"blocks.{l}.hook_mlp_out"]))
    beta = getattr(model.norm_f, "bias", None)
    if beta is not None:
        labels.append("norm_f bias")
        parts.append((beta * unembed).sum(-1))
    return Attribution(labels, torch.stack(parts))
