"""Chapter 1, data-independent weights: each check cell fails when the code it guards (or the input it is
given) is broken, and passes unbroken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import chapter, check_fails_when_broken, edited, run, uncovered_check_cells

CH1 = "01_data_independent_weights"
LAST = "h_large = 1e4"  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none

# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line).
# The last cell of the list is the check cell; a "lib:module:function" step breaks that library
# function for the case.
LIB_CHECK = "from transformer_lib.embedding import"
REDRAW = "sse_mc = ((f_train + eps_mc)"
BROKEN = {
    "library: one-hot classes counted from 1": (
        CH1, [("lib:transformer_lib.embedding:one_hot", [("torch.arange(num_classes,", "torch.arange(1, num_classes + 1,")]),
              (LIB_CHECK, [])],
        "assert torch.equal(one_hot(ids[2], C), E)"),
    "library: the mixing matrix transposed": (
        CH1, [("lib:transformer_lib.embedding:FixedMixing.forward", [("self.weight.to(x.dtype) @ x", "self.weight.T.to(x.dtype) @ x")]),
              (LIB_CHECK, [])],
        "close(mix(X_set), Y_scratch"),
    "library: Nadaraya-Watson normalised over the training points' axis": (
        CH1, [("lib:transformer_lib.embedding:nadaraya_watson", [("** 2, dim=-1)", "** 2, dim=0)")]),
              (LIB_CHECK, [])],
        "close(pred_lib, pred_ref"),
    "library: the kernel without its 1/2": (
        CH1, [("lib:transformer_lib.embedding:gaussian_kernel", [("torch.exp(-0.5 * (u / bandwidth) ** 2)", "torch.exp(-((u / bandwidth) ** 2))")]),
              (LIB_CHECK, [])],
        "close(weights_lib, K / K.sum"),
    "row indexing: ids read as 1-based": (
        CH1, [("lib:transformer_lib.embedding:embed", [("return W_E[ids]", "return W_E[ids - 1]")]),
              ("for s, sid in zip(sentences, ids):", [])],
        "assert torch.equal(embed(sid, W_E), W_E[sid])"),
    "one-hot: classes counted from 1": (
        CH1, [("lib:transformer_lib.embedding:one_hot", [("torch.arange(num_classes,", "torch.arange(1, num_classes + 1,")]),
              ("for s, sid in zip(sentences, ids):", [])],
        "assert torch.equal(one_hot(sid, C) @ W_E"),
    "fixed mixing: the error counts the features, not the elements": (
        CH1, [("lib:transformer_lib.embedding:FixedMixing.forward", [("with {x.shape[-2] if", "with {x.shape[-1] if")]),
              ("n_short = 5", [])],
        'assert f"n={n_mix}" in message'),
    "permutation: P built from columns (the inverse permutation)": (
        CH1, [("perm = torch.randperm(n_mix", [("P = torch.eye(n_mix, dtype=f64)[perm]", "P = torch.eye(n_mix, dtype=f64)[:, perm]")])],
        "close(P @ X_set, X_set[perm]"),
    "fixed mixing: forward left as the identity stub": (
        CH1, [("lib:transformer_lib.embedding:FixedMixing.forward", [("return self.weight.to(x.dtype) @ x", "return x")]),
              ("perm = torch.randperm(n_mix", [])],
        "assert perm_gap > 0.1"),
    "equivariant mixing: from_weight keeps its random start, not the given matrix": (
        CH1, [("lib:transformer_lib.embedding:FixedMixing.from_weight", [("layer.weight = nn.Parameter(weight.detach().clone())", "pass")]),
              ("a, b = 0.7, -0.2", [])],
        "close(mix_eq(P @ X_set), P @ mix_eq(X_set)"),
    "weights: the kernel left unnormalised": (
        CH1, [("lib:transformer_lib.embedding:nadaraya_watson", [("torch.softmax(-0.5 * (diff / bandwidth) ** 2, dim=-1)",
                                                                   "torch.exp(-0.5 * (diff / bandwidth) ** 2)")]),
              ("pred_grid, weights_grid = nadaraya_watson(", [])],
        "close(weights_grid.sum(dim=1)"),
    "Gaussian = softmax: the 2 of 2h² dropped": (
        CH1, [("keys = torch.randn(12, 5", [("/ (2 * h**2))", "/ h**2)")])],
        "close(gauss_weights(query, keys, h_vec)"),
    "fit: the bandwidth used as a precision (x·h, not x/h)": (
        CH1, [("lib:transformer_lib.embedding:nadaraya_watson", [("-0.5 * (diff / bandwidth) ** 2", "-0.5 * (diff * bandwidth) ** 2")]),
              ("pred_train, A = nadaraya_watson(", [])],
        "assert rmse_fit < rmse_noisy and"),
    "large bandwidth: normalised over the queries": (
        CH1, [("lib:transformer_lib.embedding:nadaraya_watson", [("** 2, dim=-1)", "** 2, dim=0)")]),
              ("h_large = 1e4", [])],
        "close(pred_large, y_train.mean()"),
    "redraws: the squared bias left out of the expected error": (
        CH1, [("pred_train, A = nadaraya_watson(", [("sse_mean = float(bias @ bias + sigma**2", "sse_mean = float(sigma**2")]),
              (REDRAW, [])],
        "assert abs(float(sse_mc.mean()) - sse_mean)"),
    "redraws: the variance without its cross term 4σ²‖Aᵀb‖²": (
        CH1, [("pred_train, A = nadaraya_watson(", [("4 * sigma**2 * (A.T @ bias).pow(2).sum()", "0")]),
              (REDRAW, [])],
        "assert abs(var_mc - sse_var)"),
    "redraws: the variance of σ²χ²₁ taken as σ⁴, not 2σ⁴": (
        CH1, [("pred_train, A = nadaraya_watson(", [("+ 2 * sigma**4", "+ sigma**4")]),
              (REDRAW, [])],
        "assert abs(var_mc - sse_var)"),
    "small bandwidth: values shuffled against their keys": (
        CH1, [("h_small = min_gap /", [("nadaraya_watson(x_train, x_train, y_train, h_small)",
                 "nadaraya_watson(x_train, x_train, y_train.flip(0), h_small)")])],
        "close(pred_small, y_train"),
    "mole: the input vector described without its segment row": (
        CH1, [("mole_out = out_m.last", [("+ minilm.type_emb.weight[0])",
                 "+ 0)")])],
        "torch.testing.assert_close(mole_in[0], by_hand"),
    "mole: vectors read before attention": (
        CH1, [("mole_out = out_m.last", [("mole_out = out_m.last[:, at]",
                 "mole_out = out_m.hidden[0][:, at]")])],
        "assert not torch.allclose(mole_out[0]"),
    "mole: senses mislabelled": (
        CH1, [("unit_vectors = F.normalize", [("sense_of = torch.tensor([list(mole_sentences).index(s) for s in senses])",
                 "sense_of = torch.tensor([0, 1, 2, 0, 1, 2])")])],
        "assert mole_same > mole_cross + 0.03"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


@pytest.mark.parametrize("phrase", [LIB_CHECK, "for s, sid in zip(sentences, ids):", "mole_out = out_m.last",
                                    "unit_vectors = F.normalize", "n_short = 5", "perm = torch.randperm(n_mix",
                                    "pred_grid, weights_grid = nadaraya_watson(", "keys = torch.randn(12, 5",
                                    "pred_train, A = nadaraya_watson(", REDRAW, "h_small = min_gap /",
                                    "a, b = 0.7, -0.2", "h_large = 1e4"])
def test_check_passes_unbroken(phrase):
    cells, namespace = chapter(CH1, LAST, SKIP)
    run(edited(cells, phrase, []), dict(namespace))


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(CH1, BROKEN) == []
