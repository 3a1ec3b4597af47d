"""Checks for the chapter 1 exercises: embedding lookup, Nadaraya–Watson, fixed mixing.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, the
calls of the student's functions, and the gradient measured through the embeddings). Below it:
the judges, which compute their references from the inputs and run in the grader. Chapter 1.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .._harness import StudentError, call, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_embedding_lookup", "check_nadaraya_watson", "check_accepted_set_sizes",
           "check_fixed_mixing_answer"]


# ---------------------------------------------------------------- 1.1 the embedding as a matrix product

def _run_embedding(fn: Callable, case: dict) -> dict:
    """The student's embeddings, and what an upstream gradient ``G`` sends back to ``W_E`` through
    them (``grad``; None when it cannot be computed) and whether they carry a gradient at all: the
    facts, recorded for the judge. A row lookup (``lookup``: the function's name) and a
    RuntimeError (``raised``) are recorded as facts too, so that the judge names the misconception."""
    table = case["W_E"].clone().requires_grad_(True)  # a leaf: the gradient must reach it
    try:
        out = call(fn, case["ids"].clone(), table, lookups=True)
    except StudentError as err:
        if err.code == "lookup":
            return {"lookup": err.detail}
        if err.code == "raised" and err.detail == "RuntimeError":
            return {"raised": "RuntimeError"}
        raise
    except RuntimeError:  # while a student works, call() lets their own errors through
        return {"raised": "RuntimeError"}
    tracked = isinstance(out, torch.Tensor) and out.requires_grad
    grad = None
    if tracked:
        try:
            (grad,) = torch.autograd.grad(out, table, case["G"].to(out.dtype), allow_unused=True)
        except Exception:  # noqa: BLE001 - e.g. an output of another shape than G: no gradient to judge
            grad = None
    return {"out": out, "requires_grad": tracked, "grad": grad}


def check_embedding_lookup(fn: Callable, ids: torch.Tensor | None = None, W_E: torch.Tensor | None = None,
                           hidden: int = 0) -> None:
    """``fn(ids (…,), W_E (C, d)) -> (…, d)`` must equal the row lookup ``W_E[ids]`` exactly,
    computed as a matrix product: row lookups (indexing, ``F.embedding``, ``index_select``,
    ``gather``, ``unbind``, iterating, splitting) and leaving torch (``.numpy()``, ``.tolist()``)
    are switched off while ``fn`` runs, and the gradient must flow back to ``W_E``: the rows of
    ``one_hotᵀ · G`` for an upstream gradient ``G``. The visible ids leave out the largest id
    ``C − 1``. Chapter 1."""
    if hidden:
        g = hidden_generator("embedding_lookup", hidden)
        cases = []
        for largest in (True, False):  # with the largest id C − 1, then without it (and in float32)
            C, d = draw(g, 3, 16), draw(g, 1, 6)
            shape = tuple(draw(g, 1, 5) for _ in range(draw(g, 1, 3)))
            ids = torch.randint(0, C if largest else C - 1, shape, generator=g)
            if largest:
                ids.view(-1)[draw(g, 0, ids.numel() - 1)] = C - 1
            table = randn(g, C, d)
            cases.append(dict(ids=ids, W_E=table if largest else table.float(), G=randn(g, *shape, d)))
    else:
        ids = torch.tensor([2, 0, 3, 2]) if ids is None else ids
        W_E = seeded(0, 5, 3).float() if W_E is None else W_E
        cases = [dict(ids=ids, W_E=W_E, G=seeded(3, *ids.shape, W_E.shape[-1]))]
    for case in cases:
        case["what"] = "embed_via_one_hot(ids, W_E)"
    run_check("embedding_lookup", fn, cases, _run_embedding, hidden)


# ---------------------------------------------------------------- 1.2 Nadaraya–Watson

def check_nadaraya_watson(fn: Callable, x_query: torch.Tensor | None = None,
                          x_train: torch.Tensor | None = None, y_train: torch.Tensor | None = None,
                          bandwidth: float = 0.2, hidden: int = 0) -> None:
    """``fn(x_query (q,), x_train (m,), y_train (m,), h) -> (pred (q,), weights (q, m))``: the
    Gaussian kernel ``exp(-(x - x_i)² / (2h²))``, weights normalised per query. Chapter 1."""
    if hidden:
        g = hidden_generator("nadaraya_watson", hidden)
        m = draw(g, 8, 25)
        x = 4 * torch.rand(m, generator=g, dtype=torch.float64) - 2
        h = 0.2 + 0.8 * float(torch.rand(1, generator=g, dtype=torch.float64))
        x_small = 2 * torch.rand(draw(g, 1, 3), generator=g, dtype=torch.float64) - 1
        cases = [dict(x_query=torch.linspace(-2, 2, draw(g, 3, 9), dtype=torch.float64), x_train=x,
                      y_train=x**3 - x + 0.1 * randn(g, m), bandwidth=h),
                 dict(x_query=2 * torch.rand(1, generator=g, dtype=torch.float64) - 1,  # q = 1, m ≤ 3
                      x_train=x_small, y_train=randn(g, x_small.shape[0]),
                      bandwidth=0.3 + float(torch.rand(1, generator=g)))]
    else:
        x_train = torch.linspace(0, 1, 6, dtype=torch.float64) if x_train is None else x_train
        cases = [dict(x_query=torch.tensor([0.1, 0.45, 0.9], dtype=torch.float64) if x_query is None else x_query,
                      x_train=x_train, y_train=torch.sin(2 * math.pi * x_train) if y_train is None else y_train,
                      bandwidth=bandwidth)]
    for case in cases:
        case["what"] = "nadaraya_watson(x_query, x_train, y_train, bandwidth)"
    run_check("nadaraya_watson", fn, cases, lambda f, c: {"result": call(
        f, c["x_query"].clone(), c["x_train"].clone(), c["y_train"].clone(), c["bandwidth"])}, hidden)


# ---------------------------------------------------------------- 1.3 the set sizes a fixed mixing layer accepts

def _run_sizes(fn: Callable, case: dict) -> dict:
    sizes = call(fn, case["W"].clone(), list(case["sizes"]))
    if isinstance(sizes, (set, frozenset, range)):  # recorded as a list (the order is not judged)
        sizes = list(sizes)
    return {"sizes": sizes}


def check_accepted_set_sizes(fn: Callable, W: torch.Tensor | None = None, sizes: list[int] | None = None,
                             hidden: int = 0) -> None:
    """``fn(W (n, n), sizes) -> list`` of the set sizes ``Y = W X`` accepts, X of shape (size, d).
    Chapter 1."""
    if hidden:
        g = hidden_generator("accepted_set_sizes", hidden)
        cases = []
        for with_n in (True, False):  # n among the candidates, then not (nothing is accepted)
            n = draw(g, 2, 11)
            n += n >= 4  # not the visible n = 4
            others = {1, n - 1, n + 1, 2 * n, draw(g, 1, 30)} - {n}
            candidates = sorted(others | {n} if with_n else others)
            order = torch.randperm(len(candidates), generator=g).tolist()
            W = torch.eye(n) if with_n else randn(g, n, n)
            cases.append(dict(W=W, sizes=[candidates[i] for i in order]))
    else:
        cases = [dict(W=seeded(1, 4, 4) if W is None else W, sizes=[2, 3, 4, 5, 8] if sizes is None else list(sizes))]
    for case in cases:
        case["what"] = "accepted_set_sizes(W, sizes)"
    run_check("accepted_set_sizes", fn, cases, _run_sizes, hidden)


# ---------------------------------------------------------------- 1.4 the multiple-choice answer: recorded

def check_fixed_mixing_answer(answer: Any) -> None:
    """Exercise 1.4's multiple-choice answer, ``"a"`` to ``"d"``: what a fixed mixing layer trained
    on 10 tokens does with 12. The judge tests the claim of every option by trying the products;
    a wrong option gets a message on the flaw in its own reasoning. Chapter 1."""
    run_check("fixed_mixing_answer", None, [{"what": "answer_fixed_mixing"}], lambda fn, case: {"answer": answer})


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import numpy as np  # noqa: E402

from .._harness import _LOOKUPS, CheckFailed, typename  # noqa: E402
from .._judging import as_array, check_finite, check_shape, close, fail, judge, pair  # noqa: E402


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


@judge("nadaraya_watson", compare=("result",), atol=1e-6, rtol=1e-6,
       ok=lambda cases, outs: "Nadaraya–Watson weights (rows sum to 1) and "
                              f"{' + '.join(str(c['x_query'].shape[0]) for c in cases)} predictions match (atol 1e-6)")
def _nadaraya_watson(case: dict, out: dict) -> None:
    x_query, x_train, y_train, bandwidth = case["x_query"], case["x_train"], case["y_train"], case["bandwidth"]

    def kernel(two: float = 2.0) -> torch.Tensor:
        return torch.exp(-(x_query[:, None] - x_train[None, :]) ** 2 / (two * bandwidth**2))

    w_ref = (kernel() / kernel().sum(dim=1, keepdim=True)).numpy()
    pred_ref = w_ref @ y_train.numpy()
    pred, weights = pair(out["result"], "nadaraya_watson", ("pred", "weights"))
    pred, weights = as_array(pred, "pred"), as_array(weights, "weights")
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


@judge("accepted_set_sizes",
       ok=lambda cases, outs: "; ".join(f"a fixed {c['W'].shape[0]}×{c['W'].shape[0]} mixing matrix accepts only "
                                        f"sets of size {c['W'].shape[0]} among {c['sizes']}" for c in cases))
def _accepted_set_sizes(case: dict, out: dict) -> None:
    W, sizes, result = case["W"], list(case["sizes"]), out["sizes"]
    expected = []
    for s in sorted(sizes):  # the reference tries the product for each size, with a set X of shape (s, 3)
        try:
            W @ torch.ones(s, 3, dtype=W.dtype)
            expected.append(s)
        except RuntimeError:
            pass
    try:
        if isinstance(result, (str, bytes)):
            raise TypeError
        got = sorted(int(s) for s in result)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        raise CheckFailed(f"accepted_set_sizes must return a list of ints, got {typename(result)}") from None
    n = W.shape[0]
    if got != expected:
        if not set(got) <= set(sizes):
            raise CheckFailed(f"accepted_set_sizes must return some of the candidate sizes {sizes}, and only those")
        if got == sorted(s for s in sizes if s <= n):
            hint = ("smaller sets do not fit either: W @ X needs X to have exactly n rows, "
                    "and the layer has no padding")
        elif got == sorted(sizes):
            hint = "W has one row and one column per position, so its shape is tied to n"
        else:
            hint = f"a fixed mixing matrix of shape {tuple(W.shape)} accepts sets of exactly n = {n} elements"
        raise CheckFailed(f"{hint}\n  expected: {expected}\n  got:      {got}")


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
