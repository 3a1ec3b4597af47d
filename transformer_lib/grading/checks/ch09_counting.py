"""Checks for the chapter 9 exercises: the exact parameter count of a configuration, the forward
FLOPs per token, and the sequence length at which attention overtakes the weight matrices.

A configuration is a plain dict (see :data:`EXAMPLE_CONFIG`). The parameter reference is a model
built from ``torch.nn`` layers on the meta device and counted; the FLOP reference is
``FlopCounterMode`` run over a forward pass of the course's ``GPT`` built from the same
configuration; the crossover reference is derived from two such FLOP counts. No helper here
computes an answer. Chapter 9.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from .._checktools import CheckFailed, call, ok, record, typename

__all__ = ["EXAMPLE_CONFIG", "check_param_count", "check_flops_per_token", "check_crossover_n"]

EXAMPLE_CONFIG: dict[str, Any] = dict(  # GPT-2 small
    vocab_size=50257, n_ctx=1024, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12,
    d_ff=3072, mlp="gelu", norm="layernorm", bias=True, tied_embeddings=True,
    positional="learned")

_KEYS = set(EXAMPLE_CONFIG)


def _validate(cfg: dict) -> dict:
    if not isinstance(cfg, dict) or set(cfg) != _KEYS:
        raise ValueError(f"a configuration is a dict with the keys {sorted(_KEYS)}")
    return dict(cfg)


def _norm(c: dict) -> nn.Module:
    d = c["d_model"]
    return nn.RMSNorm(d) if c["norm"] == "rmsnorm" else nn.LayerNorm(d, bias=c["bias"])


_STUDENT_RUNNING = [False]  # True while the student's function runs: the references refuse to


class _NoWeights(TorchFunctionMode):
    """Note the first torch result as large as a d_model × d_model weight: a model being built."""

    def __init__(self, size: int, found: list[str]) -> None:
        super().__init__()
        self.size, self.found = size, found

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() >= self.size and not self.found:
            self.found.append(f"creates a tensor of shape {tuple(out.shape)} ({getattr(func, '__name__', func)})")
        return out


def _student(fn: Callable, *args: Any, what: str) -> Any:
    """Run the student's function through ``call``, with this module's references switched off and
    without building the model: the count comes from the configuration, by arithmetic."""
    found: list[str] = []
    _STUDENT_RUNNING[0] = True
    try:
        with _NoWeights(max(1024, args[0]["d_model"] ** 2), found):
            out = call(fn, *args, what=what)
    finally:
        _STUDENT_RUNNING[0] = False
    if found:
        raise CheckFailed(f"{what} {found[0]}, the size of a weight matrix: it builds the model (or its "
                          "weights) and measures it. Derive the count from cfg with arithmetic instead")
    return out


def _refuse() -> None:
    if _STUDENT_RUNNING[0]:
        raise CheckFailed("your function uses the check's own reference: compute the count from cfg")


def _reference_model(c: dict) -> nn.Module:
    """The configuration as torch.nn layers (meta device): one Linear per projection."""
    _refuse()
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


def _as_number(value: Any, what: str, integer: bool) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if hasattr(value, "item") and not isinstance(value, (int, float)):  # a NumPy scalar
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckFailed(f"{what}: expected a number, got {typename(value)}")
    if integer and (isinstance(value, float) and not value.is_integer()):
        raise CheckFailed(f"{what}: a parameter count is a whole number, got {value!r}")
    return value


def _fail(message: str, expected: Any, got: Any, show_expected: bool = True) -> None:
    shown = f"\n  expected: {expected:,}" if show_expected else ""
    raise CheckFailed(f"{message}{shown}\n  got:      {got:,}")


def check_param_count(fn: Callable, cfg: dict | None = None) -> None:
    """``fn(cfg) -> int``: the exact number of parameters of the decoder ``cfg`` describes. Chapter 9."""
    c = _validate(EXAMPLE_CONFIG if cfg is None else cfg)
    model = _reference_model(c)
    expected = _count(model)
    got = _as_number(_student(fn, dict(c), what="param_count(cfg)"), "param_count(cfg)", integer=True)
    record("param_count", {"count": float(got)})
    if got == expected:
        ok(f"param_count = {expected:,}, the parameters of the model built from this configuration "
           f"({c['n_layers']} layers, d_model {c['d_model']}, {c['mlp']}, "
           f"{'tied' if c['tied_embeddings'] else 'untied'})")
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


def _library_model(c: dict):  # noqa: ANN202
    from transformer_lib.config import ModelConfig
    from transformer_lib.model import GPT
    return GPT(ModelConfig(**c)).eval()


def _reference_flops(c: dict, n: int) -> int:
    """Matmul FLOPs of one forward pass over n tokens, counted by FlopCounterMode."""
    _refuse()
    model = _library_model(c)
    idx = torch.zeros(1, n, dtype=torch.long)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(idx)
    return counter.get_total_flops()


def check_flops_per_token(fn: Callable, cfg: dict | None = None, n: int = 128) -> None:
    """``fn(cfg, n)``: forward matmul FLOPs per token for one sequence of n tokens. Chapter 9."""
    c = _validate(dict(EXAMPLE_CONFIG, vocab_size=1000, n_ctx=256, d_model=64, n_layers=2,
                       n_heads=4, n_kv_heads=4, d_ff=256) if cfg is None else cfg)
    total = _reference_flops(c, n)
    expected = total / n
    got = _as_number(_student(fn, dict(c), n, what="flops_per_token(cfg, n)"), "flops_per_token(cfg, n)",
                     integer=False)
    record("flops_per_token", {"flops": float(got)})
    if abs(got - expected) <= 1e-9 * expected:
        ok(f"flops_per_token = {expected:,.0f} at n = {n}, as FlopCounterMode counts a forward pass of "
           f"the built model ({total:,} FLOPs / {n} tokens)")
        return
    d, L, V = c["d_model"], c["n_layers"], c["vocab_size"]
    attn = 4 * L * n * d
    hints = [(expected - attn, "you left out the attention matmuls Q·Kᵀ and A·V: 2·2·n·d per layer "
              "and token, and they grow with n"),
             (expected - attn / 2, "Q·Kᵀ and A·V both cost 2·n·d per token and layer: you counted one"),
             (expected - 2 * d * V, "the unembedding (d × V logits) is a matmul too: 2·d·V per token"),
             (expected + 2 * d * V, "the embedding is a row lookup, not a matmul: it costs no FLOPs"),
             (3 * expected, "6N is the training cost (forward and backward); the forward pass is 2N"),
             (total, "per token: divide the FLOPs of the whole sequence by n"),
             (expected / 2, "a multiply-add is 2 FLOPs: 2 FLOPs per weight, not 1")]
    for value, hint in hints:
        if abs(got - value) <= 1e-9 * max(abs(value), 1):
            _fail(f"flops_per_token: {hint}", expected, got)
    _fail(f"flops_per_token differs from FlopCounterMode's count on the built model (n = {n})",
          expected, got)


def check_crossover_n(fn: Callable, cfg: dict | None = None) -> None:
    """``fn(cfg) -> float``: the n at which a layer's attention matmuls cost as many FLOPs as its
    weight matmuls. Chapter 9."""
    c = _validate(dict(EXAMPLE_CONFIG, vocab_size=100, n_ctx=64, d_model=32, n_layers=1, n_heads=4,
                       n_kv_heads=4, d_ff=128) if cfg is None else cfg)
    small = dict(c, vocab_size=16, n_layers=1, n_ctx=c["n_ctx"])
    n1, n2 = 8, 16  # per-token FLOPs are a + b·n: a from the weights (and head), b from attention
    f1, f2 = _reference_flops(small, n1) / n1, _reference_flops(small, n2) / n2
    slope = (f2 - f1) / (n2 - n1)
    weights = f1 - slope * n1 - 2 * small["d_model"] * small["vocab_size"]  # without the head
    expected = weights / slope
    got = _as_number(_student(fn, dict(c), what="crossover_n(cfg)"), "crossover_n(cfg)", integer=False)
    record("crossover_n", {"n": float(got)})
    if abs(got - expected) <= 1e-6 * expected:
        ok(f"crossover_n = {expected:g} = {expected / c['d_model']:g}·d_model: attention matmuls "
           "equal the weight matmuls there, as FlopCounterMode finds at two lengths")
        return
    d = c["d_model"]
    hints = [(d, "n > d is the rule of thumb without constants: compare 4·n·d (attention) with the "
              "weight FLOPs per token of a layer"),
             (6 * d, "6·d holds for d_ff = 4d and full multi-head attention only: use this config's "
              "d_ff, MLP kind and n_kv_heads"),
             (4 * d, "4·d is the crossover against the MLP alone: count the Q, K, V, O projections too"),
             (2 * expected, "Q·Kᵀ and A·V both cost 2·n·d per token: the attention term is 4·n·d")]
    for value, hint in hints:
        if abs(got - value) <= 1e-6 * value:
            _fail(f"crossover_n: {hint}", expected, got)
    _fail("crossover_n differs from the length at which the two FLOP counts are equal", expected, got)
