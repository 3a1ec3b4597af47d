"""Checks for the chapter 7 exercise on the KV cache: one cached decoding step of a grouped-query
attention layer, run step by step from empty caches.

Above the judging line: what runs in the student's kernel (the inputs, visible and hidden, and the
calls of the student's step, handed a projection that is a closure counting the rows it projects).
Below it: the judge, which computes causal grouped-query attention over the whole sequence with
torch's kernel and checks the caches row by row. Chapter 7.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .._calls import call
from .._harness import StudentError, capture, draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_gqa_step"]

_ATTENTIONS = ("scaled_dot_product_attention",)


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
from .._judging import as_array, error_message, fail, judge  # noqa: E402


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
