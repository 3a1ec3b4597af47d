"""Attention from scratch: softmax, scaled dot-product attention and the causal mask.

Chapter 2 builds attention in four steps, each adding one degree of freedom:

1. ``dot_product_attention``  ``softmax(X Xᵀ) X``            nothing learned
2. ``metric_attention``       ``softmax((X W_s)(X W_s)ᵀ) X``  a learned (symmetric) metric
3. ``query_key_attention``    ``softmax((X W_Q)(X W_K)ᵀ) X``  asymmetric matching
4. ``scaled_dot_product_attention`` / ``SelfAttention``
                              ``softmax(Q Kᵀ / √d_k) V``      separate values

Every attention in the library (multi-head, cached, cross, ALiBi) can go through
``scaled_dot_product_attention``, written with two explicit matrix products so that
``torch.utils.flop_counter.FlopCounterMode`` sees ``Q Kᵀ`` and ``A V``. It does whenever the
weights are asked for; otherwise ``MultiHeadAttention`` calls torch's fused kernel, which
computes the same output without storing the weights (Chapter 7, ``transformer_lib.multihead``).

Conventions: tokens are rows, so ``Q = X W_Q``; a boolean mask is True where a query *may*
attend to a key (the convention of ``torch.nn.functional.scaled_dot_product_attention``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer_lib._checks import (require_broadcastable, require_int, require_lead_broadcast,
                                     require_mask, require_query_block, require_tensor)

__all__ = [
    "naive_softmax",
    "softmax",
    "scaled_dot_product_attention",
    "causal_mask",
    "dot_product_attention",
    "metric_attention",
    "query_key_attention",
    "SelfAttention",
]


# --------------------------------------------------------------------------- softmax
def naive_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Textbook softmax ``exp(x) / Σ exp(x)``; overflows to nan for inputs near 1000.

    Kept only to show why the stable version is needed. ``(…) -> (…)``. Chapter 2.
    """
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Numerically stable softmax: subtract the maximum along ``dim`` before ``exp``.

    ``softmax(x) = softmax(x - c)`` for any constant ``c``; with ``c = max(x)`` every
    exponent is ≤ 0, so nothing overflows. A slice that is entirely ``-inf`` (a fully
    masked attention row) returns zeros instead of nan. ``(…) -> (…)``. Chapter 2.
    """
    require_tensor("x", x)
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf slice: keep exp = 0
    e = torch.exp(x - m)
    total = e.sum(dim=dim, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


# --------------------------------------------------------------------------- attention
def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> torch.Size:
    """Validate q, k, v and return their broadcast leading dims ``(…)``. Chapter 2."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(name, t)
        if t.ndim < 2:
            raise ValueError(f"{name}: expected at least 2 dims (…, len, dim), got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating dtype, got {t.dtype}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected dtype {q.dtype} (the dtype of q), got {t.dtype}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: expected last dim d_k={q.shape[-1]} (the width of q), got {k.shape[-1]}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v: expected {k.shape[-2]} rows (one per key), got {v.shape[-2]} (v shape {tuple(v.shape)})"
        )
    lead = q.shape[:-2]
    for name, t in (("k", k), ("v", v)):
        lead = require_lead_broadcast(name, t, lead, "q")
    return lead


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """``Attention(Q, K, V) = softmax(Q Kᵀ · scale + bias, masked) V``.

    Shapes: q ``(…, n, d_k)``, k ``(…, m, d_k)``, v ``(…, m, d_v)`` (leading dims broadcast;
    q, k and v share one floating dtype) ``-> (out (…, n, d_v), weights (…, n, m))``.

    - ``mask``: bool, broadcastable to ``(…, n, m)``; True = the query may attend to the key.
      Masked weights are exactly 0. A query whose keys are all masked gets weights 0 and
      output 0, as in ``torch.nn.functional.scaled_dot_product_attention``; a plain softmax
      over an all ``-inf`` row would give nan.
    - ``bias``: float (the dtype of q), broadcastable to ``(…, n, m)``, added to the scaled
      scores (ALiBi, or an additive ``-inf`` mask).
    - ``scale``: defaults to ``1/√d_k``, which keeps the scores at unit variance.

    Chapter 2.
    """
    lead = _check_qkv(q, k, v)
    target = (*lead, q.shape[-2], k.shape[-2])
    if mask is not None:
        require_mask("mask", mask, target)
    if bias is not None:
        require_tensor("bias", bias)
        if bias.dtype != q.dtype:
            raise TypeError(f"bias: expected dtype {q.dtype} (the dtype of q), got {bias.dtype}")
        require_broadcastable("bias", bias, target)
    scores = _scores(q, k, mask, bias, scale)  # (…, n, m)
    weights = _weights(scores)
    return weights @ v, weights


