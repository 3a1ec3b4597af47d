"""The judges of the checks for the chapter 2 exercise on a mask that moves with the tokens (2.5): the
mask under which attention on reordered tokens gives the reordered outputs.

The judge moves the mask by the permutation, confirms by a second derivation through torch's
attention that the moved mask is the answer, and names the likely misconception. The inputs and the
calls of the student's functions are in the kernel half,
:mod:`transformer_lib.grading.checks.ch02_permutation`. Chapter 2.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..protocol import CheckFailed, typename
from .common import check_shape, fail, judge


# ---------------------------------------------------------------- 2.5 a mask that moves with the tokens

def _moved(mask: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """P M Pᵀ with P the permutation matrix of ``perm`` (row i of P X is x_perm[i]): entry (i, j) is
    M[perm[i], perm[j]], by the lemma softmax(P S Pᵀ) = P softmax(S) Pᵀ."""
    P = torch.eye(len(perm), dtype=torch.float64)[perm]
    return (P @ mask.double() @ P.T) > 0.5


def _equivariant_under(mask: torch.Tensor, moved: torch.Tensor, perm: torch.Tensor) -> bool:
    """Does attention with ``moved`` on X[perm] give the rows perm of attention with ``mask`` on X? A second
    derivation: random tokens and projections through torch's scaled_dot_product_attention."""
    n = len(perm)
    gen = torch.Generator().manual_seed(5)
    X, W_Q, W_K, W_V = (torch.randn(*shape, generator=gen, dtype=torch.float64) for shape in ((n, 4), (4, 3),
                                                                                              (4, 3), (4, 2)))
    Xp = X[perm]
    before = F.scaled_dot_product_attention(X @ W_Q, X @ W_K, X @ W_V, attn_mask=mask)
    after = F.scaled_dot_product_attention(Xp @ W_Q, Xp @ W_K, Xp @ W_V, attn_mask=moved)
    return bool(torch.allclose(after, before[perm], atol=1e-12, rtol=0))


@judge("permuted_mask", compare=("mask",),
       ok=lambda cases, outs: "permuted_mask: attention on the reordered tokens with the new mask gives the reordered "
                              "outputs, for " + ", ".join(f"{c['inputs']} on {len(c['perm'])} tokens" for c in cases))
def _permuted_mask(case: dict, out: dict) -> None:
    mask, perm = case["mask"], case["perm"]
    expected = _moved(mask, perm)
    assert _equivariant_under(mask, expected, perm)
    got = out["mask"]
    if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
        kind = f"a tensor of dtype {got.dtype}" if isinstance(got, torch.Tensor) else typename(got)
        raise CheckFailed(f"permuted_mask must return a boolean tensor (True = may attend), like the mask it is "
                          f"given; got {kind}")
    check_shape(got.numpy(), tuple(expected.shape), "the mask", "one row per query, one column per key, (n, n)")
    if torch.equal(got, expected):
        return
    inverse = torch.argsort(perm)
    variants = {
        "that is the mask unchanged: it is tied to positions, so reordering the tokens moves what each entry "
        "must allow": mask,
        "that moves the mask the other way, by the inverse permutation: the new token i is the old token perm[i]; "
        "ask which old query and which old key the new entry (i, j) stands for": _moved(mask, inverse),
        "only the rows moved: the keys are reordered too, so the columns move the same way":
            mask[perm],
        "only the columns moved: the queries are reordered too, so the rows move the same way":
            mask[:, perm],
        "the mask is transposed: rows are queries and columns keys (True in row i, column j: query i may attend "
        "to key j)": expected.T,
    }
    for hint, variant in variants.items():
        if torch.equal(got, variant):
            fail(hint, expected.int(), got.int())
    fail("attention with this mask on the reordered tokens does not give the reordered outputs: the new entry (i, j) "
         "must allow what the old query and key it stands for allowed", expected.int(), got.int())
