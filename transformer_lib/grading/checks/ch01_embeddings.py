"""The checks' kernel half for the chapter 1 exercises: the embedding lookup as a matrix product,
kernel regression on vectors computed as a softmax of dot products, the equivariant part of a fixed
mixing, and the question on fixed mixing and variable n.

What runs in the student's kernel (the inputs, visible and hidden, the calls of the student's
functions, and the facts measured there: the gradient through the embeddings, the largest tensor the
kernel regression computed). The judges are in
:mod:`transformer_lib.grading.judges.ch01_embeddings`. Chapter 1.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .._calls import EagerDispatchMode, call
from .._harness import StudentError, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_embedding_lookup", "check_nw_vectors", "check_equivariant_part", "check_fixed_mixing_answer"]

_DISTANCES = ("cdist", "pdist")  # torch's pairwise distances: the exercise expands the square instead


# ---------------------------------------------------------------- 1.1 the embedding as a matrix product

def _run_embedding(fn: Callable, case: dict) -> dict:
    """The student's embeddings, and what an upstream gradient ``G`` sends back to ``W_E`` through
    them (``grad``; None when it cannot be computed) and whether they carry a gradient at all: the
    facts, recorded for the judge. A row lookup (``lookup``: the function's name) and a
    RuntimeError (``raised``) are recorded as facts too, so that the judge names the misconception."""
    table = case["W_E"].clone().requires_grad_(True)  # a leaf: the gradient must reach it

    def facts(out: Any) -> dict:  # measured on the live result, inside the watch
        tracked = type(out) is torch.Tensor and out.requires_grad
        grad = None
        if tracked:
            try:
                (grad,) = torch.autograd.grad(out, table, case["G"].to(out.dtype), allow_unused=True)
            except Exception:  # noqa: BLE001 - e.g. an output of another shape than G: no gradient to judge
                grad = None
        return {"out": out, "requires_grad": tracked, "grad": grad}

    try:
        return call(fn, case["ids"].clone(), table, lookups=True, after=facts)
    except StudentError as err:
        if err.code == "lookup":
            return {"lookup": err.detail}
        if err.code == "raised" and err.detail == "RuntimeError":
            return {"raised": "RuntimeError"}
        raise
    except RuntimeError:  # while a student works, call() lets their own errors through
        return {"raised": "RuntimeError"}


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
            cases.append(dict(ids=ids, W_E=table if largest else table.float(), G=randn(g, *shape, d),
                              inputs="the largest id C − 1 among the ids" if largest else "a float32 table"))
    else:
        ids = torch.tensor([2, 0, 3, 2]) if ids is None else ids
        W_E = seeded(0, 5, 3).float() if W_E is None else W_E
        cases = [dict(ids=ids, W_E=W_E, G=seeded(3, *ids.shape, W_E.shape[-1]))]
    for case in cases:
        case["what"] = "embed_via_one_hot(ids, W_E)"
    run_check("embedding_lookup", fn, cases, _run_embedding, hidden)


# ---------------------------------------------------------------- 1.2 kernel regression on vectors

class _Largest(EagerDispatchMode):
    """The largest tensor any of torch's operations created while the block ran (views, which share
    an input's memory, are not counted), and how many operations ran: what the computation held at
    once, and whether it loops over the queries."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.ops = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops += 1
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            if t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.numel())
        return out


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _run_nw(fn: Callable, case: dict) -> dict:
    """The student's (pred, weights), the largest tensor computed on the way and the number of torch
    operations (measured here)."""
    watch = _Largest()
    with watch:
        result = call(fn, case["Q"].clone(), case["K"].clone(), case["V"].clone(), case["bandwidth"],
                      banned=_DISTANCES)
    return {"result": result, "largest": watch.largest, "ops": watch.ops}


def check_nw_vectors(fn: Callable, hidden: int = 0) -> None:
    """``fn(Q (q, d), K (m, d), V (m, d_v), h) -> (pred (q, d_v), weights (q, m))``: Nadaraya–Watson with
    the Gaussian kernel ``exp(−‖x − k‖²/(2h²))`` on vectors, computed without a (q, m, d) tensor of
    differences. Chapter 1."""
    if hidden:
        g = hidden_generator("nw_vectors", hidden)
        q, m, d = draw(g, 50, 60), draw(g, 40, 50), draw(g, 20, 30)  # a loop over the queries shows
        keys = randn(g, m, d) * (0.5 + torch.rand(m, 1, generator=g, dtype=torch.float64))  # unequal norms
        few = randn(g, draw(g, 2, 8), 3)
        cases = [dict(Q=randn(g, q, d), K=keys, V=randn(g, m, draw(g, 1, 4)),
                      bandwidth=2.0 + 3 * float(torch.rand(1, generator=g))),
                 dict(Q=randn(g, draw(g, 1, 5), 3), K=few, V=randn(g, few.shape[0], 2),  # tiny h: exp underflows
                      bandwidth=0.002 + 0.002 * float(torch.rand(1, generator=g)))]
    else:
        K = seeded(12, 6, 5) * torch.linspace(0.5, 2.0, 6, dtype=torch.float64)[:, None]  # keys of unequal norms
        cases = [dict(Q=seeded(11, 4, 5), K=K, V=seeded(13, 6, 2), bandwidth=1.5),
                 dict(Q=seeded(14, 50, 5), K=K, V=seeded(13, 6, 2), bandwidth=2.0),          # 50 queries: a loop shows
                 dict(Q=seeded(15, 3, 5), K=K, V=seeded(13, 6, 2), bandwidth=0.003)]         # tiny h: exp underflows
    for case in cases:
        case["what"] = "nw_vectors(Q, K, V, bandwidth)"
    run_check("nw_vectors", fn, cases, _run_nw, hidden)


# ---------------------------------------------------------------- 1.3 the equivariant part of a fixed mixing

def check_equivariant_part(fn: Callable, hidden: int = 0) -> None:
    """``fn(W (n, n)) -> (n, n)``: the average of P W Pᵀ over all n! permutation matrices P. Chapter 1."""
    if hidden:
        g = hidden_generator("equivariant_part", hidden)
        cases = [dict(W=randn(g, n, n)) for n in (draw(g, 30, 40), draw(g, 2, 3), 1)]
    else:
        cases = [dict(W=seeded(14, 4, 4))]
    for case in cases:
        case["what"] = f"equivariant_part(W) for n = {case['W'].shape[0]}"
    run_check("equivariant_part", fn, cases, lambda f, c: {"result": call(f, c["W"].clone())}, hidden)


# ---------------------------------------------------------------- 1.4 the multiple-choice answer: recorded

def check_fixed_mixing_answer(answer: Any) -> None:
    """Exercise 1.4's multiple-choice answer, ``"a"`` to ``"d"``: what a fixed mixing layer trained
    on 10 tokens does with 12. The judge tests the claim of every option by trying the products;
    a wrong option gets a message on the flaw in its own reasoning. Chapter 1."""
    run_check("fixed_mixing_answer", None, [{"what": "answer_fixed_mixing"}], lambda fn, case: {"answer": answer})
