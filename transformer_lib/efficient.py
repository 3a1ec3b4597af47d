"""Two answers to attention's quadratic cost: local (sliding-window) and linear attention.

Exact attention ``softmax(Q Kᵀ/√d_k) V`` compares every query with every key: ``O(n²)`` time.
Two ways around it change *what* is computed (chapter 9's tiled attention changes only *how*):

- **sliding-window attention** keeps the softmax but lets query i see only the keys
  ``|i - j| <= window`` (Longformer's local attention, Beltagy et al., 2020). It is exact
  attention under ``sliding_window_mask``, computed block by block in ``O(n · window)``.
- **linear attention** replaces ``exp(qᵀk)`` by a kernel ``φ(q)ᵀφ(k)`` with
  ``φ(x) = elu(x) + 1`` (Katharopoulos et al., 2020). By associativity
  ``(φ(Q) φ(K)ᵀ) V = φ(Q) (φ(K)ᵀ V)``, so the ``n × m`` matrix is never formed:
  ``O((n + m) d_k d_v)``. It is a different attention, not an approximation that converges
  to softmax attention.

Conventions as in ``transformer_lib.attention``: tokens are rows, masks are True where a query
may attend.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lib._checks import require_int, require_positive
from transformer_lib.attention import _check_qkv

__all__ = ["elu_feature_map", "linear_attention", "sliding_window_mask", "sliding_window_attention"]


def elu_feature_map(x: Tensor) -> Tensor:
    """``φ(x) = elu(x) + 1``, elementwise ``(…) -> (…)``: ``x + 1`` for ``x > 0``, ``exp(x)`` otherwise.

    Positive, so ``φ(q)ᵀφ(k) > 0``. Computed as ``exp(x)`` for ``x <= 0`` rather than
    ``(exp(x) - 1) + 1``, which cancels to 0 for very negative x. Chapter 10.
    """
    return torch.where(x > 0, x + 1.0, torch.exp(x.clamp_max(0.0)))


def linear_attention(q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-12) -> Tensor:
    """Kernelised attention ``z_i = φ(q_i)ᵀ S / φ(q_i)ᵀ s`` with ``S = φ(K)ᵀ V``, ``s = Σ_j φ(k_j)``.

    Shapes: q ``(…, n, d_k)``, k ``(…, m, d_k)``, v ``(…, m, d_v)`` ``-> (…, n, d_v)``; it equals
    ``(φ(Q) φ(K)ᵀ / row sums) V`` without forming the ``(…, n, m)`` matrix. ``eps`` guards the
    division. Chapter 10.
    """
    _check_qkv(q, k, v)
    require_positive("eps", eps)
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    kv = fk.transpose(-2, -1) @ v                        # (…, d_k, d_v): once, for every query
    norm = fq @ fk.sum(dim=-2, keepdim=True).transpose(-2, -1)  # (…, n, 1)
    return (fq @ kv) / norm.clamp_min(eps)


def sliding_window_mask(n: int, window: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean band ``() -> (n, n)``: True where ``|i - j| <= window``. Chapter 10."""
    require_int("n", n)
    require_int("window", window, low=0)
    i = torch.arange(n, device=device)
    return (i[:, None] - i[None, :]).abs() <= window


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int) -> Tensor:
    """Softmax attention in which query i sees the keys ``|i - j| <= window``, in ``O(n · window)``.

    Shapes: q, k ``(…, n, d_k)``, v ``(…, n, d_v)`` (self-attention: as many keys as queries)
    ``-> (…, n, d_v)``; equal to ``scaled_dot_product_attention(q, k, v,
    sliding_window_mask(n, window))[0]``. The queries are cut into blocks of ``w = window``
    rows (at least 1); block b only scores the ``3w`` keys of blocks b - 1, b, b + 1.
    Chapter 10.
    """
    lead = _check_qkv(q, k, v)
    require_int("window", window, low=0)
    n = q.shape[-2]
    if k.shape[-2] != n:
        raise ValueError(f"k: expected n={n} keys (sliding-window self-attention), got {k.shape[-2]}")
    w = max(window, 1)
    blocks = math.ceil(n / w)
    q, k, v = (t.expand(*lead, *t.shape[-2:]) for t in (q, k, v))
    pad_q = blocks * w - n

    def keys(t: Tensor) -> Tensor:  # (…, blocks, 3w, d): keys of blocks b-1, b, b+1
        t = F.pad(t, (0, 0, w, w + pad_q))                 # w rows before, w + pad_q after
        return t.unfold(-2, 3 * w, w).transpose(-2, -1)   # (…, blocks, 3w, d)

    qb = F.pad(q, (0, 0, 0, pad_q)).unflatten(-2, (blocks, w))    # (…, blocks, w, d_k)
    scores = (qb / math.sqrt(q.shape[-1])) @ keys(k).transpose(-2, -1)  # (…, blocks, w, 3w)
    i = torch.arange(blocks * w, device=q.device).view(blocks, w, 1)
    j = torch.arange(-w, (blocks + 1) * w, device=q.device).unfold(0, 3 * w, w).view(blocks, 1, 3 * w)
    keep = ((i - j).abs() <= window) & (j >= 0) & (j < n)
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    out = weights @ keys(v)                                 # (…, blocks, w, d_v)
    return out.flatten(-3, -2)[..., :n, :]
