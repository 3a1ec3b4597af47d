"""Chapter 3, the transformer block: each check cell fails when the code it guards is broken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import check_fails_when_broken, uncovered_check_cells

CH3 = "03_the_transformer_block"
LAST = "cfg = BertConfig()"  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none


# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line
#        [, [(module, name, make_broken), ...] library patches]).
# The last cell of the list is the check cell; the ones before it define what it uses.
BROKEN = {
    "3 hull: the 1/√d scale dropped": (
        CH3, [("def distance_to_affine_hull", [("softmax(Q_h @ K_h.T / math.sqrt(d_h))",
                                                "softmax(Q_h @ K_h.T)")])],
        "torch.testing.assert_close(A_h @ V_h, Z_h"),
    "3 hull: the linear span instead of the affine hull": (
        CH3, [("def distance_to_affine_hull", [("(rows[1:] - rows[0]).T", "rows[1:].T")])],
        "assert dist_attn < 1e-10"),
    "3 hull: the MLP's GELU removed": (
        CH3, [("def distance_to_affine_hull", [('mlp_h = MLP(d_h, activation="gelu").double()',
                                                'mlp_h = MLP(d_h, activation="gelu").double(); '
                                                "mlp_h.forward = lambda Y: mlp_h.fc2(mlp_h.fc1(Y))")])],
        "assert dist_mlp > 0.01"),
    "3 MLP: the output bias dropped": (
        CH3, [("def mlp_scratch", [("return H @ W2 + b2", "return H @ W2")])],
        "torch.testing.assert_close(ours, lib(Y_m)"),
    "3 MLP: ReLU and GELU swapped": (
        CH3, [("def mlp_scratch", [('torch.relu(H) if activation == "relu" else F.gelu(H)',
                                    'F.gelu(H) if activation == "relu" else torch.relu(H)')])],
        "torch.testing.assert_close(ours, lib(Y_m)"),
    "3 collapse: A* multiplied in the wrong order": (
        CH3, [("n_c, d_c = 5, 4", [("A_star, W_V_star = A2 @ A1,", "A_star, W_V_star = A1 @ A2,")])],
        "assert collapse_err < 1e-6"),
    "3 collapse: W_V* multiplied in the wrong order": (
        CH3, [("n_c, d_c = 5, 4", [("W_V1 @ W_V2\n", "W_V2 @ W_V1\n")])], "assert collapse_err < 1e-6"),
    "3 collapse: the MLP's ReLU removed": (
        CH3, [("n_c, d_c = 5, 4", [('mlp_c = MLP(d_c, activation="relu").double()',
                                    'mlp_c = MLP(d_c, activation="relu").double(); '
                                    "mlp_c.forward = lambda Y: mlp_c.fc2(mlp_c.fc1(Y))")])],
        "assert defect_affine < 1e-12 and defect_relu > 0.05"),
    "3 collapse: the bias row left out of the one-layer form": (
        CH3, [("n_c, d_c = 5, 4", [("W_V2) + bias_row,", "W_V2),")])],
        "torch.testing.assert_close(stack(no_relu, X_c)"),
    "3 LayerNorm: the unbiased variance": (
        CH3, [("def layer_norm_scratch", [("((h - mu) ** 2).mean(dim=-1, keepdim=True)",
                                           "((h - mu) ** 2).sum(dim=-1, keepdim=True) / (h.shape[-1] - 1)")])],
        "torch.testing.assert_close(ln_h, torch.tensor("),
    "3 LayerNorm: ε outside the root": (
        CH3, [("def layer_norm_scratch", [("torch.sqrt(var + eps)", "(torch.sqrt(var) + eps)")])],
        "torch.testing.assert_close(ln_h, ref"),
    "3 two tokens: ε as large as the tokens' variance": (
        CH3, [("pair = torch.stack", [("scaled_norm = LayerNorm(4).double()", "scaled_norm = LayerNorm(4, eps=10.0).double()")])],
        "assert pair_min_gap > 1 and pair_out_gap < 1e-4"),
    "3 LayerNorm batched: statistics over the first axis": (
        CH3, [("def layer_norm_scratch", [("h.mean(dim=-1, keepdim=True)", "h.mean(dim=0, keepdim=True)"),
                                          (".mean(dim=-1, keepdim=True)      # biased",
                                           ".mean(dim=0, keepdim=True)      # biased")]),
              ("torch_ln = nn.LayerNorm(16", [])],
        "torch.testing.assert_close(ours, torch_ln(H)"),
    "3 LayerNorm batched: γ, β copied into torch's norm only": (
        CH3, [("torch_ln = nn.LayerNorm(16", [("for m in (torch_ln, lib_ln):", "for m in (torch_ln,):")])],
        "torch.testing.assert_close(lib_ln(H), torch_ln(H)"),
    "3 LayerNorm errors: the 'unbiased' variant is biased": (
        CH3, [("def ln_unbiased", [("x.var(-1, unbiased=True,", "x.var(-1, unbiased=False,")])],
        "assert abs(unbiased_factor"),
    "3 LayerNorm errors: ε inside the root in the 'outside' variant": (
        CH3, [("def ln_unbiased", [("(x.std(-1, unbiased=False, keepdim=True) + eps)",
                                    "torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)")])],
        "assert eps_err_big < 1e-4 < 0.1 < eps_err_small"),
    "3 LayerNorm errors: ε outside a square root with no floor at 0": (
        CH3, [("def ln_unbiased", [("(x.std(-1, unbiased=False, keepdim=True) + eps)",
                                    "(((x - mu) ** 2).mean(-1, keepdim=True).sqrt() + eps)")])],
        'torch.testing.assert_close(jac["outside"]'),
    "3 batch norm: running statistics (eval mode)": (
        CH3, [("bn = nn.BatchNorm1d(16", [(".double().train()", ".double().eval()")])],
        "torch.testing.assert_close(batch_norm(batch1)"),
    "3 block: heads scaled by √d, not √d_k": (
        CH3, [("def block_scratch", [("/ math.sqrt(d // h)", "/ math.sqrt(d)")]),
              ("d_b, heads_b, dff_b = 16, 4, 64", [])],
        "torch.testing.assert_close(ours, ref, atol=1e-10"),
    "3 block: post-norm with the norm inside the branch": (
        CH3, [("def block_scratch", [("x = ln1(x + attn(x))", "x = x + ln1(attn(x))")]),
              ("d_b, heads_b, dff_b = 16, 4, 64", [])],
        "torch.testing.assert_close(ours, ref, atol=1e-10"),
    "3 block: the causal mask transposed": (
        CH3, [("def block_scratch", [("dtype=torch.bool).tril()", "dtype=torch.bool).triu()")]),
              ("d_b, heads_b, dff_b = 16, 4, 64", [])],
        "torch.testing.assert_close(ours, ref_c"),
    "3 block: torch given the allowed positions as its mask": (
        CH3, [("d_b, heads_b, dff_b = 16, 4, 64", [("src_mask=causal_forbidden", "src_mask=~causal_forbidden")])],
        "torch.testing.assert_close(ours, ref_c"),
    "3 running example: Chapter 2's projections in head 2": (
        CH3, [("ex = running_example()", [("role * d_r:role * d_r + W.shape[1]", "role * d_r + W.shape[1]:(role + 1) * d_r")])],
        "np.testing.assert_allclose(weights_r[0].numpy()"),
    "3 running example: the first residual left out": (
        CH3, [("ex = running_example()", [('stages["X + MHA(X)"] = x + stages["MHA(X)"]', 'stages["X + MHA(X)"] = stages["MHA(X)"]')])],
        "torch.testing.assert_close(out_r, block_r(X_r)"),
    "3 shapes: the expand hook on the projection": (
        CH3, [("b_t, n_t, d_t, dff_t", [('"MLP expand": trace_block.mlp.fc1', '"MLP expand": trace_block.mlp.fc2')])],
        'assert trace["MLP expand"]'),
    "3 parameters: W_O forgotten in the formula": (
        CH3, [("cfg = BertConfig()", [('"attention weights (4d²)": 4 * d_ * d_',
                                       '"attention weights (4d²)": 3 * d_ * d_')])],
        "assert formula == ours_counts == bert_counts"),
    "3 parameters: the MLP's output bias forgotten": (
        CH3, [("cfg = BertConfig()", [("2 * d_ * dff_ + dff_ + d_,", "2 * d_ * dff_ + dff_,")])],
        "assert formula == ours_counts == bert_counts"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a broken cell may meet a nan
@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(CH3, BROKEN) == []
