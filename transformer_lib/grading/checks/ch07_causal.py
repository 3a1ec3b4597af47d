"""The checks' kernel half for the chapter 7 exercises: the two masks of an encoder–decoder and the map
of which tokens reach which outputs of a language model (written by the student, run on toy models).
The cached decoding step is checked in ``ch07_cache.py``, activation patching in
``ch07_patching.py``.

What runs in the student's kernel (the inputs, visible and hidden, the calls of the student's
functions, the toy language models the map is run on: plain closures whose layers let chosen queries
see chosen keys, drawn at random for the hidden tests). The judges are in
:mod:`transformer_lib.grading.judges.ch07_causal`. Chapter 7.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .._calls import call
from .._harness import draw, hidden_generator, run_check

__all__ = ["check_seq2seq_masks", "check_influence"]


# ---------------------------------------------------------------- 7.1 the masks of an encoder–decoder

def _lengths(g: torch.Generator, b: int, longest: int) -> torch.Tensor:
    """b lengths from 1 to ``longest``: one full, one of 1 when b > 1, the others at random."""
    lengths = torch.randint(1, longest + 1, (b,), generator=g)
    lengths[0] = longest
    if b > 1:
        lengths[draw(g, 1, b - 1)] = 1
    return lengths


def check_seq2seq_masks(fn: Callable, src_lengths: torch.Tensor | None = None, tgt_lengths: torch.Tensor | None = None,
                        m: int = 6, n: int = 4, hidden: int = 0) -> None:
    """``fn(src_lengths (b,), tgt_lengths (b,), m, n) -> (self_mask (b, n, n), cross_mask (b, n, m))``,
    boolean, True = may attend: the decoder's causal self-attention over its own tokens that are not
    padding, and its cross-attention over the source tokens that are not padding. Chapter 7."""
    if hidden:
        g = hidden_generator("seq2seq_masks", hidden)
        cases = []
        for b, m_, n_ in [(draw(g, 2, 4), draw(g, 2, 5), draw(g, 6, 9)),     # fewer source than target tokens
                          (draw(g, 2, 4), draw(g, 6, 9), draw(g, 2, 5)),     # more
                          (draw(g, 1, 2), draw(g, 1, 4), 1)]:                # a decoder of one token
            cases.append(dict(src_lengths=_lengths(g, b, m_), tgt_lengths=_lengths(g, b, n_), m=m_, n=n_))
    else:
        cases = [dict(src_lengths=torch.tensor([6, 3]) if src_lengths is None else src_lengths,
                      tgt_lengths=torch.tensor([4, 2]) if tgt_lengths is None else tgt_lengths, m=m, n=n)]
    for case in cases:
        case["what"] = "seq2seq_masks(src_lengths, tgt_lengths, m, n)"
    run_check("seq2seq_masks", fn, cases, lambda f, c: {"masks": call(
        f, c["src_lengths"].clone(), c["tgt_lengths"].clone(), c["m"], c["n"])}, hidden)


# ---------------------------------------------------------------- 7.2 which tokens reach which outputs

_WIDTH, _LONGEST = 16, 64  # the toy models' width and longest input


def _allowed(case: dict) -> list[torch.Tensor]:
    """Per layer, the (longest × longest) pattern of ``case``: key j ≤ i + ahead[l] for query i,
    plus the extra keys j_from … j_to of query i in layer l for each ``[l, i, j_from, j_to]`` of
    ``extra``."""
    i, j = torch.arange(_LONGEST)[:, None], torch.arange(_LONGEST)[None, :]
    masks = [j <= i + int(ahead) for ahead in case["ahead"]]
    for layer, query, first, last in case["extra"]:
        masks[layer][query, first:last + 1] = True
    return masks


def _model(case: dict, misuse: list[dict]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The toy language model of ``case``: ids ``(b, n)`` -> logits ``(b, n, vocab)``; embeddings
    plus positions, two attention layers (residual, tanh), an unembedding. A call with the wrong
    kind of ids is noted in ``misuse`` (and raises)."""
    g = torch.Generator().manual_seed(int(case["seed"]))
    d = _WIDTH
    emb = torch.randn(case["vocab"], d, generator=g, dtype=torch.float64)
    pos = 0.5 * torch.randn(_LONGEST, d, generator=g, dtype=torch.float64)
    weights = [torch.randn(3, d, d, generator=g, dtype=torch.float64) / 4 for _ in case["ahead"]]
    unembed = torch.randn(d, case["vocab"], generator=g, dtype=torch.float64) / 4
    masks = _allowed(case)

    def model(ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() \
                or not 1 <= ids.shape[1] <= _LONGEST:
            misuse.append(dict(misuse="ids", tensor=isinstance(ids, torch.Tensor),
                               shape=list(ids.shape) if isinstance(ids, torch.Tensor) else None,
                               floating=isinstance(ids, torch.Tensor) and ids.is_floating_point()))
            raise TypeError("model(ids): ids must be a (batch, n) integer tensor")
        n = ids.shape[1]
        x = emb[ids] + pos[:n]
        for w, allowed in zip(weights, masks):
            q, k, v = x @ w[0], x @ w[1], x @ w[2]
            a = torch.softmax((q @ k.transpose(-1, -2) / 16).masked_fill(~allowed[:n, :n], float("-inf")), -1)
            x = x + torch.tanh(a @ v)
        return x @ unembed
    return model


def _run_influence(fn: Callable, case: dict) -> dict:
    misuse: list[dict] = []
    with torch.random.fork_rng(devices=[]):
        try:
            reach = call(fn, _model(case, misuse), case["vocab"], case["n"])
        except Exception:  # a StudentError, or (while the student works) their own error
            if not misuse:
                raise
            return misuse[0]
    return misuse[0] if misuse else {"reach": reach}


def _toy(kind: str, vocab: int, n: int, seed: int, ahead: tuple[int, int] = (0, 0),
         extra: tuple[tuple[int, int, int, int], ...] = ()) -> dict:
    return dict(kind=kind, vocab=vocab, n=n, seed=seed, ahead=list(ahead), extra=[list(e) for e in extra],
                what="influence(model, vocab_size, n)")


def check_influence(fn: Callable, vocab: int = 13, n: int = 10, hidden: int = 0) -> None:
    """``fn(model, vocab_size, n) -> bool (n, n)``: entry [t, s] is True iff changing the token at
    position s changes the model's output at position t. Run on a causal model and on leaking ones;
    the hidden ones leak between random positions (early ones included), through one layer or a chain
    of two, from wrong entries of their masks. Chapter 7."""
    if hidden:
        g = hidden_generator("influence", hidden)

        def seed() -> int:
            return draw(g, 0, 2**31 - 1)
        vocab, n = draw(g, 8, 40), draw(g, 8, 16)
        late = draw(g, 2, n // 2)                                   # an early token …
        early = draw(g, 0, late - 2)                                # … into an earlier position, not the next
        middle = draw(g, 1, n - 3)
        chain_to, chain_from = draw(g, 0, middle - 1), draw(g, middle + 1, n - 1)
        cases = [_toy("causal", vocab, n, seed()),
                 _toy("one ahead in one layer", vocab, n, seed(), (1, 0) if draw(g, 0, 1) else (0, 1)),
                 _toy("early pair", vocab, n, seed(), extra=((draw(g, 0, 1), early, late, late),)),
                 _toy("chain", vocab, n, seed(), extra=((0, middle, chain_from, chain_from),
                                                         (1, chain_to, middle, middle))),
                 _toy("into one query", vocab, n, seed(), extra=((draw(g, 0, 1), middle, middle + 1, _LONGEST - 1),))]
        small = draw(g, 4, 6)   # a small vocabulary: repeated tokens
        cases.append(_toy("ahead", small, draw(g, 12, 20), seed(), (2, 2)))
        cases = [cases[i] for i in torch.randperm(len(cases), generator=g).tolist()]
    else:
        cases = [_toy("causal", vocab, n, 100), _toy("no mask", vocab, n, 101, (_LONGEST, _LONGEST)),
                 _toy("early pair", vocab, n, 102, extra=((0, 2, 6, 6),))]   # position 6 leaks into position 2
    run_check("influence", fn, cases, _run_influence, hidden)
