"""The judges of the checks for the chapter 7 exercises: the two masks of an encoder–decoder and the
map of which tokens reach which outputs of a language model (written by the student, run on toy
models). The cached decoding step is checked in ``ch07_cache.py``, activation patching in
``ch07_patching.py``.

The judges compute their references from the inputs and run in the grader; the judge of the map
computes it from the case's masks. The inputs and the calls of the student's functions are in the
kernel half, :mod:`transformer_lib.grading.checks.ch07_causal`. Chapter 7.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..checks.ch07_causal import _allowed, _LONGEST
from ..protocol import CheckFailed, typename
from .common import check_shape, fail, judge, pair


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
