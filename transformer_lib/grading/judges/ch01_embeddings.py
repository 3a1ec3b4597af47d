"""The judges of the checks for the chapter 1 exercises: the embedding lookup as a matrix product,
kernel regression on vectors computed as a softmax of dot products, the equivariant part of a fixed
mixing, and the question on fixed mixing and variable n.

The judges compute their references from the inputs and run in the grader. The inputs and the
calls of the student's functions are in the kernel half,
:mod:`transformer_lib.grading.checks.ch01_embeddings`. Chapter 1.
"""
from __future__ import annotations

from itertools import permutations
from typing import Any

import numpy as np
import torch

from .._calls import _LOOKUPS
from ..checks.ch01_embeddings import _DISTANCES
from ..protocol import CheckFailed, typename
from .common import as_array, check_finite, check_shape, close, fail, judge, pair


def _lookup_message(what: str, name: Any) -> str:
    """The row lookup the watch saw, named (only names the watch can report are shown)."""
    how = ("indexing (W_E[ids])" if name == "__getitem__" else
           f"torch's {name} on W_E" if name in _LOOKUPS else "a function of torch on W_E")
    return (f"{what} uses {how}, a row lookup (or a way out of torch): compute one_hot(ids) @ W_E instead, "
            "a matrix product (the point is that it equals the lookup)")


@judge("embedding_lookup", compare=("out",),
       ok=lambda cases, outs: "one_hot(ids) @ W_E equals the row lookup W_E[ids] exactly, shape "
                              + ", ".join(str((*c["ids"].shape, c["W_E"].shape[-1])) for c in cases)
                              + ", and its gradient reaches W_E")
def _embedding_lookup(case: dict, out: dict) -> None:
    ids, W_E, G, what = case["ids"], case["W_E"], case["G"], case["what"]
    C, d = W_E.shape
    if "lookup" in out:
        raise CheckFailed(_lookup_message(what, out["lookup"]))
    if "raised" in out:
        hint = (f" — these ids do not contain the largest id C − 1 = {C - 1}: does your one-hot encoding "
                f"have C = W_E.shape[0] = {C} columns (num_classes)?" if int(ids.max()) < C - 1 else "")
        raise CheckFailed(f"{what} raised a RuntimeError{hint}")
    expected = W_E[ids].double().numpy()
    got = as_array(out["out"], "the embeddings")
    if got.ndim == 2 and got.shape == expected.shape[::-1] and close(got.T, expected, 0, 0) \
            and not close(got, expected, 0, 0):
        fail("the result is transposed: tokens are rows, so the embeddings are one_hot(ids) @ W_E "
             f"with shape (n, d) = {expected.shape}, not W_Eᵀ · one_hotᵀ", expected, got)
    check_shape(got, expected.shape, "the embeddings", "one row of length d per id")
    if not close(got, expected, 0.0, 0.0):
        fail("row t of one_hot(ids) @ W_E must be exactly row ids[t] of W_E "
             "(a one-hot vector selects one row of W_E)", expected, got)
    if out.get("requires_grad") is not True:
        raise CheckFailed("the embeddings carry no gradient back to W_E: stay in torch (no .numpy(), "
                          ".tolist() or new tensors built from numbers) so that training can update W_E")
    upstream = G.to(out["out"].dtype).double() if isinstance(out["out"], torch.Tensor) else G.double()
    grad_ref = torch.zeros(C, d, dtype=torch.float64).index_add_(0, ids.reshape(-1), upstream.reshape(-1, d))
    grad = np.zeros((C, d)) if out.get("grad") is None else as_array(out["grad"], "the gradient")
    if not close(grad, grad_ref.numpy(), 1e-5, 1e-5):
        fail("the gradient with respect to W_E must be one_hotᵀ · G: row c collects the upstream "
             "gradient of every position holding token c", grad_ref.numpy(), grad)


_MAX_OPS = 40  # torch operations an answer without a loop needs (about ten); a loop over 50+ queries needs more


