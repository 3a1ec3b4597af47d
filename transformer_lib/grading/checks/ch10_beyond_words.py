"""The checks' kernel half for the appendix exercises 10.1 and 10.2: cross-sectional attention from
given projections in which no firm is its own peer, and the [CLS] token with the positions of a
larger grid. Attention in O(n) (10.3 and 10.4) is checked in ``ch10_efficient.py``.

What runs in the student's kernel (the inputs, visible and hidden, and the calls of the student's
functions). The judges are in :mod:`transformer_lib.grading.judges.ch10_beyond_words`. Chapter 10.
"""
from __future__ import annotations

from typing import Callable

import torch

from .._calls import call
from .._harness import draw, hidden_generator, randn, run_check, seeded

__all__ = ["check_cross_section_attention", "check_vit_tokens"]

_ATTENTION = ("scaled_dot_product_attention", "multi_head_attention")
_CS_ARGS = ("X_t", "X_r", "W_Q", "W_K", "W_V", "ids_t", "ids_r")


# ------------------------------------------------------------------------ 10.1 cross-sectional attention

def _ids(g: torch.Generator, n_t: int, n_r: int, shared: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Firm identifiers: ``shared`` of the n_t targets are reference firms too, each at another place."""
    pool = torch.randperm(1000, generator=g)[:n_t + n_r - shared] + 1
    ids_r = pool[:n_r]
    both = ids_r[torch.randperm(n_r, generator=g)[:shared]]
    ids_t = torch.cat([both, pool[n_r:]])[torch.randperm(n_t, generator=g)]
    return ids_t, ids_r


def check_cross_section_attention(fn: Callable, X_t: torch.Tensor | None = None, X_r: torch.Tensor | None = None,
                                  W_Q: torch.Tensor | None = None, W_K: torch.Tensor | None = None,
                                  W_V: torch.Tensor | None = None, ids_t: torch.Tensor | None = None,
                                  ids_r: torch.Tensor | None = None, hidden: int = 0) -> None:
    """``fn(X_t (n_t, d), X_r (n_r, d), W_Q (d, d_k), W_K (d, d_k), W_V (d, d_v), ids_t (n_t,), ids_r (n_r,))
    -> (Z (n_t, d_v), A (n_t, n_r))``: the targets X_t attend to the reference firms X_r, never to the
    firm with their own identifier; a target with no other firm gets zero rows. Chapter 10."""
    if hidden:
        g = hidden_generator("cross_section_attention", hidden)
        cases = []
        for n_t, n_r, shared, scale, kind in [
                (draw(g, 5, 9), draw(g, 2, 4), 0, 1.0, "no target among the reference firms, more targets"),
                (draw(g, 3, 5), draw(g, 6, 9), None, 20.0, "every target among the reference firms, large features"),
                (1, 1, 1, 1.0, "one target, whose only reference firm is itself")]:
            d, d_k, d_v = draw(g, 2, 7), draw(g, 1, 6), draw(g, 1, 5)
            ids = _ids(g, n_t, n_r, n_t if shared is None else shared)
            cases.append(dict(X_t=randn(g, n_t, d, scale=scale), X_r=randn(g, n_r, d, scale=scale),
                              W_Q=randn(g, d, d_k), W_K=randn(g, d, d_k), W_V=randn(g, d, d_v),
                              ids_t=ids[0], ids_r=ids[1], inputs=kind))
    elif X_t is not None:
        cases = [dict(X_t=X_t, X_r=X_r, W_Q=W_Q, W_K=W_K, W_V=W_V, ids_t=ids_t, ids_r=ids_r)]
    else:
        cases = [dict(X_t=seeded(30, 4, 5), X_r=seeded(31, 6, 5), W_Q=seeded(32, 5, 3), W_K=seeded(33, 5, 3),
                      W_V=seeded(34, 5, 2), ids_t=torch.tensor([12, 3, 40, 7]),
                      ids_r=torch.tensor([3, 5, 7, 9, 11, 12])),
                 dict(X_t=seeded(35, 3, 4), X_r=seeded(36, 1, 4), W_Q=seeded(37, 4, 2), W_K=seeded(38, 4, 2),
                      W_V=seeded(39, 4, 3), ids_t=torch.tensor([8, 2, 5]), ids_r=torch.tensor([8]))]
    for case in cases:
        case["what"] = "cross_section_attention(X_t, X_r, W_Q, W_K, W_V, ids_t, ids_r)"
    run_check("cross_section_attention", fn, cases, lambda f, c: {"result": call(
        f, *(c[key].clone() for key in _CS_ARGS), banned=_ATTENTION)}, hidden)


# ------------------------------------------------------------------------ 10.2 [CLS] and positions

def check_vit_tokens(fn: Callable, patches: torch.Tensor | None = None, W_E: torch.Tensor | None = None,
                     cls: torch.Tensor | None = None, pos: torch.Tensor | None = None, cols: int | None = None,
                     hidden: int = 0) -> None:
    """``fn(patches (b, L, P), W_E (P, d), cls (d,), pos (R, C, d), cols) -> (b, 1 + L, d)``: [CLS]
    first, then the embedded patches of a grid of L / cols rows and ``cols`` columns (row-major), the
    patch in row a, column b plus ``pos[a, b]``, the position learned for that place of a larger grid
    of R × C patches; [CLS] gets no position. Chapter 10."""
    if hidden:
        g = hidden_generator("vit_tokens", hidden)
        cases = []
        R, C = draw(g, 3, 5), draw(g, 3, 5)
        one = draw(g, 2, 5)
        for b, rows, cols_, P, d, kind in [
                (draw(g, 2, 3), R, C, draw(g, 2, 6), draw(g, 4, 8), "the whole grid the positions were learned on"),
                (draw(g, 1, 3), draw(g, 1, R - 1), C, draw(g, 2, 6), draw(g, 4, 8), "the full width, fewer rows"),
                (draw(g, 1, 3), 1, draw(g, 2, C - 1), draw(g, 2, 6), draw(g, 4, 8), "one row of patches"),
                (1, 1, 1, one, one, "one image of one patch, P = d")]:
            cases.append(dict(patches=randn(g, b, rows * cols_, P), W_E=randn(g, P, d), cls=randn(g, d),
                              pos=randn(g, R, C, d), cols=cols_, inputs=kind))
    elif patches is not None:
        cases = [dict(patches=patches, W_E=W_E, cls=cls, pos=pos, cols=cols)]
    else:
        cases = [dict(patches=seeded(50, 2, 6, 6), W_E=seeded(51, 6, 3), cls=seeded(52, 3), pos=seeded(53, 3, 4, 3),
                      cols=3),
                 dict(patches=seeded(54, 1, 6, 4), W_E=seeded(55, 4, 5), cls=seeded(56, 5), pos=seeded(57, 3, 5, 5),
                      cols=2)]
    for case in cases:
        case["what"] = f"vit_tokens(patches, W_E, cls, pos, cols={case['cols']})"
    run_check("vit_tokens", fn, cases, lambda f, c: {"tokens": call(
        f, *(c[key].clone() for key in ("patches", "W_E", "cls", "pos")), c["cols"])}, hidden)
