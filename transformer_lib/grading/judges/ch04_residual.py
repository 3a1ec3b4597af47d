"""The judges of the checks for the chapter 4 exercises: the expansion of a residual stack worked by
hand on new numbers, one write removed from the residual stream of a given model, and the expansion
of a stack of matrices order by order.

The judges compute their references from the inputs and run in the grader. The inputs and the calls
of the student's functions are in the kernel half,
:mod:`transformer_lib.grading.checks.ch04_residual`. Chapter 4.
"""
from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations
from typing import Any

import numpy as np
import torch
from torch import nn

from ..checks.ch04_residual import tiny_gpt
from ..protocol import CheckFailed
from .common import as_array, check_finite, check_shape, close, fail, judge


# ---------------------------------------------------------------- 4.1 the expansion by hand

_HAND_J = (Fraction(1, 2), Fraction(-1, 5), Fraction(2, 5), Fraction(-1, 2))  # j_1 … j_4, as typed in the box
_SHRINK, _TARGET = Fraction(-1, 2), Fraction(1, 1000)  # layers with j = −1/2; gradient below 10⁻³


def _order_sum(js: tuple[Fraction, ...], r: int) -> Fraction:
    """The expansion's terms with exactly r layers, added up (each subset once)."""
    return sum((math.prod(sub, start=Fraction(1)) for sub in combinations(js, r)), start=Fraction(0))


def _hand_answer(value: Any, what: str, length: int | None = None) -> np.ndarray:
    arr = as_array(value, what)
    if length is None and arr.shape != ():
        raise CheckFailed(f"{what} is one number, got an array of shape {arr.shape}")
    if length is not None and arr.shape != (length,):
        raise CheckFailed(f"{what} holds {length} numbers, the sums of the terms with 1, 2, …, {length} layers "
                          f"(got shape {arr.shape})")
    return arr


def _hand_expansion_ok(cases: list[dict], outs: list[dict]) -> str:
    return ("the product, the four order sums and the bound of the four-layer example are right, and so is the "
            "depth at which the gradient vanishes")


@judge("hand_expansion", ok=_hand_expansion_ok)
def _hand_expansion(case: dict, out: dict) -> None:
    js, tol = _HAND_J, 1e-9
    orders = [_order_sum(js, r) for r in range(1, len(js) + 1)]
    product = math.prod((1 + j for j in js), start=Fraction(1))
    assert product == 1 + sum(orders)  # the expansion, term by term
    got = _hand_answer(out["product"], "product")
    if abs(float(got) - float(product)) > tol:
        hint = ("that is the last term only, j₄ j₃ j₂ j₁ (the stack without residuals); the product is "
                "(1 + j₄)(1 + j₃)(1 + j₂)(1 + j₁)" if abs(float(got) - float(orders[-1])) <= tol else
                "multiply the four factors 1 + j_l")
        raise CheckFailed(f"product: {hint}; your value: {float(got):.6g}")
    sums = _hand_answer(out["order_sums"], "order_sums", len(js))
    wrong = [r for r in range(len(js)) if abs(sums[r] - float(orders[r])) > tol]
    if wrong:
        running = np.cumsum([float(o) for o in orders]) + 1
        doubled = [float(o) * math.factorial(r + 1) for r, o in enumerate(orders)]
        if np.allclose(sums, running, atol=tol):
            hint = "these are running totals (1 + the terms up to r layers); give each order's own sum"
        elif all(abs(sums[r] - doubled[r]) <= tol for r in wrong):
            hint = ("each subset of layers counts once: the order of the factors is fixed (later layers on the "
                    "left), so j₂ j₁ and j₁ j₂ are the same term")
        else:
            hint = "add up the products of every subset of r layers"
        entries = ", ".join(f"order {r + 1} = {sums[r]:.6g}" for r in wrong)
        raise CheckFailed(f"order_sums: {hint}\n  wrong entries ({len(wrong)} of {len(js)}), your values: {entries}")
    bound = math.prod((1 + abs(j) for j in js), start=Fraction(1)) - 1
    got = _hand_answer(out["bound"], "bound")
    if abs(float(got) - float(bound)) > tol:
        if abs(float(got) - float(product - 1)) <= tol:
            hint = "the bound uses the sizes |j_l|: Π(1 + |j_l|) − 1, not the signed product minus 1"
        elif abs(float(got) - math.expm1(sum(abs(float(j)) for j in js))) <= 1e-3:
            hint = "that is the looser bound e^(Σ|j_l|) − 1; the question asks for Π(1 + |j_l|) − 1"
        else:
            hint = "compute Π(1 + |j_l|) − 1"
        raise CheckFailed(f"bound: {hint}; your value: {float(got):.6g}")
    depth = next(L for L in range(1, 100) if (1 + _SHRINK) ** L < _TARGET)
    got = _hand_answer(out["layers_to_vanish"], "layers_to_vanish")
    if got != depth:
        hint = ("one layer short: after that many layers the factor (1/2)^L is still above 10⁻³"
                if got == depth - 1 else "each layer multiplies the gradient along that direction by 1 + j = 1/2: "
                "find the smallest L with (1/2)^L < 10⁻³")
        raise CheckFailed(f"layers_to_vanish: {hint}; your value: {got}")


