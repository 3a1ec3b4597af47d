"""The checks' kernel half for the chapter 9 exercises: the exact parameter count of a configuration,
the forward FLOPs per token of a mixture-of-experts decoder, and the smallest batch at which a
decoding step stops being limited by memory.

A configuration is a plain dict (see :data:`EXAMPLE_CONFIG`); a case carries its entries as data.
What runs in the student's kernel (the configurations, visible and hidden, the calls of the
student's functions, and a watch that notes, as data, the first tensor the student's function makes
that is as large as a weight matrix: a model being built and measured). The judges are in
:mod:`transformer_lib.grading.judges.ch09_counting`. Chapter 9.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from .._calls import call
from .._harness import draw, hidden_generator, run_check

__all__ = ["EXAMPLE_CONFIG", "check_param_count", "check_moe_flops", "check_decode_batch"]

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


_SMALL_MOE = dict(EXAMPLE_CONFIG, vocab_size=1000, n_ctx=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                  d_ff=128, mlp="swiglu", norm="rmsnorm", bias=False, tied_embeddings=False, positional="rope")


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
        configs = [EXAMPLE_CONFIG, _SMALL_MOE] if cfg is None else [cfg]   # GPT-2 small; SwiGLU, GQA, untied
    cases = [_case(c, "param_count(cfg)") for c in configs]
    run_check("param_count", fn, cases, _run, hidden)


# ---------------------------------------------------------------- 9.2 FLOPs per token of a mixture of experts
_SIZES = dict(heads=(2, 6), d_head=(4, 16), layers=(1, 3), vocab=(50, 1500), n_ctx=(64, 128))


def check_moe_flops(fn: Callable, cfg: dict | None = None, n: int = 100, n_experts: int = 8, top_k: int = 2,
                    hidden: int = 0) -> None:
    """``fn(cfg, n, n_experts, top_k)``: forward matmul FLOPs per token for one sequence of n tokens
    through the decoder ``cfg`` whose every MLP is a mixture of ``n_experts`` experts (each one of
    cfg's MLPs), ``top_k`` per token. Chapter 9."""
    if hidden:
        g = hidden_generator("moe_flops", hidden)
        configs = [_random_config(g, mlp="swiglu", norm="rmsnorm", bias=False, tied=False, positional="rope",
                                  gqa=True, **_SIZES),
                   _random_config(g, mlp="gelu", norm="layernorm", bias=_coin(g), tied=_coin(g),
                                  positional="learned", gqa=False, **_SIZES)]
        E = draw(g, 3, 8)
        cases = [_case(configs[0], "moe_flops(cfg, n, n_experts, top_k)", n=draw(g, 2, 64), n_experts=E,
                       top_k=draw(g, 2, E)),
                 _case(configs[1], "moe_flops(cfg, n, n_experts, top_k)", n=draw(g, 1, 20), n_experts=draw(g, 1, 6),
                       top_k=1)]
    else:
        cases = [_case(_SMALL_MOE if cfg is None else cfg, "moe_flops(cfg, n, n_experts, top_k)", n=n,
                       n_experts=n_experts, top_k=top_k)]
    run_check("moe_flops", fn, cases, lambda f, c: _run(f, c, c["n"], c["n_experts"], c["top_k"]), hidden)


# ---------------------------------------------------------------- 9.3 the batch of a decoding step

def check_decode_batch(fn: Callable, cfg: dict | None = None, n: int = 1024, ratio: int = 4,
                       hidden: int = 0) -> None:
    """``fn(cfg, n, ratio) -> int | None``: the smallest batch at which one decoding step with n
    tokens in the KV cache does at least ``ratio`` FLOPs per byte read (16-bit numbers: every weight
    matrix once, every sequence's cache), None if no batch does. Chapter 9."""
    if hidden:
        g = hidden_generator("decode_batch", hidden)
        wide = dict(heads=(8, 32), d_head=(64, 128), layers=(8, 40), vocab=(30000, 130000), n_ctx=(4096, 8192))
        llama = _random_config(g, mlp="swiglu", norm="rmsnorm", bias=False, tied=False, positional="rope", gqa=True,
                               **wide)
        small = _random_config(g, mlp="gelu", norm="layernorm", bias=True, tied=True, positional="learned",
                               gqa=_coin(g), **_SIZES)
        cases = [_case(llama, "decode_batch(cfg, n, ratio)", n=draw(g, 512, 8192), ratio=draw(g, 2, 8)),
                 _case(small, "decode_batch(cfg, n, ratio)", n=draw(g, 2, max(2, small["d_model"] // 4)),
                       ratio=draw(g, 2, 8)),                                              # a batch reaches it
                 _case(small, "decode_batch(cfg, n, ratio)", n=draw(g, 2048, 8192), ratio=draw(g, 50, 400)),  # none
                 _case(llama, "decode_batch(cfg, n, ratio)", n=draw(g, 1, 64), ratio=1)]   # one sequence does
    else:
        cases = [_case(EXAMPLE_CONFIG if cfg is None else cfg, "decode_batch(cfg, n, ratio)", n=n, ratio=ratio)]
        if cfg is None:   # grouped-query attention, where the cache decides; and a cache so long no batch reaches
            cases += [_case(_SMALL_MOE, "decode_batch(cfg, n, ratio)", n=512, ratio=4),
                      _case(_SMALL_MOE, "decode_batch(cfg, n, ratio)", n=4096, ratio=4)]
    run_check("decode_batch", fn, cases, lambda f, c: _run(f, c, c["n"], c["ratio"]), hidden)
