"""Named hook points: places in a forward pass where an activation can be read or replaced.

A ``HookPoint`` is an identity module, ``hook(x) is x``. The block owns
``hook_resid_pre``, ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out`` and
``hook_resid_post``; the attention owns ``hook_q``, ``hook_k``, ``hook_v``, ``hook_scores``,
``hook_pattern``, ``hook_z`` and ``hook_result`` (the names of TransformerLens). A point's name
is its path in the model, ``blocks.0.attn.hook_z``. Nothing is registered on a point unless a
run asks for it (``transformer_lib.patching``); a point with nothing registered returns its
input without the machinery of a module call, so a model used without hooks pays nothing. ``attached`` registers functions on points by name for the length
of a ``with`` block; each function receives the activation and the point's name and returns
the activation's new value, or None to leave it. Chapter 4.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from torch import Tensor, nn

from transformer_lib._checks import require_instance

__all__ = ["HookPoint", "hook_points", "attached"]

HookFn = Callable[[Tensor, str], "Tensor | None"]


class HookPoint(nn.Module):
    """An identity with a name, where a run can read or replace an activation:
    ``(…) -> (…)``, the same tensor. ``name`` is set by `hook_points` (the module's path).
    Chapter 4."""

    def __init__(self) -> None:
        super().__init__()
        self.name: str | None = None

    @property
    def active(self) -> bool:
        """True while a function is registered on the point. Library: no chapter names it."""
        return bool(self._forward_hooks)

    def __call__(self, x: Tensor) -> Tensor:
        # with nothing registered a point is a plain identity, not a module call (a few
        # microseconds each, dozens per forward pass): a model without hooks pays nothing
        return super().__call__(x) if self._forward_hooks else x

    def forward(self, x: Tensor) -> Tensor:
        """The activation itself: ``(…) -> (…)``. Chapter 4."""
        return x


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` by its path, in the order of the forward pass
    (``{"blocks.0.hook_resid_pre": …, "blocks.0.attn.hook_q": …, …}``). Chapter 4, through `HookPoint`."""
    require_instance("model", model, nn.Module, "a torch.nn.Module")
    points = {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}
    for name, point in points.items():
        point.name = name
    return points


@contextmanager
def attached(model: nn.Module, fns: Mapping[str, HookFn]) -> Iterator[dict[str, HookPoint]]:
    """For the length of the ``with`` block, ``fns[name](activation, name)`` runs at each named
    point of ``model`` and its result (unless None) replaces the activation; the functions are
    removed afterwards, also on an error. Yields `hook_points(model)`. Chapter 4, through
    `run_with_cache`."""
    points = hook_points(model)
    unknown = sorted(set(fns) - set(points))
    if unknown:
        raise ValueError(f"names: expected hook points of the model, such as "
                         f"{next(iter(points), 'none')!r}, got {unknown[:3]}")
    handles = [points[name].register_forward_hook(
        lambda _module, _args, out, fn=fn, name=name: fn(out, name)) for name, fn in fns.items()]
    try:
        yield points
    finally:
        for handle in handles:
            handle.remove()
