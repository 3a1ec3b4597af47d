"""The checks' kernel half for the chapter 7 exercise on activation patching: find the head of a small
GPT whose output, patched at given positions from a clean run into a corrupted one, recovers most of
a metric, with the recovered fractions of every head as evidence.

What runs in the student's kernel (the inputs, visible and hidden, and the call of the student's
function). The model handed to the student is an input: plain ``torch.nn`` modules built from a seed
that each case records, so that the judge rebuilds the same model; the metric is a closure over the
case's answer tokens. After the call the kernel runs the corrupted input once more and records the
logits (a hook left in place shows there). The judges are in
:mod:`transformer_lib.grading.judges.ch07_patching`. Chapter 7.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import nn

from .._calls import call
from .._harness import draw, hidden_generator, run_check

__all__ = ["check_find_head"]


# ---------------------------------------------------------------- the inputs: a small GPT

class _Attention(nn.Module):
    """Causal multi-head self-attention whose heads' outputs, side by side ``(b, n, h·d_k)``, are the
    input of ``out_proj``: ``(b, n, d) -> (b, n, d)``. Chapter 7."""

    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads, self.d_k = n_heads, d // n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d).double() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(b, n, d) -> (b, n, d)``. Chapter 7."""
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.n_heads, self.d_k).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = (q @ k.transpose(-1, -2) / math.sqrt(self.d_k)).masked_fill(
            torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return self.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d))


class _Block(nn.Module):
    """A pre-norm block: ``x + attn(norm1(x))``, then ``+ mlp(norm2(·))``. Chapter 7."""

    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d).double(), nn.LayerNorm(d).double()
        self.attn = _Attention(d, n_heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _GPT(nn.Module):
    """``tok_emb``, ``pos_emb``, ``blocks`` (each ``norm1``, ``attn``, ``norm2``, ``mlp``), ``norm_f``,
    ``lm_head``, random float64 weights from ``seed``: ``(b, n)`` ids -> ``(b, n, V)`` logits. Chapter 7."""

    def __init__(self, vocab: int, d: int, n_heads: int, n_layers: int, seed: int) -> None:
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, d).double(), nn.Embedding(_N_CTX, d).double()
        self.blocks = nn.ModuleList(_Block(d, n_heads) for _ in range(n_layers))
        self.norm_f, self.lm_head = nn.LayerNorm(d).double(), nn.Linear(d, vocab, bias=False).double()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():   # norms' gains near 1, everything else N(0, 0.5²)
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype) + (p == 1).to(p.dtype))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[-1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))


_VOCAB, _N_CTX = 12, 12


def _model(case: dict) -> _GPT:
    return _GPT(_VOCAB, case["n_heads"] * case["d_k"], case["n_heads"], case["n_layers"], case["seed"])


def _metric(answers: torch.Tensor) -> Callable[[torch.Tensor], float]:
    """The mean log-probability of each sequence's answer token at its last position."""
    def metric(logits: torch.Tensor) -> float:
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[0] != len(answers):
            raise TypeError("metric(logits): logits must be the model's output, (b, n, V)")
        logp = logits[:, -1].double().log_softmax(-1)
        return float(logp[torch.arange(len(answers)), answers].mean())
    return metric


def _case(g: torch.Generator, n_layers: int, n_heads: int, d_k: int, b: int, n: int, changed: int,
          first_patched: int, n_patched: int, inputs: str = "") -> dict:
    """A case: random clean ids, ``changed`` positions of them replaced from ``first_patched − 1`` back,
    and ``n_patched`` positions to patch chosen from ``first_patched`` on."""
    clean = torch.randint(0, _VOCAB, (b, n), generator=g)
    where = torch.randperm(first_patched, generator=g)[:changed]
    corrupted = clean.clone()
    corrupted[:, where] = (clean[:, where] + torch.randint(1, _VOCAB, (b, len(where)), generator=g)) % _VOCAB
    positions = sorted((first_patched + torch.randperm(n - first_patched, generator=g)[:n_patched]).tolist())
    return dict(seed=draw(g, 1, 2**20), n_layers=n_layers, n_heads=n_heads, d_k=d_k, clean=clean,
                corrupted=corrupted, positions=positions, answers=torch.randint(0, _VOCAB, (b,), generator=g),
                inputs=inputs)


def _run_search(fn: Callable, case: dict) -> dict:
    model = _model(case)       # a fresh model from the case's seed: whatever the student does stays there

    def after(result: Any) -> dict:  # the model once the student's function is done, inside the watch
        with torch.no_grad():
            return {"result": result, "after": model(case["corrupted"])}

    return call(fn, model, case["clean"].clone(), case["corrupted"].clone(), list(case["positions"]),
                _metric(case["answers"]), after=after)


# the visible cases: generators whose models have a head with a negative fraction larger in size than
# the largest one (so the largest |r| is not the answer) and no two heads within 1e-3 of the best
_VISIBLE = [(174, 2, 3, 4, 2, 8, 2, 4, 2), (18, 3, 2, 4, 2, 9, 2, 5, 1)]


def check_find_head(fn: Callable, hidden: int = 0) -> None:
    """``fn(model, clean_ids, corrupted_ids, positions, metric) -> ((layer, head), fractions)``: for
    every head of every block, the recovered fraction (metric(patched) − metric(corrupted)) /
    (metric(clean) − metric(corrupted)) of the run of ``corrupted_ids`` in which that head alone
    outputs, at ``positions``, what it output in the run of ``clean_ids``, as an
    ``(n_layers, n_heads)`` table, and the head with the largest. Chapter 7."""
    if hidden:
        g = hidden_generator("find_head", hidden)
        cases = [_case(g, 2, draw(g, 2, 4), draw(g, 2, 4), draw(g, 1, 3), draw(g, 7, 10), 1, 3, 2,
                       "two blocks, one token changed"),
                 _case(g, 3, 2, 2, 2, draw(g, 6, 9), 2, 5, 1, "three blocks of two heads of two dimensions, one "
                       "position patched")]
    else:
        cases = [_case(torch.Generator().manual_seed(seed), *sizes) for seed, *sizes in _VISIBLE]
    for case in cases:
        case["what"] = f"find_head(model, clean_ids, corrupted_ids, positions={case['positions']}, metric)"
    run_check("find_head", fn, cases, _run_search, hidden)
