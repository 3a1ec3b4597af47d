"""Positional information: sinusoidal, learned, rotary (RoPE) and ALiBi.

Attention by itself is permutation-equivariant; the functions here inject the order of
the tokens, either into the inputs (sinusoidal, learned), into queries and keys (RoPE),
or into the attention scores (ALiBi).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer_lib._checks import (broadcast_shapes, require_bool, require_ids, require_int, require_positive,
                                     require_query_block, require_tensor)

__all__ = [
    "sinusoidal_encoding",
    "LearnedPositionalEmbedding",
    "rope_angles",
    "rope_cos_sin",
    "rotate_half",
    "apply_rope",
    "alibi_slopes",
    "alibi_bias",
    "alibi_bias_at",
]


def sinusoidal_encoding(n: int, d: int, base: float = 10000.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """Fixed sinusoidal encodings ``() -> (n, d)``.

    ``p[i, 2k] = sin(i / base^(2k/d))`` and ``p[i, 2k+1] = cos(i / base^(2k/d))``: each pair of
    columns is a clock turning at its own frequency, fast in the first columns and slow in
    the last ones. No parameters; any ``n``. Chapter 6.
    """
    require_int("n", n)
    require_int("d", d)
    require_positive("base", base)
    pos = torch.arange(n, dtype=torch.float64)[:, None]                  # (n, 1)
    two_k = torch.arange(0, d, 2, dtype=torch.float64)                     # (ceil(d/2),)
    angle = pos / base ** (two_k / d)                                      # (n, ceil(d/2))
    p = torch.empty(n, d, dtype=torch.float64)
    p[:, 0::2] = torch.sin(angle)
    p[:, 1::2] = torch.cos(angle[:, : d // 2])
    return p.to(dtype)


class LearnedPositionalEmbedding(nn.Module):
    """A trained vector per position, as in BERT and GPT-2: ``weight`` of shape ``(n_ctx, d)``.

    ``forward(n)`` returns the first n rows ``(n, d)``; ``forward(positions)`` with an integer
    tensor ``(…,)`` returns ``(…, d)``. Positions at or past ``n_ctx`` have no vector, which
    is why learned embeddings cannot extrapolate. Chapter 6.
    """

    def __init__(self, n_ctx: int, d: int, init_std: float = 0.02) -> None:
        super().__init__()
        require_int("n_ctx", n_ctx)
        require_int("d", d)
        self.n_ctx, self.d = n_ctx, d
        self.weight = nn.Parameter(torch.randn(n_ctx, d) * init_std)

    def forward(self, positions: int | Tensor) -> Tensor:
        """``n`` -> ``(n, d)``, or integer positions ``(…,)`` -> ``(…, d)``. Chapter 6."""
        if isinstance(positions, int):
            require_int("n", positions)
            if positions > self.n_ctx:
                raise ValueError(f"n: expected at most n_ctx={self.n_ctx} positions, got {positions}")
            return self.weight[:positions]
        return self.weight[require_ids("positions", positions, self.n_ctx, "n_ctx")]

    def extra_repr(self) -> str:
        return f"n_ctx={self.n_ctx}, d={self.d}"


def _positions(positions: int | Tensor | None, lead: torch.Size, device: torch.device | None) -> Tensor:
    """None -> arange(n); int offset t -> arange(t, t + n); tensor (…, n) broadcastable to
    ``lead`` = x's ``(…, n)`` -> itself (float64)."""
    n = lead[-1]
    if positions is None:
        return torch.arange(n, dtype=torch.float64, device=device)
    if isinstance(positions, int):
        t = require_int("positions", positions, low=0)
        return torch.arange(t, t + n, dtype=torch.float64, device=device)
    positions = torch.as_tensor(positions, device=device)
    try:
        ok = positions.dim() >= 1 and broadcast_shapes(positions.shape, lead) == lead
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"positions: expected shape ({n},) or one broadcastable to x's (…, n) = "
                         f"{tuple(lead)}, got {tuple(positions.shape)}")
    return positions.to(torch.float64)


def rope_angles(positions: Tensor, d: int, base: float = 10000.0) -> Tensor:
    """Rotation angles ``(…,) -> (…, d/2)``: ``θ[…, k] = positions[…] / base^(2k/d)``. Chapter 6, through `apply_rope`."""
    require_tensor("positions", positions)
    if require_int("d", d) % 2:
        raise ValueError(f"d: expected an even dimension for RoPE, got {d}")
    require_positive("base", base)
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
    return positions.to(torch.float64)[..., None] * inv_freq


