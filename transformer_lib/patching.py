"""Activation patching: a model's activations read by name, and replaced.

    run_with_cache(model, idx)              -> output, {name: activation}
    run_with_patch(model, idx, patches)     -> the output of a run with named activations replaced
    patch_each_head(model, idx, source, metric) -> a metric of one run per head patched, (L, h)

(`transformer_lib.attribution` splits the logits into what each component writes.)

The names are those of the model's hook points (`transformer_lib.hooks`), so `model` is any
module built from the library's blocks and attention layers: a `GPT` (output: logits
``(b, n, V)``), a `BertEncoder` (output: the last hidden states ``(b, n, d)``), a GPT with
mixture-of-experts blocks, or a model of one's own that holds `MultiHeadAttention` layers.
Names follow TransformerLens; for b sequences of n tokens, h heads of width d_k and width d,
layer l counted from 0:

    blocks.{l}.hook_resid_pre     (b, n, d)       the stream entering block l
    blocks.{l}.attn.hook_q        (b, n, h, d_k)  the queries (keys, values: hook_k, hook_v)
    blocks.{l}.attn.hook_scores   (b, h, n, n)    the scaled, masked scores
    blocks.{l}.attn.hook_pattern  (b, h, n, n)    each head's attention weights (query, key)
    blocks.{l}.attn.hook_z        (b, n, h, d_k)  each head's output, A V, before W_O
    blocks.{l}.attn.hook_result   (b, n, h, d)    each head's write: z times its d_k rows of W_O
    blocks.{l}.hook_attn_out      (b, n, d)       the attention's write, Σ_heads result + b_O
    blocks.{l}.hook_resid_mid     (b, n, d)       the stream between the two sub-layers
    blocks.{l}.hook_mlp_out       (b, n, d)       the MLP's write
    blocks.{l}.hook_resid_post    (b, n, d)       the stream leaving block l

In a post-norm model (BERT) ``resid_mid`` and ``resid_post`` are the states after the norm
that follows each addition. A run registers a function on each point it reads or patches and
calls the model's own ``forward``: there is one implementation of the block and of attention.
A layer whose q, k, v, scores or pattern is read or patched attends explicitly; so a run that
caches everything gives exactly the output of the model's explicit path (``fused=False``) and
that of its default, fused path up to float rounding (about 1e-7 in float32).
Chapters 4, 5 and 7.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from transformer_lib._checks import require_instance, require_tensor
from transformer_lib.bert import BertOutput
from transformer_lib.hooks import attached, hook_points
from transformer_lib.model import GPT

__all__ = ["Patch", "activation_names", "run_with_cache", "run_with_patch",
           "patch_each_head", "recovered_fraction"]


class Patch(NamedTuple):
    """Replace part of an activation by the same part of ``source`` (the activation's shape,
    usually from the cache of another run): the ``positions`` (an int, a list or a slice of
    the position axis; the query axis of a pattern) of the ``heads`` (an int or a list; only
    for names with a head axis). None means all of them. Chapters 5 and 7."""

    source: Tensor
    positions: int | Sequence[int] | slice | None = None
    heads: int | Sequence[int] | None = None


def activation_names(model: nn.Module) -> list[str]:
    """Every name a run can cache or patch, in the order of the forward pass.
    Chapter 5, through `patch_each_head`."""
    names = list(hook_points(model))
    if not names:
        raise TypeError(f"model: expected a model with hook points (a GPT, a BertEncoder or one "
                        f"built from MultiHeadAttention layers), got {type(model).__name__}")
    return names


# --------------------------------------------------------------------------- patches
def _axes(name: str) -> tuple[int, int | None]:
    """The position axis and the head axis (None without heads) of a named activation."""
    if name.endswith(("hook_pattern", "hook_scores")):
        return 2, 1
    return (1, 2) if name.endswith(("hook_q", "hook_k", "hook_v", "hook_z", "hook_result")) else (1, None)


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
    """A tensor replaces the activation, a `Patch` part of it, a function of the activation
    and the point's name maps it."""
    if isinstance(patch, Patch):
        new = _splice(name, patch, act)
    elif isinstance(patch, Tensor) or callable(patch):
        new = patch if isinstance(patch, Tensor) else patch(act, name)
    else:
        raise TypeError(f"patches[{name!r}]: expected a tensor, a Patch or a function, "
                        f"got {type(patch).__name__}")
    if not isinstance(new, Tensor) or new.shape != act.shape or new.dtype != act.dtype:
        got = (f"{tuple(new.shape)} {new.dtype}" if isinstance(new, Tensor)
               else type(new).__name__)
        raise ValueError(f"patches[{name!r}]: expected a tensor of shape {tuple(act.shape)} "
                         f"and dtype {act.dtype}, got {got}")
    return new


