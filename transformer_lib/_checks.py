"""Input checks shared by the library's public functions.

Every check raises with a message ``"name: expected …, got …"`` that names the argument,
what was expected and what was passed: ``TypeError`` for the wrong kind of object (a float
where an int belongs, a list where a tensor belongs, a float mask), ``ValueError`` for the
right kind with a wrong value or shape. ``bool`` is never accepted as a number.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

ID_DTYPES = (torch.long, torch.int32)  # what nn.Embedding and integer indexing accept


def require_instance(name: str, value: object, cls: type | tuple[type, ...], what: str) -> Any:
    """``value`` if it is an instance of ``cls`` (described as ``what``); else ``TypeError``."""
    if not isinstance(value, cls):
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__}")
    return value


def require_tensor(name: str, x: object) -> Tensor:
    """``x`` itself if it is a ``torch.Tensor``; else ``TypeError``."""
    return require_instance(name, x, Tensor, "a torch.Tensor")


def require_int(name: str, value: object, low: int = 1) -> int:
    """``value`` if it is an int ``>= low`` (bool rejected); else ``TypeError``/``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} ({value!r})")
    if value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value}")
    return value


def require_query_block(n: int, m: int) -> None:
    """``m >= n``: n queries are the last n of m positions (bottom-right alignment)."""
    if m < n:
        raise ValueError(f"m: expected m >= n={n} (the n queries are the last n of m positions; "
                         f"m < n would leave the first queries no key), got m={m}")


def require_positive(name: str, value: object, allow_zero: bool = False) -> float:
    """``value`` if it is a finite real number ``> 0`` (``>= 0`` with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} ({value!r})")
    if not (math.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        raise ValueError(f"{name}: expected a finite number {'>=' if allow_zero else '>'} 0, "
                         f"got {value!r}")
    return value


def require_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool; else ``TypeError`` (``'yes'`` and ``1`` are not flags)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} ({value!r})")
    return value


def require_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``; else ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def require_width(name: str, x: object, d: int, label: str = "d_model") -> Tensor:
    """A tensor ``(…, d)``; else ``TypeError``/``ValueError`` showing the shape."""
    require_tensor(name, x)
    if x.ndim < 1 or x.shape[-1] != d:
        raise ValueError(f"{name}: expected shape (…, {label}={d}), got {tuple(x.shape)}")
    return x


def broadcast_shapes(*shapes: Sequence[int]) -> torch.Size:
    """The shape ``shapes`` broadcast to, as ``torch.broadcast_shapes`` gives it (which imports
    sympy on first use, most of a second per process); ``RuntimeError`` if they do not broadcast."""
    out = []
    for dims in itertools.zip_longest(*(reversed(tuple(s)) for s in shapes), fillvalue=1):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise RuntimeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return torch.Size(reversed(out))


def require_broadcastable(name: str, x: Tensor, target: Sequence[int]) -> Tensor:
    """A tensor that broadcasts to exactly ``target`` (it may not enlarge it)."""
    target = torch.Size(target)
    try:
        ok = broadcast_shapes(x.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name}: expected a shape broadcastable to {tuple(target)}, "
                         f"got {tuple(x.shape)}")
    return x


def require_mask(name: str, mask: object, target: Sequence[int]) -> Tensor:
    """A boolean tensor (True = may attend) that broadcasts to ``target``."""
    require_tensor(name, mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name}: expected dtype torch.bool (True = may attend), got {mask.dtype}")
    return require_broadcastable(name, mask, target)


def require_ids(name: str, ids: object, n: int, label: str | None = None) -> Tensor:
    """A non-empty torch.long/torch.int32 tensor with values in ``[0, n)``.

    ``label`` names the bound in the message (``"vocab_size"`` -> ``[0, vocab_size=23)``).
    """
    require_tensor(name, ids)
    if ids.dtype not in ID_DTYPES:
        raise TypeError(f"{name}: expected an integer dtype (torch.long or torch.int32), "
                        f"got {ids.dtype}")
    if ids.numel() == 0:
        raise ValueError(f"{name}: expected at least one id, got shape {tuple(ids.shape)}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= n:
        bound = f"{label}={n}" if label else str(n)
        raise ValueError(f"{name}: expected values in [0, {bound}), got min {lo} and max {hi}")
    return ids


def require_positions(name: str, positions: object, batch: int, n: int) -> Tensor:
    """Integer positions ``>= 0`` of shape ``(n,)``, ``(1, n)`` or ``(batch, n)``, returned
    as ``(batch, n)`` (one row of positions per sequence, like Hugging Face's position_ids)."""
    require_tensor(name, positions)
    if positions.dtype not in ID_DTYPES:
        raise TypeError(f"{name}: expected an integer dtype (torch.long or torch.int32), "
                        f"got {positions.dtype}")
    if tuple(positions.shape) not in ((n,), (1, n), (batch, n)):
        raise ValueError(f"{name}: expected shape (batch, n) = ({batch}, {n}) or (n,) = ({n},), "
                         f"got {tuple(positions.shape)}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"{name}: expected values >= 0, got min {int(positions.min())}")
    return positions.reshape(-1, n).expand(batch, n)


def require_lead_broadcast(name: str, x: Tensor, lead: Sequence[int], other: str) -> torch.Size:
    """The leading dims ``x.shape[:-2]`` broadcast with ``lead`` (those of ``other``);
    returns the broadcast leading dims."""
    try:
        return broadcast_shapes(lead, x.shape[:-2])
    except RuntimeError:
        raise ValueError(f"{name}: expected leading dims that broadcast with {tuple(lead)} "
                         f"(those of {other}), got {tuple(x.shape[:-2])}") from None
