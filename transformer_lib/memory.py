"""Peak tensor memory of a function call, measured from the tensors torch actually creates.

``tracemalloc`` does not see torch's allocations, a process's resident size moves with the
allocator's caching, and the profiler's CPU memory events did not add up to a consistent running
total when we tried them. This module watches every operator call through a
``TorchDispatchMode``: each tensor an operator
returns is charged the bytes of its storage when that storage is new, and released when the
last tensor viewing it is garbage-collected. The running total is the memory held by live
tensors; its maximum over the call is the peak. Scratch space that a single fused kernel
allocates and frees internally (e.g. inside ``F.scaled_dot_product_attention``) is invisible
to it; everything a Python-level algorithm materialises is counted.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch import Tensor

from transformer_lib._torch_state import EagerDispatchMode

__all__ = ["peak_memory"]


def _tensors(obj: Any) -> list[Tensor]:
    """The tensors in ``obj``, a tensor or (nested) tuples, lists and dicts of them and other values."""
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in _tensors(item)]
    return []


class _LiveBytes(EagerDispatchMode):
    """Running and peak bytes of the storages created while the mode is active. Chapter 9."""

    def __init__(self, external: set[int]) -> None:
        super().__init__()
        self.external = external  # storages that existed before (inputs): never charged
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, tensors viewing it]
        self.now = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[key]

    def _track(self, t: Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.external or storage.nbytes() == 0:
            return
        if key not in self.live:
            self.live[key] = [storage.nbytes(), 0]
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
        self.live[key][1] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in _tensors(out):
            if t.device.type != "meta":
                self._track(t)
        return out


def peak_memory(fn: Callable[..., Any], *args: Any, exclude_output: bool = True,
                **kwargs: Any) -> int:
    """Peak bytes of the tensors alive at once while ``fn(*args, **kwargs)`` runs (no grad).

    The tensors passed in are not counted; with ``exclude_output`` the bytes of the returned
    tensors are subtracted, leaving the working memory: for attention ``(…, n, d) -> (…, n, d)``
    the intermediates (scores, weights, tiles) beyond the unavoidable output. Chapter 9.
    """
    external = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
    with torch.no_grad():
        mode = _LiveBytes(external)
        with mode:
            out = fn(*args, **kwargs)
    peak = mode.peak
    if exclude_output:
        seen: set[int] = set()
        for t in _tensors(out):
            if t.untyped_storage().data_ptr() not in seen | external:
                seen.add(t.untyped_storage().data_ptr())
                peak -= t.untyped_storage().nbytes()
    return peak
