"""Activation patching: a model's activations read by name, and replaced.

    run_with_cache(model, idx)              -> output, {name: activation}
    run_with_patch(model, idx, patches)     -> the output of a run with named activations replaced
    patch_each_head(model, idx, source, metric) -> a metric of one run per head patched, (L, h)

(`transformer_lib.attribution` splits the logits into what each component writes.)

`model` is a `GPT` (output: logits ``(b, n, V)``) or a `BertEncoder` (output: the last hidden
states ``(b, n, d)``). Names follow TransformerLens; for b sequences of n tokens, h heads of
width d_k and width d, layer l counted from 0:

    blocks.{l}.hook_resid_pre     (b, n, d)       the stream entering block l
    blocks.{l}.attn.hook_pattern  (b, h, n, n)    each head's attention weights (query, key)
    blocks.{l}.attn.hook_z        (b, n, h, d_k)  each head's output, A V, before W_O
    blocks.{l}.attn.hook_result   (b, n, h, d)    each head's write: z times its d_k rows of W_O
    blocks.{l}.hook_attn_out      (b, n, d)       the attention's write, Σ_heads result + b_O
    blocks.{l}.hook_resid_mid     (b, n, d)       the stream between the two sub-layers
    blocks.{l}.hook_mlp_out       (b, n, d)       the MLP's write
    blocks.{l}.hook_resid_post    (b, n, d)       the stream leaving block l

In a post-norm model (BERT) ``resid_mid`` and ``resid_post`` are the states after the norm
that follows each addition. The runs go through the model's own modules in the order of its
forward pass (`GPT.embed`, `MultiHeadAttention.project`, the norms, the MLP) and stop at each
name; `GPT.forward` itself carries no hooks, so a model used without them pays nothing.
The runs attend explicitly (they need each head's output), so without patches a run gives
exactly the output of the model's explicit path (`MultiHeadAttention.fused = False`) and the
output of its default, fused path up to float rounding (about 1e-7 in float32).
Chapters 4, 5 and 7.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from transformer_lib._checks import require_instance, require_tensor
from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.bert import BertEncoder, key_mask
from transformer_lib.model import GPT

__all__ = ["LAYER_NAMES", "Patch", "activation_names", "run_with_cache", "run_with_patch",
           "patch_each_head", "recovered_fraction"]

LAYER_NAMES = ("hook_resid_pre", "attn.hook_pattern", "attn.hook_z", "attn.hook_result",
               "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")


class Patch(NamedTuple):
    """Replace part of an activation by the same part of ``source`` (the activation's shape,
    usually from the cache of another run): the ``positions`` (an int, a list or a slice of
    the position axis; the query axis of a pattern) of the ``heads`` (an int or a list; only
    for names with a head axis). None means all of them. Chapters 5 and 7."""

    source: Tensor
    positions: int | Sequence[int] | slice | None = None
    heads: int | Sequence[int] | None = None


def activation_names(model: nn.Module) -> list[str]:
    """Every name a run can cache or patch, layer by layer. Chapters 4, 5 and 7."""
    _check_model(model)
    return [f"blocks.{l}.{name}" for l in range(len(model.blocks)) for name in LAYER_NAMES]


def _check_model(model: object) -> None:
    require_instance("model", model, (GPT, BertEncoder), "a GPT or a BertEncoder")


# --------------------------------------------------------------------------- patches
def _axes(name: str) -> tuple[int, int | None]:
    """The position axis and the head axis (None without heads) of a named activation."""
    if name.endswith("hook_pattern"):
        return 2, 1
    return (1, 2) if name.endswith(("hook_z", "hook_result")) else (1, None)


def _axis_mask(name: str, field: str, index: object, size: int, axis: int, ndim: int) -> Tensor:
    """True at the chosen indices of one axis, shaped to broadcast over the activation."""
    keep = torch.zeros(size, dtype=torch.bool)
    try:
        keep[slice(None) if index is None else index] = True
    except (IndexError, TypeError) as err:
        raise ValueError(f"patches[{name!r}].{field}: expected indices below {size} (an int, a "
                         f"list or a slice), got {index!r}") from err
    return keep.view([size if a == axis else 1 for a in range(ndim)])


def _splice(name: str, patch: Patch, act: Tensor) -> Tensor:
    """The activation with the positions and heads ``patch`` names taken from its source."""
    source = require_tensor(f"patches[{name!r}].source", patch.source)
    if source.shape != act.shape:
        raise ValueError(f"patches[{name!r}].source: expected shape {tuple(act.shape)}, "
                         f"got {tuple(source.shape)}")
    pos_axis, head_axis = _axes(name)
    where = _axis_mask(name, "positions", patch.positions, act.shape[pos_axis], pos_axis, act.ndim)
    if patch.heads is not None:
        if head_axis is None:
            raise ValueError(f"patches[{name!r}].heads: expected None ({name} has no head "
                             f"axis), got {patch.heads!r}")
        where = where & _axis_mask(name, "heads", patch.heads, act.shape[head_axis], head_axis,
                                   act.ndim)
    return torch.where(where, source, act)


def _apply(name: str, patch: object, act: Tensor) -> Tensor:
    """A tensor replaces the activation, a `Patch` part of it, a function maps it."""
    if isinstance(patch, Patch):
        new = _splice(name, patch, act)
    elif isinstance(patch, Tensor) or callable(patch):
        new = patch if isinstance(patch, Tensor) else patch(act)
    else:
        raise TypeError(f"patches[{name!r}]: expected a tensor, a Patch or a function, "
                        f"got {type(patch).__name__}")
    if not isinstance(new, Tensor) or new.shape != act.shape or new.dtype != act.dtype:
        got = (f"{tuple(new.shape)} {new.dtype}" if isinstance(new, Tensor)
               else type(new).__name__)
        raise ValueError(f"patches[{name!r}]: expected a tensor of shape {tuple(act.shape)} "
                         f"and dtype {act.dtype}, got {got}")
    return new


class _Hooks:
    """What a run does at each name: replace (patches), then record (cache)."""

    def __init__(self, patches: dict, cache: dict | None) -> None:
        self.patches, self.cache = patches, cache

    def wants(self, name: str) -> bool:
        return self.cache is not None or name in self.patches

    def __call__(self, name: str, act: Tensor) -> Tensor:
        if name in self.patches:
            act = _apply(name, self.patches[name], act)
        if self.cache is not None:
            self.cache[name] = act
        return act


# --------------------------------------------------------------------------- the runs
def _attention(attn: nn.Module, x: Tensor, hooks: _Hooks, at: str, mask: Tensor | None,
               positions: Tensor | None) -> Tensor:
    """`MultiHeadAttention.forward` with names: ``(b, n, d) -> (b, n, d)``."""
    q, k, v, mask, bias = attn.project(x, mask=mask, positions=positions)
    z, pattern = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)  # (b, h, n, d_k)
    if hooks.wants(at + "hook_pattern"):
        new = hooks(at + "hook_pattern", pattern)
        z = z if new is pattern else new @ v
    z = hooks(at + "hook_z", z.transpose(1, 2))                                # (b, n, h, d_k)
    if not hooks.wants(at + "hook_result"):
        return attn.out_proj(z.flatten(2))
    w_o = attn.out_proj.weight.T.reshape(attn.n_heads, attn.d_k, attn.d_model)  # (h, d_k, d)
    result = hooks(at + "hook_result", torch.einsum("bnhk,hkd->bnhd", z, w_o))
    if at + "hook_result" not in hooks.patches:
        return attn.out_proj(z.flatten(2))                # the model's own sum, bit for bit
    b_o = attn.out_proj.bias
    return result.sum(2) + (0.0 if b_o is None else b_o)


def _block(block: nn.Module, x: Tensor, hooks: _Hooks, at: str, mask: Tensor | None,
           positions: Tensor | None) -> Tensor:
    """`TransformerBlock.forward` (pre- or post-norm) with names: ``(b, n, d) -> (b, n, d)``."""
    skip = (lambda h: h) if block.residual else torch.zeros_like
    x = hooks(at + "hook_resid_pre", x)
    a = _attention(block.attn, block.norm1(x) if block.norm_first else x, hooks, at + "attn.",
                   mask, positions)
    a = hooks(at + "hook_attn_out", a)
    if block.norm_first:
        mid = hooks(at + "hook_resid_mid", skip(x) + a)
        m = hooks(at + "hook_mlp_out", block.mlp(block.norm2(mid)))
        return hooks(at + "hook_resid_post", skip(mid) + m)
    mid = hooks(at + "hook_resid_mid", block.norm1(skip(x) + a))
    m = hooks(at + "hook_mlp_out", block.mlp(mid))
    return hooks(at + "hook_resid_post", block.norm2(skip(mid) + m))


def _run(model: nn.Module, idx: Tensor, patches: dict | None, cache: dict | None,
         attention_mask: Tensor | None, token_type_ids: Tensor | None) -> Tensor:
    _check_model(model)
    patches = {} if patches is None else require_instance("patches", patches, dict, "a dict")
    unknown = sorted(set(patches) - set(activation_names(model)))
    if unknown:
        raise ValueError(f"patches: expected names of activation_names(model), such as "
                         f"'blocks.0.attn.hook_z', got {unknown[:3]}")
    hooks, mask, positions = _Hooks(patches, cache), None, None
    if isinstance(model, GPT):
        if attention_mask is not None or token_type_ids is not None:
            raise ValueError("attention_mask, token_type_ids: expected None for a GPT, got a tensor")
        idx, unbatched, positions = model._inputs(idx, None, None)
        if unbatched:
            raise ValueError(f"idx: expected shape (batch, n), got {tuple(idx.shape[1:])}")
        x = model.embed(idx, positions)
    else:
        x = model.embed(idx, token_type_ids)
        mask = key_mask(attention_mask, idx)
    for l, block in enumerate(model.blocks):
        x = _block(block, x, hooks, f"blocks.{l}.", mask, positions)
    return model.lm_head(model.norm_f(x)) if isinstance(model, GPT) else x


def run_with_cache(model: nn.Module, idx: Tensor, patches: dict | None = None, *,
                   attention_mask: Tensor | None = None,
                   token_type_ids: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Run ``idx`` ``(b, n)`` and keep every named activation: ``-> (output, cache)``, the
    output as the model returns it (GPT: logits ``(b, n, V)``; BertEncoder: last hidden states
    ``(b, n, d)``, with ``attention_mask`` and ``token_type_ids`` as in its forward) and
    ``cache[name]`` with the shapes of the module docstring. With ``patches`` (as in
    `run_with_patch`) the cache holds the patched run's activations. Chapters 4, 5 and 7."""
    cache: dict[str, Tensor] = {}
    out = _run(model, idx, patches, cache, attention_mask, token_type_ids)
    return out, cache


