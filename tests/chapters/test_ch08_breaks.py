"""Chapter 8, mixture of experts: each check cell fails when the code it guards is broken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import check_fails_when_broken, uncovered_check_cells

CH8 = "08_mixture_of_experts"
LAST = "factors = [0.5"  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none


# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line
#        [, [(module, name, make_broken), ...] library patches]).
# The last cell of the list is the check cell; the ones before it define what it uses.
BROKEN = {
    "8 router: softmax over the tokens": (
        CH8, [("def my_router", [("torch.softmax(x @ W_g, dim=-1)", "torch.softmax(x @ W_g, dim=0)")])],
        "assert torch.equal(idx_mine, idx_lib)"),
    "8 router: the top-k weights not renormalised": (
        CH8, [("def my_router", [("return top / top.sum(dim=-1, keepdim=True), indices, probs",
                                  "return top, indices, probs")])],
        "torch.testing.assert_close(w_lib, w_mine"),
    "8 batched dispatch: every choice weighted as the first": (
        CH8, [("def my_moe_batched", [("weights[token, slot, None]", "weights[token, 0, None]")])],
        "torch.testing.assert_close(my_moe_batched(flat, wg, lay.experts, k), loop"),
    "8 worked example: the library's top-2 weights not renormalised": (
        CH8, [("lib:transformer_lib.moe:Router.forward", [("weights = top / top.sum(dim=-1, keepdim=True)",
                                                          "weights = top")]),
              ("class Times(torch.nn.Module)", [])],
        'torch.testing.assert_close(aux_ex["expert_weights"], w_ex'),
    "8 K = E: the layer ignores the router's weights": (
        CH8, [("lib:transformer_lib.moe:MoELayer.forward", [("y = expert(flat[tokens]) * weight_of[sel, None].to(flat.dtype)",
                                                            "y = expert(flat[tokens])")]),
              ("uni = MoELayer(d, d_ff, n_experts=5, top_k=5)", [])],
        "torch.testing.assert_close(uni(xu)[0], mean_of_experts"),
    "8 Mixtral: gate and up projections swapped": (
        CH8, [("mix_cfg = transformers.MixtralConfig", [("gate_up_proj[e, :24])", "gate_up_proj[e, 24:])"),
                                                        ("ex.fc3.weight.copy_(hf_block.experts.gate_up_proj[e, 24:])",
                                                         "ex.fc3.weight.copy_(hf_block.experts.gate_up_proj[e, :24])")])],
        "torch.testing.assert_close(y_ours, y_hf"),
    "8 balancing loss: the library divides by T, not T·K (Hugging Face's ×K)": (
        CH8, [("lib:transformer_lib.moe:load_balancing_loss", [("f = counts / index.numel()", "f = counts / index.shape[0]")]),
              ("def my_balancing_loss", [])],
        "torch.testing.assert_close(load_balancing_loss(aux2[\"router_probs\"], aux2[\"expert_index\"], 4), mine2"),
    "8 balancing loss: the library counts first choices only": (
        CH8, [("lib:transformer_lib.moe:load_balancing_loss", [("index = expert_index if expert_index.dim() == 2",
                                                               "index = expert_index[:, :1] if expert_index.dim() == 2")]),
              ("def my_balancing_loss", [])],
        "torch.testing.assert_close(load_balancing_loss(aux2[\"router_probs\"], aux2[\"expert_index\"], 4), mine2"),
    "8 balancing loss: the library's P replaced by the shares": (
        CH8, [("lib:transformer_lib.moe:load_balancing_loss", [("p = router_probs.mean(dim=0)", "p = f")]),
              ("E4, T = 4, 400", [])],
        "assert abs(lb_below - (1 + 2 * float((phi * delta).sum()))) < 1e-12"),
    "8 parameters: the library's active count ignores K": (
        CH8, [("lib:transformer_lib.moe:MoELayer.param_counts", [('"active": router + self.top_k * per_expert',
                                                                 '"active": router + per_expert')]),
              ("d_c, dff_c = 64, 256", [])],
        'assert counts["total"] == total and counts["active"]'),
    "8 parameters: every expert runs on every assignment": (
        CH8, [("lib:transformer_lib.moe:MoELayer.forward", [("sel = (expert_of == e) & keep", "sel = keep")]),
              ("d_c, dff_c = 64, 256", [])],
        "assert reached == K_c * per_expert + router_reached"),
    "8 parameters: the library's top-K weights not renormalised (the whole router gets a gradient)": (
        CH8, [("lib:transformer_lib.moe:Router.forward", [("weights = top / top.sum(dim=-1, keepdim=True)",
                                                          "weights = top")]),
              ("d_c, dff_c = 64, 256", [])],
        "assert reached == K_c * per_expert + router_reached"),
    "8 FLOPs: every expert runs on every assignment": (
        CH8, [("lib:transformer_lib.moe:MoELayer.forward", [("sel = (expert_of == e) & keep", "sel = keep")]),
              ("def measured_flops_per_token", [])],
        "assert fl == k * per_expert_flops + 2 * d_c * e"),
    "8 Mixtral count: the active count keeps every expert": (
        CH8, [("lib:transformer_lib.counting:param_breakdown", [("experts = (c.top_k if active else c.n_experts) if c.moe else 1",
                                                               "experts = c.n_experts if c.moe else 1")]),
              ('mixtral = PRESETS["mixtral-8x7b"]', [])],
        "assert active == hf_active"),
    "8 MoE GPT: the blocks keep their dense MLP": (
        CH8, [("lib:transformer_lib.model:_make_block", [("if c.moe:", "if False:")]),
              ("cfg_moe = ModelConfig", [])],
        "assert isinstance(block_mlp, MoELayer)"),
    "8 MoE GPT: the model's balancing loss summed over the blocks": (
        CH8, [("lib:transformer_lib.moe:moe_balancing_loss", [("for m in layers]).mean()", "for m in layers]).sum()")]),
              ("cfg_moe = ModelConfig", [])],
        "torch.testing.assert_close(lb_model, torch.stack(per_block).mean()"),
    "8 router training: the balancing loss never added": (
        CH8, [("REGIMES, D_IN, E_R, K_R", [('loss = F.mse_loss(out, yr) + alpha * aux["load_balancing_loss"]',
                                            "loss = F.mse_loss(out, yr)")])],
        'assert wi["share"].min() > 0.12'),
    "8 capacity from scratch: the library lets one assignment too many through": (
        CH8, [("lib:transformer_lib.moe:MoELayer.forward", [("else slot < cap", "else slot <= cap")]),
              ("def my_moe_capacity", [])],
        'assert torch.equal(aux_c["kept"], kept_mine)'),
    "8 capacity: the capacity factor never set": (
        CH8, [("factors = [0.5", [("        lay.capacity_factor = c\n", "")])],
        "assert cap == my_capacity(c, len(xr), K_R, E_R)"),
    "8 capacity: the library rounds C down": (
        CH8, [("lib:transformer_lib.moe:MoELayer.capacity", [("return math.ceil(factor", "return math.floor(factor")]),
              ("def my_moe_capacity", [])],
        "assert cap_layer.capacity(T_c) == caps[c]"),
    "8 capacity: the library takes the ceiling of a float product": (
        CH8, [("lib:transformer_lib.moe:MoELayer.capacity", [("factor = Fraction(str(float(self.capacity_factor)))",
                                                            "factor = float(self.capacity_factor)")]),
              ("def my_moe_capacity", [])],
        "assert MoELayer(d, d_ff, E_x, k_x, capacity_factor=c).capacity(T_x) == exact"),
    "8 capacity: the library counts the tokens of one sequence, not of the batch": (
        CH8, [("lib:transformer_lib.moe:MoELayer.forward", [("cap = self.capacity(n_tokens)", "cap = self.capacity(x.shape[-2])")]),
              ("def my_moe_capacity", [])],
        'assert torch.equal(aux_c["kept"], kept_mine)'),
    "8 capacity from scratch: the ceiling written as a floor": (
        CH8, [("def my_moe_capacity", [("return -(-p * T * k // (q * E))", "return p * T * k // (q * E)")])],
        "assert cap_layer.capacity(T_c) == caps[c]"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a broken cell may meet a nan
@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(CH8, BROKEN) == []
