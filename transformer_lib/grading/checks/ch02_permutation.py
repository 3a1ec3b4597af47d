"""The checks' kernel half for the chapter 2 exercise on a mask that moves with the tokens (2.5): the
mask under which attention on reordered tokens gives the reordered outputs.

What runs in the student's kernel (the masks and permutations, visible and hidden, and the call of
the student's function). The judges are in :mod:`transformer_lib.grading.judges.ch02_permutation`.
Chapter 2.
"""
from __future__ import annotations

from typing import Callable

import torch

from .._calls import call
from .._harness import draw, hidden_generator, run_check

__all__ = ["check_permuted_mask"]


# ---------------------------------------------------------------- 2.5 a mask that moves with the tokens

def _mask_case(g: torch.Generator, n: int, kind: str) -> dict:
    rows, cols = torch.arange(n)[:, None], torch.arange(n)[None, :]
    if kind == "causal":
        mask = cols <= rows
    elif kind == "window":
        mask = (cols <= rows) & (cols > rows - draw(g, 1, max(1, n - 1)))
    else:  # any mask in which every query keeps a key
        mask = torch.rand(n, n, generator=g) > 0.5
        mask[torch.arange(n), torch.randint(0, n, (n,), generator=g)] = True
    inputs = "one token" if n == 1 else {"causal": "a causal mask", "window": "a sliding-window mask"}.get(
        kind, "a mask that is neither causal nor a window")
    return dict(mask=mask, perm=torch.randperm(n, generator=g), inputs=inputs)


def check_permuted_mask(fn: Callable, hidden: int = 0) -> None:
    """``fn(mask (n, n) bool, perm (n,)) -> (n, n) bool``: the mask under which attention on the reordered
    tokens ``X[perm]`` gives the reordered outputs, ``Attn(X[perm], mask') = Attn(X, mask)[perm]``.
    Chapter 2."""
    if hidden:
        g = hidden_generator("permuted_mask", hidden)
        cases = [_mask_case(g, draw(g, 3, 9), kind) for kind in ("window", "random")] + [_mask_case(g, 1, "causal")]
    else:
        rows, cols = torch.arange(6)[:, None], torch.arange(6)[None, :]
        cases = [dict(mask=torch.ones(5, 5, dtype=torch.bool).tril(), perm=torch.tensor([2, 0, 4, 1, 3]),
                      inputs="a causal mask"),
                 dict(mask=(cols <= rows) & (cols > rows - 2), perm=torch.tensor([3, 5, 0, 4, 1, 2]),
                      inputs="a sliding-window mask")]
    for case in cases:
        case["what"] = "permuted_mask(mask, perm)"
    run_check("permuted_mask", fn, cases, lambda f, c: {"mask": call(f, c["mask"].clone(), c["perm"].clone())},
              hidden)