def _scores(q: Tensor, k: Tensor, mask: Tensor | None, bias: Tensor | None,
            scale: float | None = None) -> Tensor:
    """The scaled scores with the bias added and ``-inf`` where the mask forbids:
    ``(…, n, d_k), (…, m, d_k) -> (…, n, m)``. Scales q (n·d numbers) rather than the scores."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q * scale) @ k.transpose(-2, -1)  # (…, n, m)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores


def _weights(scores: Tensor) -> Tensor:
    """torch's fused softmax over the keys, a row with no finite score set to 0: ``(…, n, m)``."""
    weights = torch.softmax(scores, dim=-1)
    dead = scores.amax(dim=-1, keepdim=True) == float("-inf")  # every key masked: no nan, 0
    if scores.device.type == "meta" or dead.any():  # (meta tensors hold no values to test)
        weights = weights.masked_fill(dead, 0.0)
    return weights


def causal_mask(n: int, m: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Boolean causal mask ``() -> (n, m)``: True where key ``j`` may be seen by query ``i``.

    The rule ``j <= i + (m - n)`` aligns the mask bottom-right: the ``n`` queries are the
    *last* ``n`` positions of a sequence of length ``m >= n``. With a KV cache holding
    ``m - n`` earlier tokens this is exactly what the new queries may see; for ``m == n`` it
    is the lower triangle (``torch.tril``). ``m < n`` is rejected: the first ``n - m``
    queries would see no key at all. Chapter 2.
    """
    require_int("n", n, low=0)
    m = n if m is None else require_int("m", m, low=0)
    require_query_block(n, m)
    i = torch.arange(n, device=device).unsqueeze(1)
    j = torch.arange(m, device=device).unsqueeze(0)
    return j <= i + (m - n)


# --------------------------------------------------------------------------- the four stages
def _check_matrix(name: str, W: Tensor, rows: int) -> None:
    require_tensor(name, W)
    if W.ndim != 2 or W.shape[0] != rows:
        raise ValueError(f"{name}: expected shape ({rows}, d_out), got {tuple(W.shape)}")


def _check_x(X: Tensor) -> None:
    require_tensor("X", X)
    if X.ndim < 2:
        raise ValueError(f"X: expected shape (…, n, d), got {tuple(X.shape)}")


def dot_product_attention(
    X: Tensor, scale: float = 1.0, return_weights: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    """Stage 1, nothing learned: ``Y = softmax(X Xᵀ · scale) X``.

    ``(…, n, d) -> (…, n, d)`` (and weights ``(…, n, n)`` if ``return_weights``).
    Chapter 2.
    """
    _check_x(X)
    Y, A = scaled_dot_product_attention(X, X, X, scale=scale)
    return (Y, A) if return_weights else Y


def metric_attention(
    X: Tensor, W_s: Tensor, scale: float = 1.0, return_weights: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    """Stage 2, a learned metric: ``s_ij = (x_i W_s)·(x_j W_s)``, ``Y = softmax(S) X``.

    ``S = X W_s W_sᵀ Xᵀ`` is still symmetric and the output is still rows of X.
    X ``(…, n, d)``, W_s ``(d, d_s)`` ``-> (…, n, d)``. Chapter 2.
    """
    _check_x(X)
    _check_matrix("W_s", W_s, X.shape[-1])
    H = X @ W_s
    Y, A = scaled_dot_product_attention(H, H, X, scale=scale)
    return (Y, A) if return_weights else Y


def query_key_attention(
    X: Tensor, W_q: Tensor, W_k: Tensor, scale: float = 1.0, return_weights: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    """Stage 3, separate query and key: ``Y = softmax((X W_Q)(X W_K)ᵀ) X``.

    The scores are asymmetric (``s_ij ≠ s_ji``); the values are still X itself.
    X ``(…, n, d)``, W_q and W_k ``(d, d_k)`` ``-> (…, n, d)``. Chapter 2.
    """
    _check_x(X)
    _check_matrix("W_q", W_q, X.shape[-1])
    _check_matrix("W_k", W_k, X.shape[-1])
    if W_k.shape != W_q.shape:
        raise ValueError(f"W_k: expected shape {tuple(W_q.shape)} (as W_q), got {tuple(W_k.shape)}")
    Y, A = scaled_dot_product_attention(X @ W_q, X @ W_k, X, scale=scale)
    return (Y, A) if return_weights else Y


class SelfAttention(nn.Module):
    """Stage 4, one attention head with learned ``W_q, W_k, W_v`` (``nn.Linear`` layers).

    ``nn.Linear`` stores its weight as ``(out, in)``, so the book's ``W_Q ∈ R^{d×d_k}`` is
    ``self.W_q.weight.T``. With ``context`` the layer is cross-attention: queries come from
    ``x``, keys and values from ``context``.
    x ``(…, n, d_model)``, context ``(…, m, d_model)`` ``-> (…, n, d_v)``
    (and weights ``(…, n, m)`` if ``return_weights``). Chapter 2.
    """

    def __init__(self, d_model: int, d_k: int, d_v: int | None = None, bias: bool = False):
        super().__init__()
        d_v = d_k if d_v is None else d_v
        for name, val in (("d_model", d_model), ("d_k", d_k), ("d_v", d_v)):
            require_int(name, val)
        self.d_model, self.d_k, self.d_v = d_model, d_k, d_v
        self.W_q = nn.Linear(d_model, d_k, bias=bias)
        self.W_k = nn.Linear(d_model, d_k, bias=bias)
        self.W_v = nn.Linear(d_model, d_v, bias=bias)

    @classmethod
    def from_matrices(cls, W_Q: Tensor, W_K: Tensor, W_V: Tensor) -> "SelfAttention":
        """Build a bias-free head from the book's ``(d, d_k)`` matrices. Chapter 2."""
        for name, W in (("W_Q", W_Q), ("W_K", W_K), ("W_V", W_V)):
            _check_matrix(name, W, W_Q.shape[0] if isinstance(W_Q, Tensor) else -1)
        if W_K.shape != W_Q.shape:
            raise ValueError(f"W_K: expected shape {tuple(W_Q.shape)} (as W_Q), got {tuple(W_K.shape)}")
        layer = cls(W_Q.shape[0], W_Q.shape[1], W_V.shape[1], bias=False).to(W_Q.dtype)
        with torch.no_grad():
            for lin, W in ((layer.W_q, W_Q), (layer.W_k, W_K), (layer.W_v, W_V)):
                lin.weight.copy_(W.T)
        return layer

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        return_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``(…, n, d_model) -> (…, n, d_v)``; the argument order of ``MultiHeadAttention``.

        - ``context`` ``(…, m, d_model)``: cross-attention (keys and values from context).
        - ``mask``: bool, broadcastable to ``(…, n, m)``, True = may attend.
        - ``return_weights``: also return the attention weights ``(…, n, m)``.

        Chapter 2.
        """
        context = x if context is None else context
        for name, t in (("x", x), ("context", context)):
            require_tensor(name, t)
            if t.ndim < 2 or t.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name}: expected shape (…, len, d_model={self.d_model}), got {tuple(t.shape)}"
                )
        require_lead_broadcast("context", context, x.shape[:-2], "x")
        q, k, v = self.W_q(x), self.W_k(context), self.W_v(context)
        out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
        return (out, weights) if return_weights else out