# ---------------------------------------------------------------- 4.2 one write removed from the stream

def _silenced(seed: int, n_layers: int, k: int) -> nn.Module:
    """The model with sub-layer k's output projection set to zero: its write is 0, and every later
    sub-layer reads the stream without it (Chapter 4's "doing nothing is easy")."""
    model = tiny_gpt(seed, n_layers)
    block = model.blocks[k // 2]
    last = block.attn.mha.out_proj if k % 2 == 0 else block.mlp[2]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
    return model


def _writes(model: nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = model.tok_emb(idx) + model.pos_emb.weight[:idx.shape[-1]]
    x0, writes = x, []
    for b in model.blocks:
        for norm, sub in ((b.norm1, b.attn), (b.norm2, b.mlp)):
            w = sub(norm(x))
            writes.append(w)
            x = x + w
    return x0, writes


@judge("ablate_write", compare=("logits",), atol=1e-10, rtol=1e-10,
       ok=lambda cases, outs: "ablate_write = the model with that sub-layer's output projection set to zero ("
                              + ", ".join(f"write {c['k']} of {2 * c['n_layers']}" for c in cases) + ", 1e-10)")
def _ablate_write(case: dict, out: dict) -> None:
    seed, n_layers, k, idx, tol = case["seed"], case["n_layers"], case["k"], case["idx"], 1e-10
    model = tiny_gpt(seed, n_layers)
    with torch.no_grad():
        expected = _silenced(seed, n_layers, k)(idx).numpy()
        full = model(idx).numpy()
        x0, writes = _writes(model, idx)
        readout = lambda state: model.lm_head(model.norm_f(state)).numpy()  # noqa: E731
        variants = {
            "only the write's direct effect was removed: the sub-layers after write k read the stream, so once "
            "the write is gone they compute other writes; run them again on the changed stream":
                readout(x0 + sum(writes) - writes[k]),
            "that removes the whole block: only write k goes, the block's other sub-layer still writes":
                _silenced_block(seed, n_layers, k // 2, idx),
        }
        for other in (k - 1, k + 1):
            if 0 <= other < 2 * n_layers:
                variants[f"that removes write {other}: writes count from 0, write 2l is block l's attention and "
                         "write 2l + 1 its MLP"] = _silenced(seed, n_layers, other)(idx).numpy()
        state = x0 + sum(writes[:k]) + sum(writes[k + 1:])
    got = as_array(out["logits"], case["what"])
    if got.shape == tuple(state.shape) != expected.shape:
        raise CheckFailed(f"{case['what']} returns the stream's last state, shape {got.shape}: read it out through "
                          f"model.norm_f and model.lm_head, the logits of shape {expected.shape}")
    check_shape(got, expected.shape, "the logits", "(b, n, V): what model(idx) returns")
    check_finite(got, "the logits", "the model is finite on every input")
    if close(got, expected, tol, tol):
        return
    if close(got, full, tol, tol):
        fail("these are the model's own logits: write k was not removed", expected, got)
    for hint, variant in variants.items():
        if close(got, variant, tol, tol):
            fail(hint, expected, got)
    fail("the logits differ from the model run with write k removed (atol 1e-10)", expected, got)


def _silenced_block(seed: int, n_layers: int, block: int, idx: torch.Tensor) -> np.ndarray:
    model = _silenced(seed, n_layers, 2 * block)
    with torch.no_grad():
        last = model.blocks[block].mlp[2]
        last.weight.zero_()
        last.bias.zero_()
        return model(idx).numpy()


# ---------------------------------------------------------------- 4.3 the expansion, order by order

def _orders(Js: list[torch.Tensor], later_left: bool = True) -> torch.Tensor:
    """The order sums by adding one layer at a time: with layer l added, the terms with r layers are the
    old ones plus J_l times the old terms with r − 1 layers (J_l on the left: it acts last)."""
    d = Js[0].shape[0]
    orders = [torch.eye(d, dtype=torch.float64)] + [torch.zeros(d, d, dtype=torch.float64) for _ in Js]
    for J in Js:
        orders = [orders[0]] + [orders[r] + (J @ orders[r - 1] if later_left else orders[r - 1] @ J)
                                for r in range(1, len(orders))]
    return torch.stack(orders)


def _by_subsets(Js: list[torch.Tensor]) -> torch.Tensor:
    """The same sums by listing all 2^L subsets (for small L): a second derivation."""
    d, L = Js[0].shape[0], len(Js)
    orders = torch.zeros(L + 1, d, d, dtype=torch.float64)
    for r in range(L + 1):
        for sub in combinations(range(L), r):
            term = torch.eye(d, dtype=torch.float64)
            for l in sub:
                term = Js[l] @ term
            orders[r] += term
    return orders


@judge("expansion_orders", compare=("orders",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "expansion_orders: the order sums add up to Π(I + J_l), order 1 is Σ J_l, order L is "
                              "J_L ⋯ J_1, for " + ", ".join(str(len(c["Js"])) for c in cases)
                              + " layers (rtol 1e-9)")
def _expansion_orders(case: dict, out: dict) -> None:
    Js = [J.double() for J in case["Js"]]
    L, d, tol = len(Js), Js[0].shape[0], 1e-9
    expected = _orders(Js)
    product = torch.eye(d, dtype=torch.float64)
    for J in Js:
        product = (torch.eye(d, dtype=torch.float64) + J) @ product
    assert torch.allclose(expected.sum(0), product, atol=1e-9, rtol=1e-9)  # the expansion adds up to the product
    if L <= 10:
        assert torch.allclose(expected, _by_subsets(Js), atol=1e-12, rtol=1e-12)
    got = as_array(out["orders"], case["what"])
    if got.shape == (L, d, d):
        raise CheckFailed(f"{case['what']} returns {L} orders: there are L + 1 = {L + 1}, from order 0 (the "
                          "identity, the path through no layer) to order L")
    check_shape(got, (L + 1, d, d), case["what"], "(L + 1, d, d): one d × d matrix per order 0, 1, …, L")
    check_finite(got, case["what"], "the order sums of finite matrices are finite")
    ref = expected.numpy()
    if close(got, ref, tol, tol):
        return
    variants = {
        "later layers stand on the left: the term of layers m < l is J_l J_m, so adding layer l multiplies the "
        "old terms by J_l from the left": _orders(Js, later_left=False).numpy(),
        "order r collects the terms with exactly r layers; these are running totals (orders 0 … r added up)":
            np.cumsum(ref, axis=0),
    }
    for hint, variant in variants.items():
        if close(got, variant, tol, tol):
            fail(hint, ref, got)
    if not close(got.sum(axis=0), product.numpy(), tol, tol):
        fail("the orders do not add up to the product (I + J_L) ⋯ (I + J_1) (their sum shown)", product.numpy(),
             got.sum(axis=0))
    fail(f"the order sums differ from the expansion of (I + J_L) ⋯ (I + J_1) (rtol {tol})", ref, got)
