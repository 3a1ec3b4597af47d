"""Checks for the chapter 7 exercises: the two masks of an encoder–decoder, the map of which
tokens reach which outputs of a language model (written by the student, run on toy models), and
one cached decoding step of a grouped-query attention layer.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, the
calls of the student's functions, the toy language models the map is run on: plain closures whose
layers let chosen queries see chosen keys, drawn at random for the hidden tests, and the
projection handed to the decoding step, a closure that counts the rows it projects). Below it:
the judges, which compute their references from the inputs and run in the grader; the judge of
the map computes it from the case's masks. Chapter 7.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .._harness import StudentError, call, capture, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_seq2seq_masks", "check_influence", "check_gqa_step"]

_ATTENTIONS = ("scaled_dot_product_attention",)


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
        cases = [_toy("causal", vocab, n, 100), _toy("no mask", vocab, n, 101, (_LONGEST, _LONGEST))]
    run_check("influence", fn, cases, _run_influence, hidden)


# ---------------------------------------------------------------- 7.3 one cached step of a GQA layer

def _run_gqa(fn: Callable, case: dict) -> dict:
    """Run the student's step from empty caches over the rows of x, feeding back the caches it
    returns; record every step's (z_t, K_cache, V_cache) and the rows the projection computed in it.
    A step that does not return two tensor caches ends the run; an error after the first step is
    recorded with it, and so is a call of the projection on anything but a (m, d) or (d,) tensor."""
    x, W_Q, W_K, W_V = case["x"], case["W_Q"].clone(), case["W_K"].clone(), case["W_V"].clone()
    n_kv, d = case["n_kv_heads"], x.shape[1]
    d_k = W_K.shape[1] // n_kv
    rows: list[int] = []
    misuse: list[Any] = []

    def project(rows_in: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not isinstance(rows_in, torch.Tensor) or rows_in.dim() not in (1, 2) or rows_in.shape[-1] != d \
                or not rows_in.is_floating_point():
            misuse.append(list(rows_in.shape) if isinstance(rows_in, torch.Tensor) else None)
            raise TypeError("project(x): x must be a float (m, d) or (d,) tensor")
        rows[-1] += 1 if rows_in.dim() == 1 else int(rows_in.shape[0])
        return rows_in @ W_Q, rows_in @ W_K, rows_in @ W_V

    K, V = torch.zeros(n_kv, 0, d_k, dtype=x.dtype), torch.zeros(n_kv, 0, d_k, dtype=x.dtype)
    steps: list = []
    for t in range(x.shape[0]):
        rows.append(0)
        try:
            result = call(fn, x[t].clone(), K.clone(), V.clone(), project, case["n_heads"], n_kv, banned=_ATTENTIONS)
        except Exception as err:  # a StudentError, or (while the student works) their own error
            if misuse:
                return {"steps": steps, "rows": rows, "misuse": misuse[:1]}
            if not steps or not isinstance(err, StudentError):
                raise
            return {"steps": steps, "rows": rows[:len(steps)], "step_error": err.code, "step_detail": err.detail}
        steps.append(capture(result))  # now: the student may change its tensors in place later
        if not (isinstance(result, (tuple, list)) and len(result) == 3
                and all(isinstance(c, torch.Tensor) for c in result[1:])):
            break
        K, V = result[1].detach(), result[2].detach()
    return {"steps": steps, "rows": rows[:len(steps)]}


def _gqa_case(g: torch.Generator, n: int, d: int, n_heads: int, n_kv: int, d_k: int) -> dict:
    return dict(x=randn(g, n, d), W_Q=randn(g, d, n_heads * d_k), W_K=randn(g, d, n_kv * d_k),
                W_V=randn(g, d, n_kv * d_k), n_heads=n_heads, n_kv_heads=n_kv)


def check_gqa_step(fn: Callable, x: torch.Tensor | None = None, n_heads: int = 4, n_kv_heads: int = 2, d_k: int = 3,
                   hidden: int = 0) -> None:
    """``fn(x_t (d,), K_cache (n_kv, t, d_k), V_cache (n_kv, t, d_k), project, n_heads, n_kv_heads) ->
    (z_t (n_heads·d_k,), K_cache (n_kv, t+1, d_k), V_cache (n_kv, t+1, d_k))``, run step by step from
    empty caches, equals causal grouped-query attention over the whole sequence, with one row
    projected per step. Chapter 7."""
    if hidden:
        g = hidden_generator("gqa_step", hidden)
        H = 2 * draw(g, 2, 4)
        cases = [_gqa_case(g, draw(g, 6, 10), draw(g, 3, 8), H, H // 2, draw(g, 2, 5)),   # groups of two
                 _gqa_case(g, draw(g, 4, 8), draw(g, 3, 8), draw(g, 2, 4), 1, draw(g, 2, 4)),  # one key/value head
                 _gqa_case(g, draw(g, 1, 3), draw(g, 2, 5), 3, 3, draw(g, 1, 3))]          # plain multi-head
    else:
        x = seeded(71, 6, 5) if x is None else x
        d = x.shape[-1]
        cases = [dict(x=x, W_Q=seeded(72, d, n_heads * d_k), W_K=seeded(73, d, n_kv_heads * d_k),
                      W_V=seeded(74, d, n_kv_heads * d_k), n_heads=n_heads, n_kv_heads=n_kv_heads)]
    for case in cases:
        case["what"] = "gqa_step(x_t, K_cache, V_cache, project, n_heads, n_kv_heads)"
    run_check("gqa_step", fn, cases, _run_gqa, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .._harness import CheckFailed, typename  # noqa: E402
from .._judging import as_array, check_shape, error_message, fail, judge, pair  # noqa: E402


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


# ---------------------------------------------------------------- 7.3 one cached step of a GQA layer

def _gqa_reference(case: dict, grouping: str = "consecutive", scale: float | None = None,
                   past_only: bool = False) -> np.ndarray:
    """(n, H·d_k): causal grouped-query attention over the whole sequence (torch's, with enable_gqa),
    or with the heads grouped the other way (h % n_kv), another scale, or without the diagonal."""
    x, H, kv = case["x"], case["n_heads"], case["n_kv_heads"]
    n = x.shape[0]
    q = (x @ case["W_Q"]).reshape(n, H, -1).transpose(0, 1)
    k, v = ((x @ case[w]).reshape(n, kv, -1).transpose(0, 1) for w in ("W_K", "W_V"))
    if grouping == "interleaved":
        k, v = k[torch.arange(H) % kv], v[torch.arange(H) % kv]
    mask = torch.ones(n, n, dtype=torch.bool).tril(-1 if past_only else 0)
    z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, scale=scale)
    return z.transpose(0, 1).reshape(n, -1).nan_to_num().numpy()   # past only: nothing at the first step


def _rows_ok(cases: list[dict], outs: list[dict]) -> str:
    return (" and ".join(f"{c['x'].shape[0]} steps of {c['n_heads']} query heads over {c['n_kv_heads']} key/value "
                         f"head{'s' * (c['n_kv_heads'] > 1)}" for c in cases)
            + " reproduce causal grouped-query attention (torch's, enable_gqa); the caches hold X·W_K and X·W_V of the "
              "tokens so far, one row projected per step")


@judge("gqa_step", bans=_ATTENTIONS, ok=_rows_ok)
def _gqa_step(case: dict, out: dict) -> None:
    x, H, kv, what = case["x"], case["n_heads"], case["n_kv_heads"], case["what"]
    n, d_k = x.shape[0], case["W_K"].shape[1] // kv
    if out.get("misuse"):
        got = out["misuse"][0]
        raise CheckFailed(f"call project on the new token, a (d,) or (1, d) tensor with d = {x.shape[1]}, got "
                          + (f"a tensor of shape {tuple(got)}" if isinstance(got, list) else "something else"))
    K_all, V_all = ((x @ case[w]).reshape(n, kv, d_k).transpose(0, 1).numpy() for w in ("W_K", "W_V"))
    steps = out["steps"] if isinstance(out.get("steps"), list) else []
    rows = out.get("rows") if isinstance(out.get("rows"), list) else []
    zs = []
    for t, step in enumerate(steps):
        if not isinstance(step, list) or len(step) != 3:
            raise CheckFailed(f"gqa_step must return (z_t, K_cache, V_cache), got {typename(step)}")
        z, K_c, V_c = step
        if not isinstance(K_c, torch.Tensor) or not isinstance(V_c, torch.Tensor):
            raise CheckFailed("gqa_step must return the caches as tensors")
        for name, c in (("K_cache", K_c), ("V_cache", V_c)):
            if tuple(c.shape) == (t + 1, kv, d_k) and kv != t + 1:
                raise CheckFailed(f"{name} has the token axis first: keep one cache per key/value head, "
                                  f"(n_kv_heads, t, d_k) = {(kv, t + 1, d_k)}, and append along dim 1")
            if tuple(c.shape) != (kv, t + 1, d_k):
                raise CheckFailed(f"after step {t} {name} must hold {t + 1} rows per key/value head: expected shape "
                                  f"{(kv, t + 1, d_k)}, got {tuple(c.shape)}; did you append the new key and value "
                                  "(torch.cat along dim 1)?")
        K_got, V_got = as_array(K_c, "K_cache"), as_array(V_c, "V_cache")
        if not (np.allclose(K_got, K_all[:, :t + 1], atol=1e-9, rtol=1e-9)
                and np.allclose(V_got, V_all[:, :t + 1], atol=1e-9, rtol=1e-9)):
            fail(f"after step {t} the caches must hold the keys x_s W_K and the values x_s W_V of the tokens s ≤ {t}, "
                 "head by head, in order (keys, then values, shown)", np.concatenate([K_all[:, :t + 1],
                                                                                     V_all[:, :t + 1]], -1),
                 np.concatenate([K_got, V_got], -1))
        projected = rows[t] if t < len(rows) and isinstance(rows[t], int) else -1
        if projected != 1:
            raise CheckFailed(f"step {t} projected {projected} rows: " + (
                "it recomputes the keys and values of every token so far, which the cache is there to avoid: "
                "project the new token only (one row per step) and reuse the cached rows" if projected == t + 1 > 1
                else "project the new token, one row per step, once (project returns its query, key and value)"))
        zs.append(as_array(z, "z_t").reshape(-1))
    if "step_error" in out:
        raise CheckFailed(error_message({"error": out["step_error"], "detail": out.get("step_detail")}, what))
    if len(steps) < n:
        raise CheckFailed(f"{what} must return (z_t, K_cache, V_cache), the caches as tensors")
    expected = _gqa_reference(case)
    got = np.stack(zs) if len({r.shape for r in zs}) == 1 else None
    if got is None or got.shape != expected.shape:
        raise CheckFailed(f"z_t must have shape ({H * d_k},) at every step: the {H} heads' outputs side by side")
    tol = dict(atol=1e-9, rtol=1e-9)
    if np.allclose(got, expected, **tol):
        return
    if kv not in (1, H) and np.allclose(got, _gqa_reference(case, "interleaved"), **tol):
        fail(f"consecutive query heads share a key/value head: head h reads key/value head h // {H // kv} "
             "(repeat_interleave), not h % n_kv_heads", expected, got)
    if n > 1 and np.allclose(got[1:], _gqa_reference(case, past_only=True)[1:], **tol):
        fail("the new token must attend to itself too: append its key and value to the caches *before* computing "
             "the scores", expected, got)
    if np.allclose(got, _gqa_reference(case, scale=1.0), **tol):
        fail(f"did you forget to divide the scores by √d_k = √{d_k}?", expected, got)
    fail("the outputs of the cached steps differ from causal grouped-query attention over the whole sequence "
         "(atol 1e-9)", expected, got)
