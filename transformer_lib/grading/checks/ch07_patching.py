"""Checks for the chapter 7 exercise on activation patching: one head of a small GPT patched, at
chosen positions, from a clean run into a corrupted one, and the recovered fraction of a metric.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, and the
call of the student's function). The model handed to the student is an input: plain ``torch.nn``
modules built from a seed that each case records, so that the judge rebuilds the same model; the
metric is a closure over the case's answer tokens. After the call the kernel runs the corrupted
input once more and records the logits (a hook left in place shows there). Below the line: the judge,
which recomputes the patched run by an explicit forward pass of the same weights with the head's
output replaced (no hook), and names the likely misconception. Chapter 7.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import nn

from .._calls import call
from .._harness import draw, hidden_generator, run_check

__all__ = ["check_patch_head"]


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


def _case(g: torch.Generator, n_layers: int, n_heads: int, d_k: int, b: int, n: int, layer: int, changed: int,
          first_patched: int, n_patched: int) -> dict:
    """A case: random clean ids, ``changed`` positions of them replaced from ``first_patched − 1`` back,
    and ``n_patched`` positions to patch chosen from ``first_patched`` on."""
    clean = torch.randint(0, _VOCAB, (b, n), generator=g)
    where = torch.randperm(first_patched, generator=g)[:changed]
    corrupted = clean.clone()
    corrupted[:, where] = (clean[:, where] + torch.randint(1, _VOCAB, (b, len(where)), generator=g)) % _VOCAB
    positions = sorted((first_patched + torch.randperm(n - first_patched, generator=g)[:n_patched]).tolist())
    return dict(seed=draw(g, 1, 2**20), n_layers=n_layers, n_heads=n_heads, d_k=d_k, clean=clean,
                corrupted=corrupted, layer=layer, head=draw(g, 0, n_heads - 1), positions=positions,
                answers=torch.randint(0, _VOCAB, (b,), generator=g))


def _run_patch(fn: Callable, case: dict) -> dict:
    model = _model(case)       # a fresh model from the case's seed: whatever the student does stays there
    def after(r: Any) -> dict:  # the model once the student's function is done, inside the watch
        with torch.no_grad():
            return {"r": r, "after": model(case["corrupted"])}

    return call(fn, model, case["clean"].clone(), case["corrupted"].clone(), case["layer"], case["head"],
                list(case["positions"]), _metric(case["answers"]), after=after)


def check_patch_head(fn: Callable, hidden: int = 0) -> None:
    """``fn(model, clean_ids, corrupted_ids, layer, head, positions, metric) -> r``: the recovered
    fraction (metric(patched) − metric(corrupted)) / (metric(clean) − metric(corrupted)) of the run of
    ``corrupted_ids`` in which head ``head`` of block ``layer`` outputs, at ``positions``, what it
    output in the run of ``clean_ids``. Chapter 7."""
    if hidden:
        g = hidden_generator("patch_head", hidden)
        cases = [_case(g, 2, draw(g, 2, 4), draw(g, 2, 4), draw(g, 1, 3), draw(g, 7, 10), 0, 1, 3, 2),
                 _case(g, 3, draw(g, 2, 3), draw(g, 2, 4), draw(g, 2, 3), draw(g, 8, 12), draw(g, 1, 2), 2, 4, 3),
                 _case(g, 2, 4, 2, 2, draw(g, 6, 9), 1, 2, 5, 1)]
    else:
        cases = [_case(torch.Generator().manual_seed(97), 2, 3, 4, 2, 8, 0, 2, 4, 2)]
    for case in cases:
        case["what"] = (f"patch_head(model, clean_ids, corrupted_ids, layer={case['layer']}, head={case['head']}, "
                        f"positions={case['positions']}, metric)")
    run_check("patch_head", fn, cases, _run_patch, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import numpy as np  # noqa: E402

from .._harness import CheckFailed, typename  # noqa: E402
from .._judging import judge  # noqa: E402


def _forward(model: _GPT, ids: torch.Tensor, layer: int = -1, heads: list[int] | None = None,
             positions: list[int] | None = None, source: list[torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The logits of an explicit pass and every block's head outputs ``(b, n, h, d_k)``; in block
    ``layer`` the ``heads`` at ``positions`` output ``source[layer]``'s values instead."""
    b, n = ids.shape
    x = model.tok_emb.weight[ids] + model.pos_emb.weight[:n]
    zs = []
    for l, block in enumerate(model.blocks):
        a, h = block.attn, block.norm1(x)
        q, k, v = ((h @ p.weight.T + p.bias).view(b, n, a.n_heads, a.d_k) for p in (a.q_proj, a.k_proj, a.v_proj))
        scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(a.d_k)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        z = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v)
        if l == layer:
            keep = torch.zeros(1, n, a.n_heads, 1, dtype=torch.bool)
            keep[:, positions, :, :] = True
            keep[:, :, [hh for hh in range(a.n_heads) if hh not in heads]] = False
            z = torch.where(keep, source[l], z)
        zs.append(z)
        x = x + z.reshape(b, n, -1) @ a.out_proj.weight.T + a.out_proj.bias
        x = x + block.mlp(block.norm2(x))
    return model.lm_head(model.norm_f(x)), zs


