"""Checks for the chapter 2 exercises: the practice problem by hand, the stable softmax,
attention from scratch and the √d_k questions. The mask that moves with the tokens (2.5) is
checked in ``ch02_permutation.py``.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, and
the calls of the student's functions). Below it: the judges, which compute their references
from the inputs and run in the grader. Chapter 2.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .._calls import call
from .._harness import draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_hand_qkv", "check_hand_scores", "check_hand_weights", "check_stable_softmax",
           "check_attention", "check_masked_attention", "check_score_std", "check_score_range",
           "check_variance_divided_by_dk"]

_SOFTMAXES = ("softmax", "logsumexp")  # also log_softmax, nn.Softmax, torch.special.softmax, Tensor.softmax
_ATTENTIONS = ("scaled_dot_product_attention",)


# ---------------------------------------------------------------- 2.1 by hand: the values are recorded

def _record_values(name: str, values: dict[str, Any]) -> None:
    run_check(name, None, [{"what": name}], lambda fn, case: dict(values))


def check_hand_qkv(Q: Any, K: Any, V: Any) -> None:
    """The practice problem's ``Q = X W_Q``, ``K = X W_K``, ``V = X W_V`` (3×2 each). Chapter 2."""
    _record_values("hand_qkv", {"Q": Q, "K": K, "V": V})


def check_hand_scores(S: Any, S_symmetric: Any = None) -> None:
    """The practice problem's raw scores ``S = Q Kᵀ`` (3×3), and the answer to "is S symmetric?"."""
    _record_values("hand_scores", {"S": S, "S_symmetric": S_symmetric})


def check_hand_weights(A: Any, Z: Any, A_row_sum: Any = None) -> None:
    """The practice problem's ``A = softmax(S/√d_k)`` to 3 decimals (within 0.0005), ``Z = A V`` to
    3 decimals (within 0.001) and what each row of A sums to. Chapter 2."""
    _record_values("hand_weights", {"A": A, "Z": Z, "A_row_sum": A_row_sum})


# ---------------------------------------------------------------- 2.2 the stable softmax

def check_stable_softmax(fn: Callable, x: torch.Tensor | None = None, dim: int = -1, hidden: int = 0) -> None:
    """``fn(x, dim)`` must equal ``torch.softmax(x, dim)``, also for entries of ±1000. Chapter 2."""
    if hidden:
        g = hidden_generator("stable_softmax", hidden)
        shape = (draw(g, 1, 3), draw(g, 2, 6), draw(g, 2, 6))
        cases = [dict(x=(400 * randn(g, *shape)).float(), dim=draw(g, -3, 2)),
                 dict(x=-1e4 + randn(g, draw(g, 2, 5), draw(g, 2, 5)), dim=draw(g, 0, 1))]
    else:
        cases = [dict(x=torch.tensor([[1.0, 2.0, 3.0], [1000.0, 999.0, -5.0]]) if x is None else x, dim=dim)]
    for case in cases:
        case["what"] = "stable_softmax(x, dim)"
    run_check("stable_softmax", fn, cases, lambda f, c: {"out": call(f, c["x"].clone(), dim=c["dim"],
                                                                        banned=_SOFTMAXES)}, hidden)


# ---------------------------------------------------------------- 2.3 attention from scratch

def _run_attention(fn: Callable, case: dict) -> dict:
    kwargs = {} if case.get("mask") is None else {"mask": case["mask"].clone()}
    return {"result": call(fn, case["q"].clone(), case["k"].clone(), case["v"].clone(), banned=_ATTENTIONS,
                           **kwargs)}


def _inputs(q: torch.Tensor, k: torch.Tensor) -> str:
    """The kind of a case's inputs, for the ✓ line and a hidden test's message: batched or not, n = m or not."""
    kind = ["batched" if q.dim() > 2 else "no batch dimension", "n = m" if q.shape[-2] == k.shape[-2] else "n ≠ m"]
    return ", ".join(kind + ["d_k = 1"] * (q.shape[-1] == 1))


