"""Chapter 9, parameter and FLOP counting: each check cell fails when the code it guards is broken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import check_fails_when_broken, uncovered_check_cells

CH9 = "09_parameter_and_flop_counting"
LAST = "def minimal(q, k, v)"  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none


# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line
#        [, [(module, name, make_broken), ...] library patches]).
# The last cell of the list is the check cell; the ones before it define what it uses.
BROKEN = {
    "9 MiniLM file: the position_ids buffer counted as parameters": (
        CH9, [("from safetensors import safe_open", [('[k for k in shapes if k.endswith("position_ids")]', "[]")])],
        'assert in_file == counts["all-MiniLM-L6-v2"]'),
    "9 GPT-2 formula: the final norm forgotten": (
        CH9, [("def gpt2_params", [("n_ctx * d + 2 * d", "n_ctx * d")])], "assert ours == param_count(gpt2)"),
    "9 GPT-2 formula: the MLP biases as 4d": (
        CH9, [("def gpt2_params", [("8 * d * d + 5 * d", "8 * d * d + 4 * d")])], "assert ours == param_count(gpt2)"),
    "9 transformers: LLaMA built without GQA": (
        CH9, [("def hf_gpt2(c)", [("        num_key_value_heads=c.n_kv_heads, ", "        ")])],
        "assert formula == reference == built"),
    "9 GPT-3 matrices: one Q, K, V matrix per layer, not per head": (
        CH9, [("stated = {", [("(L * heads * 3, d, d_head)", "(L * 3, d, d_head)")])],
        "assert (n_matrices, matrix_total) =="),
    "9 rule of thumb: 12Ld² without the vocabulary": (
        CH9, [("def matrix_count(c)", [("rough = 12 * c.n_layers * c.d_model**2 + c.vocab_size * c.d_model",
                                        "rough = 12 * c.n_layers * c.d_model**2")])],
        "assert all(-0.02 < rule_error[m][0] < 0 for m in gpt_style)"),
    "9 matrix count: SwiGLU with two matrices": (
        CH9, [("def matrix_count(c)", [('k = 3 if c.mlp == "swiglu" else 2', "k = 2")])],
        "assert all(abs(rule_error[m][1]) < 1e-4 for m in llama)"),
    "9 matrix count: K and V as wide as Q (GQA ignored)": (
        CH9, [("def matrix_count(c)", [("2 * d * c.kv_dim", "2 * d * d")])],
        "assert all(abs(rule_error[m][1]) < 1e-4 for m in llama)"),
    "9 published counts: vocabulary gain against the wrong model": (
        CH9, [("bert_large_heads = count_params", [('counts["LLaMA-3 70B"] - counts["LLaMA-2 70B"]',
                                                    'counts["LLaMA-3 70B"] - counts["LLaMA-2 7B"]')])],
        "assert rest_2 == rest_3 and tables_3 - tables_2 == vocab_gain"),
    "9 shares: the library's breakdown without the norms": (
        CH9, [("stated = {", []), ('GROUP = {"tok_emb"', [])],
        "assert found == shares[name], name",
        [("transformer_lib.counting", "_norm_params", lambda original: lambda c: 0)]),
    "9 FLOPs from scratch: A·V forgotten": (
        CH9, [("def my_flops_per_token", [("attention = 2 * n * d + 2 * n * d", "attention = 2 * n * d")])],
        "assert my_flops_per_token(PRESETS[preset], n) == flops_per_token(PRESETS[preset], n)"),
    "9 FLOPs by counter: the library counts A·V once": (
        CH9, [("small = ModelConfig(vocab_size=97", [])],
        "assert flops_per_token(c, n) * n == flops, (label, n)",
        [("transformer_lib.counting", "flops_breakdown", lambda original: lambda config, n: {
            **original(config, n), "attention_scores": original(config, n)["attention_scores"] // 2})]),
    "9 FLOPs by counter: every variant run with the first config": (
        CH9, [("small = ModelConfig(vocab_size=97", [("model = GPT(c).eval()", "model = GPT(small).eval()")])],
        "assert flops_per_token(c, n) * n == flops, (label, n)"),
    "9 FLOPs by counter: the model built one layer deeper": (
        CH9, [("small = ModelConfig(vocab_size=97", [("model = GPT(c).eval()",
                                                      "model = GPT(replace(c, n_layers=c.n_layers + 1)).eval()")])],
        "assert quadratic == [4 * c.n_layers * c.d_model] * 2"),
    "9 training: the blocks' weights frozen": (
        CH9, [("train_ratio = {}", [("    model = GPT(c)\n", "    model = GPT(c)\n    model.blocks.requires_grad_(False)\n")])],
        "assert training.get_total_flops() == 3 * forward.get_total_flops()"),
    "9 training FLOPs: the forward pass only": (
        CH9, [("D_tokens = 300e9", [("train = 6 * N3 * D_tokens", "train = 2 * N3 * D_tokens")])],
        "assert abs(train / published - 1) < 0.005"),
    "9 PF-days: a petaFLOP/s for an hour": (
        CH9, [("PF_DAY = 1e15", [("PF_DAY = 1e15 * 86_400", "PF_DAY = 1e15 * 3_600")])],
        "assert abs(pf_days / 3640 - 1) < 0.005"),
    "9 crossover: QKᵀ counted, AV forgotten": (
        CH9, [("def crossover(c)", [("weights / (4 * c.d_model)", "weights / (2 * c.d_model)")])],
        "assert attention == weights, (c.mlp, attention, weights)"),
    "9 crossover: the library's SwiGLU with two matrices": (
        CH9, [("def crossover(c)", [])],
        "assert attention == weights, (c.mlp, attention, weights)",
        [("transformer_lib.counting", "_mlp_matrices", lambda original: lambda c: 2)]),
    "9 doubling n: the model attends to a window of 16 keys": (
        CH9, [("lib:transformer_lib.multihead:MultiHeadAttention.forward",
               [("_scores(q, k, mask, bias)", "_scores(q, k[..., -16:, :], None if mask is None else mask[..., -16:], "
                                              "None if bias is None else bias[..., -16:])"),
                ("z = weights @ v", "z = weights @ v[..., -16:, :]")]),
              ("(a1, w1, _), (a2, w2, _) = measured_parts", [])],
        "assert a2 == 4 * a1 and w2 == 2 * w1"),
    "9 causal tiles: the causal flag not passed on": (
        CH9, [("n_c, block = 1024, 64", [("causal=causal, block_q=block", "causal=False, block_q=block")])],
        "assert tile_flops[True] * 2 * m == tile_flops[False] * (m + 1)"),
    "9 KV cache: K counted, V forgotten": (
        CH9, [("tiny = ModelConfig(vocab_size=50, n_ctx=64", [('layer["k"].numel() + layer["v"].numel()',
                                                              'layer["k"].numel()')])],
        "assert stored == kv_cache_size(tiny, 20)"),
    "9 KV cache: bytes without the 2 bytes a number": (
        CH9, [("tiny = ModelConfig(vocab_size=50, n_ctx=64", [("per_token = kv_cache_size(l3, 1) * 2",
                                                               "per_token = kv_cache_size(l3, 1)")])],
        "assert per_token == 327_680"),
    "9 decode: the step run without its cache": (
        CH9, [("def decode_flops(c, n)", [("lm_model(torch.zeros(1, 1, dtype=torch.long), cache=cache)",
                                           "lm_model(torch.zeros(1, 1, dtype=torch.long))")])],
        "assert step.get_total_flops() == decode_flops(lm, 21)"),
    "9 decode bytes: one cache read for the whole batch": (
        CH9, [("def weight_entries(c)", [("batch * kv_cache_size(c, n)", "kv_cache_size(c, n)")])],
        "assert bytes_held(half, cache) == decode_bytes(lm, 21, batch=3)"),
    "9 decode bytes: the library's cache size counts the keys only": (
        CH9, [("def weight_entries(c)", [])],
        "assert bytes_held(half, cache) == decode_bytes(lm, 21, batch=3)",
        [("transformer_lib.counting", "kv_cache_size", lambda original: lambda c, n: original(c, n) // 2)]),
    "9 decode bytes: the unembedding not read": (
        CH9, [("def weight_entries(c)", [("- 4 * c.n_layers * c.d_model) // 2",
                                          "- 4 * c.n_layers * c.d_model - 2 * c.d_model * c.vocab_size) // 2")])],
        "assert bytes_held(half, cache) == decode_bytes(lm, 21, batch=3)"),
    "9 intensity: one cache read for the whole batch, the byte check skipped": (
        CH9, [("def weight_entries(c)", [("batch * kv_cache_size(c, n)", "kv_cache_size(c, n)"),
                                         ("assert bytes_held(half, cache) == decode_bytes(lm, 21, batch=3)", "pass")]),
              ("batches = [1, 8, 64, 512]", [])],
        "assert all(decode[a] < decode[b] < limit"),
    "9 intensity: the bytes of one sequence at every batch": (
        CH9, [("def weight_entries(c)", [("/ decode_bytes(c, n, batch, bytes_per_number)",
                                          "/ decode_bytes(c, n, 1, bytes_per_number)")]),
              ("batches = [1, 8, 64, 512]", [])],
        "assert all(decode[a] < decode[b] < limit"),
    "9 prefill: the FLOPs of one token, not of the prompt": (
        CH9, [("batches = [1, 8, 64, 512]", [("prefill = forward_flops(l3, l3.n_ctx)", "prefill = flops_per_token(l3, l3.n_ctx)")])],
        "assert prefill > chip"),
    "9 scores at 128K: the attention drops the last key": (
        CH9, [("tiny = ModelConfig(vocab_size=50, n_ctx=64", [])],
        "assert scores_binary == n128**2",
        [("transformer_lib.attention", "scaled_dot_product_attention", lambda original: (
            lambda q, k, v, mask=None, bias=None: original(q, k[..., :-1, :], v[..., :-1, :])))]),
    "9 online softmax: the running output not rescaled": (
        CH9, [("def online_attention", [("a = torch.exp(m - m_new) * a + p @ v", "a = a + p @ v")])],
        "torch.testing.assert_close(online_attention(q, k, v, block=32), explicit"),
    "9 online softmax: the running sum not rescaled": (
        CH9, [("def online_attention", [("ell = torch.exp(m - m_new) * ell + p.sum", "ell = ell + p.sum")])],
        "torch.testing.assert_close(online_attention(q, k, v, block=32), explicit"),
    "9 tiled: the causal flag not passed on": (
        CH9, [("for dtype, tol in [(torch.float32", [("tiled_attention(q, k, v, causal=causal,",
                                                      "tiled_attention(q, k, v, causal=False,")])],
        "torch.testing.assert_close(got, reference"),
    "9 memory wall: a key block as long as the sequence": (
        CH9, [("wall_ns = [256", [("block_q=256, block_k=256)", "block_q=256, block_k=2048)")])],
        "assert np.all(tiled_peak[1:] == tiled_peak[1])"),
    "9 speed: the library given K and V swapped": (
        CH9, [("def minimal(q, k, v)", [('"library": lambda: scaled_dot_product_attention(q, k, v)',
                                         '"library": lambda: scaled_dot_product_attention(q, v, k)'),
                                        ("for _ in range(7):", "for _ in range(1):")])],
        'torch.testing.assert_close(runs["library"]()[0], runs["fused"]()'),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a broken cell may meet a nan
@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(CH9, BROKEN) == []