def run_with_patch(model: nn.Module, idx: Tensor, patches: dict, *,
                   attention_mask: Tensor | None = None,
                   token_type_ids: Tensor | None = None) -> Tensor:
    """The model's output on ``idx`` ``(b, n)`` with named activations replaced:
    ``patches[name]`` is a tensor of the activation's shape (replaces it whole), a `Patch`
    (replaces some positions and heads by those of its source) or a function of the
    activation returning its new value (``lambda z: 0 * z`` ablates every head). Whatever
    reads the activation later in the pass reads the new value. Chapters 5 and 7."""
    require_instance("patches", patches, dict, "a dict")
    return _run(model, idx, patches, None, attention_mask, token_type_ids)


def patch_each_head(model: nn.Module, idx: Tensor, source: dict[str, Tensor],
                    metric: Callable[[Tensor, dict[str, Tensor]], float], positions: object = None,
                    layers: Sequence[int] | None = None, **inputs: Tensor | None) -> Tensor:
    """One run per head: head h of layer l takes its output ``hook_z`` (at ``positions``,
    default all) from ``source`` (the cache of another run), everything else is the run's
    own; returns ``metric(output, cache)`` of each run, ``(len(layers), h)`` (default all
    L layers). ``inputs`` are ``attention_mask`` and ``token_type_ids`` for a BertEncoder.
    Chapters 5 and 7."""
    _check_model(model)
    layers = range(len(model.blocks)) if layers is None else layers
    out = torch.empty(len(layers), model.blocks[0].attn.n_heads, dtype=torch.float64)
    for row, l in enumerate(layers):
        name = f"blocks.{l}.attn.hook_z"
        if name not in source:
            raise ValueError(f"source: expected a cache with {name!r} (from run_with_cache), "
                             f"got keys {sorted(source)[:3]}")
        for h in range(out.shape[1]):
            patch = {name: Patch(source[name], positions=positions, heads=h)}
            out[row, h] = float(metric(*run_with_cache(model, idx, patch, **inputs)))
    return out


def recovered_fraction(clean: Tensor | float, corrupted: Tensor | float,
                       patched: Tensor | float) -> Tensor:
    """How much of the way from the corrupted run back to the clean one a patch brings a
    metric: ``(patched − corrupted) / (clean − corrupted)``, 1 for the clean value, 0 for the
    corrupted one; ``(…), (…), (…) -> (…)``, shapes broadcast. Chapters 5 and 7."""
    clean, corrupted, patched = (torch.as_tensor(t, dtype=torch.float64)
                                 for t in (clean, corrupted, patched))
    if bool((clean == corrupted).any()):
        raise ValueError("clean, corrupted: expected metrics that differ (the fraction divides "
                         "by clean − corrupted), got equal values")
    return (patched - corrupted) / (clean - corrupted)
