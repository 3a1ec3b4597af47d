"""The judges of the checks for the chapter 9 exercises: the exact parameter count of a configuration,
the forward FLOPs per token of a mixture-of-experts decoder, and the smallest batch at which a
decoding step stops being limited by memory.

The judges and their references run in the grader: for 9.1 a model built from ``torch.nn`` layers on
the meta device and counted; for 9.2 ``FlopCounterMode`` over a forward pass of the course's ``GPT``
built from the configuration; for 9.3 the weight matrices and the KV cache read off that meta-device
model, from which the smallest batch is solved for. The inputs and the calls of the student's
functions are in the kernel half, :mod:`transformer_lib.grading.checks.ch09_counting`. Chapter 9.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..checks.ch09_counting import _KEYS
from ..protocol import CheckFailed
from .common import judge, number


def _config(case: dict) -> dict:
    return {key: case[key] for key in _KEYS}


def _norm(c: dict) -> nn.Module:
    d = c["d_model"]
    return nn.RMSNorm(d) if c["norm"] == "rmsnorm" else nn.LayerNorm(d, bias=c["bias"])


def _reference_model(c: dict) -> nn.Module:
    """The configuration as torch.nn layers (meta device): one Linear per projection."""
    d, kv = c["d_model"], c["n_kv_heads"] * (c["d_model"] // c["n_heads"])
    b, f = c["bias"], c["d_ff"]
    with torch.device("meta"):
        def block() -> nn.Module:
            mlp = [nn.Linear(d, f, bias=b), nn.Linear(f, d, bias=b)]
            if c["mlp"] == "swiglu":
                mlp.append(nn.Linear(d, f, bias=b))  # the gate
            return nn.ModuleList([_norm(c), nn.Linear(d, d, bias=b), nn.Linear(d, kv, bias=b),
                                  nn.Linear(d, kv, bias=b), nn.Linear(d, d, bias=b), _norm(c), *mlp])
        model = nn.ModuleDict({
            "tok": nn.Embedding(c["vocab_size"], d),
            "blocks": nn.ModuleList(block() for _ in range(c["n_layers"])),
            "norm_f": _norm(c),
            "head": nn.Linear(d, c["vocab_size"], bias=False)})
        if c["positional"] == "learned":
            model["pos"] = nn.Embedding(c["n_ctx"], d)
    if c["tied_embeddings"]:
        model["head"].weight = model["tok"].weight
    return model


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a shared (tied) matrix once


def _library_model(c: dict, n_experts: int = 0, top_k: int = 2):  # noqa: ANN202
    from transformer_lib.config import ModelConfig
    from transformer_lib.model import GPT
    return GPT(ModelConfig(**c, n_experts=n_experts, top_k=top_k)).eval()


_FLOPS: dict[tuple, int] = {}  # the counts made so far (a grading run judges the same configurations again)


def _reference_flops(c: dict, n: int, n_experts: int = 0, top_k: int = 2) -> int:
    """Matmul FLOPs of one forward pass over n tokens, counted by FlopCounterMode."""
    key = (*sorted(c.items()), n, n_experts, top_k)
    if key not in _FLOPS:
        model = _library_model(c, n_experts, top_k)
        idx = torch.randint(0, c["vocab_size"], (1, n), generator=torch.Generator().manual_seed(n))
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(idx)
        if len(_FLOPS) > 1000:
            _FLOPS.clear()
        _FLOPS[key] = counter.get_total_flops()
    return _FLOPS[key]


def _answer(case: dict, out: dict, integer: bool) -> float:
    """The student's number, after the watch's verdict on building the model."""
    what = case["what"]
    built = out.get("built")
    if isinstance(built, list) and all(isinstance(s, int) for s in built):
        raise CheckFailed(f"{what} creates a tensor of shape {tuple(built)}, the size of a weight matrix: it builds "
                          "the model (or its weights) and measures it. Derive the count from cfg with arithmetic "
                          "instead")
    value = number(out["answer"], what)
    if integer and isinstance(value, float) and not value.is_integer():
        raise CheckFailed(f"{what}: a parameter count is a whole number, got {value!r}")
    return value


def _fail(message: str, expected: Any, got: Any) -> None:
    """Fail with ``got``; the number asked for, ``expected``, is never shown."""
    raise CheckFailed(f"{message}\n  got: {got:,}")


def _described(c: dict) -> str:
    return (f"{c['n_layers']} layers, d_model {c['d_model']}, {c['mlp']}, "
            f"{'tied' if c['tied_embeddings'] else 'untied'}")


@judge("param_count", ok=lambda cases, outs: "param_count = " + ", ".join(
    f"{_count(_reference_model(_config(c))):,} ({_described(c)})" for c in cases)
    + ": the parameters of the model built from each configuration")
def _param_count(case: dict, out: dict) -> None:
    c = _config(case)
    model = _reference_model(c)
    expected = _count(model)
    got = _answer(case, out, integer=True)
    if got == expected:
        return
    d, L, V, f = c["d_model"], c["n_layers"], c["vocab_size"], c["d_ff"]
    kv = c["n_kv_heads"] * (d // c["n_heads"])
    biases = sum(m.bias.numel() for m in model.modules() if isinstance(m, nn.Linear) and m.bias is not None)
    norms = sum(p.numel() for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))
                for p in m.parameters())
    hints = []
    if biases:
        hints.append((expected - biases, "you left out the biases of the linear layers (every Linear "
                      "has a bias when cfg['bias'] is True)"))
    hints.append((expected - norms, "you left out the norms: each block has two, plus the final norm "
                  "(LayerNorm: gain and shift when cfg['bias'], RMSNorm: a gain only)"))
    if c["tied_embeddings"]:
        hints.append((expected + V * d, "the unembedding is tied to the token embedding: it is one "
                      "matrix, count it once"))
    else:
        hints.append((expected - V * d, "the embeddings are untied: the unembedding is a second "
                      "V × d matrix"))
    hints.append((12 * L * d * d, "12·L·d² is the approximation; the exercise asks for the exact count"))
    hints.append((12 * L * d * d + V * d, "12·L·d² + V·d is the approximation; the exercise asks for "
                  "the exact count (biases, norms, positions, GQA, SwiGLU, untied head)"))
    if c["mlp"] == "swiglu":
        hints.append((expected - L * d * f - (L * f if c["bias"] else 0),
                      "SwiGLU has three d × d_ff matrices per block (gate, up, down): you counted two"))
    if kv != d:
        extra = L * 2 * d * (d - kv) + (L * 2 * (d - kv) if c["bias"] else 0)
        hints.append((expected + extra, "with grouped-query attention W_K and W_V are d × (n_kv_heads · "
                      "d_head), not d × d"))
    if c["positional"] == "learned":
        hints.append((expected - c["n_ctx"] * d, "you left out the learned position table (n_ctx × d)"))
    if c["norm"] == "rmsnorm":
        hints.append((expected + norms, "RMSNorm has a gain only, no shift"))
    for value, hint in hints:
        if got == value:
            _fail(f"param_count: {hint}", expected, got)
    _fail("param_count differs from the number of parameters of the built model", expected, got)



def _moe_described(c: dict, case: dict) -> str:
    return f"{case['n_experts']} {c['mlp']} experts, top-{case['top_k']}, n = {case['n']}"


@judge("moe_flops", ok=lambda cases, outs: "moe_flops = " + ", ".join(
    f"{_reference_flops(_config(c), c['n'], c['n_experts'], c['top_k']) / c['n']:,.0f} "
    f"({_moe_described(_config(c), c)})"
    for c in cases) + ", as FlopCounterMode counts a forward pass of the built mixture-of-experts model (divided by n)")
def _moe_flops(case: dict, out: dict) -> None:
    c, n, E, K = _config(case), case["n"], case["n_experts"], case["top_k"]
    expected = _reference_flops(c, n, E, K) / n
    got = _answer(case, out, integer=False)
    if abs(got - expected) <= 1e-9 * expected:
        return
    d, L, V, f = c["d_model"], c["n_layers"], c["vocab_size"], c["d_ff"]
    k = 3 if c["mlp"] == "swiglu" else 2
    expert = 2 * k * d * f                      # one expert's FLOPs per token
    hints = [(expected + L * (E - K) * expert, f"only the top_k = {K} chosen experts run for a token: the other "
              f"{E - K} cost nothing (that is the point of the mixture)"),
             (expected - L * (K - 1) * expert, f"every token runs through top_k = {K} experts, not one"),
             (expected - 2 * L * d * E, f"the router is a product with a d × E = {d} × {E} matrix too: 2·d·E per token "
              "and layer"),
             (expected - 4 * L * n * d, "you left out the attention matmuls Q·Kᵀ and A·V: 2·2·n·d per layer and token"),
             (expected - 2 * d * V, "the unembedding (d × V logits) is a matmul too: 2·d·V per token"),
             (expected * n, "per token: divide the FLOPs of the whole sequence by n"),
             (expected / 2, "a multiply-add is 2 FLOPs: 2 FLOPs per weight, not 1")]
    if k == 3:
        hints.append((expected - L * K * 2 * d * f, "a SwiGLU expert has three d × d_ff matrices (gate, up, down)"))
    for value, hint in hints:
        if abs(got - value) <= 1e-9 * max(abs(value), 1):
            _fail(f"moe_flops: {hint}", expected, got)
    _fail(f"moe_flops differs from FlopCounterMode's count on the built model (n = {n})", expected, got)


def _decode_parts(c: dict, n: int) -> tuple[int, int, int]:
    """From the model built on the meta device: the entries of its weight matrices (the blocks'
    projections and the unembedding), a step's FLOPs per sequence (2 per weight, 4·L·n·d for
    q·Kᵀ and a·V against n keys) and the numbers of one sequence's cache of n tokens."""
    model = _reference_model(c)
    linears = [m for m in model["blocks"].modules() if isinstance(m, nn.Linear)] + [model["head"]]
    weights = sum(m.weight.numel() for m in linears)
    cache = n * sum(block[2].out_features + block[3].out_features for block in model["blocks"])
    return weights, 2 * weights + 4 * c["n_layers"] * n * c["d_model"], cache


