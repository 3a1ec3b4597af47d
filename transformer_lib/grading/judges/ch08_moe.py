"""The judges of the checks for the chapter 8 exercises: a new worked example by hand (routing, the
balancing loss with K = 2 and the assignments a capacity drops), the capacity-limited forward pass
with batched dispatch, and the gradient of the balancing loss on the router's logits in closed form.

The judges rebuild the experts from the case's weights, compute their references (autograd for the
gradient) and run in the grader. The inputs and the calls of the student's functions are in the
kernel half, :mod:`transformer_lib.grading.checks.ch08_moe`. Chapter 8.
"""
from __future__ import annotations

import numpy as np
import torch

from ..checks.ch08_moe import _AUTOGRAD
from ..protocol import CheckFailed, typename
from .common import as_array, check_shape, close, fail, judge, number, pair


# ---------------------------------------------------------------- 8.1 the worked example, by hand

# The example's router scores (W_g = I: each token's features are its scores), typed as inputs.
_SCORES = torch.tensor([[2.0, 0.0, 1.0], [0.0, 3.0, 1.0], [1.0, 2.0, 0.0], [0.0, 1.0, 3.0]], dtype=torch.float64)
_K, _CAPACITY = 2, 2


def _hand_routing_ref() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    probs = torch.softmax(_SCORES, dim=-1)
    top, idx = probs.topk(_K, dim=-1)
    return idx, top / top.sum(-1, keepdim=True), probs


def _kept(idx: torch.Tensor, capacity: int, n_experts: int, token_first: bool = False) -> torch.Tensor:
    """Which assignments fit: in priority order (all first choices in token order, then all second
    choices, …; or, wrongly, each token's choices before the next token's), at most ``capacity`` each."""
    T, k = idx.shape
    order = ([(i, j) for i in range(T) for j in range(k)] if token_first
             else [(i, j) for j in range(k) for i in range(T)])
    load, kept = [0] * n_experts, torch.zeros(T, k, dtype=torch.bool)
    for i, j in order:
        e = int(idx[i, j])
        if load[e] < capacity:
            load[e] += 1
            kept[i, j] = True
    return kept


def _wrong_entries(name: str, got: np.ndarray, expected: np.ndarray, atol: float, hint: str) -> None:
    """Fail naming the wrong entries with the student's values, never the expected ones."""
    if got.shape != expected.shape:
        raise CheckFailed(f"{name} must have shape {expected.shape} (got {got.shape})")
    wrong = np.argwhere(~(np.abs(got - expected) <= atol))
    if len(wrong):
        entries = ", ".join(f"{name}[{', '.join(map(str, pos))}] = {got[tuple(pos)]:.4g}" for pos in wrong[:8])
        raise CheckFailed(f"{name}: {hint}\n  wrong entries ({len(wrong)} of {got.size}), your values: {entries}")


@judge("hand_routing", compare=("indices",),
       ok="the example's top-2 experts and their renormalised weights are right to 3 decimals")
def _hand_routing(case: dict, out: dict) -> None:
    idx, w, probs = _hand_routing_ref()
    got_i, got_w = as_array(out["indices"], "indices"), as_array(out["weights"], "weights")
    least = np.sort(probs.topk(2, -1, largest=False).indices.numpy(), 1)
    hint = ("these are the least probable experts: keep the 2 largest probabilities" if got_i.shape == least.shape
            and np.array_equal(np.sort(got_i, 1), least) else "list each token's experts from the most to the least "
            "probable" if got_i.shape == idx.shape and np.array_equal(got_i, idx.flip(-1).numpy())
            else "not the two most probable experts of each token")
    _wrong_entries("indices", got_i, idx.numpy(), 0, hint)
    raw = probs.gather(1, idx)
    hint = "renormalise the two kept probabilities to sum to 1" if close(got_w, raw.numpy(), 5e-4, 0) else \
        "the weights are the two kept probabilities divided by their sum (to 3 decimals)"
    _wrong_entries("weights", got_w, w.numpy(), 5e-4 + 1e-9, hint)


