"""Checks for the chapter 8 exercises: top-k routing with renormalised weights, the MoE forward
pass with batched dispatch, and the Switch load-balancing loss.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, the
calls of the student's functions, and what the kernel must measure: how often, and on how many
rows, the student calls each expert; the gradient through the student's loss). The experts handed
to the student are plain closures: their weights and their counters live in this module's
functions, not on the objects. Below the line: the judges, which rebuild the experts from the
case's weights, compute their references and run in the grader. Chapter 8.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .._harness import StudentError, call, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_top_k_routing", "check_moe_forward", "check_balancing_loss"]


# ---------------------------------------------------------------- 8.1 top-k routing

def check_top_k_routing(fn: Callable, logits: torch.Tensor | None = None, k: int = 2, hidden: int = 0) -> None:
    """``fn(logits (T, E), k) -> (weights (T, k), indices (T, k))``: the k most probable experts of
    each token, most probable first, and their probabilities renormalised to sum to 1. Chapter 8."""
    if hidden:
        g = hidden_generator("top_k_routing", hidden)
        E = draw(g, 4, 8)
        cases = [dict(logits=randn(g, draw(g, 2, 12), E, scale=2.0), k=draw(g, 2, E - 1)),
                 dict(logits=randn(g, draw(g, 1, 10), draw(g, 2, 8)), k=1)]      # one expert per token
        E = draw(g, 2, 4)
        cases.append(dict(logits=randn(g, draw(g, 2, 6), E), k=E))              # every expert, in order
    else:
        cases = [dict(logits=seeded(80, 7, 5, scale=1.5) if logits is None else logits, k=k)]
    for case in cases:
        case["what"] = "top_k_routing(logits, k)"
    run_check("top_k_routing", fn, cases,
              lambda f, c: {"result": call(f, c["logits"].clone(), c["k"])}, hidden)


# ---------------------------------------------------------------- 8.2 the forward pass

def _expert_weights(g: torch.Generator, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weights of one expert, a small tanh MLP (m, d) -> (m, d)."""
    w1 = torch.randn(d, 2 * d, generator=g, dtype=torch.float64) / d ** 0.5
    b1 = 0.1 * torch.randn(2 * d, generator=g, dtype=torch.float64)
    w2 = torch.randn(2 * d, d, generator=g, dtype=torch.float64) / (2 * d) ** 0.5
    return w1, b1, w2


def _moe_case(x: torch.Tensor, W_g: torch.Tensor, k: int, gens: list[torch.Generator]) -> dict:
    """A case of the forward pass: the experts' weights stacked (E, …), as data."""
    w1, b1, w2 = (torch.stack(ws) for ws in zip(*(_expert_weights(g, x.shape[1]) for g in gens)))
    return dict(x=x, W_g=W_g, k=k, w1=w1, b1=b1, w2=w2, what="moe_forward(x, W_g, experts, k)")


def _run_moe(fn: Callable, case: dict) -> dict:
    """Call the student's forward pass with experts that count, in this function's variables, how
    often they are called and on how many rows; an expert called on something other than an
    (m, d) tensor stops the run and says what it got (a shape, or None for a non-tensor)."""
    d = case["x"].shape[1]
    n_experts = case["w1"].shape[0]
    calls, rows = [0] * n_experts, [0] * n_experts
    misuse: list[Any] = []

    def make(e: int) -> Callable[[Any], torch.Tensor]:
        w1, b1, w2 = case["w1"][e].clone(), case["b1"][e].clone(), case["w2"][e].clone()

        def expert(x: Any) -> torch.Tensor:
            if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != d:
                misuse.append(list(x.shape) if isinstance(x, torch.Tensor) else None)
                raise ValueError("an expert takes a (m, d) tensor")
            calls[e] += 1
            rows[e] += int(x.shape[0])
            return torch.tanh(x @ w1 + b1) @ w2
        return expert

    experts = [make(e) for e in range(n_experts)]
    try:
        y = call(fn, case["x"].clone(), case["W_g"].clone(), experts, case["k"])
    except (StudentError, ValueError):  # (a ValueError reaches here only while a student works)
        if misuse:
            return {"misuse": [misuse[0]]}
        raise
    return {"y": y, "calls": calls, "rows": rows, "misuse": misuse[:1]}