def _smallest_batch(weights: int, flops: int, cache: int, ratio: int) -> int | None:
    """The least b ≥ 1 with b·flops ≥ ratio·2·(weights + b·cache) (16-bit numbers), None if none."""
    gain = flops - 2 * ratio * cache
    return None if gain <= 0 else max(1, -(-2 * ratio * weights // gain))


def _decode_ok(cases: list[dict], outs: list[dict]) -> str:
    found = [_smallest_batch(*_decode_parts(_config(c), c["n"]), c["ratio"]) for c in cases]
    return "decode_batch = " + ", ".join(f"{'no batch' if b is None else b} ({c['ratio']} FLOPs per byte at n = "
                                         f"{c['n']:,})" for b, c in zip(found, cases))


@judge("decode_batch", compare=("answer",), ok=_decode_ok)
def _decode_batch(case: dict, out: dict) -> None:
    c, n, ratio, what = _config(case), case["n"], case["ratio"], case["what"]
    weights, flops, cache = _decode_parts(c, n)
    expected = _smallest_batch(weights, flops, cache, ratio)
    built = out.get("built")
    if isinstance(built, list) and all(isinstance(s, int) for s in built):
        _answer(case, out, integer=True)   # raises: it built the model
    answer = out["answer"]
    got = None if answer is None else int(number(answer, what, integer=True))
    if got == expected:
        return
    kv = cache // n
    hints = [(_smallest_batch(weights, flops, n * 2 * c["n_layers"] * c["d_model"], ratio),
              f"with grouped-query attention the cache holds n_kv_heads·d_head = {kv // (2 * c['n_layers'])} numbers "
              "per token for K and for V in each layer, not d_model"),
             (_smallest_batch(weights, flops, 0, ratio), "each sequence reads its own KV cache: the bytes grow with "
              "the batch, by 2·2·L·n·n_kv_heads·d_head per sequence"),
             (_smallest_batch(weights, 2 * weights, cache, ratio), "a decoding step also does the attention FLOPs "
              "q·Kᵀ and a·V against the n cached keys: 4·L·n·d"),
             (_smallest_batch(2 * weights, flops, 2 * cache, ratio), "16-bit numbers take 2 bytes, not 4"),
             (None if expected is None else expected - 1, "the batch must reach the ratio: the smallest b with "
              "b·FLOPs ≥ ratio·bytes (round up)")]
    found = [hint for value, hint in hints if got == value and value != expected]
    if found:   # an integer answer can fit more than one mistake: name each
        raise CheckFailed(f"{what}: {'; or '.join(found)}\n  got: {_plain(got)}")
    if expected is None:
        raise CheckFailed(f"{what}: no batch reaches {ratio} FLOPs per byte here: each sequence brings its own cache, "
                          f"so however large the batch the step does at most {flops / (2 * cache):.1f} FLOPs per byte "
                          "of cache. Return None")
    if got is None:
        raise CheckFailed(f"{what}: a large enough batch reaches {ratio} FLOPs per byte here; return None only when "
                          "no batch does")
    _fail(f"{what} differs from the smallest batch whose FLOPs per byte reach the ratio", expected, got)


def _plain(value: int | None) -> str:
    return "None" if value is None else f"{value:,}"
