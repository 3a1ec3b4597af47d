"""Chapter 2, building up attention: each check cell fails when the code it guards (or the input it is
given) is broken, and passes unbroken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import chapter, check_fails_when_broken, edited, run, uncovered_check_cells

CH2 = "02_building_up_attention"
LAST = "cat_tokens = ["  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none

# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line).
# The last cell of the list is the check cell; a "lib:module:function" step breaks that library
# function for the case.
ATT = "lib:transformer_lib.attention:"
BROKEN = {
    "from scratch: the library softmax normalised over the wrong axis": (
        CH2, [(ATT + "softmax", [("total = e.sum(dim=dim, keepdim=True)", "total = e.sum(dim=0, keepdim=True)")]),
              ("t = torch.from_numpy", [])],
        "np.testing.assert_allclose(lib.detach().numpy(), ours,"),
    "from scratch: step 3 with the query and key projections swapped": (
        CH2, [(ATT + "query_key_attention", [("(X @ W_q, X @ W_k, X,", "(X @ W_k, X @ W_q, X,")]),
              ("t = torch.from_numpy", [])],
        "np.testing.assert_allclose(lib.detach().numpy(), ours,"),
    "from scratch: the library's default scale 1/d_k, not 1/√d_k": (
        CH2, [(ATT + "_scores", [("1.0 / math.sqrt(q.shape[-1])", "1.0 / q.shape[-1]")]),
              ("t = torch.from_numpy", [])],
        "np.testing.assert_allclose(lib.detach().numpy(), ours,"),
    "cross-attention: queries taken from the context, keys and values from x": (
        CH2, [(ATT + "SelfAttention.forward", [("self.W_q(x), self.W_k(context), self.W_v(context)",
                                                "self.W_q(context), self.W_k(x), self.W_v(x)")]),
              ("C = 0.5 * rng.standard_normal((7, 8))", [])],
        "np.testing.assert_allclose(weights.detach().numpy(), A_cross,"),
    "A and Z: the library's softmax over the queries, not the keys": (
        CH2, [(ATT + "_weights", [("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)")]),
              ("Z_lib, A_lib = scaled_dot_product_attention(", [])],
        "np.testing.assert_allclose(A_lib, A_np"),
    "row 3: the max subtracted in the numerator only": (
        CH2, [(ATT + "softmax", [("total = e.sum(dim=dim, keepdim=True)", "total = torch.exp(x).sum(dim=dim, keepdim=True)")]),
              ("row3 = torch.tensor(S_np[2]", [])],
        "np.testing.assert_allclose(raw, e_raw"),
    "Gumbel-max: the argmax over the queries, not the keys": (
        CH2, [("N_gumbel = 200_000", [("(U[None] + G).argmax(axis=2)", "(U[None] + G).argmax(axis=1)")])],
        "assert err < tol"),
    "F.sdpa: the causal mask hides the diagonal too": (
        CH2, [(ATT + "causal_mask", [("return j <= i + (m - n)", "return j < i + (m - n)")]),
              ("g = torch.Generator().manual_seed(0)", [])],
        "torch.testing.assert_close(out_c, ref"),
    "F.sdpa: the bias scaled with the scores": (
        CH2, [(ATT + "_scores", [("scores = (q * scale) @ k.transpose(-2, -1)  # (…, n, m)", "scores = q @ k.transpose(-2, -1)"),
                                 ("return scores", "return scores * scale")]),
              ("g = torch.Generator().manual_seed(0)", [("torch.testing.assert_close(\n    out_b,",  # one line, to name it
                                                        "torch.testing.assert_close(out_b,")])],
        "torch.testing.assert_close(out_b,"),
    "FLOPs: the scores as a broadcast product summed, not a matrix product": (
        CH2, [(ATT + "_scores", [("scores = (q * scale) @ k.transpose(-2, -1)",
                                  "scores = ((q * scale)[..., :, None, :] * k[..., None, :, :]).sum(-1)")]),
              ("from torch.utils.flop_counter import FlopCounterMode", [])],
        "assert attention_flops(n_q, m_k, dk=16, dv=8) == expected"),
    "Jacobian: a aᵀ added, not subtracted": (
        CH2, [("def softmax_jacobian(a):", [("torch.diag(a) - torch.outer(a, a)", "torch.diag(a) + torch.outer(a, a)")])],
        "torch.testing.assert_close(softmax_jacobian(softmax(zz)), J_auto"),
    "permutation: the layer causal by default": (
        CH2, [(ATT + "SelfAttention.forward", [("scaled_dot_product_attention(q, k, v, mask=mask)",
                                                "scaled_dot_product_attention(q, k, v, mask=causal_mask(q.shape[-2]) if mask is None else mask)")]),
              ("sa = SelfAttention(d_model=8", [])],
        "torch.testing.assert_close(sa(P @ Xp), P @ sa(Xp)"),
    "permutation: the layer drops its mask": (
        CH2, [(ATT + "SelfAttention.forward", [("scaled_dot_product_attention(q, k, v, mask=mask)",
                                                "scaled_dot_product_attention(q, k, v)")]),
              ("sa = SelfAttention(d_model=8", [])],
        "assert broken > 1e-3"),
    "saturation: a aᵀ added, not subtracted, in the batched Jacobian": (
        CH2, [("scales = np.logspace(-1, np.log10(64), 25)", [("torch.diag_embed(a) - a[:, :, None]", "torch.diag_embed(a) + a[:, :, None]")])],
        "assert med[i32] < 1e-4 * med[i1]"),
    "running example: Q and K projections swapped": (
        CH2, [("syllabus = {", [("Q_t, K_t, V_t = Xt @ WQt, Xt @ WKt, Xt @ WVt",
                 "Q_t, K_t, V_t = Xt @ WKt, Xt @ WQt, Xt @ WVt")])],
        "torch.equal(M, torch.tensor"),
    "running example: S = K Qᵀ": (
        CH2, [("syllabus = {", [("S_t = Q_t @ K_t.T",
                 "S_t = K_t @ Q_t.T")])],
        "torch.equal(M, torch.tensor"),
    "running example: V from W_Q": (
        CH2, [("syllabus = {", [("Xt @ WVt\n",
                 "Xt @ WQt\n")])],
        "torch.equal(M, torch.tensor"),
    "entropy: the scale dropped": (
        CH2, [("def mean_entropy", [("(1.0, math.sqrt(dk), dk)",
                 "(1.0, 1.0, dk)")])],
        "scaled_H.max() - scaled_H.min()"),
    "entropy: divided by d_k instead of √d_k": (
        CH2, [("def mean_entropy", [("(1.0, math.sqrt(dk), dk)",
                 "(1.0, dk, dk)")])],
        "scaled_H.max() - scaled_H.min()"),
    "±2σ share: scores not Gaussian (uniform)": (
        CH2, [("two_sigma_mass = math.erf", [("inside = (samples[dk].abs()",
                 "inside = ((torch.rand(N_mc) * 2 - 1) * math.sqrt(3 * dk)).abs()\ninside = (inside")])],
        "assert abs(inside - two_sigma_mass)"),
    "stable softmax: no shift": (
        CH2, [("def softmax_decimal", [("stable = softmax(scores)",
                 "stable = naive_softmax(scores)")])],
        "torch.softmax(scores, 0)"),
    "stable softmax: a stray temperature": (
        CH2, [("def softmax_decimal", [("stable = softmax(scores)",
                 "stable = softmax(scores / 2)")])],
        "torch.softmax(scores, 0)"),
    "step 2: a direction outside the null space": (
        CH2, [("v0 = vecs[:, 0]", [("v0 = vecs[:, 0]",
                 "v0 = vecs[:, -1]")])],
        "null_len < 1e-12"),
    "step 1: equal normalisers claimed for random tokens": (
        CH2, [("normaliser = np.exp", [("Xu = Xr / np.linalg.norm(Xr, axis=1, keepdims=True)",
                 "Xu = X / np.linalg.norm(X, axis=1, keepdims=True)")])],
        "step1_rand_asym > 1e-3"),
    "erratum: a table that is softmax(S/T) for one T": (
        CH2, [("cat_tokens = [", [("cat_published = np.array([[.49, .28, .23], [.12, .63, .25],\n                          [.15, .30, .55]])",
                 "cat_published = np.round(softmax(torch.tensor(cat_scores) / 1.2).numpy(), 3)"),
                ("assert cat_err[2] <= 0.005",
                 "pass")])],
        "best_err > 0.005"),
    "variance: the fresh scores divided by d_k, not √d_k": (
        CH2, [("def sample_scores(dk):", [("(sample_scores(dk) / math.sqrt(dk))",
                 "(sample_scores(dk) / dk)")])],
        "assert abs(scaled - 1) < 4 * se"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


@pytest.mark.parametrize("phrase", [
    "t = torch.from_numpy", "C = 0.5 * rng.standard_normal((7, 8))", "syllabus = {",
    "Z_lib, A_lib = scaled_dot_product_attention(", "row3 = torch.tensor(S_np[2]", "normaliser = np.exp",
    "v0 = vecs[:, 0]", "N_gumbel = 200_000", "g = torch.Generator().manual_seed(0)",
    "from torch.utils.flop_counter import FlopCounterMode", "def sample_scores(dk):", "def mean_entropy",
    "two_sigma_mass = math.erf", "def softmax_jacobian(a):", "sa = SelfAttention(d_model=8", "def softmax_decimal",
    "cat_tokens = [", "scales = np.logspace(-1, np.log10(64), 25)"])
def test_check_passes_unbroken(phrase):
    cells, namespace = chapter(CH2, LAST, SKIP)
    run(edited(cells, phrase, []), dict(namespace))


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(CH2, BROKEN) == []
