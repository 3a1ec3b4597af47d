"""Checks for the chapter 7 exercises: the causal mask, a leakage test written by the student,
and one generation step with a key/value cache.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, the
calls of the student's functions, and the toy language models the leakage test is run on: plain
closures whose layers let chosen queries see chosen future keys, drawn at random for the hidden
tests). Below it: the judges, which compute their references from the inputs and run in the
grader; the judge of the leakage test knows from the case's data whether the model leaks.
Chapter 7.
"""
from __future__ import annotations

from typing import Callable

import torch

from .._harness import StudentError, call, capture, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_causal_mask", "check_causal_weights", "check_leakage_test", "check_cached_step"]

_ATTENTIONS = ("scaled_dot_product_attention",)


# ---------------------------------------------------------------- 7.1 the causal mask

def check_causal_mask(fn: Callable, sizes: list[int] | None = None, hidden: int = 0) -> None:
    """``fn(n)`` = boolean ``(n, n)`` mask, True where query i may attend to key j ≤ i. Chapter 7."""
    if hidden:
        g = hidden_generator("causal_mask", hidden)
        sizes = [1, 2, draw(g, 6, 16)]
    cases = [dict(n=n, what=f"causal_mask({n})") for n in ([5] if sizes is None else sizes)]
    run_check("causal_mask", fn, cases, lambda f, c: {"mask": call(f, c["n"])}, hidden)


