"""Chapter 7, causal masking: each check cell fails when the code it guards is broken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import check_fails_when_broken, uncovered_check_cells

CH7 = "07_causal_masking"
LAST = "xattn = MultiHeadAttention(16, 2)"  # the last cell the cases need
# not run: the language model's training and what reads it (no case needs them; its claims are tested
# over five seeds in tests/claims/test_ch07_claims.py)
SKIP = ("steps=900, lr=6e-3", 'glue("val_loss"', "def line_stats", 'glue("sample_words"')


# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line
#        [, [(module, name, make_broken), ...] library patches]).
# The last cell of the list is the check cell; the ones before it define what it uses.
BROKEN = {
    "7 mask: the diagonal masked too": (
        CH7, [("def my_causal_mask", [("return j <= i", "return j < i")])],
        "assert np.array_equal(causal_mask(n).numpy(), my_causal_mask(n))"),
    "7 mask: the future allowed, the past masked": (
        CH7, [("def my_causal_mask", [("return j <= i", "return j >= i")])],
        "assert np.array_equal(causal_mask(n).numpy(), my_causal_mask(n))"),
    "7 mask after softmax: renormalised along the wrong axis": (
        CH7, [("A_after = A_full * my_causal_mask(n)", [("row_sums[:, None]", "row_sums[None, :]")])],
        "np.testing.assert_allclose(renorm, A_mine"),
    "7 fully masked row: the mask inverted": (
        CH7, [("big = torch.tensor(-1e9)", [("vv, mask=none)", "vv, mask=~none)")])],
        "assert torch.equal(w, torch.zeros(1, 3))"),
    "7 leakage: token t itself changed": (
        CH7, [("def leaks(model", [("y[:, t + 1:] = torch.randint(0, vocab, (2, n - t - 1)",
                                    "y[:, t:] = torch.randint(0, vocab, (2, n - t)")])],
        "assert leaks(GPT(cfg).eval()) == [], scheme"),
    "7 plain-torch GPT: the mask after the softmax": (
        CH7, [("def my_gpt(m, idx", [('.masked_fill(future, float("-inf"))', ""),
                                       ("(s.softmax(-1) @ v)", "(s.softmax(-1).masked_fill(future, 0.0) @ v)")])],
        "torch.testing.assert_close(my_gpt(tiny, x), tiny(x)"),
    "7 plain-torch GPT: the future visible": (
        CH7, [("def my_gpt(m, idx", [("future = ~torch.ones(n, t + n, dtype=torch.bool).tril(t)",
                                      "future = ~torch.ones(n, t + n, dtype=torch.bool)")])],
        "torch.testing.assert_close(my_gpt(tiny, x), tiny(x)"),
    "7 loss: the library's mean taken over every position, graded or not": (
        CH7, [("lib:transformer_lib.train:cross_entropy_loss",
               [("targets.reshape(-1), ignore_index=IGNORE_INDEX)",
                 'targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum") / targets.numel()')]),
              ("inputs, targets = x[:, :-1], x[:, 1:]", [])],
        "torch.testing.assert_close(cross_entropy_loss(logits, targets), by_hand"),
    "7 loss: evaluate_loss a plain mean of the batches' means": (
        CH7, [("lib:transformer_lib.train:evaluate_loss", [("count = float((targets != IGNORE_INDEX).sum())", "count = 1.0")]),
              ("inputs, targets = x[:, :-1], x[:, 1:]", [])],
        "assert abs(evaluate_loss(lm, two_batches) - by_hand.item()) < 1e-12"),
    "7 baselines: unigram loss averaged over the vocabulary": (
        CH7, [("def unigram_bigram", [("-(uni / uni.sum())[va].log().mean()", "-(uni / uni.sum()).log().mean()")])],
        "assert bigram_val < unigram_val < math.log(Vc)"),
    "7 baselines: bigram normalised over the previous character": (
        CH7, [("def unigram_bigram", [("(C + alpha).sum(1, keepdim=True)", "(C + alpha).sum(0, keepdim=True)")])],
        "assert torch.allclose(P.sum(1)"),
    "7 language model: the learning rate's exponent mistyped": (
        CH7, [("steps=900, lr=6e-3", [("steps=900, lr=6e-3", "steps=30, lr=6e-9")])],
        "assert margin > 0.3"),
    "7 induction: the previous occurrence, not the token after it": (
        CH7, [("xi, yi = induction_task(512", [("maps[1][rows, :, q_pos, k_pos]",
                                                "maps[1][rows, :, q_pos, k_pos - 1]")])],
        "assert worst_by_head.min() > 0.5"),
    "7 patching: the patch takes the other head": (
        CH7, [("def head_from(source", [("positions=positions, heads=head)", "positions=positions, heads=1 - head)")]),
              ("# the patch changes what it should", [])],
        "assert r_prev > 0.5 and att_prev.min() > 0.45"),
    "7 patching: the patch at the position before the chosen one": (
        CH7, [("def head_from(source", [("positions=positions, heads=head)",
                                         "positions=np.subtract(positions, 1).tolist(), heads=head)")]),
              ("# the patch changes what it should", [])],
        "assert r_prev > 0.5 and att_prev.min() > 0.45"),
    "7 patching: the patch ignores its source and takes the clean run's": (
        CH7, [("def head_from(source", [("Patch(source[name]", "Patch(clean[name]")]),
              ("# the patch changes what it should", [])],
        "assert abs(r_mis) < 0.2 and r_prev - r_mis > 0.4"),
    "7 patching: layer 2's head 1 silenced (one induction head left)": (
        CH7, [("def head_from(source", [("PT_GAP = 3\n", "PT_GAP = 3\nind_model = copy.deepcopy(ind_model)\n"
                                        "with torch.no_grad():\n    ind_model.attn[1].out_proj.weight[:, 16:] = 0\n")]),
              ("# the patch changes what it should", [])],
        "assert min(r_induction) > 0.5"),
    "7 patching: the patch takes every head of the layer": (
        CH7, [("def head_from(source", [("positions=positions, heads=head)", "positions=positions, heads=None)")]),
              ("# the patch changes what it should", [])],
        "assert r_other < 0.45 and r_prev - r_other > 0.1"),
    "7 patching: the library's recovered fraction measured from the clean end": (
        CH7, [("lib:transformer_lib.patching:recovered_fraction", [("return (patched - corrupted) / (clean - corrupted)",
                                                                    "return (clean - patched) / (clean - corrupted)")]),
              ("def head_from(source", []), ("# the patch changes what it should", [])],
        "assert r_prev > 0.5 and att_prev.min() > 0.45"),
    "7 patching map: layer 2's rows patch layer 1": (
        CH7, [("patch_map = np.zeros(", [("head_from(clean, l, h, [p])", "head_from(clean, 0, h, [p])")])],
        "assert np.abs(patch_map[~expected]).max() < 0.05"),
    "7 q, k, v: the keys patched at the queries' positions": (
        CH7, [("inputs = {\"k\": answers", [('inputs = {"k": answers,', 'inputs = {"k": queries,')])],
        'assert r_input["k"] > 0.5'),
    "7 q, k, v: the library's hook points for queries and keys swapped": (
        CH7, [("lib:transformer_lib.multihead:MultiHeadAttention.forward", [("q = self.hook_q(", "q = self.hook_k("),
                                                                           ("k = self.hook_k(", "k = self.hook_q(")]),
              ("inputs = {\"k\": answers", [])],
        'assert r_input["k"] > 0.5'),
    "7 generate: the library's cache forgets how many tokens it holds": (
        CH7, [("lib:transformer_lib.model:GPT._cache_len", [("return 0 if k is None else k.shape[-2]", "return 0")]),
              ("gen_gpt = GPT(ModelConfig(vocab_size=50", [])],
        "assert torch.equal(greedy_c, greedy_n) and torch.equal(samp[0], samp[1])"),
    "7 generate: the library's cached steps rerun the whole window": (
        CH7, [("lib:transformer_lib.model:GPT.generate", [("logits = self(idx[:, -1:], cache=cache)",
                                                          "cache = [{} for _ in self.blocks]; "
                                                          "logits = self(idx[:, -n_ctx:], cache=cache)")]),
              ("gen_gpt = GPT(ModelConfig(vocab_size=50", [])],
        "assert len(rows_c) == 4 and all(r == prompt_then_one"),
    "7 KV cache from scratch: every step starts from an empty cache and reruns the window": (
        CH7, [("def my_generate", [("logits = my_gpt(m, next_id, cache)",
                                    "cache = [{} for _ in m.blocks]; logits = my_gpt(m, idx, cache)")])],
        "assert all(r == [start.shape[1]] + [1] * 40"),
    "7 KV cache from scratch: the new token's position restarts at 0": (
        CH7, [("def my_gpt(m, idx", [("m.pos_emb.weight[t:t + n]", "m.pos_emb.weight[:n]")]),
              ("def my_generate", [])],
        "assert torch.equal(mine, gen64.generate(start, 40, temperature=0, use_cache=True))"),
    "7 KV cache from scratch: the new queries' mask not moved past the cached keys": (
        CH7, [("def my_gpt(m, idx", [("dtype=torch.bool).tril(t)", "dtype=torch.bool).tril()")]),
              ("def my_generate", [])],
        "assert torch.equal(mine, gen64.generate(start, 40, temperature=0, use_cache=True))"),
    "7 KV cache timing: the cached step reruns the window": (
        CH7, [("def step_seconds(model, lengths", [("model(x[:, n - 1:n], cache=[dict(c) for c in caches[n]])",
                                                    "model(x[:, :n])")])],
        "assert abs(rise_cache) < 0.25 * rise_full"),
    "7 KV cache: bytes for K or V only": (
        CH7, [("mistral_7b = ModelConfig", [("kv_bytes = 2 * c.n_layers", "kv_bytes = c.n_layers")])],
        "assert stored == 10 * kv_bytes"),
    "7 KV cache: Chapter 9's count ignores grouped-query attention": (
        CH7, [("lib:transformer_lib.counting:kv_cache_size", [("2 * config.n_layers * n * config.kv_dim",
                                                              "2 * config.n_layers * n * config.d_model")]),
              ("mistral_7b = ModelConfig", [])],
        "assert per_token == 2 * kv_cache_size(cfg, 1)"),
    "7 MLM: 20% random tokens, none kept": (
        CH7, [("def mlm_corrupt", [("rnd = chosen & (u >= 0.8) & (u < 0.9)", "rnd = chosen & (u >= 0.8)")])],
        "assert abs(kept - (0.1 + 0.1 / vocab_m))"),
    "7 MLM: the library's loss averaged over the unchosen positions too": (
        CH7, [("lib:transformer_lib.train:cross_entropy_loss",
               [("targets.reshape(-1), ignore_index=IGNORE_INDEX)",
                 'targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum") / targets.numel()')]),
              ("def mlm_corrupt", [])],
        "torch.testing.assert_close(cross_entropy_loss(logits_m, tgt[:n_loss])"),
    "7 cross-attention: attends to itself": (
        CH7, [("xattn = MultiHeadAttention(16, 2)", [("xattn(dec, context=enc, return_weights=True)",
                                                      "xattn(dec, return_weights=True)")])],
        "torch.testing.assert_close(w, torch.softmax"),
    "7 fox and dog: no causal mask": (
        CH7, [("published = {3:", [("mask=causal_mask(nw), bias=S_fox", "bias=S_fox")])],
        "assert torch.all(A_fox.triu(1) == 0)"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a broken cell may meet a nan
@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(CH7, BROKEN) == []
