"""Data-independent weights: token embeddings, fixed mixing and kernel regression.

`one_hot` and `embed` turn token ids into vectors, `FixedMixing` mixes a set of
vectors with a fixed n x n matrix (the layer attention replaces), and
`nadaraya_watson` is kernel regression, the non-parametric ancestor of attention.
Chapter 1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer_lib._checks import require_ids, require_int, require_positive, require_tensor

__all__ = ["one_hot", "embed", "FixedMixing", "gaussian_kernel", "nadaraya_watson"]


def one_hot(ids: Tensor, num_classes: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """One-hot vectors e_c: `(...)` integer ids -> `(..., C)` with C = num_classes.

    Row c of the identity matrix, as a float tensor so it can multiply W_E. Chapter 1.
    """
    require_int("num_classes", num_classes)
    require_ids("ids", ids, num_classes, "num_classes")
    classes = torch.arange(num_classes, device=ids.device)
    return (ids.unsqueeze(-1) == classes).to(dtype)


def embed(ids: Tensor, W_E: Tensor) -> Tensor:
    """Embedding lookup x = e_c^T W_E: ids `(...)`, W_E `(C, d)` -> `(..., d)`.

    Implemented as row indexing `W_E[ids]`, which equals `one_hot(ids, C) @ W_E`
    exactly. The same id always gives the same vector, whatever its context. Chapter 1.
    """
    if require_tensor("W_E", W_E).dim() != 2:
        raise ValueError(f"W_E: expected a 2-D tensor of shape (C, d), got {tuple(W_E.shape)}")
    require_ids("ids", ids, W_E.shape[0], "C")
    return W_E[ids]


class FixedMixing(nn.Module):
    """Mix a set of n vectors with one fixed matrix: y_i = sum_j W_ij x_j, i.e. Y = W X.

    `weight` has shape `(n, n)`; forward maps `(..., n, d) -> (..., n, d)` and mixes
    across elements, the same way for every feature. It only accepts sets of exactly
    n elements (and width d if `d` is given): the layer attention replaces. Chapter 1.
    """

    def __init__(self, n: int, d: int | None = None, *, generator: torch.Generator | None = None):
        super().__init__()
        require_int("n", n)
        if d is not None:
            require_int("d", d)
        self.n, self.d = n, d
        bound = 1.0 / math.sqrt(n)  # nn.Linear's default initialisation range
        init = (torch.rand(n, n, generator=generator) * 2 - 1) * bound
        self.weight = nn.Parameter(init)

    @classmethod
    def from_weight(cls, weight: Tensor, d: int | None = None) -> "FixedMixing":
        """Build the layer around a given `(n, n)` matrix (copied). Chapter 1."""
        if require_tensor("weight", weight).dim() != 2 or weight.shape[0] != weight.shape[1]:
            raise ValueError(f"weight: expected a square 2-D tensor (n, n), got {tuple(weight.shape)}")
        layer = cls(weight.shape[0], d, generator=torch.Generator().manual_seed(0))
        layer.weight = nn.Parameter(weight.detach().clone())
        return layer

    def forward(self, x: Tensor) -> Tensor:
        """`(..., n, d) -> (..., n, d)`: Y = W X along the set dimension. Chapter 1."""
        if require_tensor("x", x).dim() < 2 or x.shape[-2] != self.n:
            raise ValueError(
                f"x: expected a set of n={self.n} elements, shape (..., {self.n}, d), "
                f"got shape {tuple(x.shape)} with {x.shape[-2] if x.dim() >= 2 else 'no'} elements; "
                "a fixed (n, n) mixing matrix cannot handle another set size"
            )
        if self.d is not None and x.shape[-1] != self.d:
            raise ValueError(f"x: expected feature width d={self.d}, got shape {tuple(x.shape)}")
        return self.weight.to(x.dtype) @ x

    def extra_repr(self) -> str:
        return f"n={self.n}, d={self.d}"


def gaussian_kernel(u: Tensor, bandwidth: float) -> Tensor:
    """Gaussian kernel K(u) = exp(-u^2 / (2 h^2)) of a difference u = x - x_i, h = bandwidth.

    Elementwise, any shape `(...) -> (...)`. Unnormalised: the constant cancels in
    Nadaraya-Watson. Chapter 1.
    """
    require_positive("bandwidth", bandwidth)
    u = torch.as_tensor(u)
    return torch.exp(-0.5 * (u / bandwidth) ** 2)


def nadaraya_watson(
    x_query: Tensor, x_train: Tensor, y_train: Tensor, bandwidth: float
) -> tuple[Tensor, Tensor]:
    """Nadaraya-Watson kernel regression with a Gaussian kernel.

    x_query `(q,)`, x_train `(m,)`, y_train `(m,)` -> (pred `(q,)`, weights `(q, m)`), with
    weights[a, i] = K(x_a - x_i) / sum_j K(x_a - x_j) and pred = weights @ y_train.
    The weights are computed as a softmax of -(x_a - x_i)^2 / (2 h^2), which is the same
    ratio but cannot underflow to 0/0 for a tiny bandwidth. Chapter 1.
    """
    x_query, x_train, y_train = (torch.as_tensor(t) for t in (x_query, x_train, y_train))
    for name, t in (("x_query", x_query), ("x_train", x_train), ("y_train", y_train)):
        if t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(t.shape)}")
    if x_train.shape[0] == 0:
        raise ValueError("x_train: expected at least one training point, got shape (0,)")
    if y_train.shape != x_train.shape:
        raise ValueError(
            f"y_train: expected shape {tuple(x_train.shape)} like x_train, got {tuple(y_train.shape)}"
        )
    require_positive("bandwidth", bandwidth)
    diff = x_query[:, None] - x_train[None, :]  # (q, m)
    weights = torch.softmax(-0.5 * (diff / bandwidth) ** 2, dim=-1)
    return weights @ y_train.to(weights.dtype), weights