def check_causal_weights(fn: Callable, scores: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(S (…, n, n))`` = causal attention weights ``softmax(S + M)``. Chapter 7."""
    if hidden:
        g = hidden_generator("causal_weights", hidden)
        n = draw(g, 6, 9)
        cases = [dict(S=randn(g, n, n, scale=3.0)),
                 dict(S=randn(g, draw(g, 1, 3), draw(g, 1, 3), *(draw(g, 2, 4),) * 2, scale=3.0)),
                 dict(S=randn(g, 1, 1, scale=3.0))]
    else:
        cases = [dict(S=seeded(70, 2, 5, 5, scale=2.0) if scores is None else scores)]
    for case in cases:
        case["what"] = "causal_weights(S)"
    run_check("causal_weights", fn, cases, lambda f, c: {"A": call(f, c["S"].clone(), banned=_ATTENTIONS)}, hidden)


# ---------------------------------------------------------------- 7.2 the leakage test

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
            a = torch.softmax((q @ k.transpose(-1, -2) / 4).masked_fill(~allowed[:n, :n], float("-inf")), -1)
            x = x + torch.tanh(a @ v)
        return x @ unembed
    return model


def _run_leaks(fn: Callable, case: dict) -> dict:
    misuse: list[dict] = []
    with torch.random.fork_rng(devices=[]):
        try:
            verdict = call(fn, _model(case, misuse), case["vocab"], case["n"])
        except Exception:  # a StudentError, or (while the student works) their own error
            if not misuse:
                raise
            return misuse[0]
    return misuse[0] if misuse else {"verdict": verdict}


def _leak(kind: str, vocab: int, n: int, seed: int, ahead: tuple[int, int] = (0, 0),
          extra: tuple[tuple[int, int, int, int], ...] = ()) -> dict:
    return dict(kind=kind, vocab=vocab, n=n, seed=seed, ahead=list(ahead), extra=[list(e) for e in extra],
                what="leaks(model, vocab_size, n)")


def check_leakage_test(fn: Callable, vocab: int = 13, n: int = 10, hidden: int = 0) -> None:
    """``fn(model, vocab_size, n) -> bool``: True iff the model lets later tokens change earlier
    outputs. Run on a correct causal model (must be False) and leaking ones (must be True); the
    hidden ones leak between random positions, in random layers. Chapter 7."""
    if hidden:
        g = hidden_generator("leakage_test", hidden)

        def seed() -> int:
            return draw(g, 0, 2**31 - 1)
        if hidden == 1:
            vocab, n = draw(g, 8, 40), draw(g, 6, 16)
            k, layer, one_layer = draw(g, 1, 3), draw(g, 0, 1), draw(g, 1, 3)
            query, layer_q = draw(g, 0, n - 3), draw(g, 0, 1)  # query sees every later key
            early, layer_p = draw(g, 0, n - 3), draw(g, 0, 1)  # one later key (not the next) into one query
            late, layer_s = draw(g, early + 2, n - 1), draw(g, 0, 1)
            cases = [_leak("correct", vocab, n, seed()),
                     _leak("ahead", vocab, n, seed(), (k, k)),
                     _leak("one layer", vocab, n, seed(), (one_layer, 0) if layer == 0 else (0, one_layer)),
                     _leak("into", vocab, n, seed(), extra=((layer_q, query, query + 1, _LONGEST - 1),)),
                     _leak("pair", vocab, n, seed(), extra=((layer_p, early, late, late),)),
                     _leak("second-last", vocab, n, seed(), extra=((layer_s, n - 2, n - 1, n - 1),))]
        else:  # a small vocabulary, longer inputs: repeated tokens
            vocab, n, layer = draw(g, 4, 6), draw(g, 12, 20), draw(g, 0, 1)
            cases = [_leak("correct", vocab, n, seed()), _leak("ahead", vocab, n, seed(), (1, 1)),
                     _leak("one layer", vocab, n, seed(), (1, 0) if layer == 0 else (0, 1))]
        cases = [cases[i] for i in torch.randperm(len(cases), generator=g).tolist()]
    else:
        cases = [_leak("correct", vocab, n, 100), _leak("no mask", vocab, n, 101, (_LONGEST, _LONGEST))]
    run_check("leakage_test", fn, cases, _run_leaks, hidden)


# ---------------------------------------------------------------- 7.3 one cached step

def _run_cached(fn: Callable, case: dict) -> dict:
    """Run the student's step from empty caches over the rows of x, feeding back the caches it
    returns; record every step's (z_t, K_cache, V_cache). A step that does not return two tensor
    caches ends the run (nothing to feed back); an error after the first step is recorded with it."""
    x, W_Q, W_K, W_V = case["x"], case["W_Q"], case["W_K"], case["W_V"]
    K, V = torch.zeros(0, W_K.shape[1], dtype=x.dtype), torch.zeros(0, W_V.shape[1], dtype=x.dtype)
    steps: list = []
    for t in range(x.shape[0]):
        try:
            result = call(fn, x[t].clone(), K.clone(), V.clone(), W_Q.clone(), W_K.clone(), W_V.clone(),
                          banned=_ATTENTIONS)
        except StudentError as err:
            if not steps:
                raise
            return {"steps": steps, "step_error": err.code, "step_detail": err.detail}
        steps.append(capture(result))  # now: the student may change its tensors in place later
        if not (isinstance(result, (tuple, list)) and len(result) == 3
                and all(isinstance(c, torch.Tensor) for c in result[1:])):
            break
        K, V = result[1].detach(), result[2].detach()
    return {"steps": steps}


def _cached_case(g: torch.Generator, n: int, d: int, d_k: int, d_v: int) -> dict:
    return dict(x=randn(g, n, d), W_Q=randn(g, d, d_k), W_K=randn(g, d, d_k), W_V=randn(g, d, d_v))


def check_cached_step(fn: Callable, x: torch.Tensor | None = None, d_k: int = 4, d_v: int = 3,
                      hidden: int = 0) -> None:
    """``fn(x_t (d,), K_cache (t, d_k), V_cache (t, d_v), W_Q, W_K, W_V) -> (z_t (d_v,), K (t+1, d_k),
    V (t+1, d_v))``, run step by step from empty caches, equals causal attention over the whole
    sequence. Chapter 7."""
    if hidden:
        g = hidden_generator("cached_step", hidden)
        cases = [_cached_case(g, draw(g, 7, 10), draw(g, 2, 8), draw(g, 2, 8), draw(g, 1, 6)),
                 _cached_case(g, draw(g, 1, 3), draw(g, 1, 4), 1, draw(g, 1, 3))]
    else:
        x = seeded(71, 6, 5) if x is None else x
        d = x.shape[-1]
        cases = [dict(x=x, W_Q=seeded(72, d, d_k), W_K=seeded(73, d, d_k), W_V=seeded(74, d, d_v))]
    for case in cases:
        case["what"] = "cached_step(x_t, K_cache, V_cache, W_Q, W_K, W_V)"
    run_check("cached_step", fn, cases, _run_cached, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import math  # noqa: E402

import numpy as np  # noqa: E402

from .._harness import CheckFailed, typename  # noqa: E402
from .._judging import as_array, check_shape, close, error_message, fail, judge  # noqa: E402


# ---------------------------------------------------------------- 7.1 the causal mask

@judge("causal_mask", compare=("mask",),
       ok=lambda cases, outs: "causal_mask is the lower triangle, diagonal included, True = may attend "
                              f"(n in {[c['n'] for c in cases]})")
def _causal_mask(case: dict, out: dict) -> None:
    n, what, value = case["n"], case["what"], out["mask"]
    if not isinstance(value, torch.Tensor):
        raise CheckFailed(f"{what}: expected a torch.Tensor, got {typename(value)}")
    if value.dtype != torch.bool:
        raise CheckFailed(f"{what}: expected a boolean tensor (True = may attend, PyTorch's "
                          f"convention), got dtype {value.dtype}; an additive 0/−∞ mask is the other "
                          "convention")
    got = value.numpy()
    check_shape(got, (n, n), what, "one row per query, one column per key")
    i, j = np.indices((n, n))
    expected = j <= i
    hints = {
        "this is the upper triangle: query i may see keys j ≤ i, the lower triangle "
        "(row i is the query)": j >= i,
        "the diagonal is excluded: every token may attend to itself (j ≤ i, not j < i)": j < i,
        "the convention is flipped: True must mean *may attend* (PyTorch's convention), so the "
        "future (j > i) is False": j > i,
    }
    if not np.array_equal(got, expected):
        for hint, variant in hints.items():
            if np.array_equal(got, variant):
                fail(f"{what}: {hint}", expected.astype(int), got.astype(int))
        fail(f"{what} is not the causal mask j ≤ i", expected.astype(int), got.astype(int))


@judge("causal_weights", compare=("A",), atol=1e-9, rtol=1e-9, bans=_ATTENTIONS,
       ok=lambda cases, outs: "causal weights: zeros above the diagonal, rows sum to 1, equal softmax(S + M) for S "
                              + ", ".join(str(tuple(c["S"].shape)) for c in cases))
def _causal_weights(case: dict, out: dict) -> None:
    s = case["S"]
    n = s.shape[-1]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    expected = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).numpy()
    got = as_array(out["A"], "A")
    check_shape(got, expected.shape, "causal_weights(S)", "the weights have the shape of the scores")
    after = (torch.softmax(s, dim=-1) * allowed).numpy()
    if close(got, after, 1e-9, 1e-9) and not close(got, expected, 1e-9, 1e-9):
        sums = got.sum(-1)
        fail("rows of A do not sum to 1: the mask was applied after the softmax. Set the scores of "
             "the future to −inf *before* the softmax (row sums shown)", np.ones_like(sums), sums)
    if not np.all(np.isfinite(got)):
        raise CheckFailed("A contains nan/inf: mask with −inf and take the softmax over the keys")
    if not np.all(got[..., ~allowed.numpy()] == 0):
        fail("weights of future keys (j > i) must be exactly 0: mask the scores with −inf where "
             "j > i (a large negative number leaves them small but not 0)", expected, got)
    if not close(got, expected, 1e-9, 1e-9):
        fail("A differs from softmax(S + M) with M = −∞ above the diagonal (atol 1e-9)", expected, got)


# ---------------------------------------------------------------- 7.2 the leakage test

def _leaking(case: dict) -> bool:
    """Whether the model of ``case`` lets a later token reach an earlier output (within n tokens)."""
    n = int(case["n"])
    return any(0 < int(a) for a in case["ahead"]) or any(
        int(query) < n - 1 and int(first) < n and int(last) > int(query) for _, query, first, last in case["extra"])


def _how(case: dict) -> str:
    """How the model of ``case`` leaks, in words, for the message."""
    ahead, extra, n = [int(a) for a in case["ahead"]], case["extra"], int(case["n"])
    if min(ahead) >= n:
        return "everywhere: it has no mask"
    if min(ahead) > 0:
        return f"{min(ahead)} position{'s' if min(ahead) > 1 else ''} ahead, in every layer"
    if max(ahead) > 0:
        layer = ahead.index(max(ahead)) + 1
        return f"{max(ahead)} position{'s' if max(ahead) > 1 else ''} ahead, only through layer {layer}"
    _, query, first, last = (int(v) for v in extra[0])
    if query == n - 2 and first == last == n - 1:
        return "only into the second-last position, from the last one"
    if first == last:
        return f"only from position {first} into position {query}"
    return f"every later token into position {query} only"


@judge("leakage_test",
       ok=lambda cases, outs: "the leakage test passes a causal model and catches leaking ones (leaking "
                              + "; ".join(_how(c) for c in cases if _leaking(c)) + ")")
def _leakage_test(case: dict, out: dict) -> None:
    if out.get("misuse") == "ids":
        shape = out.get("shape")
        kind = "a float tensor" if out.get("floating") is True else "a tensor"
        got = (f"{kind} of shape {tuple(int(s) for s in shape)}" if isinstance(shape, list) and out.get("tensor")
               else "something that is not a tensor")
        raise CheckFailed(f"the test must call model(ids) with ids a (batch, n) integer tensor (n from 1 to "
                          f"{_LONGEST}), got {got}")
    verdict = out.get("verdict")
    if isinstance(verdict, torch.Tensor) and verdict.numel() == 1 and verdict.dtype == torch.bool:
        verdict = bool(verdict)
    elif isinstance(verdict, np.ndarray) and verdict.size == 1 and verdict.dtype == bool:
        verdict = bool(verdict)
    if not isinstance(verdict, bool):
        raise CheckFailed(f"leaks(model, vocab_size, n) must return True or False, got {typename(verdict)}")
    if verdict and not _leaking(case):
        raise CheckFailed("your test reports a leak in a correct causal model: compare only the "
                          "outputs at positions ≤ t after changing the tokens after t (outputs after "
                          "t may change)")
    if not verdict and _leaking(case):
        raise CheckFailed(f"your test misses a leaking model: change the tokens after t and compare "
                          f"the outputs at positions ≤ t, for every t from 0 to n − 2 (this model "
                          f"leaks {_how(case)})")


# ---------------------------------------------------------------- 7.3 one cached step

@judge("cached_step", bans=_ATTENTIONS,
       ok=lambda cases, outs: " and ".join(str(c["x"].shape[0]) for c in cases) + " cached steps reproduce causal "
                              "attention over the whole sequence; the caches grow by one row per step")
def _cached_step(case: dict, out: dict) -> None:
    x, W_Q, W_K, W_V, what = case["x"], case["W_Q"], case["W_K"], case["W_V"], case["what"]
    n, d_k, d_v = x.shape[0], W_K.shape[1], W_V.shape[1]
    q, k, v = x @ W_Q, x @ W_K, x @ W_V
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    a = torch.softmax((q @ k.T / math.sqrt(d_k)).masked_fill(~allowed, float("-inf")), -1)
    expected = (a @ v).numpy()
    steps = out["steps"] if isinstance(out.get("steps"), list) else []
    rows = []
    for t, step in enumerate(steps):
        if not isinstance(step, list) or len(step) != 3:
            raise CheckFailed(f"cached_step must return (z_t, K_cache, V_cache), got {typename(step)}")
        z, K_c, V_c = step
        if not isinstance(K_c, torch.Tensor) or not isinstance(V_c, torch.Tensor):
            raise CheckFailed("cached_step must return the caches as tensors")
        if tuple(K_c.shape) != (t + 1, d_k) or tuple(V_c.shape) != (t + 1, d_v):
            raise CheckFailed(f"after step {t} the caches must hold {t + 1} rows (one key and one value "
                              f"per token so far): got K {tuple(K_c.shape)}, V {tuple(V_c.shape)}; did "
                              "you append the new key and value (torch.cat along dim 0)?")
        rows.append(as_array(z, "z_t").reshape(-1))
    if "step_error" in out:
        raise CheckFailed(error_message({"error": out["step_error"], "detail": out.get("step_detail")}, what))
    got = np.stack(rows) if rows and len({r.shape for r in rows}) == 1 else None
    if got is None or got.shape != expected.shape:
        raise CheckFailed(f"z_t must have shape ({d_v},) at every step")
    if not close(got, expected, 1e-9, 1e-9):
        past_only = np.stack([np.zeros(d_v)] + [torch.softmax(q[t] @ k[:t].T / math.sqrt(d_k), -1).numpy()
                                                 @ v[:t].numpy() for t in range(1, n)])
        if n > 1 and close(got[1:], past_only[1:], 1e-9, 1e-9):
            fail("the new token must attend to itself too: append its key and value to the cache "
                 "*before* computing the scores", expected, got)
        unscaled = torch.softmax((q @ k.T).masked_fill(~allowed, float("-inf")), -1) @ v
        if close(got, unscaled.numpy(), 1e-9, 1e-9):
            fail(f"did you forget to divide the scores by √d_k = √{d_k}?", expected, got)
        fail("the outputs of the cached steps differ from causal attention over the whole sequence "
             "(atol 1e-9)", expected, got)
    K_c, V_c = (as_array(c, name) for c, name in zip(steps[-1][1:], ("K_cache", "V_cache")))
    if not close(K_c, k.numpy(), 1e-9, 1e-9) or not close(V_c, v.numpy(), 1e-9, 1e-9):
        fail("the caches must hold the keys x_t W_K and the values x_t W_V of the tokens so far, one row "
             "per token in order (the last caches shown: keys, then values)", np.concatenate([k, v], -1),
             np.concatenate([K_c, V_c], -1))
