"""The judges of the checks for the chapter 7 exercise on activation patching: find the head of a small
GPT whose output, patched at given positions from a clean run into a corrupted one, recovers most of
a metric, with the recovered fractions of every head as evidence.

The judge recomputes every head's patched run by an explicit forward pass of the same weights with
that head's output replaced (no hook), picks the head itself and names the likely misconception. The
inputs and the calls of the student's functions are in the kernel half,
:mod:`transformer_lib.grading.checks.ch07_patching`. Chapter 7.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..checks.ch07_patching import _GPT, _metric, _model
from ..protocol import CheckFailed, typename
from .common import as_array, check_shape, judge, pair


def _forward(model: _GPT, ids: torch.Tensor, layer: int = -1, heads: list[int] | None = None,
             positions: list[int] | None = None, source: list[torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The logits of an explicit pass and every block's head outputs ``(b, n, h, d_k)``; in block
    ``layer`` the ``heads`` at ``positions`` output ``source[layer]``'s values instead."""
    b, n = ids.shape
    x = model.tok_emb.weight[ids] + model.pos_emb.weight[:n]
    zs = []
    for l, block in enumerate(model.blocks):
        a, h = block.attn, block.norm1(x)
        q, k, v = ((h @ p.weight.T + p.bias).view(b, n, a.n_heads, a.d_k) for p in (a.q_proj, a.k_proj, a.v_proj))
        scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(a.d_k)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        z = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v)
        if l == layer:
            keep = torch.zeros(1, n, a.n_heads, 1, dtype=torch.bool)
            keep[:, positions, :, :] = True
            keep[:, :, [hh for hh in range(a.n_heads) if hh not in heads]] = False
            z = torch.where(keep, source[l], z)
        zs.append(z)
        x = x + z.reshape(b, n, -1) @ a.out_proj.weight.T + a.out_proj.bias
        x = x + block.mlp(block.norm2(x))
    return model.lm_head(model.norm_f(x)), zs


def _table(case: dict, model: _GPT, heads: Callable[[int], list[int]] = lambda h: [h],
           positions: list[int] | None = None, noising: bool = False) -> np.ndarray:
    """The recovered fraction of every ``[layer, head]``, patching ``heads(head)`` at ``positions`` (the
    case's if None) of that layer (``noising``: the corrupted run's head patched into the clean run
    instead, the other direction)."""
    where = list(case["positions"]) if positions is None else positions
    metric = _metric(case["answers"])
    (clean, clean_z), (corr, corr_z) = _forward(model, case["clean"]), _forward(model, case["corrupted"])
    m_clean, m_corr = metric(clean), metric(corr)
    into, source = (case["clean"], corr_z) if noising else (case["corrupted"], clean_z)
    return np.array([[(metric(_forward(model, into, layer, heads(head), where, source)[0]) - m_corr) / (m_clean - m_corr)
                      for head in range(case["n_heads"])] for layer in range(case["n_layers"])])


def _variants(case: dict, model: _GPT, expected: np.ndarray) -> dict[str, Callable[[], np.ndarray]]:
    """What likely mistakes give for the table (computed when asked), message first."""
    H, n, positions = case["n_heads"], case["clean"].shape[1], list(case["positions"])
    found = {"measured from the wrong end: r = (metric(patched) − metric(corrupted)) / (metric(clean) − "
             "metric(corrupted)) is 0 for the corrupted run and 1 for the clean one": lambda: 1 - expected}
    for shift in (1, -1):
        found[f"the fractions belong to the heads {'after' if shift > 0 else 'before'} them: head h is the d_k "
              "columns h·d_k … (h+1)·d_k − 1 of the input of out_proj (heads count from 0)"] = \
            lambda shift=shift: np.roll(expected, -shift, axis=1)
        moved = [p + shift for p in positions if 0 <= p + shift < n]
        if moved:
            found[f"that patches the positions one to the {'right' if shift > 0 else 'left'} of the ones given: "
                  f"patch the given positions of the position axis (dim 1)"] = \
                lambda moved=moved: _table(case, model, positions=moved)
    found["that patches every position: only the positions given take the clean values"] = lambda: _table(
        case, model, positions=list(range(n)))
    found["that patches every head of the layer at once: each head is patched alone, its own d_k columns"] = \
        lambda: _table(case, model, heads=lambda h: list(range(H)))
    found["that runs the clean input with the corrupted run's head: run the corrupted input, with the clean run's "
          "values of the head"] = lambda: _table(case, model, noising=True)
    return found