# --------------------------------------------------------------------------- the runs
def _run(model: nn.Module, idx: Tensor, patches: dict | None, cache: dict | None,
         names: Sequence[str] | Callable[[str], bool] | None, attention_mask: Tensor | None,
         token_type_ids: Tensor | None) -> Tensor:
    """The model's own forward with a function on every point patched or cached."""
    points = activation_names(model)
    patches = {} if patches is None else require_instance("patches", patches, dict, "a dict")
    unknown = sorted(set(patches) - set(points))
    if unknown:
        example = next((name for name in points if name.endswith("hook_z")), points[0])
        raise ValueError(f"patches: expected names of activation_names(model), such as "
                         f"{example!r}, got {unknown[:3]}")
    if cache is None or names is None:
        wanted = (lambda _: cache is not None)
    elif callable(names):
        wanted = names
    else:
        names = set(require_instance("names", names, (list, tuple, set), "a list of names or a function"))
        if names - set(points):
            raise ValueError(f"names: expected names of activation_names(model), got "
                             f"{sorted(names - set(points))[:3]}")
        wanted = names.__contains__

    def at(act: Tensor, name: str) -> Tensor:
        if name in patches:
            act = _apply(name, patches[name], act)
        if cache is not None and wanted(name):
            cache[name] = act
        return act

    inputs = {k: v for k, v in (("attention_mask", attention_mask),
                                ("token_type_ids", token_type_ids)) if v is not None}
    if isinstance(model, GPT):
        if inputs:
            raise ValueError("attention_mask, token_type_ids: expected None for a GPT, got a tensor")
        if require_tensor("idx", idx).dim() != 2:
            raise ValueError(f"idx: expected shape (batch, n), got {tuple(idx.shape)}")
    with attached(model, {name: at for name in points if name in patches or wanted(name)}):
        out = model(idx, **inputs)
    return out.last if isinstance(out, BertOutput) else out


def run_with_cache(model: nn.Module, idx: Tensor, patches: dict | None = None, *,
                   names: Sequence[str] | Callable[[str], bool] | None = None,
                   attention_mask: Tensor | None = None,
                   token_type_ids: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Run ``idx`` ``(b, n)`` and keep the named activations: ``-> (output, cache)``, the
    output as the model returns it (GPT: logits ``(b, n, V)``; BertEncoder: last hidden states
    ``(b, n, d)``, with ``attention_mask`` and ``token_type_ids`` as in its forward) and
    ``cache[name]`` with the shapes of the module docstring. ``names``: which activations to
    keep, a list of names or a function ``name -> bool`` (default all). With ``patches`` (as
    in `run_with_patch`) the cache holds the patched run's activations. Chapters 4, 5 and 7."""
    cache: dict[str, Tensor] = {}
    out = _run(model, idx, patches, cache, names, attention_mask, token_type_ids)
    return out, cache


def run_with_patch(model: nn.Module, idx: Tensor, patches: dict, *,
                   attention_mask: Tensor | None = None,
                   token_type_ids: Tensor | None = None) -> Tensor:
    """The model's output on ``idx`` ``(b, n)`` with named activations replaced:
    ``patches[name]`` is a tensor of the activation's shape (replaces it whole), a `Patch`
    (replaces some positions and heads by those of its source) or a function ``f(act, name)``
    of the activation and its name returning the new value (``lambda z, name: 0 * z`` ablates
    every head). Whatever reads the activation later in the pass reads the new value.
    Chapter 4."""
    require_instance("patches", patches, dict, "a dict")
    return _run(model, idx, patches, None, None, attention_mask, token_type_ids)


def patch_each_head(model: nn.Module, idx: Tensor, source: dict[str, Tensor],
                    metric: Callable[[Tensor, dict[str, Tensor]], float], positions: object = None,
                    layers: Sequence[int] | None = None, **inputs: Tensor | None) -> Tensor:
    """One run per head: head h of attention layer l (the l-th ``hook_z`` of the model) takes
    its output ``hook_z`` (at ``positions``, default all) from ``source`` (the cache of another
    run), everything else is the run's own; returns ``metric(output, cache)`` of each run,
    ``(len(layers), h)`` (default all L layers). ``inputs`` are ``attention_mask`` and
    ``token_type_ids`` for a BertEncoder. Chapter 5."""
    z_names = [name for name in activation_names(model) if name.endswith("hook_z")]
    layers = range(len(z_names)) if layers is None else layers
    n_heads = model.get_submodule(z_names[0].removesuffix(".hook_z")).n_heads
    out = torch.empty(len(layers), n_heads, dtype=torch.float64)
    for row, l in enumerate(layers):
        name = z_names[l]
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