@judge("hand_balance", ok="the example's f, P, balancing loss and kept assignments are right")
def _hand_balance(case: dict, out: dict) -> None:
    idx, w, probs = _hand_routing_ref()
    T, E = probs.shape
    f = torch.bincount(idx.reshape(-1), minlength=E).double() / (T * _K)
    P = probs.mean(0)
    got_f, got_P = as_array(out["f"], "f").reshape(-1), as_array(out["P"], "P").reshape(-1)
    _wrong_entries("f", got_f, f.numpy(), 1e-3, f"divide each expert's count by the T·K = {T * _K} assignments"
                   if close(got_f, (f * _K).numpy(), 1e-3, 0) else "f_e is the share of the assignments expert e got")
    weighted = torch.zeros(T, E, dtype=torch.float64).scatter(1, idx, w).mean(0)
    _wrong_entries("P", got_P, P.numpy(), 1.1e-3, "P_e is the mean of the full softmax probabilities over the "
                   "tokens, not of the renormalised top-2 weights" if close(got_P, weighted.numpy(), 1.1e-3, 0)
                   else "P_e is the mean over the 4 tokens of their softmax probability for expert e (3 decimals)")
    loss, expected = number(out["loss"], "loss"), float(E * (f * P).sum())
    if abs(loss - expected) > 2e-3:
        hint = ("the factor E = 3 is missing" if abs(loss - expected / E) <= 2e-3 else
                f"f must count the T·K = {T * _K} assignments" if abs(loss - _K * expected) <= 2e-3 else
                "the loss is E · Σ_e f_e P_e (to 3 decimals)")
        raise CheckFailed(f"loss: {hint}; your value: {loss:.4g}")
    got_kept = out["kept"]
    if not isinstance(got_kept, torch.Tensor) or got_kept.dtype != torch.bool:
        raise CheckFailed(f"kept must be a boolean tensor (True = kept), got {typename(got_kept)}")
    expected_kept = _kept(idx, _CAPACITY, E)
    hint = ("serve the assignments in priority order: every token's first choice (in token order) before any second "
            "choice" if torch.equal(got_kept, _kept(idx, _CAPACITY, E, token_first=True)) else
            f"each expert takes at most {_CAPACITY} assignments, in priority order; the rest are dropped")
    _wrong_entries("kept", got_kept.numpy().astype(float), expected_kept.numpy().astype(float), 0, hint)


# ---------------------------------------------------------------- 8.2 the forward pass with a capacity