def _nw_reference(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, h: float, two: float = 2.0,
                  square: bool = True, key_norms: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Nadaraya–Watson on vectors from the distances themselves (a (q, m, d) tensor is fine here), the
    weights a softmax of −‖x − k‖²/(2h²); variants for the messages."""
    if key_norms:
        dist2 = ((Q[:, None, :] - K[None, :, :]) ** 2).sum(dim=-1)
        scores = -dist2 / (two * (h**2 if square else h))
    else:  # the dot products alone, as if every key had the same norm
        scores = Q @ K.T / (h**2 if square else h)
    weights = torch.softmax(scores, dim=-1)
    return (weights @ V).numpy(), weights.numpy()


@judge("nw_vectors", compare=("result",), atol=1e-6, rtol=1e-6, bans=_DISTANCES,
       ok=lambda cases, outs: "Nadaraya–Watson on vectors: weights (rows sum to 1) and predictions match the Gaussian "
                              "kernel for Q " + ", ".join(str(tuple(c["Q"].shape)) for c in cases)
                              + " (atol 1e-6), a tiny bandwidth included, with no (q, m, d) tensor computed")
def _nw_vectors(case: dict, out: dict) -> None:
    Q, K, V, h, atol = case["Q"].double(), case["K"].double(), case["V"].double(), case["bandwidth"], 1e-6
    pred_ref, w_ref = _nw_reference(Q, K, V, h)
    pred, weights = pair(out["result"], "nw_vectors", ("pred", "weights"))
    pred, weights = as_array(pred, "pred"), as_array(weights, "weights")
    if weights.shape == w_ref.shape[::-1] != w_ref.shape:
        fail("weights are transposed: row i holds query i's weights over the m keys, shape (q, m) = "
             f"{w_ref.shape}", w_ref, weights)
    check_shape(weights, w_ref.shape, "weights", "one row per query, one column per key")
    check_finite(weights, "weights", "for a small bandwidth every kernel value exp(−‖x − k‖²/(2h²)) underflows to 0 "
                 "and their ratio is 0/0: compute the weights as a softmax of the scores, which subtracts each "
                 "row's largest score first")
    check_shape(pred, pred_ref.shape, "pred", "one prediction of width d_v per query")
    q, m, d = Q.shape[0], K.shape[0], Q.shape[1]
    allowed = max(q * m, q * d, m * d, m * V.shape[1], q * V.shape[1])
    if close(weights, w_ref, atol, atol) and close(pred, pred_ref, atol, atol):
        largest, ops = out.get("largest"), out.get("ops")
        if not isinstance(largest, int) or largest > allowed:
            raise CheckFailed(f"nw_vectors computed a tensor of {largest} numbers, more than any (q, m), (m, d) or "
                              f"(q, d) array ({allowed}): the differences x − k of every query and key, "
                              f"(q, m, d) = ({q}, {m}, {d}). Expand the square instead, ‖x − k‖² = ‖x‖² − 2 xᵀk "
                              "+ ‖k‖², so that one matrix product gives every xᵀk")
        if not isinstance(ops, int) or ops > _MAX_OPS:
            raise CheckFailed(f"nw_vectors ran {ops} torch operations for {q} queries: it loops over the queries "
                              "(or the keys). One matrix product Q Kᵀ gives every query's dot products at once; "
                              "expand ‖x − k‖² around it")
        return
    variants = {
        "the keys' norms do not cancel: −‖x − k‖²/2h² = (xᵀk − ‖k‖²/2 − ‖x‖²/2)/h², and only the query's "
        "term ‖x‖² is the same for every key (the chapter's softmax of dot products needs keys of equal "
        "norm; these are not)": _nw_reference(Q, K, V, h, key_norms=False),
        "the kernel width is off: use exp(−‖x − k‖²/(2h²)), with the 2 in the denominator":
            _nw_reference(Q, K, V, h, two=1.0),
        "the kernel divides by 2h², the bandwidth squared, not by 2h": _nw_reference(Q, K, V, h, square=False),
    }
    for hint, (v_pred, v_w) in variants.items():
        if close(weights, v_w, atol, atol):
            fail(hint, w_ref, weights)
    sums = weights.sum(axis=1)
    if not np.allclose(sums, 1.0, atol=1e-6):
        fail("rows of weights do not sum to 1: the weights of each query are its kernel values divided by their "
             "sum, a softmax over the keys (row sums shown)", np.ones_like(sums), sums)
    if not close(weights, w_ref, atol, atol):
        fail(f"weights differ from the Gaussian-kernel weights softmax(−‖x − k‖²/(2h²)) (atol {atol})", w_ref, weights)
    fail("pred must be the weighted average Σ_i w_i(x) v_i of the values", pred_ref, pred)


def _orbit_average(W: torch.Tensor) -> torch.Tensor:
    """The average of P W Pᵀ over every permutation, by listing them (small n only)."""
    n = W.shape[0]
    perms = list(permutations(range(n)))
    total = torch.zeros_like(W)
    for perm in perms:
        index = torch.tensor(perm)
        total += W[index][:, index]
    return total / len(perms)


def _equivariant_closed_form(W: torch.Tensor) -> torch.Tensor:
    """aI + b11ᵀ: every diagonal entry is carried onto every diagonal position equally often, and every
    off-diagonal entry onto every off-diagonal position (Proposition 2's two orbits)."""
    n = W.shape[0]
    diag = torch.diagonal(W).mean()
    off = (W.sum() - torch.diagonal(W).sum()) / (n * (n - 1)) if n > 1 else torch.zeros((), dtype=W.dtype)
    return off * torch.ones(n, n, dtype=W.dtype) + (diag - off) * torch.eye(n, dtype=W.dtype)


@judge("equivariant_part", compare=("result",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "equivariant_part = the average of P W Pᵀ over all n! permutations, for n in "
                              f"{[c['W'].shape[0] for c in cases]}: it commutes with every permutation (1e-9)")
def _equivariant_part(case: dict, out: dict) -> None:
    W, atol = case["W"].double(), 1e-9
    n = W.shape[0]
    expected = _equivariant_closed_form(W)
    if n <= 6:  # a second derivation: list the n! permutations
        assert torch.allclose(expected, _orbit_average(W), atol=1e-12, rtol=1e-12)
    got = as_array(out["result"], case["what"])
    check_shape(got, (n, n), "the equivariant part", "an n × n mixing matrix, like W")
    check_finite(got, "the equivariant part", "an average of finite matrices is finite")
    ref = expected.numpy()
    if close(got, ref, atol, atol):
        return
    shift = torch.roll(torch.eye(n, dtype=torch.float64), 1, dims=0)
    cyclic = sum(torch.linalg.matrix_power(shift, k) @ W @ torch.linalg.matrix_power(shift, k).T
                 for k in range(n)) / n
    mean = float(W.mean())
    variants = {
        "that is W itself: P W Pᵀ moves W's entries around, and the average mixes them": W.numpy(),
        "a permutation carries a diagonal entry (i, i) to a diagonal entry (π(i), π(i)), never off the diagonal: "
        "average the diagonal and the off-diagonal entries separately": np.full((n, n), mean),
        "averaging W and Wᵀ is not enough: a permutation carries entry (i, j) to every off-diagonal position "
        "(π(i), π(j))": ((W + W.T) / 2).numpy(),
        "those are the n cyclic shifts only; the average runs over all n! permutations, which carry any "
        "off-diagonal entry to any other": cyclic.numpy(),
        "the off-diagonal entries average to the same number b, not to 0": (torch.diagonal(W).mean()
                                                                           * torch.eye(n, dtype=torch.float64)).numpy(),
    }
    for hint, variant in variants.items():
        if close(got, variant, atol, atol):
            fail(hint, ref, got)
    P = torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=torch.Generator().manual_seed(0))]
    G = torch.from_numpy(got)
    if n > 1 and not torch.allclose(P @ G @ P.T, G, atol=1e-9):
        fail("the result does not commute with a permutation (P G Pᵀ shown): an average over all permutations "
             "is unchanged by any one of them", ref, (P @ G @ P.T).numpy())
    fail(f"the result differs from the average of P W Pᵀ over all permutations (atol {atol})", ref, got)


def _defined(n_rows_w: int, n_rows_x: int, d: int = 3) -> bool:
    """Is W (n_w × n_w) @ X (n_x × d) defined? Tried, not reasoned."""
    try:
        torch.zeros(n_rows_w, n_rows_w) @ torch.zeros(n_rows_x, d)
    except RuntimeError:
        return False
    return True


def _claims() -> dict[str, tuple[bool, str]]:
    """Option: (does its claim hold?, what is wrong with it). No option is marked right: each is a
    claim about matrix shapes, tested by trying the products."""
    n, longer = 10, 12
    return {
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


def _choice(answer: Any) -> str:
    return answer.strip().lower() if isinstance(answer, str) else ""


@judge("fixed_mixing_answer",
       ok=lambda cases, outs: f"({_choice(outs[0]['answer'])}): the shapes bear it out — W X needs X to have "
                              "exactly n rows, and W's weights belong to positions, not to tokens")
def _fixed_mixing_answer(case: dict, out: dict) -> None:
    claims, answer = _claims(), out["answer"]
    choice = _choice(answer)
    if choice not in claims:
        raise CheckFailed('answer_fixed_mixing must be one of the letters "a", "b", "c" or "d", '
                          f"as a string (got {typename(answer)})")
    holds, flaw = claims[choice]
    if not holds:
        raise CheckFailed(f"({choice}) is not right: {flaw}")
