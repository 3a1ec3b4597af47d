"""Checks for the chapter 7 exercise on activation patching: find the head of a small GPT whose
output, patched at given positions from a clean run into a corrupted one, recovers most of a
metric, with the recovered fractions of every head as evidence.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, and the
call of the student's function). The model handed to the student is an input: plain ``torch.nn``
modules built from a seed that each case records, so that the judge rebuilds the same model; the
metric is a closure over the case's answer tokens. After the call the kernel runs the corrupted
input once more and records the logits (a hook left in place shows there). Below the line: the
judge, which recomputes every head's patched run by an explicit forward pass of the same weights
with that head's output replaced (no hook), picks the head itself and names the likely
misconception. Chapter 7.
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


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import numpy as np  # noqa: E402

from .._harness import CheckFailed, typename  # noqa: E402
from .._judging import as_array, check_shape, judge, pair  # noqa: E402


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


def _table(case: dict, model: _GPT, heads: Callable[[int], list[int]] = lambda h: [h],
           positions: list[int] | None = None, noising: bool = False) -> np.ndarray:
    """The recovered fraction of every ``[layer, head]``, patching ``heads(head)`` at ``positions`` (the
    case's if None) of that layer (``noising``: the corrupted run's head patched into the clean run
    instead, the other direction)."""
    where = list(case["positions"]) if positions is None else positions
    metric = _metric(case["answers"])
    (clean, clean_z), (corr, corr_z) = _forward(model, case["clean"]), _forward(model, case["corrupted"])
    m_clean, m_corr = metric(clean), metric(corr)
    into, source = (case["clean"], corr_z) if noising else (case["corrupted"], clean_z)
    return np.array([[(metric(_forward(model, into, layer, heads(head), where, source)[0]) - m_corr) / (m_clean - m_corr)
                      for head in range(case["n_heads"])] for layer in range(case["n_layers"])])


def _variants(case: dict, model: _GPT, expected: np.ndarray) -> dict[str, Callable[[], np.ndarray]]:
    """What likely mistakes give for the table (computed when asked), message first."""
    H, n, positions = case["n_heads"], case["clean"].shape[1], list(case["positions"])
    found = {"measured from the wrong end: r = (metric(patched) − metric(corrupted)) / (metric(clean) − "
             "metric(corrupted)) is 0 for the corrupted run and 1 for the clean one": lambda: 1 - expected}
    for shift in (1, -1):
        found[f"the fractions belong to the heads {'after' if shift > 0 else 'before'} them: head h is the d_k "
              "columns h·d_k … (h+1)·d_k − 1 of the input of out_proj (heads count from 0)"] = \
            lambda shift=shift: np.roll(expected, -shift, axis=1)
        moved = [p + shift for p in positions if 0 <= p + shift < n]
        if moved:
            found[f"that patches the positions one to the {'right' if shift > 0 else 'left'} of the ones given: "
                  f"patch the given positions of the position axis (dim 1)"] = \
                lambda moved=moved: _table(case, model, positions=moved)
    found["that patches every position: only the positions given take the clean values"] = lambda: _table(
        case, model, positions=list(range(n)))
    found["that patches every head of the layer at once: each head is patched alone, its own d_k columns"] = \
        lambda: _table(case, model, heads=lambda h: list(range(H)))
    found["that runs the clean input with the corrupted run's head: run the corrupted input, with the clean run's "
          "values of the head"] = lambda: _table(case, model, noising=True)
    return found


def _find_ok(cases: list[dict], outs: list[dict]) -> str:
    return ("the recovered fractions of every head equal explicit passes with that head's output replaced (1e-6), "
            "and the head picked has the largest, for " + ", ".join(
                f"{c['n_layers'] * c['n_heads']} heads ({c['n_layers']} blocks of {c['n_heads']}) patched at "
                f"positions {c['positions']}" for c in cases))


@judge("find_head", ok=_find_ok)
def _find_head(case: dict, out: dict) -> None:
    what, tol, L, H = case["what"], 1e-6, case["n_layers"], case["n_heads"]
    best, fractions = pair(out.get("result"), what, ("(layer, head)", "fractions"))
    model = _model(case)
    with torch.no_grad():
        expected = _table(case, model)
        corr_logits = _forward(model, case["corrupted"])[0].numpy()
    after = out.get("after")
    if not (isinstance(after, torch.Tensor) and np.allclose(after.numpy(), corr_logits, atol=1e-9, rtol=0)):
        raise CheckFailed(f"{what}: after your function returned, the model still gives other logits on the "
                          "corrupted input: remove each hook (handle.remove(), in a finally block) and leave the "
                          "weights as they were")
    got = as_array(fractions, f"{what}: the fractions")
    if got.shape == (H, L) and H != L:
        raise CheckFailed(f"{what}: the fractions are indexed [layer, head], shape (n_layers, n_heads) = ({L}, {H}), "
                          f"got shape {got.shape}")
    check_shape(got, (L, H), f"{what}: the fractions", "one row per block, one column per head")
    wrong = np.abs(got - expected) > tol
    if wrong.any():
        if not np.isfinite(got).all():
            raise CheckFailed(f"{what}: the fractions hold nan or inf: the metric of the clean and the corrupted "
                              "runs differ here, so only a wrong patch or a wrong formula divides by zero")
        for hint, make in _variants(case, model, expected).items():
            with torch.no_grad():
                variant = make()
            if np.allclose(got, variant, atol=tol, rtol=0) and np.abs(variant - expected).max() > 10 * tol:
                raise CheckFailed(f"{what}: {hint}")
        layer, head = (int(i) for i in np.argwhere(wrong)[0])
        raise CheckFailed(f"{what}: the recovered fraction of block {layer}, head {head} (and {int(wrong.sum()) - 1} "
                          "more) differs from that of the corrupted run with this head's output (its columns of "
                          f"out_proj's input) replaced by the clean run's at these positions (atol {tol})")
    if not (isinstance(best, list) and len(best) == 2 and all(type(i) is int for i in best)):
        raise CheckFailed(f"{what}: the head must be a pair of whole numbers (layer, head), got {typename(best)}")
    top = expected.max()
    if not (0 <= best[0] < L and 0 <= best[1] < H and expected[best[0], best[1]] >= top - 10 * tol):
        layer, head = best
        if 0 <= head < L and 0 <= layer < H and expected[head, layer] >= top - 10 * tol:
            raise CheckFailed(f"{what}: the head is given as (layer, head), blocks first")
        if 0 <= layer < L and 0 <= head < H and (abs(expected[layer, head]) >= np.abs(expected).max() - 10 * tol
                                                  or expected[layer, head] <= expected.min() + 10 * tol):
            raise CheckFailed(f"{what}: the head that recovers most has the largest fraction, not the smallest nor "
                              "the largest in size: a negative fraction means the patch moves the metric further "
                              "from the clean run")
        raise CheckFailed(f"{what}: the head picked is not the one with the largest recovered fraction in your own "
                          "table")
