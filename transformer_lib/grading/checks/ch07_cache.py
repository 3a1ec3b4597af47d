"""The checks' kernel half for the chapter 7 exercise on the KV cache: one cached decoding step of a
grouped-query attention layer, run step by step from empty caches.

What runs in the student's kernel (the inputs, visible and hidden, and the calls of the student's
step, handed a projection that is a closure counting the rows it projects). The judges are in
:mod:`transformer_lib.grading.judges.ch07_cache`. Chapter 7.
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