def _fraction(case: dict, model: _GPT, layer: int, heads: list[int], positions: list[int], noising: bool = False
              ) -> float:
    """The recovered fraction of the patch (``noising``: the corrupted run's head patched into the
    clean run instead, the other direction)."""
    metric = _metric(case["answers"])
    clean_logits, clean_z = _forward(model, case["clean"])
    corr_logits, corr_z = _forward(model, case["corrupted"])
    if noising:
        patched, _ = _forward(model, case["clean"], layer, heads, positions, corr_z)
    else:
        patched, _ = _forward(model, case["corrupted"], layer, heads, positions, clean_z)
    m_clean, m_corr = metric(clean_logits), metric(corr_logits)
    return (metric(patched) - m_corr) / (m_clean - m_corr)


def _variants(case: dict, model: _GPT) -> dict[str, float]:
    """What likely mistakes give, message first."""
    L, H, n = case["n_layers"], case["n_heads"], case["clean"].shape[1]
    layer, head, positions = case["layer"], case["head"], list(case["positions"])
    r = _fraction(case, model, layer, [head], positions)
    found = {"measured from the wrong end: r = (metric(patched) − metric(corrupted)) / (metric(clean) − "
             "metric(corrupted)) is 0 for the corrupted run and 1 for the clean one": 1 - r}
    for other in ((head - 1) % H, (head + 1) % H):
        found[f"that is head {other}'s patch: head h is the d_k columns h·d_k … (h+1)·d_k − 1 of the input of "
              "out_proj (heads count from 0)"] = _fraction(case, model, layer, [other], positions)
    for shift, side in ((-1, "left"), (1, "right")):
        moved = [p + shift for p in positions if 0 <= p + shift < n]
        if moved:
            found[f"that patches the positions one to the {side} of the ones given: patch positions "
                  f"{positions} of the position axis (dim 1)"] = _fraction(case, model, layer, [head], moved)
    found["that patches every position: only the positions given take the clean values"] = _fraction(
        case, model, layer, [head], list(range(n)))
    found["that patches every head of the layer: only head `head`'s d_k columns take the clean values"] = \
        _fraction(case, model, layer, list(range(H)), positions)
    for other in (layer - 1, layer + 1):
        if 0 <= other < L:
            found[f"that patches block {other}: blocks count from 0 (model.blocks[layer])"] = _fraction(
                case, model, other, [head], positions)
    found["that runs the clean input with the corrupted run's head: run the corrupted input, with the clean run's "
          "values of the head"] = _fraction(case, model, layer, [head], positions, noising=True)
    return found


@judge("patch_head",
       ok=lambda cases, outs: "the recovered fraction of one head patched at chosen positions equals an explicit "
                              "pass with that head's output replaced (1e-6), for " + ", ".join(
           f"block {c['layer']} head {c['head']} of a {c['n_layers']}-block model at positions {c['positions']}"
           for c in cases))
def _patch_head(case: dict, out: dict) -> None:
    what, tol = case["what"], 1e-6
    got = out.get("r")
    if isinstance(got, torch.Tensor) and got.numel() == 1 and got.is_floating_point():
        got = float(got)
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise CheckFailed(f"{what} must return the recovered fraction, a number (a float or a one-element "
                          f"tensor), got {typename(got)}")
    model = _model(case)
    with torch.no_grad():
        expected = _fraction(case, model, case["layer"], [case["head"]], list(case["positions"]))
        corr_logits = _forward(model, case["corrupted"])[0].numpy()
        variants = _variants(case, model)
    after = out.get("after")
    if not (isinstance(after, torch.Tensor) and np.allclose(after.numpy(), corr_logits, atol=1e-9, rtol=0)):
        raise CheckFailed(f"{what}: after your function returned, the model still gives other logits on the "
                          "corrupted input: remove the hook (handle.remove(), in a finally block) and leave the "
                          "weights as they were")
    if abs(got - expected) <= tol:
        return
    if not math.isfinite(got):
        raise CheckFailed(f"{what} returned {got}: the metric of the clean and the corrupted runs differ here")
    for hint, value in variants.items():
        if abs(got - value) <= tol and abs(value - expected) > 10 * tol:
            raise CheckFailed(f"{what}: {hint}\nexpected r = {expected:.6f}, got {got:.6f}")
    raise CheckFailed(f"{what}: the recovered fraction differs from that of the corrupted run with this head's "
                      f"output (its columns of out_proj's input) replaced by the clean run's at these positions "
                      f"(atol {tol})\nexpected r = {expected:.6f}, got {got:.6f}")
