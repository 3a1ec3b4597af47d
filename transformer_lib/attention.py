"""Attention from scratch: softmax, scaled dot-product attention and the causal mask.

Chapter 2 builds attention in four steps, each adding one degree of freedom:

1. ``dot_product_attention``  ``softmax(X Xᵀ) X``            nothing learned
2. ``metric_attention``       ``softmax((X W_s)(X W_s)ᵀ) X``  a learned (symmetric) metric
3. ``query_key_attention``    ``softmax((X W_Q)(X W_K)ᵀ) X``  asymmetric matching
4. ``scaled_dot_product_attention`` / ``SelfAttention``
                              ``softmax(Q Kᵀ / √d_k) V``      separate values

Every attention in the library (multi-head, cached, cross, ALiBi) goes through
``scaled_dot_product_attention``, written with two explicit matrix products so that
``torch.utils.flop_counter.FlopCounterMode`` sees ``Q Kᵀ`` and ``A V``.

Conventions: tokens are rows, so ``Q = X W_Q``; a boolean mask is True where a query *may*
attend to a key (the convention of ``torch.nn.functional.scaled_dot_product_attention``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

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


def _require_tensor(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def _require_broadcastable(name: str, x: Tensor, target: torch.Size) -> None:
    try:
        ok = torch.broadcast_shapes(x.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name}: expected a shape broadcastable to {tuple(target)}, got {tuple(x.shape)}"
        )


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
    _require_tensor("x", x)
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf slice: keep exp = 0
    e = torch.exp(x - m)
    total = e.sum(dim=dim, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


# --------------------------------------------------------------------------- attention
def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """``Attention(Q, K, V) = softmax(Q Kᵀ · scale + bias, masked) V``.

    Shapes: q ``(…, n, d_k)``, k ``(…, m, d_k)``, v ``(…, m, d_v)`` (leading dims broadcast)
    ``-> (out (…, n, d_v), weights (…, n, m))``.

    - ``mask``: bool, broadcastable to ``(…, n, m)``; True = the query may attend to the key.
      Masked weights are exactly 0. A query whose keys are all masked gets weights 0 and
      output 0 (PyTorch's fused kernel would return nan there).
    - ``bias``: float, broadcastable to ``(…, n, m)``, added to the scaled scores (ALiBi,
      or an additive ``-inf`` mask).
    - ``scale``: defaults to ``1/√d_k``, which keeps the scores at unit variance.

    Chapter 2.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _require_tensor(name, t)
        if t.ndim < 2:
            raise ValueError(f"{name}: expected at least 2 dims (…, len, dim), got {tuple(t.shape)}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: expected last dim d_k={q.shape[-1]} (the width of q), got {k.shape[-1]}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v: expected {k.shape[-2]} rows (one per key), got {v.shape[-2]} (v shape {tuple(v.shape)})"
        )
    d_k = q.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale

    scores = (q @ k.transpose(-2, -1)) * scale  # (…, n, m)
    if bias is not None:
        _require_tensor("bias", bias)
        _require_broadcastable("bias", bias, scores.shape)
        scores = scores + bias
    if mask is not None:
        _require_tensor("mask", mask)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask: expected dtype torch.bool (True = may attend), got {mask.dtype}")
        _require_broadcastable("mask", mask, scores.shape)
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores, dim=-1)
    return weights @ v, weights


def causal_mask(n: int, m: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Boolean causal mask ``(n, m)``: True where key ``j`` may be seen by query ``i``.

    The rule ``j <= i + (m - n)`` aligns the mask bottom-right: the ``n`` queries are the
    *last* ``n`` positions of a sequence of length ``m``. With a KV cache holding ``m - n``
    earlier tokens this is exactly what the new queries may see; for ``m == n`` it is the
    lower triangle (``torch.tril``). Chapter 2 (used throughout Chapter 7).
    """
    m = n if m is None else m
    for name, val in (("n", n), ("m", m)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 0:
            raise ValueError(f"{name}: expected a non-negative int, got {val!r}")
    i = torch.arange(n, device=device).unsqueeze(1)
    j = torch.arange(m, device=device).unsqueeze(0)
    return j <= i + (m - n)


# --------------------------------------------------------------------------- the four stages
def _check_matrix(name: str, W: Tensor, rows: int) -> None:
    _require_tensor(name, W)
    if W.ndim != 2 or W.shape[0] != rows:
        raise ValueError(f"{name}: expected shape ({rows}, d_out), got {tuple(W.shape)}")


def _check_x(X: Tensor) -> None:
    _require_tensor("X", X)
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
            if not isinstance(val, int) or val <= 0:
                raise ValueError(f"{name}: expected a positive int, got {val!r}")
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
        mask: Tensor | None = None,
        context: Tensor | None = None,
        return_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        context = x if context is None else context
        for name, t in (("x", x), ("context", context)):
            _require_tensor(name, t)
            if t.ndim < 2 or t.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name}: expected shape (…, len, d_model={self.d_model}), got {tuple(t.shape)}"
                )
        q, k, v = self.W_q(x), self.W_k(context), self.W_v(context)
        out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
        return (out, weights) if return_weights else out