def _routing(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts (last axis), the k largest, renormalised."""
    top, idx = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    return top / top.sum(-1, keepdim=True), idx


def _forward(case: dict, kept: torch.Tensor, renormalise: bool = False) -> np.ndarray:
    """Σ over each token's kept assignments of w_ie · expert_e(x_i) (weights renormalised over the
    kept ones with ``renormalise``), one token at a time."""
    x, E = case["x"], case["w1"].shape[0]
    weights, idx = _routing(x @ case["W_g"], case["k"])
    if renormalise:
        weights = weights * kept / (weights * kept).sum(-1, keepdim=True).clamp_min(1e-300)
    y = torch.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(case["k"]):
            if kept[i, j]:
                e = int(idx[i, j])
                y[i] += weights[i, j] * (torch.tanh(x[i:i + 1] @ case["w1"][e] + case["b1"][e]) @ case["w2"][e])[0]
    return y.numpy()


@judge("moe_capacity", compare=("result",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "MoE forward with a capacity, " + ", ".join(
           f"{c['x'].shape[0]} tokens, top-{c['k']} of {c['w1'].shape[0]} experts, capacity {c['capacity']}"
           for c in cases) + ": the kept assignments in priority order, the per-token sum over them, each expert "
                             "called once on exactly its kept tokens")
def _moe_capacity(case: dict, out: dict) -> None:
    x, k, capacity, what = case["x"], case["k"], case["capacity"], case["what"]
    T, d = x.shape
    E = case["w1"].shape[0]
    if out.get("misuse"):
        got = out["misuse"][0]
        raise CheckFailed(f"call each expert on a (m, d) tensor with d = {d}: the rows of its kept tokens, got "
                          + (f"a tensor of shape {tuple(got)}" if isinstance(got, list) else "something that is not "
                             "a tensor"))
    _, idx = _routing(x @ case["W_g"], k)
    expected_kept = _kept(idx, capacity, E)
    y, kept = pair(out["result"], what, ("y", "kept"))
    if not isinstance(kept, torch.Tensor) or kept.dtype != torch.bool or tuple(kept.shape) != (T, k):
        raise CheckFailed(f"kept must be a boolean (T, k) = {(T, k)} tensor, True where the assignment fits, got "
                          + (f"dtype {kept.dtype}, shape {tuple(kept.shape)}" if isinstance(kept, torch.Tensor)
                             else typename(kept)))
    if not torch.equal(kept, expected_kept):
        hint = ("assignments beyond the capacity must be dropped: each expert takes at most capacity of them"
                if bool(kept.all()) else "serve the assignments in priority order: every token's first choice, in "
                "token order, before any second choice" if torch.equal(kept, _kept(idx, capacity, E, True))
                else f"at most {capacity} assignments per expert, in priority order")
        fail(f"kept: {hint}", expected_kept.int().numpy(), kept.int().numpy())
    got = as_array(y, "y")
    check_shape(got, (T, d), what, "one output row per token")
    expected = _forward(case, expected_kept)
    if not close(got, expected, 1e-9, 1e-9):
        everything = torch.ones_like(expected_kept)
        if close(got, _forward(case, everything), 1e-9, 1e-9):
            fail("a dropped assignment contributes nothing: add only the kept ones", expected, got)
        if close(got, _forward(case, expected_kept, renormalise=True), 1e-9, 1e-9):
            fail("the weights of the kept assignments are not renormalised after the drops: a token whose second "
                 "choice was dropped keeps w_i1 · expert(x_i) only", expected, got)
        fail("y differs from the sum over each token's kept assignments of w_ie · expert_e(x_i) (atol 1e-9)",
             expected, got)
    want = [int(((idx == e) & expected_kept).sum()) for e in range(E)]
    calls, rows = out.get("calls"), out.get("rows")
    if not all(isinstance(v, list) and len(v) == E for v in (calls, rows)):
        raise CheckFailed(f"{what}: the check could not count the calls of the experts")
    for e, (made, processed, kept_e) in enumerate(zip(calls, rows, want)):
        if made > 1:
            raise CheckFailed(f"expert {e} was called {made} times: batch the dispatch, calling each expert once on "
                              "all its kept tokens (not once per token)")
        if processed != kept_e:
            raise CheckFailed(f"expert {e} processed {processed} rows but {kept_e} of its assignments are kept: run "
                              "each expert on its kept tokens only (computing an expert on tokens it drops, or on "
                              "every token, costs the compute a mixture of experts and its capacity save)")


# ---------------------------------------------------------------- 8.3 the gradient on the router's logits

def _loss_grad(z: torch.Tensor, index: torch.Tensor, shares: float = 1.0, mean: float = 1.0) -> np.ndarray:
    """∂/∂z of E · Σ_e f_e P_e, by autograd (f scaled by ``shares``, P by ``mean``: usual slips)."""
    T, E = z.shape
    leaf = z.clone().requires_grad_(True)
    f = torch.bincount(index.reshape(-1), minlength=E).double() / index.numel() * shares
    loss = E * (f * torch.softmax(leaf, -1).mean(0) * mean).sum()
    grad, = torch.autograd.grad(loss, leaf)
    return grad.numpy()


@judge("balancing_grad", compare=("grad",), atol=1e-12, rtol=1e-10, bans=_AUTOGRAD,
       ok=lambda cases, outs: "∂L_bal/∂logits = (E/T)·p_ie·(f_e − Σ_j f_j p_ij) matches autograd (atol 1e-12) for "
                              + ", ".join(f"T = {c['logits'].shape[0]}, E = {c['logits'].shape[1]}, "
                                          f"k = {c['expert_index'].shape[1]}" for c in cases) + "; each row sums to 0")
def _balancing_grad(case: dict, out: dict) -> None:
    z, index, what = case["logits"], case["expert_index"], case["what"]
    T, E = z.shape
    k = index.shape[1]
    if out.get("complex"):
        raise CheckFailed(f"{what} computes with complex numbers (a complex-step derivative): derive the gradient "
                          "in closed form, through the softmax")
    got = as_array(out["grad"], what)
    expected = _loss_grad(z, index)
    check_shape(got, expected.shape, what, "one row per token, one column per expert: (T, E)")
    if close(got, expected, 1e-12, 1e-10):
        return
    f = torch.bincount(index.reshape(-1), minlength=E).double() / (T * k)
    hints = {
        "that is the gradient with respect to the probabilities, E·f_e/T: the logits reach the loss through the "
        "softmax, so multiply by its Jacobian ∂p_ij/∂z_ie = p_ij(δ_je − p_ie)": (E * f / T).expand(T, E).numpy(),
        f"f_e is a share of the T·k = {T * k} assignments: divide the counts by T·k, not T": _loss_grad(z, index, k),
        f"P_e is a mean over the T = {T} tokens: the gradient of each row carries a factor 1/T":
            _loss_grad(z, index, mean=T),
        "the sign is flipped: this is the gradient, the direction in which the loss grows": -expected,
    }
    for hint, variant in hints.items():
        if close(got, variant, 1e-9, 1e-7):
            fail(f"{what}: {hint}", expected, got)
    if close(got, expected, 1e-6, 1e-5):
        fail(f"{what} is right only to about 1e-7 (finite differences, or float32?): derive the closed form and "
             "compute it in float64 (atol 1e-12)", expected, got)
    sums = got.sum(-1)
    if not np.allclose(sums, 0, atol=1e-9):
        fail(f"{what}: each row must sum to 0 (adding a constant to a token's logits changes no probability); "
             "row sums shown", np.zeros_like(sums), sums)
    fail(f"{what} differs from the gradient autograd computes (atol 1e-12)", expected, got)