def check_moe_forward(fn: Callable, x: torch.Tensor | None = None, n_experts: int = 4, k: int = 2,
                      hidden: int = 0) -> None:
    """``fn(x (T, d), W_g (d, E), experts, k) -> y (T, d)``: ``y_i = Σ_{e ∈ top-k} w_ie · expert_e(x_i)``
    with renormalised weights, each expert called once on exactly the tokens routed to it. Chapter 8."""
    if hidden:
        g = hidden_generator("moe_forward", hidden)
        E = draw(g, 5, 8)
        shapes = [(draw(g, 12, 20), draw(g, 3, 7), E, draw(g, 2, min(4, E - 1))),
                  (draw(g, 5, 10), draw(g, 2, 5), draw(g, 2, 4), 1),                  # one expert per token
                  (draw(g, 1, 3), draw(g, 2, 5), draw(g, 6, 8), draw(g, 1, 2))]       # idle experts
        cases = [_moe_case(randn(g, T, d), randn(g, d, n), k_, [g] * n) for T, d, n, k_ in shapes]
    else:
        x = seeded(81, 10, 6) if x is None else x
        cases = [_moe_case(x, seeded(82, x.shape[1], n_experts), k,
                           [torch.Generator().manual_seed(83 + e) for e in range(n_experts)])]
    run_check("moe_forward", fn, cases, _run_moe, hidden)


# ---------------------------------------------------------------- 8.3 the load-balancing loss

def _run_balancing(fn: Callable, case: dict) -> dict:
    """Call the student's loss on a leaf that requires grad; measure the gradient through it."""
    leaf = case["probs"].clone().requires_grad_(True)
    E = case["probs"].shape[1]
    loss = call(fn, leaf, case["expert_index"].clone(), E)
    out: dict[str, Any] = {"loss": loss}
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        out["requires_grad"] = bool(loss.requires_grad)
        if loss.requires_grad:
            grad, = call(lambda: torch.autograd.grad(loss.reshape(()), leaf, allow_unused=True))
            out["grad"] = grad
    return out


def _balancing_case(probs: torch.Tensor, expert_index: torch.Tensor, balanced: bool = False) -> dict:
    return dict(probs=probs, expert_index=expert_index, balanced=balanced,
                what="balancing_loss at perfect balance" if balanced
                else "balancing_loss(router_probs, expert_index, n_experts)")


def _balanced(E: int, k: int, rounds: int) -> dict:
    """Every expert the same share of the assignments, uniform probabilities."""
    T = rounds * E
    index = torch.stack([(torch.arange(T) + j) % E for j in range(k)], 1)
    return _balancing_case(torch.full((T, E), 1.0 / E, dtype=torch.float64), index, balanced=True)


