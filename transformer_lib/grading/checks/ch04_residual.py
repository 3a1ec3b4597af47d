"""Checks for the chapter 4 exercises: a pre-norm residual block written from its sub-layers,
the residual stream of a given model taken apart into writes, and a sub-layer that defeats the
"gradient at least 1" claim.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, and
the calls of the student's functions). The sub-layers and the small model handed to the student
are inputs: plain ``torch.nn`` modules built from a seed, which each case records, so that the
judge rebuilds the same ones. ``sublayers`` and ``tiny_gpt`` stay public: the exercise notebook
offers them to try a solution on. Below the line: the judges, which compute their references
from the inputs and run in the grader. Chapter 4.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .._harness import call, draw, hidden_generator, randn, run_check, seeded

__all__ = ["sublayers", "tiny_gpt", "check_pre_norm_block", "check_stream_writes", "check_shrinking_sublayer"]


# ---------------------------------------------------------------- the inputs: sub-layers and a small model

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


def sublayers(d: int = 8, seed: int = 0) -> tuple[nn.Module, nn.Module, nn.Module, nn.Module]:
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
            attn, mlp, norm1, norm2 = sublayers(d, seed=seed + 10 * layer)
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
    """The model of exercise 4.2: vocabulary 11, context 8, width 8. Chapter 4."""
    return _TinyGPT(_VOCAB, _N_CTX, _WIDTH, n_layers, seed)


# ---------------------------------------------------------------- 4.1 the residual block

def _run_block(fn: Callable, case: dict) -> dict:
    with torch.no_grad():  # fresh sub-layers from the case's seed: whatever the student does to them stays there
        return {"out": call(fn, case["x"].clone(), *sublayers(case["d"], case["seed"]))}


def check_pre_norm_block(fn: Callable, d: int = 8, seed: int = 0, hidden: int = 0) -> None:
    """``fn(x, attn, mlp, norm1, norm2)`` must compute a pre-norm block, with the sub-layers of
    ``sublayers(d, seed)``. Chapter 4."""
    if hidden:
        g = hidden_generator("pre_norm_block", hidden)
        cases = []
        for _ in range(2):
            d, seed = 2 * draw(g, 1, 8), draw(g, 1, 2**20)
            cases.append(dict(d=d, seed=seed, x=randn(g, draw(g, 1, 3), draw(g, 1, 8), d)))
    else:
        cases = [dict(d=d, seed=seed, x=seeded(seed + 50, 2, 5, d))]
    for case in cases:
        case["what"] = "pre_norm_block(x, attn, mlp, norm1, norm2)"
    run_check("pre_norm_block", fn, cases, _run_block, hidden)


# ---------------------------------------------------------------- 4.2 the stream's writes

def _run_stream(fn: Callable, case: dict) -> dict:
    with torch.no_grad():  # a fresh model from the case's seed
        return {"result": call(fn, tiny_gpt(case["seed"], case["n_layers"]), case["idx"].clone())}


def check_stream_writes(fn: Callable, seed: int = 0, n_layers: int = 3, n: int = 6, hidden: int = 0) -> None:
    """``fn(model, idx) -> (x0, writes)`` for the model ``tiny_gpt(seed, n_layers)``: the embedding
    and the 2L writes. Chapter 4."""
    if hidden:
        g = hidden_generator("stream_writes", hidden)
        # a shallow model on a sequence of any length, then one deeper than the visible one on the full context
        setups = [(draw(g, 1, 2), (draw(g, 1, 3), draw(g, 1, _N_CTX))), (draw(g, 4, 5), (draw(g, 1, 2), _N_CTX))]
        cases = [dict(seed=draw(g, 1, 2**20), n_layers=n_layers, idx=torch.randint(0, _VOCAB, shape, generator=g))
                 for n_layers, shape in setups]
    else:
        cases = [dict(seed=seed, n_layers=n_layers,
                      idx=torch.randint(0, _VOCAB, (2, n), generator=torch.Generator().manual_seed(seed + 7)))]
    for case in cases:
        case["what"] = "stream_writes(model, idx)"
    run_check("stream_writes", fn, cases, _run_stream, hidden)


# ---------------------------------------------------------------- 4.3 the erratum

def check_shrinking_sublayer(fn: Callable, d: int = 6, depth: int = 10, hidden: int = 0) -> None:
    """``fn(d) -> W (d, d)`` with ‖W‖₂ ≤ 1 such that ``depth`` layers x ↦ x + W x pass back,
    along some direction, less than 1e-6 of a unit gradient. Chapter 4."""
    if hidden:
        g = hidden_generator("shrinking_sublayer", hidden)
        cases = [dict(d=draw(g, 1, 4), depth=depth), dict(d=draw(g, 10, 24), depth=depth)]  # never the visible 6
    else:
        cases = [dict(d=d, depth=depth)]
    for case in cases:
        case["what"] = f"shrinking_sublayer({case['d']})"
    run_check("shrinking_sublayer", fn, cases, lambda f, c: {"W": call(f, c["d"])}, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import numpy as np  # noqa: E402

from .._harness import CheckFailed, typename  # noqa: E402
from .._judging import as_array, check_shape, close, fail, judge  # noqa: E402


@judge("pre_norm_block", compare=("out",), atol=1e-10, rtol=1e-10,
       ok=lambda cases, outs: "pre_norm_block matches x1 = x + Attn(LN1(x)), out = x1 + MLP(LN2(x1)) on x "
                              + ", ".join(str(tuple(c["x"].shape)) for c in cases) + " (1e-10)")
def _pre_norm_block(case: dict, out: dict) -> None:
    x, tol = case["x"], 1e-10
    attn, mlp, norm1, norm2 = sublayers(case["d"], case["seed"])  # the student's sub-layers, rebuilt
    with torch.no_grad():
        a = attn(norm1(x)); x1 = x + a  # noqa: E702
        expected = (x1 + mlp(norm2(x1))).numpy()
        post1 = norm1(x + attn(x))
        around1 = norm1(x) + attn(norm1(x))
        variants = {
            "this is post-norm: the norm comes after the addition, LN(x + f(x)). In pre-norm the "
            "sub-layer reads a normalised copy and the stream itself is never normalised: "
            "x + f(LN(x))": norm2(post1 + mlp(post1)),
            "the residual goes around the norm (LN(x) + f(LN(x))): the skip must carry x itself, "
            "x + f(LN(x)), or the stream is normalised at every sub-layer":
                norm2(around1) + mlp(norm2(around1)),
            "the second residual is missing: the MLP's output must be added to x1, "
            "out = x1 + MLP(LN2(x1))": mlp(norm2(x1)),
            "the first residual is missing: x1 = x + Attn(LN1(x))": attn(norm1(x)) + mlp(norm2(a)),
            "there are no residuals at all: each sub-layer must add its output to its input":
                mlp(norm2(a)),
            "norm1 is used twice: the MLP reads norm2(x1)": x1 + mlp(norm1(x1)),
        }
    got = as_array(out["out"], "pre_norm_block(x, …)")
    check_shape(got, expected.shape, "the block's output", "a block maps (b, n, d) to (b, n, d)")
    for hint, variant in variants.items():
        if close(got, variant.numpy(), tol, tol) and not close(got, expected, tol, tol):
            fail(hint, expected, got)
    if not close(got, expected, tol, tol):
        fail("the output differs from x1 + MLP(LN2(x1)) with x1 = x + Attn(LN1(x)) (atol 1e-10)", expected, got)


def _unpack_stream(result: object) -> tuple[np.ndarray, list[np.ndarray]]:
    if not isinstance(result, list) or len(result) != 2 or not isinstance(result[1], list):
        raise CheckFailed("stream_writes must return a pair (x0, writes) with writes a list of tensors, got "
                          f"{typename(result)}")
    return as_array(result[0], "x0"), [as_array(w, f"writes[{i}]") for i, w in enumerate(result[1])]


@judge("stream_writes", compare=("result",), atol=1e-10, rtol=1e-10,
       ok=lambda cases, outs: "x0 + the writes, through norm_f and lm_head, give the model's logits (float64, "
                              + ", ".join(f"{c['n_layers']} blocks" for c in cases) + ", 1e-9)")
def _stream_writes(case: dict, out: dict) -> None:
    idx, n_layers, tol = case["idx"], case["n_layers"], 1e-10
    model = tiny_gpt(case["seed"], n_layers)  # the student's model, rebuilt
    x0, writes = _unpack_stream(out["result"])
    with torch.no_grad():
        x = model.tok_emb(idx) + model.pos_emb.weight[:idx.shape[-1]]
        ref_x0, ref_writes, states, raw = x.numpy(), [], [], []
        for b in model.blocks:
            for norm, sub in ((b.norm1, b.attn), (b.norm2, b.mlp)):
                w = sub(norm(x)); raw.append(sub(x).numpy())  # noqa: E702
                x = x + w
                ref_writes.append(w.numpy()); states.append(x.numpy())  # noqa: E702
        logits = model(idx).numpy()
        tokens_only = model.tok_emb(idx).numpy()
    if close(x0, tokens_only, tol, tol):
        fail("x0 is only the token embedding: the stream starts with token + position embeddings", ref_x0, x0)
    if not close(x0, ref_x0, tol, tol):
        fail("x0 differs from tok_emb(idx) + pos_emb(positions) (atol 1e-10)", ref_x0, x0)
    L2 = 2 * n_layers
    if len(writes) != L2:
        hint = " — did you keep only the attention writes? Each block writes twice" if len(writes) == n_layers else ""
        raise CheckFailed(f"expected {L2} writes (two per block, {n_layers} blocks), got {len(writes)}{hint}")
    for k, (w, ref) in enumerate(zip(writes, ref_writes)):
        if close(w, states[k], tol, tol) and not close(w, ref, tol, tol):
            fail(f"writes[{k}] is the state of the stream after the sub-layer, not what the sub-layer "
                 "wrote: a write is f(LN(x)), the change, not x + f(LN(x))", ref, w)
        if close(w, raw[k], tol, tol) and not close(w, ref, tol, tol):
            fail(f"writes[{k}] reads the stream without its norm: each sub-layer reads norm1(x) or "
                 "norm2(x), sub(norm(x))", ref, w)
        if not close(w, ref, tol, tol):
            fail(f"writes[{k}] differs from the sub-layer's output (atol 1e-10)", ref, w)
    with torch.no_grad():
        rebuilt = model.lm_head(model.norm_f(torch.from_numpy(x0 + sum(writes)))).numpy()
    if not close(rebuilt, logits, 1e-9, 1e-9):
        fail("lm_head(norm_f(x0 + Σ writes)) differs from the model's logits", logits, rebuilt)


@judge("shrinking_sublayer",
       ok=lambda cases, outs: f"{cases[0]['depth']} residual layers x + W x pass back at most 1e-6 of a unit gradient "
                              "along one direction, with ‖W‖₂ ≤ 1 (d = " + ", ".join(str(c["d"]) for c in cases)
                              + "): residuals do not guarantee a gradient ≥ 1")
def _shrinking_sublayer(case: dict, out: dict) -> None:
    d, depth = case["d"], case["depth"]
    W = torch.from_numpy(as_array(out["W"], "W"))
    check_shape(W.numpy(), (d, d), "W", f"a linear sub-layer f(x) = W x on R^{d} is a {d}×{d} matrix")
    if not torch.isfinite(W).all():
        raise CheckFailed("W contains nan or inf")
    norm = float(torch.linalg.matrix_norm(W, ord=2))
    if norm > 1 + 1e-9:
        raise CheckFailed(f"‖W‖₂ = {norm:.3f} > 1: the point is that even a sub-layer no larger than "
                          "the identity can cancel the skip path; look for an eigenvalue near −1")

    def stack(x: torch.Tensor) -> torch.Tensor:
        for _ in range(depth):
            x = x + W @ x
        return x

    J = torch.autograd.functional.jacobian(stack, torch.zeros(d, dtype=torch.float64))
    smallest = float(torch.linalg.svdvals(J).min())
    if smallest > 1e-6:
        raise CheckFailed(f"through {depth} residual layers the gradient keeps at least {smallest:.2e} of "
                          "its size in every direction (needed: at most 1e-6 along one): choose W with an "
                          "eigenvalue at (or very near) −1, so that I + W nearly cancels that direction")
