"""The judges of the checks for the chapter 7 exercise on the KV cache: one cached decoding step of a
grouped-query attention layer, run step by step from empty caches.

The judge computes causal grouped-query attention over the whole sequence with torch's kernel and
checks the caches row by row. The inputs and the calls of the student's functions are in the kernel
half, :mod:`transformer_lib.grading.checks.ch07_cache`. Chapter 7.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..checks.ch07_cache import _ATTENTIONS
from ..protocol import CheckFailed, typename
from .common import as_array, error_message, fail, judge


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