def _find_ok(cases: list[dict], outs: list[dict]) -> str:
    return ("the recovered fractions of every head equal explicit passes with that head's output replaced (1e-6), "
            "and the head picked has the largest, for " + ", ".join(
                f"{c['n_layers'] * c['n_heads']} heads ({c['n_layers']} blocks of {c['n_heads']}) patched at "
                f"positions {c['positions']}" for c in cases))


@judge("find_head", ok=_find_ok)
def _find_head(case: dict, out: dict) -> None:
    what, tol, L, H = case["what"], 1e-6, case["n_layers"], case["n_heads"]
    best, fractions = pair(out.get("result"), what, ("(layer, head)", "fractions"))
    model = _model(case)
    with torch.no_grad():
        expected = _table(case, model)
        corr_logits = _forward(model, case["corrupted"])[0].numpy()
    after = out.get("after")
    if not (isinstance(after, torch.Tensor) and np.allclose(after.numpy(), corr_logits, atol=1e-9, rtol=0)):
        raise CheckFailed(f"{what}: after your function returned, the model still gives other logits on the "
                          "corrupted input: remove each hook (handle.remove(), in a finally block) and leave the "
                          "weights as they were")
    got = as_array(fractions, f"{what}: the fractions")
    if got.shape == (H, L) and H != L:
        raise CheckFailed(f"{what}: the fractions are indexed [layer, head], shape (n_layers, n_heads) = ({L}, {H}), "
                          f"got shape {got.shape}")
    check_shape(got, (L, H), f"{what}: the fractions", "one row per block, one column per head")
    wrong = np.abs(got - expected) > tol
    if wrong.any():
        if not np.isfinite(got).all():
            raise CheckFailed(f"{what}: the fractions hold nan or inf: the metric of the clean and the corrupted "
                              "runs differ here, so only a wrong patch or a wrong formula divides by zero")
        for hint, make in _variants(case, model, expected).items():
            with torch.no_grad():
                variant = make()
            if np.allclose(got, variant, atol=tol, rtol=0) and np.abs(variant - expected).max() > 10 * tol:
                raise CheckFailed(f"{what}: {hint}")
        layer, head = (int(i) for i in np.argwhere(wrong)[0])
        raise CheckFailed(f"{what}: the recovered fraction of block {layer}, head {head} (and {int(wrong.sum()) - 1} "
                          "more) differs from that of the corrupted run with this head's output (its columns of "
                          f"out_proj's input) replaced by the clean run's at these positions (atol {tol})")
    if not (isinstance(best, list) and len(best) == 2 and all(type(i) is int for i in best)):
        raise CheckFailed(f"{what}: the head must be a pair of whole numbers (layer, head), got {typename(best)}")
    top = expected.max()
    if not (0 <= best[0] < L and 0 <= best[1] < H and expected[best[0], best[1]] >= top - 10 * tol):
        layer, head = best
        if 0 <= head < L and 0 <= layer < H and expected[head, layer] >= top - 10 * tol:
            raise CheckFailed(f"{what}: the head is given as (layer, head), blocks first")
        if 0 <= layer < L and 0 <= head < H and (abs(expected[layer, head]) >= np.abs(expected).max() - 10 * tol
                                                  or expected[layer, head] <= expected.min() + 10 * tol):
            raise CheckFailed(f"{what}: the head that recovers most has the largest fraction, not the smallest nor "
                              "the largest in size: a negative fraction means the patch moves the metric further "
                              "from the clean run")
        raise CheckFailed(f"{what}: the head picked is not the one with the largest recovered fraction in your own "
                          "table")
