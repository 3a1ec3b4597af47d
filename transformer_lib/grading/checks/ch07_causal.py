"""Checks for the chapter 7 exercises: the two masks of an encoder–decoder and the map of which
tokens reach which outputs of a language model (written by the student, run on toy models). The
cached decoding step is checked in ``ch07_cache.py``, activation patching in ``ch07_patching.py``.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, the
calls of the student's functions, the toy language models the map is run on: plain closures whose
layers let chosen queries see chosen keys, drawn at random for the hidden tests). Below it:
the judges, which compute their references from the inputs and run in the grader; the judge of
the map computes it from the case's masks. Chapter 7.
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


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import numpy as np  # noqa: E402

from .._harness import CheckFailed, typename  # noqa: E402
from .._judging import check_shape, fail, judge, pair  # noqa: E402


# ---------------------------------------------------------------- 7.1 the masks of an encoder–decoder

def _bool_masks(value: Any, name: str, shape: tuple[int, ...], hint: str) -> np.ndarray:
    if not isinstance(value, torch.Tensor):
        raise CheckFailed(f"{name}: expected a torch.Tensor, got {typename(value)}")
    if value.dtype != torch.bool:
        raise CheckFailed(f"{name}: expected a boolean tensor (True = may attend, PyTorch's convention), got dtype "
                          f"{value.dtype}; an additive 0/−∞ mask is the other convention")
    check_shape(value.numpy(), shape, name, hint)
    return value.numpy()


def _compare_masks(name: str, got: np.ndarray, expected: np.ndarray, hints: dict[str, np.ndarray]) -> None:
    if np.array_equal(got, expected):
        return
    for hint, variant in hints.items():
        if np.array_equal(got, variant):
            fail(f"{name}: {hint}", expected.astype(int), got.astype(int))
    fail(f"{name} is not the mask described", expected.astype(int), got.astype(int))


@judge("seq2seq_masks", compare=("masks",),
       ok=lambda cases, outs: "encoder–decoder masks: causal self-attention over the decoder's real tokens, "
                              "cross-attention over the source's real tokens, for " + ", ".join(
           f"{len(c['src_lengths'])} pair{'s' * (len(c['src_lengths']) > 1)} (m = {c['m']}, n = {c['n']})"
           for c in cases))
def _seq2seq_masks(case: dict, out: dict) -> None:
    src, tgt, m, n = case["src_lengths"].numpy(), case["tgt_lengths"].numpy(), case["m"], case["n"]
    b = len(src)
    self_mask, cross_mask = pair(out["masks"], "seq2seq_masks", ("self_mask", "cross_mask"))
    got_self = _bool_masks(self_mask, "self_mask", (b, n, n),
                           "one (n, n) mask per pair: decoder queries × decoder keys")
    got_cross = _bool_masks(cross_mask, "cross_mask", (b, n, m), "it is (b, m, n), transposed: one row per decoder "
                            "query, one column per source key" if getattr(cross_mask, "shape", None) == (b, m, n)
                            else "one (n, m) mask per pair: decoder queries × source keys")
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    causal = np.broadcast_to(j <= i, (b, n, n))
    tgt_keys = np.arange(n)[None, None, :] < tgt[:, None, None]
    tgt_queries = np.arange(n)[None, :, None] < tgt[:, None, None]
    _compare_masks("self_mask", got_self, causal & tgt_keys, {
        "the decoder's padding must be masked as keys: no query may attend to a position ≥ tgt_lengths[b]": causal,
        "the decoder's self-attention is causal: query i sees the keys j ≤ i only": tgt_keys.repeat(n, 1),
        "mask the padded keys (the columns j ≥ tgt_lengths[b]), not the padded queries (the rows)":
            causal & tgt_queries,
        "True means *may attend*: this is the complement of the mask": ~(causal & tgt_keys),
    })
    src_keys = np.broadcast_to(np.arange(m)[None, None, :] < src[:, None, None], (b, n, m))
    k_src = np.arange(m)[None, None, :]
    _compare_masks("cross_mask", got_cross, src_keys, {
        "cross-attention is not causal: every decoder token may read the whole source (the encoder has seen it "
        "all)": src_keys & (k_src <= np.arange(n)[None, :, None]),
        "the source's padding must be masked: no query may attend to a source position ≥ src_lengths[b]":
            np.ones((b, n, m), dtype=bool),
        "the keys of cross-attention are the source's tokens: mask them with src_lengths, not tgt_lengths":
            np.broadcast_to(k_src < tgt[:, None, None], (b, n, m)),
        "mask the padded source keys (the columns), not decoder queries (the rows)":
            np.broadcast_to(np.arange(n)[None, :, None] < src[:, None, None], (b, n, m)),
        "True means *may attend*: this is the complement of the mask": ~src_keys,
    })


# ---------------------------------------------------------------- 7.2 which tokens reach which outputs

def _reach(case: dict) -> np.ndarray:
    """(n, n): [t, s] True iff token s reaches output t through the case's layers (each lets query i
    read the keys its mask allows; the residual stream keeps what a position had)."""
    n = int(case["n"])
    reach = torch.eye(n, dtype=torch.bool)
    for allowed in _allowed(case):
        reach = (allowed[:n, :n].double() @ reach.double()) > 0
    return reach.numpy()


def _how(case: dict) -> str:
    """How the model of ``case`` lets later tokens through, in words, for the messages."""
    ahead, extra, n = [int(a) for a in case["ahead"]], case["extra"], int(case["n"])
    if min(ahead) >= n:
        return "has no mask"
    if max(ahead) > 0:
        where = "in every layer" if min(ahead) > 0 else f"only in layer {ahead.index(max(ahead)) + 1}"
        return f"lets each query see {max(ahead)} position{'s' * (max(ahead) > 1)} ahead, {where}"
    if not extra:
        return "is causal"
    if len(extra) > 1:
        return "passes a later token on through two layers, one position at a time"
    _, query, first, last = (int(v) for v in extra[0])
    return f"lets position {query} see {'position ' + str(first) if first == last else 'every later token'}"


def _entries(cells: np.ndarray, got: np.ndarray) -> str:
    return ", ".join(f"[{t}, {s}] = {bool(got[t, s])}" for t, s in cells[:8])


@judge("influence",
       ok=lambda cases, outs: "the map of which tokens reach which outputs is exact for a causal model and for "
                              "models that leak (" + "; ".join(f"one {_how(c)}" for c in cases if c["kind"] != "causal")
                              + ")")
def _influence(case: dict, out: dict) -> None:
    what, n = case["what"], int(case["n"])
    if out.get("misuse") == "ids":
        shape = out.get("shape")
        kind = "a float tensor" if out.get("floating") is True else "a tensor"
        got = (f"{kind} of shape {tuple(int(s) for s in shape)}" if isinstance(shape, list) and out.get("tensor")
               else "something that is not a tensor")
        raise CheckFailed(f"the function must call model(ids) with ids a (batch, n) integer tensor (n from 1 to "
                          f"{_LONGEST}), got {got}")
    value = out.get("reach")
    if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or tuple(value.shape) != (n, n):
        raise CheckFailed(f"{what} must return a boolean (n, n) tensor, [t, s] for output t and token s, got "
                          + (f"a tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
                             if isinstance(value, torch.Tensor) else typename(value)))
    got, expected = value.numpy(), _reach(case)
    if np.array_equal(got, expected):
        return
    if not got.any():
        raise CheckFailed(f"{what}: in your map no token reaches any output, not even its own: the map holds every "
                          "influence, the causal ones too (s ≤ t, the diagonal included); change each token to a "
                          "different one and compare the outputs exactly")
    later = np.triu(np.ones((n, n), dtype=bool), 1)
    from_on = np.flip(np.maximum.accumulate(np.flip(expected, 1), axis=1), 1)   # changing tokens s … n − 1 at once
    hints = {
        "row t is the output at position t, column s the token you changed: the map is transposed": expected.T,
        "the map holds every influence, the causal ones too (s ≤ t), not only the leaks": expected & later,
        "change one token at a time: changing the tokens from s to the end at once credits s with what the "
        "later ones do": from_on,
        "changing token t changes the output at t itself: the diagonal is True": expected & ~np.eye(n, dtype=bool),
    }
    for hint, variant in hints.items():
        if np.array_equal(got, variant):
            raise CheckFailed(f"{what}: {hint} (this model {_how(case)})")
    wrong = np.argwhere(got != expected)
    missed = [tuple(w) for w in wrong if expected[tuple(w)]]
    if missed and all(s > t for t, s in missed):
        raise CheckFailed(f"{what} misses a leak of a model that {_how(case)}: change each token s on its own, to a "
                          "token it is not, and compare every output t < s; your wrong entries: "
                          + _entries(wrong, got))
    raise CheckFailed(f"{what}: [t, s] must be True exactly when changing token s changes output t (compare the "
                      f"outputs exactly, or within 1e-9); this model {_how(case)}; your wrong entries: "
                      + _entries(wrong, got))
