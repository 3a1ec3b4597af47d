"""The checks' kernel half for the chapter 4 exercises: the expansion of a residual stack worked by
hand on new numbers, one write removed from the residual stream of a given model, and the expansion
of a stack of matrices order by order.

What runs in the student's kernel (the inputs, visible and hidden, and the calls of the student's
functions). The small model handed to the student is an input: plain ``torch.nn`` modules built from
a seed, which each case records, so that the judge rebuilds the same model. ``tiny_gpt`` stays
public: the exercise notebook offers it to try a solution on. The judges are in
:mod:`transformer_lib.grading.judges.ch04_residual`. Chapter 4.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from .._calls import call
from .._harness import draw, hidden_generator, randn, run_check, seeded

__all__ = ["tiny_gpt", "check_hand_expansion", "check_ablate_write", "check_expansion_orders"]


# ---------------------------------------------------------------- the inputs: a small model

class _Attention(nn.Module):
    """Causal multi-head self-attention from ``torch.nn.MultiheadAttention``: ``(b, n, d) -> (b, n, d)``.
    Chapter 4."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(b, n, d) -> (b, n, d)``, each position attending to itself and earlier ones. Chapter 4."""
        n = x.shape[-2]
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        return self.mha(x, x, x, attn_mask=future, need_weights=False)[0]


def _randomize(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=g, dtype=p.dtype) + (p == 1).to(p.dtype))
    return module


def _sublayers(d: int = 8, seed: int = 0) -> tuple[nn.Module, nn.Module, nn.Module, nn.Module]:
    """``(attn, mlp, norm1, norm2)``: random float64 torch modules, each ``(b, n, d) -> (b, n, d)``
    (``d`` even: the attention has two heads). Chapter 4."""
    attn = _Attention(d, 2)
    mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)).double()
    norm1, norm2 = nn.LayerNorm(d).double(), nn.LayerNorm(d).double()
    return tuple(_randomize(m, seed + i) for i, m in enumerate((attn, mlp, norm1, norm2)))


class _TinyGPT(nn.Module):
    """A small pre-norm GPT made of torch modules: ``tok_emb``, ``pos_emb`` (``nn.Embedding``),
    ``blocks`` (each with ``norm1``, ``attn``, ``norm2``, ``mlp``), ``norm_f``, ``lm_head``.
    ``(b, n)`` ids -> ``(b, n, V)`` logits. Chapter 4."""

    def __init__(self, vocab: int, n_ctx: int, d: int, n_layers: int, seed: int) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d).double()
        self.pos_emb = nn.Embedding(n_ctx, d).double()
        self.blocks = nn.ModuleList()
        for layer in range(n_layers):
            attn, mlp, norm1, norm2 = _sublayers(d, seed=seed + 10 * layer)
            block = nn.Module()
            block.norm1, block.attn, block.norm2, block.mlp = norm1, attn, norm2, mlp
            self.blocks.append(block)
        self.norm_f = nn.LayerNorm(d).double()
        self.lm_head = nn.Linear(d, vocab, bias=False).double()
        for i, m in enumerate((self.tok_emb, self.pos_emb, self.norm_f, self.lm_head)):
            _randomize(m, seed + 1000 + i)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``(b, n)`` token ids -> ``(b, n, V)`` logits. Chapter 4."""
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[-1]))
        for b in self.blocks:
            x = x + b.attn(b.norm1(x))
            x = x + b.mlp(b.norm2(x))
        return self.lm_head(self.norm_f(x))


_VOCAB, _N_CTX, _WIDTH = 11, 8, 8


def tiny_gpt(seed: int = 0, n_layers: int = 3) -> nn.Module:
    """The model of exercise 4.2: vocabulary 11, context 8, width 8, ``n_layers`` pre-norm blocks. Chapter 4."""
    return _TinyGPT(_VOCAB, _N_CTX, _WIDTH, n_layers, seed)


# ---------------------------------------------------------------- 4.1 the expansion by hand: the values are recorded

def check_hand_expansion(product: Any, order_sums: Any, bound: Any, layers_to_vanish: Any) -> None:
    """Exercise 4.1's answers for the four scalar layers j = (1/2, −1/5, 2/5, −1/2): the product
    (1 + j₄)(1 + j₃)(1 + j₂)(1 + j₁), the sums of the expansion's terms with 1, 2, 3 and 4 layers, the
    bound Π(1 + |j|) − 1, and the depth at which layers with j = −1/2 pass back less than 10⁻³.
    Chapter 4."""
    values = {"product": product, "order_sums": order_sums, "bound": bound, "layers_to_vanish": layers_to_vanish}
    run_check("hand_expansion", None, [{"what": "the expansion by hand"}], lambda fn, case: dict(values))


# ---------------------------------------------------------------- 4.2 one write removed from the stream

def _run_ablate(fn: Callable, case: dict) -> dict:
    with torch.no_grad():  # a fresh model from the case's seed: whatever the student does to it stays there
        return {"logits": call(fn, tiny_gpt(case["seed"], case["n_layers"]), case["idx"].clone(), case["k"])}


def check_ablate_write(fn: Callable, hidden: int = 0) -> None:
    """``fn(model, idx, k) -> logits (b, n, V)`` of ``tiny_gpt(seed, n_layers)`` with the k-th write to
    the residual stream (0 = block 0's attention, 1 = its MLP, …) removed and every later sub-layer
    run on the changed stream. Chapter 4."""
    if hidden:
        g = hidden_generator("ablate_write", hidden)
        cases = []
        for kind in (0, 1):  # an attention write, then an MLP write
            n_layers = draw(g, 1, 4)
            cases.append(dict(seed=draw(g, 1, 2**20), n_layers=n_layers, k=2 * draw(g, 0, n_layers - 1) + kind,
                              idx=torch.randint(0, _VOCAB, (draw(g, 1, 3), draw(g, 1, _N_CTX)), generator=g)))
    else:
        ids = torch.randint(0, _VOCAB, (2, 6), generator=torch.Generator().manual_seed(7))
        cases = [dict(seed=0, n_layers=3, k=2, idx=ids),                   # an attention write
                 dict(seed=1, n_layers=4, k=7, idx=ids[:1, :5])]           # the last block's MLP write
    for case in cases:
        case["what"] = f"ablate_write(model, idx, k={case['k']})"
    run_check("ablate_write", fn, cases, _run_ablate, hidden)


# ---------------------------------------------------------------- 4.3 the expansion, order by order

def check_expansion_orders(fn: Callable, hidden: int = 0) -> None:
    """``fn(Js) -> (L + 1, d, d)``: entry r is the sum of the 2^L-term expansion of
    (I + J_L) ⋯ (I + J_1) over its terms with exactly r layers (later layers on the left). Chapter 4."""
    if hidden:
        g = hidden_generator("expansion_orders", hidden)
        setups = [(30, draw(g, 2, 3)), (1, draw(g, 1, 4)), (draw(g, 5, 8), draw(g, 3, 5))]  # deep: no 2^L loop
        cases = [dict(Js=[randn(g, d, d, scale=0.4 / d**0.5) for _ in range(L)]) for L, d in setups]
    else:
        cases = [dict(Js=[seeded(70 + l, 3, 3, scale=0.3) for l in range(4)])]
    for case in cases:
        case["what"] = f"expansion_orders(Js) for {len(case['Js'])} layer(s)"
    run_check("expansion_orders", fn, cases, lambda f, c: {"orders": call(f, [J.clone() for J in c["Js"]])}, hidden)
