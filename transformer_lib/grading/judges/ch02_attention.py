"""The judges of the checks for the chapter 2 exercises: the practice problem by hand, the stable
softmax, attention from scratch and the √d_k questions. The mask that moves with the tokens (2.5) is
checked in ``ch02_permutation.py``.

The judges compute their references from the inputs and run in the grader. The inputs and the calls
of the student's functions are in the kernel half,
:mod:`transformer_lib.grading.checks.ch02_attention`. Chapter 2.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..checks.ch02_attention import _ATTENTIONS, _SOFTMAXES
from ..protocol import CheckFailed
from .common import as_array, check_finite, check_shape, close, fail, judge, pair, show, truth


@judge("stable_softmax", compare=("out",), atol=1e-6, rtol=1e-5, bans=_SOFTMAXES,
       ok=lambda cases, outs: f"stable_softmax matches torch.softmax on inputs of shape "
                              f"{', '.join(str(tuple(c['x'].shape)) for c in cases)}, largest |entry| "
                              f"{max(float(c['x'].abs().max()) for c in cases):g} (rtol 1e-5)")
def _stable_softmax(case: dict, out: dict) -> None:
    x, dim, atol, rtol = case["x"], case["dim"], 1e-6, 1e-5
    expected = torch.softmax(x.double(), dim=dim).numpy()
    got = as_array(out["out"], "stable_softmax(x)")
    check_shape(got, expected.shape, "stable_softmax(x)", "softmax keeps the shape of its input")
    check_finite(got, "stable_softmax(x)", "exp overflows for large entries (exp(1000) = inf): subtract "
                 "the maximum along `dim` (x.amax(dim, keepdim=True)) before exponentiating")
    sums = got.sum(axis=dim)
    if not np.allclose(sums, 1.0, atol=1e-5):
        other = [d for d in range(got.ndim) if d != dim % got.ndim and np.allclose(got.sum(axis=d), 1.0, atol=1e-5)]
        hint = (f"did you take the softmax over the wrong axis (dim={other[0]} instead of dim={dim})?"
                if other else "did you divide by the sum along `dim` (with keepdim=True)?")
        fail(f"the output does not sum to 1 along dim={dim} — {hint} (sums shown)", np.ones_like(sums), sums)
    if not close(got, expected, atol, rtol):
        fail(f"stable_softmax differs from the softmax along dim={dim} (atol {atol}, rtol {rtol})",
             expected, got)


def _diagnose_weights(a: np.ndarray, mask, expected: np.ndarray, unmasked: np.ndarray,
                      variants: dict[str, np.ndarray], atol: float) -> None:
    """Raise with the misconception that explains a wrong A, if one does."""
    if close(a, np.swapaxes(expected, -1, -2), atol, atol) and not close(a, expected, atol, atol):
        fail("A looks transposed: A[i, j] is how much query i attends to key j, so compute "
             "softmax(Q Kᵀ/√d_k) with the softmax over the keys (dim=-1)", expected, a)
    check_shape(a, expected.shape, "A", "one row per query, one column per key: (…, n, m)")
    if mask is not None:
        allowed = mask.expand(expected.shape).numpy()
        if close(a, unmasked, atol, atol) and not close(a, expected, atol, atol):
            fail("the mask was not applied: weights at masked positions must be exactly 0 (set those scores to "
                 "−inf before the softmax; True = may attend)", expected, a)
        if np.allclose(np.where(allowed, a, 0.0), np.where(allowed, unmasked, 0.0), atol=atol) \
                and not close(a, expected, atol, atol):
            sums = a.sum(axis=-1)
            fail("rows of A do not sum to 1 — did you apply the mask after the softmax? Set masked "
                 "scores to −inf before the softmax so the remaining weights renormalise (row sums shown)",
                 np.ones_like(sums), sums)
        if not np.allclose(a[~allowed], 0.0, atol=atol):
            fail("weights at masked positions must be exactly 0: set the scores to −inf where the mask "
                 "is False before the softmax (True = may attend, PyTorch's convention)", expected, a)
    check_finite(a, "A", "exp overflows unless the softmax subtracts the row maximum")
    for hint, variant in variants.items():
        if close(a, variant, atol, atol) and not close(a, expected, atol, atol):
            fail(hint, expected, a)
    if not close(a, expected, atol, atol):
        fail(f"A differs from softmax(Q Kᵀ/√d_k) (atol {atol})", expected, a)


def _attention(case: dict, out: dict) -> None:
    q, k, v, mask, atol = case["q"], case["k"], case["v"], case.get("mask"), 1e-6
    d_k = q.shape[-1]

    def weights(scale: float, dim: int = -1, masked: bool = True) -> np.ndarray:
        scores = q @ k.transpose(-2, -1) * scale
        if masked and mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=dim).numpy()

    a_ref = weights(1 / math.sqrt(d_k))
    z_ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).numpy()
    z, a = pair(out["result"], "attention", ("Z", "A"))
    z, a = as_array(z, "Z"), as_array(a, "A")
    _diagnose_weights(a, mask, a_ref, weights(1 / math.sqrt(d_k), masked=False), {
        f"did you forget to divide the scores by √d_k = √{d_k}?": weights(1.0),
        f"divide the scores by √d_k = {math.sqrt(d_k):g}, not by d_k = {d_k}": weights(1 / d_k),
        "rows of A do not sum to 1 — did you take the softmax over the wrong axis (dim=-2)? It runs over "
        "the keys (dim=-1)": weights(1 / math.sqrt(d_k), dim=-2)}, atol)
    square = a_ref.shape[-1] == a_ref.shape[-2]
    if square and z.shape == z_ref.shape and close(z, np.swapaxes(a_ref, -1, -2) @ v.numpy(), atol, atol) \
            and not close(z, z_ref, atol, atol):
        fail("Z = A V: row i of Z is query i's weighted average of the value rows (did you use Aᵀ?)", z_ref, z)
    check_shape(z, z_ref.shape, "Z", "one row per query, d_v columns: (…, n, d_v)")
    if not close(z, z_ref, atol, atol):
        fail(f"Z differs from torch.nn.functional.scaled_dot_product_attention (atol {atol})", z_ref, z)


judge("attention", compare=("result",), atol=1e-6, rtol=1e-6, bans=_ATTENTIONS,
      ok=lambda cases, outs: "attention matches softmax(Q Kᵀ/√d_k) and torch's scaled_dot_product_attention for "
                             + "; ".join(f"Q {tuple(c['q'].shape)}, K {tuple(c['k'].shape)}, V {tuple(c['v'].shape)} "
                                         f"({c['inputs']})" for c in cases) + " (atol 1e-6)")(_attention)
judge("masked_attention", compare=("result",), atol=1e-6, rtol=1e-6, bans=_ATTENTIONS,
      ok=lambda cases, outs: "masked attention: weights are 0 where the mask is False, rows sum to 1, output "
                             "matches torch for masks of shape "
                             + "; ".join(f"{tuple(c['mask'].shape)} on Q {tuple(c['q'].shape)} ({c['inputs']})"
                                         for c in cases) + " (atol 1e-6)")(_attention)


# q, k with iid N(0, 1) entries: qᵀk sums d_k independent terms q_i k_i, each of variance 1.
_E_Q, _E_Q2 = 0.0, 1.0  # mean and second moment of each entry of q (and of k)
_TERM = _E_Q2 * _E_Q2 - (_E_Q * _E_Q) ** 2  # Var(q_i k_i)


def _numbers(reference: Callable, hints: dict[str, Callable]) -> Callable[[dict, dict], None]:
    def judge_number(case: dict, out: dict) -> None:
        d, what = case["d_k"], case["what"]
        got = as_array(out["value"], what)
        expected = np.asarray(reference(d), dtype=np.float64)
        check_shape(got, expected.shape, what)
        if not close(got, expected, 1e-12, 1e-6):   # the value asked for is never shown
            hint = next((f"{what}: {h}" for h, variant in hints.items()
                         if close(got, np.asarray(variant(d), dtype=np.float64), 1e-12, 1e-6)),
                        f"{what} is not right for q, k with independent N(0, 1) entries")
            raise CheckFailed(f"{hint}\n  got: {show(got)}")
    return judge_number


def _two_sigma(d: int, k: float = 2.0) -> tuple[float, float]:
    return (-k * math.sqrt(d * _TERM), k * math.sqrt(d * _TERM))


judge("score_std", compare=("value",), atol=1e-12, rtol=1e-6,
      ok=lambda cases, outs: "score_std: the raw score qᵀk has standard deviation √d_k for d_k in "
                             f"{[c['d_k'] for c in cases]}")(_numbers(lambda d: math.sqrt(d * _TERM), {
          "that is the variance Var(qᵀk) = d_k; the standard deviation is its square root": lambda d: d * _TERM,
          "that is the standard deviation after dividing by √d_k; the question is about the raw qᵀk":
              lambda d: 1.0}))
judge("score_range", compare=("value",), atol=1e-12, rtol=1e-6,
      ok=lambda cases, outs: "score_range: about 95% of raw scores lie within ±2√d_k for d_k in "
                             f"{[c['d_k'] for c in cases]}")(_numbers(_two_sigma, {
          "that is ±1 standard deviation (about 68% of scores); the question asks for ±2 (about 95%)":
              lambda d: _two_sigma(d, 1.0),
          "the range uses the standard deviation √d_k, not the variance d_k":
              lambda d: (-2.0 * d * _TERM, 2.0 * d * _TERM)}))
judge("variance_divided_by_dk", compare=("value",), atol=1e-12, rtol=1e-6,
      ok=lambda cases, outs: "variance_divided_by_dk: dividing by d_k leaves variance 1/d_k (nearly uniform "
                             f"attention), d_k in {[c['d_k'] for c in cases]}")(_numbers(lambda d: d * _TERM / d**2, {
          "that is the variance after dividing by √d_k; dividing by d_k divides the variance by d_k²":
              lambda d: d * _TERM / d,
          "Var(c·X) = c²·Var(X): with c = 1/d_k the variance is d_k/d_k² = 1/d_k": lambda d: d * _TERM / d**3}))


# The practice problem's data (typed as inputs; the answers are computed from them).
_X = torch.tensor([[1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 0, 1]], dtype=torch.float64)
_W_Q = torch.tensor([[1, 0], [0, 1], [1, 0], [0, 1]], dtype=torch.float64)
_W_K = torch.tensor([[0, 1], [1, 0], [0, 1], [1, 1]], dtype=torch.float64)
_W_V = _W_Q.clone()


def _compare_hand(name: str, got: np.ndarray, expected: torch.Tensor, atol: float,
                  hints: dict[str, torch.Tensor]) -> None:
    """Fail naming the misconception and the wrong entries (with the student's values), never
    the expected values: the student works them out by hand."""
    expected = expected.numpy()
    if got.shape == expected.shape[::-1] != expected.shape:
        raise CheckFailed(f"{name} is transposed: tokens are rows, so {name} has shape {expected.shape}, "
                          f"one row per token (got {got.shape})")
    check_shape(got, expected.shape, name)
    if close(got, expected, atol, 0.0):
        return
    hint = next((h for h, variant in hints.items() if close(got, variant.numpy(), atol, 0.0)),
                f"these entries are off by more than {atol:g}")
    wrong = np.argwhere(~(np.abs(got - expected) <= atol))
    entries = ", ".join(f"{name}[{', '.join(map(str, pos))}] = {got[tuple(pos)]:.4g}" for pos in wrong[:9])
    raise CheckFailed(f"{name}: {hint}\n  wrong entries ({len(wrong)} of {got.size}), your values: {entries}")


@judge("hand_qkv", compare=("Q", "K", "V"), atol=1e-9, ok="Q, K and V of the practice problem are right")
def _hand_qkv(case: dict, out: dict) -> None:
    q, k, v = _X @ _W_Q, _X @ _W_K, _X @ _W_V
    got = {n: as_array(out[n], n) for n in ("Q", "K", "V")}
    swapped = "Q and K are swapped: Q = X W_Q, K = X W_K"
    _compare_hand("Q", got["Q"], q, 1e-9, {swapped: k})
    _compare_hand("K", got["K"], k, 1e-9, {swapped: q})
    _compare_hand("V", got["V"], v, 1e-9, {"V = X W_V (here W_V = W_Q)": k})


@judge("hand_scores", compare=("S",), atol=1e-9,
       ok="S = Q Kᵀ of the practice problem is right, and so is your answer on its symmetry")
def _hand_scores(case: dict, out: dict) -> None:
    q, k = _X @ _W_Q, _X @ _W_K
    s, d_k = q @ k.T, q.shape[-1]
    _compare_hand("S", as_array(out["S"], "S"), s, 1e-9, {
        "S looks transposed: s_ij = q_i · k_j, so S = Q Kᵀ (row i belongs to query i), not K Qᵀ": s.T,
        "S is the raw score matrix Q Kᵀ; the 1/√d_k scaling comes in the next step": s / math.sqrt(d_k),
        "the keys are K = X W_K, not Q (Q Qᵀ is symmetric)": q @ q.T})
    if truth(out["S_symmetric"], "S_symmetric") != bool(torch.equal(s, s.T)):
        raise CheckFailed("S_symmetric: S is symmetric when s_ij = s_ji for every pair i, j; compare the "
                          "entries of your (correct) S above and below its diagonal")


@judge("hand_weights",
       ok="A = softmax(S/√2) and Z = A V of the practice problem are right to 3 decimals, and so is the row sum")
def _hand_weights(case: dict, out: dict) -> None:
    q, k, v, atol, atol_z = _X @ _W_Q, _X @ _W_K, _X @ _W_V, 5e-4 + 1e-9, 1e-3
    s, d_k = q @ k.T, q.shape[-1]
    a = torch.softmax(s / math.sqrt(d_k), dim=-1)
    got_a, got_z = as_array(out["A"], "A"), as_array(out["Z"], "Z")
    hints = {f"did you forget to divide the scores by √d_k = √{d_k} before the softmax?": torch.softmax(s, -1),
             f"divide the scores by √d_k = √{d_k} ≈ {math.sqrt(d_k):.3f}, not by d_k = {d_k}":
                 torch.softmax(s / d_k, -1),
             "columns sum to 1 instead of rows — did you take the softmax over the wrong axis?":
                 torch.softmax(s / math.sqrt(d_k), 0),
             "A looks transposed: row i holds query i's weights over the keys": a.T}
    if got_a.shape == a.shape and close(got_a, a.numpy(), 5e-3, 0.0) and not close(got_a, a.numpy(), atol, 0.0):
        raise CheckFailed("A: right to 2 decimals but not to 3 — give every weight to 3 decimals "
                          "(within 0.0005 of the exact value)")
    _compare_hand("A", got_a, a, atol, hints)
    if got_z.shape == (a @ v).shape and close(got_z, (a @ v).numpy(), 5e-3, 0.0) \
            and not close(got_z, (a @ v).numpy(), atol_z, 0.0):
        raise CheckFailed("Z: right to 2 decimals but not to 3 — give every entry to 3 decimals")
    _compare_hand("Z", got_z, a @ v, atol_z, {"Z = A V: the weights multiply V from the left": a.T @ v,
                                              "Z uses the values V, not the keys K": a @ k})
    if out["A_row_sum"] is None:
        raise CheckFailed("A_row_sum: set it to what each row of A sums to (a number)")
    row_sum = as_array(out["A_row_sum"], "A_row_sum")
    if row_sum.shape not in {(), (1,), (a.shape[0],)}:
        raise CheckFailed(f"A_row_sum: one number (or one per row), got shape {row_sum.shape}")
    if not np.allclose(row_sum, a.sum(dim=-1).numpy(), atol=1e-6, rtol=0):
        hint = ("that is the sum of the whole matrix; the question is about one row"
                if np.allclose(row_sum, a.sum().item(), atol=1e-6) else
                "each row of A is a softmax: positive numbers divided by their own total")
        raise CheckFailed(f"A_row_sum: {hint}")
