"""Checks for the chapter 1 exercises: embedding lookup, Nadaraya–Watson, fixed mixing.

Each check computes its reference inside the function; no helper here computes an answer.
Chapter 1.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from .._checktools import (seeded, CheckFailed, as_array, call, check_finite, check_shape, close, fail, ok, record,
                           typename, unpack_pair)

__all__ = ["check_embedding_lookup", "check_nadaraya_watson", "check_accepted_set_sizes",
           "check_fixed_mixing_answer"]



# ---------------------------------------------------------------- Chapter 1

def check_embedding_lookup(fn: Callable, ids: torch.Tensor | None = None,
                           W_E: torch.Tensor | None = None) -> None:
    """``fn(ids (…,), W_E (C, d)) -> (…, d)`` must equal the row lookup ``W_E[ids]`` exactly,
    computed as a matrix product: row lookups (indexing, ``F.embedding``, ``index_select``,
    ``gather``, ``unbind``, iterating, splitting) and leaving torch (``.numpy()``, ``.tolist()``)
    are switched off while ``fn`` runs, and the gradient must flow back to ``W_E``: the rows of
    ``one_hotᵀ · G`` for an upstream gradient ``G``. The default ids leave out the largest id
    ``C − 1``. Chapter 1."""
    ids = torch.tensor([2, 0, 3, 2]) if ids is None else ids
    W_E = seeded(0, 5, 3).float() if W_E is None else W_E
    C, d = W_E.shape
    expected = W_E[ids].double().numpy()
    table = W_E.detach().clone().requires_grad_(True)  # a leaf: the gradient must reach it
    try:
        out = call(fn, ids.clone(), table, what="embed_via_one_hot(ids, W_E)", lookups=True)
    except RuntimeError:
        hint = (f" — these ids do not contain the largest id C − 1 = {C - 1}: does your one-hot encoding "
                f"have C = W_E.shape[0] = {C} columns (num_classes)?" if int(ids.max()) < C - 1 else "")
        raise CheckFailed(f"embed_via_one_hot(ids, W_E) raised a RuntimeError{hint}") from None
    got = as_array(out, "the embeddings")
    record("embedding", {"out": got})
    if got.ndim == 2 and got.shape == expected.shape[::-1] and close(got.T, expected, 0, 0):
        fail("the result is transposed: tokens are rows, so the embeddings are one_hot(ids) @ W_E "
             f"with shape (n, d) = {expected.shape}, not W_Eᵀ · one_hotᵀ", expected, got)
    check_shape(got, expected.shape, "the embeddings", "one row of length d per id")
    if not close(got, expected, 0.0, 0.0):
        fail("row t of one_hot(ids) @ W_E must be exactly row ids[t] of W_E "
             "(a one-hot vector selects one row of W_E)", expected, got)
    if not (isinstance(out, torch.Tensor) and out.requires_grad):
        raise CheckFailed("the embeddings carry no gradient back to W_E: stay in torch (no .numpy(), "
                          ".tolist() or new tensors built from numbers) so that training can update W_E")
    upstream = seeded(3, *got.shape).to(out.dtype)
    (grad,) = torch.autograd.grad(out, table, upstream, allow_unused=True)
    grad_ref = torch.zeros(C, d, dtype=torch.float64).index_add_(0, ids.reshape(-1), upstream.double().reshape(-1, d))
    grad = np.zeros((C, d)) if grad is None else as_array(grad, "the gradient")
    if not close(grad, grad_ref.numpy(), 1e-5, 1e-5):
        fail("the gradient with respect to W_E must be one_hotᵀ · G: row c collects the upstream "
             "gradient of every position holding token c", grad_ref.numpy(), grad)
    ok(f"one_hot(ids) @ W_E equals the row lookup W_E[ids] exactly, shape {tuple(expected.shape)}, "
       "and its gradient reaches W_E")


def check_nadaraya_watson(fn: Callable, x_query: torch.Tensor | None = None,
                          x_train: torch.Tensor | None = None, y_train: torch.Tensor | None = None,
                          bandwidth: float = 0.2) -> None:
    """``fn(x_query (q,), x_train (m,), y_train (m,), h) -> (pred (q,), weights (q, m))``. Chapter 1.

    Reference: Gaussian kernel ``exp(-(x - x_i)² / (2h²))``, weights normalised per query.
    """
    x_train = torch.linspace(0, 1, 6, dtype=torch.float64) if x_train is None else x_train
    y_train = torch.sin(2 * math.pi * x_train) if y_train is None else y_train
    x_query = torch.tensor([0.1, 0.45, 0.9], dtype=torch.float64) if x_query is None else x_query

    def kernel(two: float = 2.0) -> torch.Tensor:
        return torch.exp(-(x_query[:, None] - x_train[None, :]) ** 2 / (two * bandwidth**2))

    w_ref = (kernel() / kernel().sum(dim=1, keepdim=True)).numpy()
    pred_ref = w_ref @ y_train.numpy()
    result = call(fn, x_query.clone(), x_train.clone(), y_train.clone(), bandwidth,
                  what="nadaraya_watson(x_query, x_train, y_train, bandwidth)")
    pred, weights = unpack_pair(result, "nadaraya_watson", ("pred", "weights"))
    pred, weights = as_array(pred, "pred"), as_array(weights, "weights")
    record("nadaraya_watson", {"pred": pred, "weights": weights}, atol=1e-6, rtol=1e-6)
    if weights.shape == w_ref.shape[::-1] != w_ref.shape:
        fail("weights are transposed: row i holds query i's weights over the m training points, "
             f"shape (q, m) = {w_ref.shape}", w_ref, weights)
    check_shape(weights, w_ref.shape, "weights", "one row per query, one column per training point")
    check_finite(weights, "weights", "the Gaussian kernel exp(−u²/(2h²)) is finite for every u")
    sums = weights.sum(axis=1)
    if not np.allclose(sums, 1.0, atol=1e-6):
        hint = ("weights are not normalised: did you forget to divide K(x, x_i) by Σ_j K(x, x_j)?"
                if close(weights, kernel().numpy(), 1e-6, 1e-6) else "the weights of each query must sum to 1")
        fail(f"rows of weights do not sum to 1 — {hint} (row sums shown)", np.ones_like(sums), sums)
    if np.any(weights < 0):
        fail("kernel weights are never negative: K(x, x_i) = exp(−(x − x_i)²/(2h²)) > 0", w_ref, weights)
    if not close(weights, w_ref, 1e-6, 1e-6):
        wide = kernel(two=1.0)
        hint = ("the kernel width is off: use exp(−(x − x_i)²/(2h²)), with the 2 in the denominator"
                if close(weights, (wide / wide.sum(dim=1, keepdim=True)).numpy(), 1e-6, 1e-6)
                else "weights differ from the Gaussian-kernel weights")
        fail(hint, w_ref, weights)
    check_shape(pred, pred_ref.shape, "pred", "one prediction per query")
    if not close(pred, pred_ref, 1e-6, 1e-6):
        fail("pred must be the weighted average Σ_i w_i(x) y_i of the training targets", pred_ref, pred)
    ok(f"Nadaraya–Watson weights (rows sum to 1) and {pred_ref.shape[0]} predictions match (atol 1e-6)")


def check_accepted_set_sizes(fn: Callable, W: torch.Tensor | None = None,
                             sizes: list[int] | None = None) -> None:
    """``fn(W (n, n), sizes) -> list`` of the set sizes ``Y = W X`` accepts. Chapter 1.

    The reference tries the product for each size, with a set X of shape (size, 3).
    """
    W = seeded(1, 4, 4) if W is None else W
    sizes = [2, 3, 4, 5, 8] if sizes is None else sizes
    expected = []
    for s in sizes:
        try:
            W @ torch.ones(s, 3, dtype=W.dtype)
            expected.append(s)
        except RuntimeError:
            pass
    result = call(fn, W.clone(), list(sizes), what="accepted_set_sizes(W, sizes)")
    try:
        got = sorted(int(s) for s in result)
    except (TypeError, ValueError, OverflowError):
        raise CheckFailed(f"accepted_set_sizes must return a list of ints, got {typename(result)}") from None
    record("accepted_set_sizes", {"sizes": np.array(got[:100], dtype=np.float64)})
    n = W.shape[0]
    if got != expected:
        if not set(got) <= set(sizes):
            raise CheckFailed(f"accepted_set_sizes must return some of the candidate sizes {list(sizes)}, "
                              "and only those")
        if got == [s for s in sizes if s <= n]:
            hint = ("smaller sets do not fit either: W @ X needs X to have exactly n rows, "
                    "and the layer has no padding")
        elif got == sorted(sizes):
            hint = "W has one row and one column per position, so its shape is tied to n"
        else:
            hint = f"a fixed mixing matrix of shape {tuple(W.shape)} accepts sets of exactly n = {n} elements"
        raise CheckFailed(f"{hint}\n  expected: {expected}\n  got:      {got}")
    ok(f"a fixed {n}×{n} mixing matrix accepts only sets of size {n} among {list(sizes)}")


def check_fixed_mixing_answer(answer: Any) -> None:
    """Exercise 1.4's multiple-choice answer, ``"a"`` to ``"d"``: what a fixed mixing layer trained
    on 10 tokens does with 12. Chapter 1.

    No option is marked right here: each is a claim about matrix shapes, and the check tests every
    claim by trying the products; the right option is the one whose claim holds. A wrong option
    gets a message on the flaw in its own reasoning.
    """
    def _defined(n_rows_w: int, n_rows_x: int, d: int = 3) -> bool:  # is W (n_w × n_w) @ X (n_x × d) defined?
        try:
            torch.zeros(n_rows_w, n_rows_w) @ torch.zeros(n_rows_x, d)
        except RuntimeError:
            return False
        return True

    n, longer = 10, 12
    claims = {  # option: (does its claim hold?, what is wrong with it)
        "a": (all(_defined(n, m) for m in (n, longer)),
              "(a) says the product W X exists for any number of rows of X. Compare the shapes: W is "
              f"{n} × {n} and X is {longer} × d, and a product needs the inner dimensions to agree"),
        "b": (_defined(n, n) and not _defined(n, longer),
              "(b) is not the statement the products bear out"),
        "c": (not all(_defined(n, n, d) for d in (1, 3, 64)),
              "(c) blames the width d of the token vectors. A longer sentence has more tokens, each of "
              "the same width; try W X with X of shape 10 × d for a few widths d"),
        "d": (all(_defined(longer, max(m, longer)) for m in (n, longer, longer + 1)),  # shorter ones padded
              f"(d) trusts padding to {longer} for good. Ask what the padded layer does with a sentence "
              f"of {longer + 1} tokens, and whether its weights then depend on the tokens at all"),
    }
    choice = answer.strip().lower() if isinstance(answer, str) else ""
    record("fixed_mixing_answer", {"choice": np.array([ord(choice) if choice in claims else 0.0])})
    if choice not in claims:
        raise CheckFailed('answer_fixed_mixing must be one of the letters "a", "b", "c" or "d", '
                          f"as a string (got {typename(answer)})")
    holds, flaw = claims[choice]
    if not holds:
        raise CheckFailed(f"({choice}) is not right: {flaw}")
    ok(f"({choice}): the shapes bear it out — W X needs X to have exactly n rows, and W's weights "
       "belong to positions, not to tokens")