def check_balancing_loss(fn: Callable, probs: torch.Tensor | None = None,
                         expert_index: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(router_probs (T, E), expert_index (T, k), n_experts) -> scalar``
    ``E · Σ_e f_e · P_e`` with f_e the share of the T·k assignments and P_e the mean probability;
    differentiable through ``router_probs``; 1 at perfect balance. Chapter 8."""
    if hidden:
        g = hidden_generator("balancing_loss", hidden)
        E = draw(g, 4, 8)
        p = torch.softmax(randn(g, draw(g, 10, 24), E, scale=2.0), -1)
        cases = [_balancing_case(p, p.topk(draw(g, 2, min(4, E - 1)), -1).indices)]
        p = torch.softmax(randn(g, draw(g, 5, 12), draw(g, 2, 4)), -1)
        cases.append(_balancing_case(p, p.argmax(-1, keepdim=True)))                # k = 1
        E = draw(g, 3, 6)
        p = torch.softmax(randn(g, draw(g, 4, 10), E), -1)
        cases.append(_balancing_case(p, p[:, :-1].topk(draw(g, 1, 2), -1).indices))  # the last expert idle
        cases.append(_balanced(draw(g, 2, 6), 2, draw(g, 1, 4)))
    else:
        if probs is None:
            probs = torch.softmax(seeded(84, 12, 4, scale=1.5), -1)
        expert_index = probs.topk(2, -1).indices if expert_index is None else expert_index
        cases = [_balancing_case(probs, expert_index), _balanced(probs.shape[1], 2, 4)]
    run_check("balancing_loss", fn, cases, _run_balancing, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import numpy as np  # noqa: E402

from .._harness import CheckFailed, Opaque, typename  # noqa: E402
from .._judging import as_array, check_shape, close, fail, judge, number, pair  # noqa: E402


def _routing(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts (last axis), the k largest, renormalised."""
    probs = torch.softmax(logits, dim=-1)
    top, idx = probs.topk(k, dim=-1)
    return top / top.sum(-1, keepdim=True), idx


def _as_index(value: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dtype == torch.bool:
        raise CheckFailed(f"{what}: expected an integer tensor of expert indices (as torch.topk "
                          f"returns), got {typename(value)}"
                          + (f" of dtype {value.dtype}" if isinstance(value, torch.Tensor) else ""))
    got = value.numpy()
    check_shape(got, shape, what, "one row per token, one column per chosen expert")
    return got


@judge("top_k_routing", compare=("result",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "top-k routing of " + ", ".join(
           f"{c['logits'].shape[0]} token{'s' * (c['logits'].shape[0] != 1)} over {c['logits'].shape[1]} experts "
           f"(k = {c['k']})" for c in cases)
       + ": the most probable experts, in order, weights renormalised to sum to 1")
def _top_k_routing(case: dict, out: dict) -> None:
    logits, k = case["logits"], case["k"]
    T, E = logits.shape
    expected_w, expected_i = _routing(logits, k)
    weights, indices = pair(out["result"], "top_k_routing(logits, k)", ("weights", "indices"))
    got_i = _as_index(indices, (T, k), "indices")
    got_w = as_array(weights, "weights")
    check_shape(got_w, (T, k), "weights", "one row per token, one weight per chosen expert")
    probs = torch.softmax(logits, dim=-1)
    smallest = probs.topk(k, dim=-1, largest=False).indices.numpy()
    if k < E and np.array_equal(np.sort(got_i, 1), np.sort(smallest, 1)):
        fail("these are the k *least* probable experts: route each token to the k largest "
             "probabilities (torch.topk keeps the largest by default)", expected_i.numpy(), got_i)
    over_tokens = torch.softmax(logits, dim=0)
    tok_w, tok_i = over_tokens.topk(k, dim=-1)
    if k < E and np.array_equal(got_i, tok_i.numpy()) and not np.array_equal(got_i, expected_i.numpy()):
        fail("the experts come from a softmax over the token axis (dim=0): the router's softmax runs "
             "over the experts of each token (the last axis), so each row is a distribution over E "
             "experts", expected_i.numpy(), got_i)
    if not np.array_equal(np.sort(got_i, 1), np.sort(expected_i.numpy(), 1)):
        fail("the chosen experts are not the k most probable ones of each token", expected_i.numpy(), got_i)
    if not np.array_equal(got_i, expected_i.numpy()):
        fail("order each token's k experts from the most to the least probable (as torch.topk does)",
             expected_i.numpy(), got_i)
    if not close(got_w, expected_w.numpy(), 1e-9, 1e-9):
        if close(got_w, probs.gather(1, expected_i).numpy(), 1e-9, 1e-9):
            fail("the top-k weights are not renormalised: divide them by their sum so each token's "
                 "weights add up to 1 (row sums shown)", np.ones(T), got_w.sum(1))
        if close(got_w, (tok_w / tok_w.sum(-1, keepdim=True)).numpy(), 1e-9, 1e-9):
            fail("the weights come from a softmax over the token axis (dim=0): take it over the "
                 "experts (the last axis)", expected_w.numpy(), got_w)
        fail("the weights differ from the renormalised top-k softmax probabilities (atol 1e-9)",
             expected_w.numpy(), got_w)


def _experts(case: dict) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """The case's experts, rebuilt from their weights."""
    return [lambda x, e=e: torch.tanh(x @ case["w1"][e] + case["b1"][e]) @ case["w2"][e]
            for e in range(case["w1"].shape[0])]


def _counts(value: Any, n_experts: int, what: str) -> list[int]:
    if not isinstance(value, list) or len(value) != n_experts or not all(isinstance(v, int) for v in value):
        raise CheckFailed(f"{what}: the check could not count the calls of the experts")
    return value


@judge("moe_forward", compare=("y",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "MoE forward of " + ", ".join(
           f"{c['x'].shape[0]} token{'s' * (c['x'].shape[0] != 1)}, top-{c['k']} of {c['w1'].shape[0]} experts"
           for c in cases)
       + ": equals the per-token sum, each expert called once on exactly its tokens")
def _moe_forward(case: dict, out: dict) -> None:
    x, W_g, k, what = case["x"], case["W_g"], case["k"], case["what"]
    T, d = x.shape
    n_experts = case["w1"].shape[0]
    misuse = out.get("misuse") or []
    if misuse:
        got = misuse[0]
        shape = f"a tensor of shape {tuple(got)}" if isinstance(got, list) else "something that is not a tensor"
        raise CheckFailed(f"call each expert on a (m, d) tensor with d = {d}: the rows of the tokens routed to "
                          f"it, got {shape}")
    experts = _experts(case)
    weights, idx = _routing(x @ W_g, k)
    probs = torch.softmax(x @ W_g, -1)
    raw = probs.gather(1, idx)
    expected, unnormalised, overwrite = torch.zeros_like(x), torch.zeros_like(x), torch.zeros_like(x)
    for i in range(T):
        for j in range(k):
            row = experts[int(idx[i, j])](x[i:i + 1])[0]
            expected[i] += weights[i, j] * row
            unnormalised[i] += raw[i, j] * row
    for e in range(n_experts):                    # later experts overwrite earlier ones
        token, slot = torch.where(idx == e)
        overwrite[token] = weights[token, slot, None] * experts[e](x[token])
    got = as_array(out["y"], "y")
    check_shape(got, (T, d), what, "one output row per token")
    if close(got, unnormalised.numpy(), 1e-9, 1e-9):
        fail("the outputs are weighted by the raw top-k probabilities: renormalise them to sum to 1 "
             "over each token's k experts", expected.numpy(), got)
    if k > 1 and close(got, overwrite.numpy(), 1e-9, 1e-9):
        fail("each token keeps only one expert's output: add every expert's contribution to the "
             "token's row (index_add_ or +=), do not assign it", expected.numpy(), got)
    if not close(got, expected.numpy(), 1e-9, 1e-9):
        fail("y differs from Σ over each token's top-k experts of w_ie · expert_e(x_i) with "
             "renormalised weights (atol 1e-9)", expected.numpy(), got)
    routed = torch.bincount(idx.reshape(-1), minlength=n_experts).tolist()
    calls, rows = _counts(out.get("calls"), n_experts, what), _counts(out.get("rows"), n_experts, what)
    for e, (made, processed, want) in enumerate(zip(calls, rows, routed)):
        if made > 1:
            raise CheckFailed(f"expert {e} was called {made} times: batch the dispatch, calling "
                              "each expert once on all the tokens routed to it (not once per token)")
        if processed != want:
            raise CheckFailed(f"expert {e} processed {processed} rows but {want} tokens are routed to it: "
                              "run each expert only on its own tokens (running every expert on every "
                              "token costs E/k times the compute a mixture of experts saves)")


@judge("balancing_loss", compare=("grad",), atol=1e-9, rtol=1e-9,
       ok=lambda cases, outs: "balancing loss = E·Σ f·P for " + ", ".join(
           f"T = {c['probs'].shape[0]}, E = {c['probs'].shape[1]}, k = {c['expert_index'].shape[1]}"
           for c in cases if not c["balanced"]) + "; 1 at balance; gradient E·f_e/T through the probabilities")
def _balancing_loss(case: dict, out: dict) -> None:
    probs, expert_index = case["probs"], case["expert_index"]
    T, E = probs.shape
    k = expert_index.shape[1]
    counts = torch.bincount(expert_index.reshape(-1), minlength=E).to(probs.dtype)
    f, P = counts / (T * k), probs.mean(0)
    expected = float(E * (f * P).sum())
    result = out["loss"]
    if not isinstance(result, torch.Tensor) or result.numel() != 1:
        raise CheckFailed("balancing_loss must return a one-element torch.Tensor (a scalar you can "
                          f"backpropagate through), got {typename(result)}"
                          + (f" of shape {tuple(result.shape)}" if isinstance(result, torch.Tensor) else ""))
    got = number(result, case["what"])
    if case["balanced"] and abs(got - expected) > 1e-9:
        fail("at perfect balance (every expert the same share, uniform probabilities) the loss must be 1",
             expected, got)
    variants = {
        f"the shares f_e are divided by T tokens instead of the T·k = {T * k} assignments (the loss "
        f"must be 1 at balance for every k, not k)": float(E * (counts / T * P).sum()),
        f"the factor E = {E} is missing: without it the balanced value is 1/E, not 1":
            float((f * P).sum()),
        "f_e must count the assignments (expert_index), not repeat the probabilities: E·Σ P_e² is the "
        "soft version": float(E * (P * P).sum()),
    }
    for hint, value in variants.items():
        if abs(got - value) < 1e-9 and abs(value - expected) > 1e-6:
            fail(hint, expected, got)
    if not abs(got - expected) < 1e-9:
        fail("the loss differs from E · Σ_e f_e · P_e (atol 1e-9)", expected, got)
    grad = out.get("grad")
    if not out.get("requires_grad") or grad is None:
        raise CheckFailed("the loss carries no gradient: compute P_e from router_probs with torch "
                          "operations (no .detach(), .item() or numpy), so the router can learn from it")
    grad_expected = (E * f / T).expand(T, E).numpy()   # ∂L/∂p_ie = E f_e / T
    got_grad = as_array(grad, "the gradient") if not isinstance(grad, Opaque) else np.zeros(0)
    if not close(got_grad, grad_expected, 1e-9, 1e-9):
        fail("the gradient with respect to router_probs must be E·f_e/T (the counts f_e are constants, "
             "the gradient flows through P_e only)", grad_expected, got_grad)
