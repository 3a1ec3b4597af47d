"""Checks for the chapter 9 exercises: the exact parameter count of a configuration, the forward
FLOPs per token, and the sequence length at which attention overtakes the weight matrices.

A configuration is a plain dict (see :data:`EXAMPLE_CONFIG`); a case carries its entries as
data. Above the judging line: what runs in the student's kernel (the configurations, visible and
hidden, the calls of the student's functions, and a watch that notes, as data, the first tensor
the student's function makes that is as large as a weight matrix: a model being built and
measured). Below it: the judges and their references, which run in the grader: a model built
from ``torch.nn`` layers on the meta device and counted, ``FlopCounterMode`` over a forward pass
of the course's ``GPT`` built from the configuration, and two such counts for the crossover.
Chapter 9.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from .._harness import call, draw, hidden_generator, run_check

__all__ = ["EXAMPLE_CONFIG", "check_param_count", "check_flops_per_token", "check_crossover_n"]

EXAMPLE_CONFIG: dict[str, Any] = dict(  # GPT-2 small
    vocab_size=50257, n_ctx=1024, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12,
    d_ff=3072, mlp="gelu", norm="layernorm", bias=True, tied_embeddings=True,
    positional="learned")

_KEYS = tuple(EXAMPLE_CONFIG)


def _validate(cfg: dict) -> dict:
    if not isinstance(cfg, dict) or set(cfg) != set(_KEYS):
        raise ValueError(f"a configuration is a dict with the keys {sorted(_KEYS)}")
    return dict(cfg)


class _Sizes(TorchFunctionMode):
    """Note the shape of the first torch result with at least ``size`` entries."""

    def __init__(self, size: int, found: list[list[int]]) -> None:
        super().__init__()
        self.size, self.found = size, found

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() >= self.size and not self.found:
            self.found.append(list(out.shape))
        return out


def _run(fn: Callable, case: dict, *args: Any) -> dict:
    """The student's answer for the case's configuration, and the shape of the first tensor it
    made as large as a d_model × d_model weight (None if none)."""
    cfg = {key: case[key] for key in _KEYS}
    found: list[list[int]] = []
    with _Sizes(max(1024, cfg["d_model"] ** 2), found):
        answer = call(fn, cfg, *args)
    return {"answer": answer, "built": found[0] if found else None}


def _case(cfg: dict, what: str, **extra: Any) -> dict:
    return dict(_validate(cfg), what=what, **extra)


def _random_config(g: torch.Generator, *, mlp: str, norm: str, bias: bool, tied: bool, positional: str,
                   gqa: bool, heads: tuple[int, int], d_head: tuple[int, int], layers: tuple[int, int],
                   vocab: tuple[int, int], n_ctx: tuple[int, int]) -> dict:
    """A decoder configuration with the given choices and sizes drawn from the given ranges (an even
    d_head for RoPE; with ``gqa`` fewer key/value heads than query heads, a divisor of them)."""
    n_heads = draw(g, *heads)
    divisors = [k for k in range(1, n_heads) if n_heads % k == 0] if gqa else [n_heads]
    n_kv = divisors[draw(g, 0, len(divisors) - 1)] if divisors else n_heads
    dh = draw(g, *d_head)
    dh += dh % 2 if positional == "rope" else 0
    d = n_heads * dh
    return dict(vocab_size=draw(g, *vocab), n_ctx=draw(g, *n_ctx), d_model=d, n_layers=draw(g, *layers),
                n_heads=n_heads, n_kv_heads=n_kv, d_ff=draw(g, d, 4 * d), mlp=mlp, norm=norm, bias=bias,
                tied_embeddings=tied, positional=positional)


def _coin(g: torch.Generator) -> bool:
    return bool(draw(g, 0, 1))


# ---------------------------------------------------------------- 9.1 the exact parameter count

def check_param_count(fn: Callable, cfg: dict | None = None, hidden: int = 0) -> None:
    """``fn(cfg) -> int``: the exact number of parameters of the decoder ``cfg`` describes. Chapter 9."""
    if hidden:
        g = hidden_generator("param_count", hidden)
        big = dict(heads=(16, 64), d_head=(64, 128), layers=(16, 80), vocab=(30000, 130000), n_ctx=(2048, 8192))
        small = dict(heads=(2, 8), d_head=(4, 24), layers=(1, 4), vocab=(50, 2000), n_ctx=(16, 300))
        configs = [  # LLaMA-like at full size; the odd small ones flip every choice; one all at random
            _random_config(g, mlp="swiglu", norm="rmsnorm", bias=False, tied=False, positional="rope",
                           gqa=_coin(g), **big),
            _random_config(g, mlp="swiglu", norm="layernorm", bias=True, tied=False, positional="learned",
                           gqa=True, **small),
            _random_config(g, mlp="gelu", norm="layernorm", bias=False, tied=True, positional="learned",
                           gqa=True, **small),
            _random_config(g, mlp=("gelu", "swiglu")[draw(g, 0, 1)], norm=("layernorm", "rmsnorm")[draw(g, 0, 1)],
                           bias=_coin(g), tied=_coin(g), positional=("learned", "rope")[draw(g, 0, 1)],
                           gqa=_coin(g), **small)]
    else:
        configs = [EXAMPLE_CONFIG if cfg is None else cfg]
    cases = [_case(c, "param_count(cfg)") for c in configs]
    run_check("param_count", fn, cases, _run, hidden)


# ---------------------------------------------------------------- 9.2 FLOPs per token

_SMALL_FLOPS = dict(EXAMPLE_CONFIG, vocab_size=1000, n_ctx=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4,
                    d_ff=256)
_SIZES = dict(heads=(2, 6), d_head=(4, 16), layers=(1, 3), vocab=(50, 1500), n_ctx=(64, 128))


def check_flops_per_token(fn: Callable, cfg: dict | None = None, n: int = 128, hidden: int = 0) -> None:
    """``fn(cfg, n)``: forward matmul FLOPs per token for one sequence of n tokens. Chapter 9."""
    if hidden:
        g = hidden_generator("flops_per_token", hidden)
        configs = [_random_config(g, mlp="swiglu", norm="rmsnorm", bias=False, tied=False, positional="rope",
                                  gqa=True, **_SIZES),
                   _random_config(g, mlp="gelu", norm="layernorm", bias=_coin(g), tied=_coin(g),
                                  positional="learned", gqa=False, **_SIZES)]
        cases = [_case(configs[0], "flops_per_token(cfg, n)", n=draw(g, 2, 64)),
                 _case(configs[1], "flops_per_token(cfg, n)", n=draw(g, 1, 20))]
    else:
        cases = [_case(_SMALL_FLOPS if cfg is None else cfg, "flops_per_token(cfg, n)", n=n)]
    run_check("flops_per_token", fn, cases, lambda f, c: _run(f, c, c["n"]), hidden)


# ---------------------------------------------------------------- 9.3 the crossover

_SMALL_CROSSOVER = dict(EXAMPLE_CONFIG, vocab_size=100, n_ctx=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=4,
                        d_ff=128)


def check_crossover_n(fn: Callable, cfg: dict | None = None, hidden: int = 0) -> None:
    """``fn(cfg) -> float``: the n at which a layer's attention matmuls cost as many FLOPs as its
    weight matmuls. Chapter 9."""
    if hidden:
        g = hidden_generator("crossover_n", hidden)
        configs = [_random_config(g, mlp="swiglu", norm="rmsnorm", bias=False, tied=False, positional="rope",
                                  gqa=True, **_SIZES),
                   _random_config(g, mlp="gelu", norm="layernorm", bias=_coin(g), tied=_coin(g),
                                  positional="learned", gqa=_coin(g), **_SIZES)]
    else:
        configs = [_SMALL_CROSSOVER if cfg is None else cfg]
    run_check("crossover_n", fn, [_case(c, "crossover_n(cfg)") for c in configs], _run, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from .._harness import CheckFailed  # noqa: E402
from .._judging import judge, number  # noqa: E402


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


def _library_model(c: dict):  # noqa: ANN202
    from transformer_lib.config import ModelConfig
    from transformer_lib.model import GPT
    return GPT(ModelConfig(**c)).eval()


_FLOPS: dict[tuple, int] = {}  # the counts made so far (a grading run judges the same configurations again)


def _reference_flops(c: dict, n: int) -> int:
    """Matmul FLOPs of one forward pass over n tokens, counted by FlopCounterMode."""
    key = (*sorted(c.items()), n)
    if key not in _FLOPS:
        model = _library_model(c)
        idx = torch.zeros(1, n, dtype=torch.long)
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
    raise CheckFailed(f"{message}\n  expected: {expected:,}\n  got:      {got:,}")


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


@judge("flops_per_token", ok=lambda cases, outs: "flops_per_token = " + ", ".join(
    f"{_reference_flops(_config(c), c['n']) / c['n']:,.0f} at n = {c['n']}" for c in cases)
    + ", as FlopCounterMode counts a forward pass of the built model (divided by n)")
def _flops_per_token(case: dict, out: dict) -> None:
    c, n = _config(case), case["n"]
    total = _reference_flops(c, n)
    expected = total / n
    got = _answer(case, out, integer=False)
    if abs(got - expected) <= 1e-9 * expected:
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
    _fail(f"flops_per_token differs from FlopCounterMode's count on the built model (n = {n})", expected, got)


def _reference_crossover(c: dict) -> float:
    """Per-token FLOPs are a + b·n: a from the weights (and the head), b from attention; measured at
    two lengths on one layer with a small vocabulary."""
    small = dict(c, vocab_size=16, n_layers=1, n_ctx=max(16, c["n_ctx"]))
    n1, n2 = 8, 16
    f1, f2 = _reference_flops(small, n1) / n1, _reference_flops(small, n2) / n2
    slope = (f2 - f1) / (n2 - n1)
    weights = f1 - slope * n1 - 2 * small["d_model"] * small["vocab_size"]  # without the head
    return weights / slope


def _crossover_ok(cases: list[dict], outs: list[dict]) -> str:
    found = [(_reference_crossover(_config(c)), c["d_model"]) for c in cases]
    return ("crossover_n = " + ", ".join(f"{x:g} = {x / d:g}·d_model" for x, d in found)
            + ": attention matmuls equal the weight matmuls there, as FlopCounterMode finds at two lengths")


@judge("crossover_n", ok=_crossover_ok)
def _crossover_n(case: dict, out: dict) -> None:
    c = _config(case)
    expected = _reference_crossover(c)
    got = _answer(case, out, integer=False)
    if abs(got - expected) <= 1e-6 * expected:
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