def _attention_case(g: torch.Generator, masked: bool) -> dict:
    lead = tuple(draw(g, 1, 3) for _ in range(draw(g, 0, 2)))
    n, m, d_k, d_v = draw(g, 1, 7), draw(g, 1, 8), draw(g, 1, 9), draw(g, 1, 6)
    case = dict(q=randn(g, *lead, n, d_k, scale=1.5), k=randn(g, *lead, m, d_k, scale=1.5), v=randn(g, *lead, m, d_v))
    case["inputs"] = _inputs(case["q"], case["k"])
    if masked:
        mask = torch.rand(n, m, generator=g) > 0.5
        mask[torch.arange(n), torch.randint(0, m, (n,), generator=g)] = True  # every query sees some key
        case["mask"] = mask
    return case


def check_attention(fn: Callable, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
                    v: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(Q (…, n, d_k), K (…, m, d_k), V (…, m, d_v)) -> (Z (…, n, d_v), A (…, n, m))``. Chapter 2."""
    if hidden:
        g = hidden_generator("attention", hidden)
        cases = [_attention_case(g, masked=False) for _ in range(3)]
    else:
        cases = [dict(q=seeded(10, 2, 3, 8, scale=1.5) if q is None else q,     # batched, n ≠ m
                      k=seeded(11, 2, 5, 8, scale=1.5) if k is None else k, v=seeded(12, 2, 5, 3) if v is None else v)]
        cases[0]["inputs"] = _inputs(cases[0]["q"], cases[0]["k"])
    for case in cases:
        case["what"] = "attention(Q, K, V)"
    run_check("attention", fn, cases, _run_attention, hidden)


def check_masked_attention(fn: Callable, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
                           v: torch.Tensor | None = None, mask: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(Q, K, V, mask=mask)`` with a bool mask (True = may attend), e.g. causal. Chapter 2."""
    if hidden:
        g = hidden_generator("masked_attention", hidden)
        cases = [_attention_case(g, masked=True) for _ in range(3)]
    else:
        q = seeded(20, 2, 4, 4, scale=1.5) if q is None else q
        k = seeded(21, 2, 6, 4, scale=1.5) if k is None else k
        v = seeded(22, 2, 6, 3) if v is None else v
        n, m = q.shape[-2], k.shape[-2]   # causal with m − n cached keys before the queries
        mask = torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n) if mask is None else mask
        cases = [dict(q=q, k=k, v=v, mask=mask, inputs=_inputs(q, k))]
    for case in cases:
        case["what"] = "attention(Q, K, V, mask)"
    run_check("masked_attention", fn, cases, _run_attention, hidden)


# ---------------------------------------------------------------- 2.4 the d_k = 256 questions

def _check_numbers(name: str, fn: Callable, d_ks: list[int] | None, hidden: int) -> None:
    if hidden:
        g = hidden_generator(name, hidden)
        d_ks = [1, draw(g, 2, 63), draw(g, 64, 5000)]
    cases = [dict(d_k=d, what=f"{name}({d})", **({"inputs": "d_k = 1"} if d == 1 else {}))
             for d in ([1, 64, 256] if d_ks is None else d_ks)]
    run_check(name, fn, cases, lambda f, c: {"value": call(f, c["d_k"])}, hidden)


def check_score_std(fn: Callable, d_ks: list[int] | None = None, hidden: int = 0) -> None:
    """``fn(d_k)`` = standard deviation of the raw score qᵀk, tried for several d_k. Chapter 2."""
    _check_numbers("score_std", fn, d_ks, hidden)


def check_score_range(fn: Callable, d_ks: list[int] | None = None, hidden: int = 0) -> None:
    """``fn(d_k)`` = ``(low, high)``, mean ± 2 standard deviations of qᵀk, tried for several d_k. Chapter 2."""
    _check_numbers("score_range", fn, d_ks, hidden)


def check_variance_divided_by_dk(fn: Callable, d_ks: list[int] | None = None, hidden: int = 0) -> None:
    """``fn(d_k)`` = Var(qᵀk / d_k), tried for several d_k. Chapter 2."""
    _check_numbers("variance_divided_by_dk", fn, d_ks, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import math  # noqa: E402

import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .._harness import CheckFailed  # noqa: E402
from .._judging import as_array, check_finite, check_shape, close, fail, judge, pair, show, truth  # noqa: E402


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
