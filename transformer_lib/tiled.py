"""Tiled attention with an online softmax: exact attention without an n × m score matrix.

``softmax(Q Kᵀ/√d_k) V`` is computed one (query block, key block) tile at a time. For each
query row the loop over key blocks keeps three running quantities — the largest score seen so
far ``m``, the sum of ``exp(score - m)`` seen so far ``ℓ``, and the unnormalised output
``acc = Σ exp(score - m) v`` — and rescales ``ℓ`` and ``acc`` by ``exp(m_old - m_new)`` whenever
a new block raises the maximum. After the last block, ``acc / ℓ`` is the exact attention output.
This is the idea of FlashAttention (Dao et al., 2022); here it is plain torch, written for
reading, so its point is memory (a tile of ``block_q × block_k`` scores at a time), not speed.

Conventions as in ``transformer_lib.attention``: tokens are rows, a boolean mask is True where
a query *may* attend to a key, a query whose keys are all masked gets output 0.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from transformer_lib._checks import require_bool, require_int, require_mask, require_query_block
from transformer_lib.attention import _check_qkv

__all__ = ["tiled_attention"]


def _tile_mask(mask: Tensor | None, causal: bool, i0: int, i1: int, j0: int, j1: int,
               offset: int, device: torch.device) -> Tensor | None:
    """The (…, i1-i0, j1-j0) block of the mask (and of the causal rule), or None if all True."""
    keep = None if mask is None else mask[..., i0:i1, j0:j1]
    if causal and j1 - 1 > i0 + offset:  # some key in the tile lies after some query
        i = torch.arange(i0, i1, device=device).unsqueeze(1)
        j = torch.arange(j0, j1, device=device).unsqueeze(0)
        rule = j <= i + offset
        keep = rule if keep is None else keep & rule
    return keep


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    block_q: int = 128,
    block_k: int = 128,
) -> Tensor:
    """Exact ``softmax(Q Kᵀ · scale, masked) V`` by tiles, with an online softmax.

    Shapes: q ``(…, n, d_k)``, k ``(…, m, d_k)``, v ``(…, m, d_v)`` (leading dims broadcast)
    ``-> (…, n, d_v)``; the same result as ``scaled_dot_product_attention(q, k, v, mask)[0]``,
    without ever holding more than ``block_q × block_k`` scores per leading index.

    - ``mask``: bool, broadcastable to ``(…, n, m)``, True = may attend.
    - ``causal``: also apply the bottom-right causal rule ``j <= i + (m - n)`` (as
      ``causal_mask(n, m)``) tile by tile, so no n × m mask is built; tiles entirely in the
      future are skipped.
    - ``scale``: defaults to ``1/√d_k``; ``block_q``, ``block_k``: tile sizes (any n, m work).

    Chapter 9.
    """
    lead = _check_qkv(q, k, v)
    n, m = q.shape[-2], k.shape[-2]
    require_bool("causal", causal)
    require_int("block_q", block_q)
    require_int("block_k", block_k)
    if causal:
        require_query_block(n, m)
    if mask is not None:
        require_mask("mask", mask, (*lead, n, m))
        mask = mask.expand(*lead, n, m)  # a view: no copy
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q, k, v = q.expand(*lead, n, -1), k.expand(*lead, m, -1), v.expand(*lead, m, -1)
    out = q.new_empty((*lead, n, v.shape[-1]))
    offset = m - n
    for i0 in range(0, n, block_q):
        i1 = min(i0 + block_q, n)
        qi = q[..., i0:i1, :] * scale
        run_max = qi.new_full((*lead, i1 - i0, 1), float("-inf"))  # m: largest score so far
        run_sum = qi.new_zeros((*lead, i1 - i0, 1))  # ℓ: Σ exp(score - m)
        acc = qi.new_zeros((*lead, i1 - i0, v.shape[-1]))  # Σ exp(score - m) v
        last = min(m, i1 + offset) if causal else m  # keys after i1-1+offset are all masked
        for j0 in range(0, last, block_k):
            j1 = min(j0 + block_k, m)
            s = qi @ k[..., j0:j1, :].transpose(-2, -1)  # (…, bq, bk): the only scores held
            keep = _tile_mask(mask, causal, i0, i1, j0, j1, offset, q.device)
            if keep is not None:
                s = s.masked_fill(~keep, float("-inf"))
            new_max = torch.maximum(run_max, s.amax(dim=-1, keepdim=True))
            safe = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
            p = torch.exp(s - safe)  # masked scores -> exp(-inf) = 0
            rescale = torch.exp(run_max - safe)  # exp(m_old - m_new) <= 1; 0 if nothing seen yet
            run_sum = run_sum * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + p @ v[..., j0:j1, :]
            run_max = new_max
        out[..., i0:i1, :] = acc / torch.where(run_sum == 0, torch.ones_like(run_sum), run_sum)
    return out
