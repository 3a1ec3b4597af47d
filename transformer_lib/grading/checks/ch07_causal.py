"""Checks for the chapter 7 exercises: the causal mask, a leakage test written by the student,
and one generation step with a key/value cache.

Each check computes its reference inside the function; the toy models the leakage test is run
on are built here from ``torch.nn`` alone. Chapter 7.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from .._checktools import (_ATTENTIONS, CheckFailed, as_array, call, check_shape, close, fail, ok,
                           record, seeded, typename)

__all__ = ["check_causal_mask", "check_causal_weights", "check_leakage_test", "check_cached_step"]


def _as_bool_mask(value: Any, n: int) -> np.ndarray:
    if not isinstance(value, torch.Tensor):
        raise CheckFailed(f"causal_mask({n}): expected a torch.Tensor, got {typename(value)}")
    if value.dtype != torch.bool:
        raise CheckFailed(f"causal_mask({n}): expected a boolean tensor (True = may attend, PyTorch's "
                          f"convention), got dtype {value.dtype}; an additive 0/−∞ mask is the other "
                          "convention")
    return value.detach().cpu().numpy()


def check_causal_mask(fn: Callable, sizes: list[int] | None = None) -> None:
    """``fn(n)`` = boolean ``(n, n)`` mask, True where query i may attend to key j ≤ i. Chapter 7."""
    sizes = [5] if sizes is None else sizes
    for n in sizes:
        got = _as_bool_mask(call(fn, n, what=f"causal_mask({n})"), n)
        record(f"causal_mask_{n}", {"mask": got.astype(np.float64)})
        check_shape(got, (n, n), f"causal_mask({n})", "one row per query, one column per key")
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
                    fail(f"causal_mask({n}): {hint}", expected.astype(int), got.astype(int))
            fail(f"causal_mask({n}) is not the causal mask j ≤ i", expected.astype(int), got.astype(int))
    ok(f"causal_mask is the lower triangle, diagonal included, True = may attend (n in {sizes})")


def check_causal_weights(fn: Callable, scores: torch.Tensor | None = None) -> None:
    """``fn(S (…, n, n))`` = causal attention weights ``softmax(S + M)``. Chapter 7."""
    s = seeded(70, 2, 5, 5, scale=2.0) if scores is None else scores
    n = s.shape[-1]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    expected = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).numpy()
    got = as_array(call(fn, s.clone(), what="causal_weights(S)", banned=_ATTENTIONS), "A")
    record("causal_weights", {"A": got}, atol=1e-9, rtol=1e-9)
    check_shape(got, expected.shape, "causal_weights(S)", "the weights have the shape of the scores")
    after = (torch.softmax(s, dim=-1) * allowed).numpy()
    if close(got, after, 1e-9, 1e-9):
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
    ok(f"causal weights: zeros above the diagonal, rows sum to 1, equal softmax(S + M) for S "
       f"{tuple(s.shape)}")


# ------------------------------------------------------------------ the leakage test

class _ToyLM(nn.Module):
    """Ids ``(b, n)`` -> logits ``(b, n, V)``: embeddings, attention layers, an unembedding.

    ``ahead[l]`` is how many future positions layer l may see (0 = causal); ``leak_into`` limits
    the leak to those query positions (None = every position)."""

    def __init__(self, vocab: int, ahead: list[int], leak_into: list[int] | None, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        d = 16
        self.emb = nn.Parameter(torch.randn(vocab, d, generator=g, dtype=torch.float64))
        self.pos = nn.Parameter(0.5 * torch.randn(64, d, generator=g, dtype=torch.float64))
        self.w = nn.ParameterList(nn.Parameter(torch.randn(3, d, d, generator=g, dtype=torch.float64) / 4)
                                  for _ in ahead)
        self.out = nn.Parameter(torch.randn(d, vocab, generator=g, dtype=torch.float64) / 4)
        self.ahead, self.leak_into = ahead, leak_into

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
            raise CheckFailed("the test must call model(ids) with ids a (batch, n) integer tensor, got "
                              f"{typename(ids)}" + (f" of shape {tuple(ids.shape)}"
                                                   if isinstance(ids, torch.Tensor) else ""))
        n = ids.shape[1]
        x = self.emb[ids] + self.pos[:n]
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        for w, ahead in zip(self.w, self.ahead):
            allowed = j <= i + ahead
            if self.leak_into is not None:
                rows = torch.zeros(n, 1, dtype=torch.bool)
                rows[[p for p in self.leak_into if p < n]] = True
                allowed = torch.where(rows, allowed, j <= i)
            q, k, v = x @ w[0], x @ w[1], x @ w[2]
            a = torch.softmax((q @ k.transpose(-1, -2) / 4).masked_fill(~allowed, float("-inf")), -1)
            x = x + torch.tanh(a @ v)
        return x @ self.out


_MODELS = {
    "correct": ([0, 0], None),
    "no mask": ([64, 64], None),
    "one position ahead": ([1, 1], None),
    "only through layer 2": ([0, 1], None),
    "only into position 0": ([0, 64], [0]),
    "only into the second-last position": ([1, 0], [-2]),
}


def check_leakage_test(fn: Callable, cases: list[str] | None = None, vocab: int = 13, n: int = 10) -> None:
    """``fn(model, vocab_size, n) -> bool``: True iff the model lets later tokens change earlier
    outputs. Run on a correct causal model (must be False) and leaking ones (must be True). Chapter 7."""
    cases = ["correct", "no mask"] if cases is None else cases
    for seed, name in enumerate(cases):
        ahead, into = _MODELS[name]
        into = None if into is None else [p % n for p in into]
        model = _ToyLM(vocab, ahead, into, seed=100 + seed).eval()
        with torch.random.fork_rng(devices=[]):
            verdict = call(fn, model, vocab, n, what="leaks(model, vocab_size, n)")
        if not isinstance(verdict, (bool, np.bool_)) and not (isinstance(verdict, torch.Tensor)
                                                              and verdict.dtype == torch.bool
                                                              and verdict.numel() == 1):
            raise CheckFailed(f"leaks(model, vocab_size, n) must return True or False, got {typename(verdict)}")
        verdict = bool(verdict)
        if name == "correct" and verdict:
            raise CheckFailed("your test reports a leak in a correct causal model: compare only the "
                              "outputs at positions ≤ t after changing the tokens after t (outputs after "
                              "t may change)")
        if name != "correct" and not verdict:
            raise CheckFailed(f"your test misses a leaking model: change the tokens after t and compare "
                              f"the outputs at positions ≤ t, for every t from 0 to n − 2 (this model "
                              f"leaks {name})")
    ok(f"the leakage test passes a causal model and catches leaking ones ({', '.join(cases)})")


# ------------------------------------------------------------------ one cached step

def check_cached_step(fn: Callable, x: torch.Tensor | None = None, d_k: int = 4, d_v: int = 3) -> None:
    """``fn(x_t (d,), K_cache (t, d_k), V_cache (t, d_v), W_Q, W_K, W_V) -> (z_t (d_v,), K (t+1, d_k),
    V (t+1, d_v))``, run step by step from empty caches, equals causal attention over the whole
    sequence. Chapter 7."""
    x = seeded(71, 6, 5) if x is None else x
    n, d = x.shape
    W_Q, W_K, W_V = seeded(72, d, d_k), seeded(73, d, d_k), seeded(74, d, d_v)
    q, k, v = x @ W_Q, x @ W_K, x @ W_V
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    a = torch.softmax((q @ k.T / math.sqrt(d_k)).masked_fill(~allowed, float("-inf")), -1)
    expected = (a @ v).numpy()
    K_c, V_c = torch.zeros(0, d_k, dtype=x.dtype), torch.zeros(0, d_v, dtype=x.dtype)
    rows = []
    for t in range(n):
        result = call(fn, x[t].clone(), K_c.clone(), V_c.clone(), W_Q, W_K, W_V,
                      what="cached_step(x_t, K_cache, V_cache, W_Q, W_K, W_V)", banned=_ATTENTIONS)
        if not isinstance(result, (tuple, list)) or len(result) != 3:
            raise CheckFailed(f"cached_step must return (z_t, K_cache, V_cache), got {typename(result)}")
        z, K_c, V_c = result
        if not isinstance(K_c, torch.Tensor) or not isinstance(V_c, torch.Tensor):
            raise CheckFailed("cached_step must return the caches as tensors")
        if tuple(K_c.shape) != (t + 1, d_k) or tuple(V_c.shape) != (t + 1, d_v):
            raise CheckFailed(f"after step {t} the caches must hold {t + 1} rows (one key and one value "
                              f"per token so far): got K {tuple(K_c.shape)}, V {tuple(V_c.shape)}; did "
                              "you append the new key and value (torch.cat along dim 0)?")
        rows.append(as_array(z, "z_t").reshape(-1))
    got = np.stack(rows) if len({r.shape for r in rows}) == 1 else None
    if got is None or got.shape != expected.shape:
        raise CheckFailed(f"z_t must have shape ({d_v},) at every step")
    record("cached_step", {"Z": got}, atol=1e-9, rtol=1e-9)
    past_only = np.stack([np.zeros(d_v)] + [torch.softmax(q[t] @ k[:t].T / math.sqrt(d_k), -1).numpy()
                                             @ v[:t].numpy() for t in range(1, n)])
    if close(got[1:], past_only[1:], 1e-9, 1e-9):
        fail("the new token must attend to itself too: append its key and value to the cache "
             "*before* computing the scores", expected, got)
    unscaled = torch.softmax((q @ k.T).masked_fill(~allowed, float("-inf")), -1) @ v
    if close(got, unscaled.numpy(), 1e-9, 1e-9):
        fail(f"did you forget to divide the scores by √d_k = √{d_k}?", expected, got)
    if not close(got, expected, 1e-9, 1e-9):
        fail("the outputs of the cached steps differ from causal attention over the whole sequence "
             "(atol 1e-9)", expected, got)
    ok(f"{n} cached steps reproduce causal attention over the whole sequence; the caches grow by one "
       "row per step")
