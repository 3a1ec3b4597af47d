"""Chapter 4, the residual stream: each check cell fails when the code it guards is broken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import check_fails_when_broken, uncovered_check_cells

CH4 = "04_the_residual_stream"
LAST = "share = dla.values[:, mask]"  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none


# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line
#        [, [(module, name, make_broken), ...] library patches]).
# The last cell of the list is the check cell; the ones before it define what it uses.
BROKEN = {
    "4 block: attention reads the stream without its norm": (
        CH4, [("def residual_block", [("a = block.attn(block.norm1(x))", "a = block.attn(x)")])],
        "torch.testing.assert_close(lib_out, out"),
    "4 block: the MLP reads x, not x1": (
        CH4, [("def residual_block", [("block.mlp(block.norm2(x1))", "block.mlp(block.norm2(x))")])],
        "torch.testing.assert_close(lib_out, out"),
    "4 GPT stream: positions left out": (
        CH4, [("gpt = GPT(cfg).double().eval()", [("gpt.tok_emb(idx) + gpt.pos_emb.weight[:10]",
                                                    "gpt.tok_emb(idx)")])],
        "torch.testing.assert_close(lib, ours"),
    "4 GPT stream: logits without the final norm": (
        CH4, [("gpt = GPT(cfg).double().eval()", [("gpt.lm_head(gpt.norm_f(h))", "gpt.lm_head(h)")])],
        "torch.testing.assert_close(logits, gpt.lm_head"),
    "4 expansion: later layers on the right": (
        CH4, [("Js = [0.3 * torch.randn", [("term = Js[l] @ term", "term = term @ Js[l]")])],
        "torch.testing.assert_close(expansion, product"),
    "4 zero writes: only the attention's write zeroed": (
        CH4, [("lazy = TransformerBlock(16, 4)", [("(lazy.attn.out_proj, lazy.mlp.fc2)", "(lazy.attn.out_proj,)")])],
        "assert torch.equal(lazy(x), x)"),
    "4 gradient highway: the gradient not divided by ‖g‖": (
        CH4, [("def gradient_profile", [("float(gr.norm() / g.norm())", "float(gr.norm())")])],
        "assert math.isclose(profiles[residual][8][0]"),
    "4 gradient highway: residuals left on in the plain stack": (
        CH4, [("def gradient_profile", [("n_heads=4), residual=residual)", "n_heads=4), residual=True)")])],
        "assert np.all(np.diff(at_input[False]) < 0)"),
    "4 erratum: the residual left out of the stack": (
        CH4, [("def stack(W, depth=10)", [("t := t + W @ t", "t := W @ t")])],
        "assert torch.equal(stack(-I8, depth=1)"),
    "4 erratum: the small part not kept off u": (
        CH4, [("P = I8 - torch.outer(u, u)", [("P = I8 - torch.outer(u, u)", "P = I8")])],
        "assert abs(along_u / 0.1**10 - 1) < 1e-6"),
    "4 sweep: the from-scratch Jacobian keeps the identity": (
        CH4, [("def scaled_gpt(s, seed", [("J_probe - torch.eye(x_one.numel(), dtype=f64)", "J_probe")])],
        "assert math.isclose(J_probe_norm.item()"),
    "4 sweep: sub-layers that write nothing": (
        CH4, [("def scaled_gpt(s, seed", [("p.mul_(s)", "p.mul_(0.0)")])],
        "assert np.all(through[:, -1] > 2)"),
    "4 sweep: the bound from the Jacobians of the first scale only": (
        CH4, [("def scaled_gpt(s, seed", [("residual_jacobian_norms(scaled_gpt(s, 0).blocks, x_one)",
                                            "residual_jacobian_norms(scaled_gpt(1, 0).blocks, x_one)")])],
        "assert np.all(deviation[0] <= bound_s)"),
    "4 pre/post-norm: both stacks pre-norm": (
        CH4, [("def xavier_(model)", [("n_heads=4, norm_first=norm_first,", "n_heads=4, norm_first=True,"),
                                     ("final_norm=norm_first", "final_norm=True")])],
        "assert pre_mean < 0.65 < 0.8 < post_mean"),
    "4 pre/post-norm: Xavier's initialisation never applied": (
        CH4, [("def xavier_(model)", [("nn.init.xavier_uniform_(p)", "pass")])],
        'assert min(writes24["Xavier", nf].min()'),
    "4 pre/post-norm: no embedding norm": (
        CH4, [("def xavier_(model)", [("embedding_norm=True,", "embedding_norm=False,")])],
        "assert post_vs_pre < 0.02"),
    "4 pre/post-norm: the stream records the states as the writes": (
        CH4, [("lib:transformer_lib.model:GPT.forward", [("recording(self.blocks, stream)",
                                                          "recording(self.blocks, Stream(stream.writes, stream.states))")]),
              ("def xavier_(model)", [])],
        'assert max(writes24["GPT-2", nf].max()'),
    "4 no embedding norm: the norm always applied": (
        CH4, [("lib:transformer_lib.model:GPT.__init__", [("self.emb_norm = _make_norm(c) if c.embedding_norm else nn.Identity()",
                                                          "self.emb_norm = _make_norm(c)")]),
              ("def post_norm_block_gradients", [])],
        "assert first_vs_rest.min() > 5"),
    "4 embedding-norm control: the norm never applied": (
        CH4, [("lib:transformer_lib.model:GPT.__init__", [("self.emb_norm = _make_norm(c) if c.embedding_norm else nn.Identity()",
                                                          "self.emb_norm = nn.Identity()")]),
              ("def post_norm_block_gradients", [])],
        "assert with_spread.max() < 1.3"),
    "4 sorter training: the learning rate's exponent mistyped": (
        CH4, [("V, n_sort = 10, 4", [("steps=120, lr=3e-3", "steps=12, lr=3e-9")])],
        "assert losses[-1] < 0.5 * losses[0]"),
    "4 decomposition: the embedding left out": (
        CH4, [("sorter64 = GPT(sorter.config)", [("total = st.states[0] + sum(st.writes)",
                                                  "total = sum(st.writes)")])],
        "torch.testing.assert_close(total, st.states[-1]"),
    "4 logit lens: each reading scored against the previous position's answer": (
        CH4, [("mask = y_test != -100", [("(logit_lens(sorter64, s).argmax(-1)[mask]",
                                          "(logit_lens(sorter64, s).argmax(-1).roll(1, dims=1)[mask]")])],
        "assert lens_acc[-1] > baseline + 0.2"),
    "4 logit lens: every position scored, not the answers": (
        CH4, [("mask = y_test != -100", [("mask = y_test != -100", "mask = torch.ones_like(y_test, dtype=torch.bool)")])],
        "assert (mask.sum(1) == n_sort).all()"),

    "4 attribution: the final norm's scale recomputed for each component": (
        CH4, [("def attribution_by_sublayer", [("/ sigma * model.norm_f.weight",
                                                "/ c.std(-1, unbiased=False, keepdim=True) * model.norm_f.weight")])],
        "torch.testing.assert_close(by_sublayer.sum(0), logit_predicted"),
    "4 attribution: the final norm's bias left out": (
        CH4, [("def attribution_by_sublayer", [("+ [(model.norm_f.bias * w_u).sum(-1)]", "")])],
        "torch.testing.assert_close(by_sublayer.sum(0), logit_predicted"),
    "4 attribution: each head's write taken from the wrong rows of W_O": (
        CH4, [("lib:transformer_lib.multihead:MultiHeadAttention._write", [("self.out_proj.weight.T.reshape(", "self.out_proj.weight.reshape(")]),
              ("from transformer_lib.attribution import direct_logit_attribution", [])],
        "torch.testing.assert_close(per_sublayer, by_sublayer"),
    "4 attribution: the components not centred by the final norm": (
        CH4, [("lib:transformer_lib.attribution:_frozen_norm", [("c = c - c.mean(dim=-1, keepdim=True) if centre else c", "c = c")]),
              ("from transformer_lib.attribution import direct_logit_attribution", [])],
        "torch.testing.assert_close(per_sublayer, by_sublayer"),
    "4 attribution: the block adds the MLP's write to the block's input": (
        CH4, [("lib:transformer_lib.block:TransformerBlock.forward", [("out = self.hook_resid_post(skip(x1) + m)",
                                                                      "out = self.hook_resid_post(skip(x) + m)")]),
              ("from transformer_lib.attribution import direct_logit_attribution", [])],
        "torch.testing.assert_close(logits_cached, logits64"),
    "4 attribution: the MLPs' shares filed under the attention bias": (
        CH4, [("lib:transformer_lib.attribution:direct_logit_attribution", [("labels.append(f\"L{l} b_O\")", "labels.append(f\"L{l} swap\")"),
                                                                           ("labels.append(f\"L{l} MLP\")", "labels.append(f\"L{l} b_O\")"),
                                                                           ("labels.append(f\"L{l} swap\")", "labels.append(f\"L{l} MLP\")")]),
              ("from transformer_lib.attribution import direct_logit_attribution",
               [("torch.testing.assert_close(per_sublayer, by_sublayer, atol=1e-10, rtol=0)", "pass")]),
              ("share = dla.values[:, mask]", [])],
        "assert mlp_frac > 0.6"),
    "4 heads removed: run_with_patch ignores its patches": (
        CH4, [("lib:transformer_lib.patching:_run", [("act = _apply(name, patches[name], act)", "pass")]),
              ("share = dla.values[:, mask]", [])],
        "assert cost[costly] - cost[cheap] > 0.04"),
    "4 heads removed: the head of the next block mean-ablated": (
        CH4, [("share = dla.values[:, mask]", [('{f"blocks.{l}.attn.hook_z": to_mean}', '{f"blocks.{(l + 1) % n_blocks}.attn.hook_z": to_mean}')])],
        "assert worst.startswith(\"L0H\") and cost[worst] > 0.1"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a broken cell may meet a nan
@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(CH4, BROKEN) == []
