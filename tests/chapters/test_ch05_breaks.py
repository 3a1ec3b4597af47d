"""Chapter 5, multi-head attention: each check cell fails when the code it guards is broken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import check_fails_when_broken, uncovered_check_cells

CH5 = "05_multi_head_attention"
LAST = 'out_name = f"blocks.{len(minilm.blocks) - 1}'  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none


# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line
#        [, [(module, name, make_broken), ...] library patches]).
# The last cell of the list is the check cell; the ones before it define what it uses.
BROKEN = {
    "5 split: reshaped without the transpose": (
        CH5, [("def split(x, h)", [("x.reshape(*lead, n, h, d // h).transpose(-3, -2)",
                                    "x.reshape(*lead, h, n, d // h)")]),
              ("x = torch.arange(12).reshape(3, 4)", [])],
        "assert torch.equal(good[i], x[:, 2 * i:2 * i + 2])"),
    "5 merge: reshaped without the transpose": (
        CH5, [("def split(x, h)", [("x.transpose(-3, -2).reshape(*lead, n, h * d_k)",
                                    "x.reshape(*lead, n, h * d_k)")]),
              ("x = torch.arange(12).reshape(3, 4)", [])],
        "assert torch.equal(merge(good), x)"),
    "5 heads: overlapping column slices in the loop": (
        CH5, [("def split(x, h)", [("slice(i * d_k, (i + 1) * d_k)", "slice(i, i + d_k)")]),
              ("d, h, n = 12, 3, 5", [])],
        "torch.testing.assert_close(out_batched, out_loop"),
    "5 heads: scaled by √n, not √d_k": (
        CH5, [("def split(x, h)", [("math.sqrt(q.shape[-1])", "math.sqrt(q.shape[-2])")]),
              ("d, h, n = 12, 3, 5", [])],
        "torch.testing.assert_close(out_lib, out_loop"),
    "5 running example: heads by reshape, no transpose": (
        CH5, [("ex = running_example()", [("(split_heads(M, n_heads) for M in (Q, K, V))",
                                           "(M.reshape(n_heads, 4, 2) for M in (Q, K, V))")])],
        "assert np.array_equal(S_heads[i].numpy(), Qn[:, cols]"),
    "5 running example: Q and K swapped": (
        CH5, [("Z_heads, A_heads = scaled_dot_product_attention(q, k, v)",
               [("A_heads = scaled_dot_product_attention(q, k, v)",
                 "A_heads = scaled_dot_product_attention(k, q, v)")])],
        "np.testing.assert_allclose(A_heads[i], A_np"),
    "5 four questions: √d_k not undone": (
        CH5, [("def hand_set", [("score * math.sqrt(d_k)", "score")])],
        "torch.testing.assert_close(four[t], torch.softmax(s, 0)"),
    "5 two neighbours: the two heads merged into one": (
        CH5, [("def two_head_copier", [("MultiHeadAttention(d_nb, 2, bias=False)", "MultiHeadAttention(d_nb, 1, bias=False)")])],
        "assert err_two < 1e-3"),
    "5 two neighbours: both heads look left": (
        CH5, [("def two_head_copier", [("enumerate((-1, 1))", "enumerate((-1, -1))")])],
        "assert err_two < 1e-3"),
    "5 two neighbours: the merged layer keeps two heads": (
        CH5, [("def two_head_copier", [("merged = MultiHeadAttention(d_nb, 1, bias=False)",
                                         "merged = MultiHeadAttention(d_nb, 2, bias=False)")])],
        "assert err_merged > 0.4"),
    "5 two neighbours trained: the two-head model built with one head": (
        CH5, [("def train_heads", [("layer = MultiHeadAttention(d_nb, n_heads)", "layer = MultiHeadAttention(d_nb, 1)")])],
        "assert trained[2] < 0.01"),
    "5 vs torch: the mask inverted in attend": (
        CH5, [("def split(x, h)", [("s.masked_fill(~mask,", "s.masked_fill(mask,")]),
              ("ref = nn.MultiheadAttention(d, h, bias=False", [])],
        "torch.testing.assert_close(got, out_ref"),
    "5 vs torch: torch given the allowed positions as its mask": (
        CH5, [("ref = nn.MultiheadAttention(d, h, bias=False", [("torch_mask = None if mask is None else ~mask",
                                                                "torch_mask = None if mask is None else mask")])],
        "torch.testing.assert_close(got, out_ref"),
    "5 vs torch with biases: ours always causal": (
        CH5, [("ref = nn.MultiheadAttention(d, h, bias=False", [("lib_b(x, mask=mask)", "lib_b(x, mask=cm)")])],
        "torch.testing.assert_close(lib_b(x, mask="),
    "5 parameters: every head counted full width": (
        CH5, [("d_pc = 12", [("split_heads(lin.weight.T, hh)[i].numel()", "lin.weight.numel()")])],
        "assert per_head == [3 * d_pc * (d_pc // hh)] * hh"),
    "5 parameters: three bias vectors, not four": (
        CH5, [("d_pc = 12", [("(4 * d_pc if bias else 0)", "(3 * d_pc if bias else 0)")])],
        "assert ours_n == torch_n == expected"),
    "5 FLOPs: a multiply-add counted once": (
        CH5, [("n_fl = 16", [("8 * n_fl * d_pc**2 + 4 * n_fl**2 * d_pc", "4 * n_fl * d_pc**2 + 2 * n_fl**2 * d_pc")])],
        "assert one_wide == closed_form"),
    "5 FLOPs: the layer keeps the fused kernel under the counter": (
        CH5, [("lib:transformer_lib.multihead:MultiHeadAttention._fused_ok", [("_torch_state.dispatch_mode_active() or ", "")]),
              ("n_fl = 16", [])],
        "assert counted == closed_form and hidden =="),
    "5 FLOPs: the counter sees the fused kernel's work": (
        CH5, [("n_fl = 16", [])],
        "assert counted == closed_form and hidden ==",
        [("torch.nn.functional", "scaled_dot_product_attention", lambda original: (
            lambda q, k, v, **kw: (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1) @ v))]),
    "5 FLOPs: the written-out fused path scores without 1/√d_k": (
        CH5, [("n_fl = 16", [("F.scaled_dot_product_attention(q, k, v)", "F.scaled_dot_product_attention(q, k, v, scale=1.0)")])],
        "torch.testing.assert_close(fused_path(layer, x_fl[None])"),
    "5 per-head writes: W_O sliced by columns": (
        CH5, [("E = randn(n, d, seed=9)", [("writes.append(head_i @ W_o[rows])",
                                            "writes.append(head_i @ W_o[:, rows].T)")])],
        "torch.testing.assert_close(concat, sum(writes)"),
    "5 GQA: the layer not causal": (
        CH5, [("d_g, h_g, n_g = 16, 8, 6", [("n_kv_heads=gg,\n                             causal=True)",
                                             "n_kv_heads=gg,\n                             causal=False)")])],
        "torch.testing.assert_close(out_g, ref_out"),
    "5 LLaMA cache: bytes without the 2 bytes a number": (
        CH5, [('cfg = PRESETS["llama3-70b"]', [("bytes_tok = 2 * kv_cache_size(cfg, 1)",
                                                "bytes_tok = kv_cache_size(cfg, 1)")])],
        "assert bytes_tok == 2 * 2 * L_l * g_l * dk_l"),
    "5 trained heads: attention read as columns": (
        CH5, [("from transformer_lib.bert import load_minilm", [("torch.stack(out_b.attentions)[:, 0]",
                                                              "torch.stack(out_b.attentions)[:, 0].transpose(-1, -2)")]),
              ("flat = prev.flatten()", [])],
        "assert best > 0.95"),
    "5 trained heads: the diagonal scored as the previous token": (
        CH5, [("from transformer_lib.bert import load_minilm", [("A_tr[:, :, rows, rows - 1]", "A_tr[:, :, rows, rows]")]),
              ("flat = prev.flatten()", [])],
        "assert best > 0.95"),
    "5 trained heads: the first word scored as [CLS]": (
        CH5, [("from transformer_lib.bert import load_minilm", [("A_tr[:, :, :, 0].mean(-1)", "A_tr[:, :, :, 1].mean(-1)")]),
              ("cls_layer, cls_head = divmod", [])],
        "assert float(cls.max()) > 0.8"),

    "5 patching: the hook swaps in the previous position": (
        CH5, [('sentence = "The board approved', [("z[:, i_tok, cols] = clean_z[:, i_tok, cols]",
                                                    "z[:, i_tok - 1, cols] = clean_z[:, i_tok - 1, cols]")]),
              ("from transformer_lib.patching import", [])],
        "torch.testing.assert_close(patched_cache[h_name][0, i_tok], h_patched"),
    "5 patching: the library patches the wrong head": (
        CH5, [("lib:transformer_lib.patching:_splice", [('"heads", patch.heads,', '"heads", (patch.heads + 1) % act.shape[head_axis],')]),
              ("from transformer_lib.patching import", [])],
        "torch.testing.assert_close(patched_cache[h_name][0, i_tok], h_patched"),
    "5 patching: the recovered fraction measured from the clean end": (
        CH5, [("lib:transformer_lib.patching:recovered_fraction", [("return (patched - corrupted) / (clean - corrupted)",
                                                                    "return (patched - clean) / (clean - corrupted)")]),
              ("from transformer_lib.patching import", [])],
        "assert abs(r_lib - r_hook) < 1e-4"),
    "5 controls: the library patches the wrong head": (
        CH5, [("lib:transformer_lib.patching:_splice", [('"heads", patch.heads,', '"heads", (patch.heads + 1) % act.shape[head_axis],')]),
              ('swaps = [("declining", "rising")', [])],
        "assert prev_r.min() > 0.15"),
    "5 controls: the previous-token head's values zeroed in the model": (
        CH5, [('sentence = "The board approved', [("w_o = minilm.blocks[prev_layer].attn.out_proj",
                                                    "import copy\nminilm = copy.deepcopy(minilm)\n"
                                                    "v_proj = minilm.blocks[prev_layer].attn.v_proj\n"
                                                    "v_proj.weight.data[prev_head * d_k:(prev_head + 1) * d_k] = 0\n"
                                                    "v_proj.bias.data[prev_head * d_k:(prev_head + 1) * d_k] = 0\n"
                                                    "w_o = minilm.blocks[prev_layer].attn.out_proj")]),
              ('swaps = [("declining", "rising")', [])],
        "assert prev_r.min() > 0.15"),
    "5 controls: the recovered fraction measured from the clean end": (
        CH5, [("lib:transformer_lib.patching:recovered_fraction", [("return (patched - corrupted) / (clean - corrupted)",
                                                                    "return (patched - clean) / (clean - corrupted)")]),
              ('swaps = [("declining", "rising")', [])],
        "assert np.abs(total_r - 1).max() < 0.1"),
    "5 downstream: the model cut after its first layer": (
        CH5, [('out_name = f"blocks.{len(minilm.blocks) - 1}', [("out_name = ", "import copy\nminilm = copy.deepcopy(minilm)\n"
                                                                             "minilm.blocks = minilm.blocks[:1]\nout_name = ")])],
        "assert (prev_final < prev_r).all()"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a broken cell may meet a nan
@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(CH5, BROKEN) == []