def rope_cos_sin(
    positions: Tensor, d: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """``cos, sin`` of shape ``(…,) -> (…, d)``, each angle repeated for dims k and k + d/2
    (LLaMA layout). Computed in float64, returned in ``dtype``. Library: no chapter names it.
    """
    theta = rope_angles(positions, d, base)
    emb = torch.cat([theta, theta], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _require_pairs(x: object) -> Tensor:
    """A tensor ``(…, d)`` with d even: RoPE rotates pairs of dimensions. Chapter 6."""
    require_tensor("x", x)
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"x: expected an even last dimension d for RoPE, got shape {tuple(x.shape)}")
    return x


def rotate_half(x: Tensor) -> Tensor:
    """``(…, d) -> (…, d)``: ``[x1, x2] -> [-x2, x1]`` with x1, x2 the two halves. Chapter 6."""
    half = _require_pairs(x).shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(
    x: Tensor, positions: int | Tensor | None = None, base: float = 10000.0, interleaved: bool = False
) -> Tensor:
    """Rotary position embedding ``(…, n, d) -> (…, n, d)``.

    The d features of the vector at position p form d/2 pairs; pair k is rotated by the
    angle ``p / base^(2k/d)``. Applied to queries and keys, the score ``q_mᵀ k_n`` then
    depends on positions only through ``m − n``. Two pairings are in use:

    - ``interleaved=False`` (default): pairs ``(k, k + d/2)``, the rotate-half layout of
      Hugging Face's LLaMA (and GPT-NeoX). The library's attention uses it, so a ``GPT``
      holding ``LlamaForCausalLM`` weights computes the same logits.
    - ``interleaved=True``: pairs ``(2k, 2k + 1)``, as in RoFormer and Meta's original
      LLaMA code (a complex multiplication per pair).

    The two differ by a fixed permutation of the features, so they give the same scores once
    the output features of W_Q and W_K are permuted within each head: the columns of W_Q in
    the book's ``Q = X W_Q``, the rows of ``nn.Linear.weight`` (what Hugging Face's conversion
    of Meta's checkpoints does). ``positions``: None for ``0…n−1``, an int offset t for
    ``t…t+n−1`` (KV cache), or a tensor ``(n,)`` or broadcastable to x's ``(…, n)``
    (e.g. ``(b, 1, n)`` for x ``(b, h, n, d)``: one row of positions per sequence);
    ``base`` > 0. Chapter 6.
    """
    _require_pairs(x)
    if x.dim() < 2:
        raise ValueError(f"x: expected shape (…, n, d), got {tuple(x.shape)}")
    require_bool("interleaved", interleaved)
    theta = rope_angles(_positions(positions, x.shape[:-1], x.device), x.shape[-1], base)
    dtype = x.dtype if x.is_floating_point() else torch.float32
    cos, sin = theta.cos().to(dtype), theta.sin().to(dtype)             # (…, n, d/2)
    x1, x2 = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin                  # rotate each pair
    return torch.stack([y1, y2], dim=-1).flatten(-2) if interleaved else torch.cat([y1, y2], dim=-1)


def alibi_slopes(n_heads: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Head-specific ALiBi slopes ``() -> (n_heads,)``.

    For h a power of two: ``2^(-8 i / h)`` for i = 1…h (h = 8: 1/2, 1/4, …, 1/256). Otherwise,
    with p the largest power of two below h, the p slopes for p heads followed by every other
    slope for 2p heads (1st, 3rd, …), as in BLOOM. Chapter 6.
    """
    require_int("n_heads", n_heads)

    def geometric(h: int) -> list[float]:
        return [2.0 ** (-8.0 * i / h) for i in range(1, h + 1)]

    p = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = geometric(p) + geometric(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float64).to(dtype)


def alibi_bias(
    n: int,
    n_heads: int,
    m: int | None = None,
    *,
    symmetric: bool = True,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> Tensor:
    """Additive ALiBi score bias ``() -> (n_heads, n, m)``, to add to ``QKᵀ/√d_k`` before softmax.

    Query i sits at position ``i + (m − n)`` (bottom-right aligned, so a query block of n
    positions after ``m − n`` cached keys lines up like ``causal_mask``; ``m >= n``); with
    the signed distance ``δ_ij = i + (m − n) − j``:

    - ``symmetric=True`` (default): ``−slope_h · |δ_ij|``, a recency penalty in both
      directions (the form used for bidirectional attention); on the entries a causal mask
      keeps (``δ ≥ 0``) it is exactly the causal ALiBi bias.
    - ``symmetric=False``: ``−slope_h · δ_ij``, linear in j; future keys get a positive bias
      and must be masked.

    BLOOM's ``build_alibi_tensor`` is ``slope_h · j`` of shape ``(h, 1, m)``, the same for
    every query. The two differ by a per-row constant, which softmax ignores:
    ``alibi_bias(n, h, m)[h, i, j] == bloom[h, 0, j] − slope_h · (i + m − n)`` for every j
    with ``symmetric=False`` and for the causal entries ``j ≤ i + m − n`` by default.

    Chapter 6.
    """
    require_int("n", n)
    m = n if m is None else require_int("m", m)
    require_query_block(n, m)
    i = torch.arange(n, device=device) + (m - n)
    return alibi_bias_at(i, torch.arange(m, device=device), n_heads, symmetric=symmetric, dtype=dtype)


def alibi_bias_at(
    q_positions: Tensor,
    k_positions: Tensor,
    n_heads: int,
    *,
    symmetric: bool = True,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """ALiBi bias for queries and keys at given positions: ``(…, n), (…, m) -> (…, n_heads, n, m)``.

    ``−slope_h · |p_i − p_j|`` with ``p_i = q_positions[…, i]`` and ``p_j = k_positions[…, j]``
    (``−slope_h · (p_i − p_j)`` with ``symmetric=False``); the leading dims broadcast. It
    depends on the positions only through their differences. ``alibi_bias`` is the case of
    consecutive positions. Chapter 6, through `MultiHeadAttention`.
    """
    require_tensor("q_positions", q_positions)
    require_tensor("k_positions", k_positions)
    require_int("n_heads", n_heads)
    delta = (q_positions.to(torch.float64)[..., None, :, None]
             - k_positions.to(torch.float64)[..., None, None, :])            # (…, 1, n, m)
    distance = delta.abs() if symmetric else delta
    slopes = alibi_slopes(n_heads, torch.float64).to(delta.device)
    return (-slopes[:, None, None] * distance).to(dtype)
