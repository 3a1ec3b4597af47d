"""Chapter 6, positional information: each check cell fails when the code it guards is broken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import check_fails_when_broken, uncovered_check_cells

CH6 = "06_positional_information"
LAST = "alibi_drop = mean_acc"  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none


# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line
#        [, [(module, name, make_broken), ...] library patches]).
# The last cell of the list is the check cell; the ones before it define what it uses.
BROKEN = {
    "6 symmetry: the layer causal although asked not to be": (
        CH6, [("lib:transformer_lib.multihead:MultiHeadAttention._mask_and_bias", [("if causal:", "if True:")]),
              ("perm = [0, 5, 2, 3, 4, 1]", [])],
        "torch.testing.assert_close(out_b, out_a[perm]"),
    "6 symmetry: the sinusoidal table all zeros": (
        CH6, [("lib:transformer_lib.positional:sinusoidal_encoding", [("return p.to(dtype)", "return (0 * p).to(dtype)")]),
              ("perm = [0, 5, 2, 3, 4, 1]", [])],
        "assert gap > 0.05"),
    "6 sinusoidal: sin and cos swapped": (
        CH6, [("def my_sinusoidal", [("P[:, 0::2] = torch.sin(i * omega)", "P[:, 0::2] = torch.cos(i * omega)")])],
        "torch.testing.assert_close(sinusoidal_encoding(4, 8"),
    "6 sinusoidal: exponent k/d": (
        CH6, [("def my_sinusoidal", [("torch.arange(0, d, 2, dtype=torch.float64) / d",
                                      "torch.arange(0, d // 2, dtype=torch.float64) / d")])],
        "torch.testing.assert_close(sinusoidal_encoding(4, 8"),
    "6 rotation: the library's frequencies 10000^(-k/d)": (
        CH6, [("lib:transformer_lib.positional:sinusoidal_encoding", [("base ** (two_k / d)", "base ** (two_k / 2 / d)")]),
              ("d_rot = 16", [])],
        "torch.testing.assert_close(P[i + delta, 2 * k:2 * k + 2], R @ P[i, 2 * k:2 * k + 2]"),
    "6 slowest period: the angle read as cos over sin": (
        CH6, [("def slowest_period(d)", [("math.atan2(p1[-2], p1[-1])", "math.atan2(p1[-1], p1[-2])")])],
        "assert abs(slowest_period(d_show) / formula - 1) < 1e-9"),
    "6 slowest period: the library's exponent divided by d − 2": (
        CH6, [("lib:transformer_lib.positional:sinusoidal_encoding", [("base ** (two_k / d)", "base ** (two_k / (d - 2))")]),
              ("def slowest_period(d)", [])],
        "assert abs(slowest_period(d_show) / formula - 1) < 1e-9"),
    "6 learned: the table read from row 1": (
        CH6, [("lib:transformer_lib.positional:LearnedPositionalEmbedding.forward",
               [("return self.weight[:positions]", "return self.weight[1:positions + 1]")]),
              ("learned = LearnedPositionalEmbedding(n_ctx=16, d=8)", [])],
        "torch.testing.assert_close(learned(5), my_rows"),
    "6 learned: GPT's table one row too long": (
        CH6, [("lib:transformer_lib.model:GPT.__init__", [("LearnedPositionalEmbedding(c.n_ctx, c.d_model)",
                                                          "LearnedPositionalEmbedding(c.n_ctx + 1, c.d_model)")]),
              ("learned = LearnedPositionalEmbedding(n_ctx=16, d=8)", [])],
        "assert gpt2.pos_emb.weight.shape == hf_gpt2.transformer.wpe.weight.shape"),
    "6 RoPE: rotate-half turns the wrong way": (
        CH6, [("def my_rope_interleaved", [("torch.cat([-x2, x1], dim=-1)", "torch.cat([x2, -x1], dim=-1)")])],
        "torch.testing.assert_close(apply_rope(x_r, pos_r), my_rope_half(x_r, pos_r)"),
    "6 RoPE: the library turns the wrong way": (
        CH6, [("lib:transformer_lib.positional:apply_rope", [("x1 * cos - x2 * sin, x2 * cos + x1 * sin",
                                                             "x1 * cos + x2 * sin, x2 * cos - x1 * sin")]),
              ("def my_rope_interleaved", [])],
        "torch.testing.assert_close(apply_rope(x_r, pos_r, interleaved=True)"),
    "6 worked example: the library pairs the halves when asked to interleave": (
        CH6, [("lib:transformer_lib.positional:apply_rope", [("if interleaved else x.chunk(2, dim=-1)",
                                                             "if False else x.chunk(2, dim=-1)")]),
              ("def rope_score4", [])],
        "assert abs(rope_score4(2, 1, library_rope) - by_hand) < 1e-12"),
    "6 relative scores: the library turns the wrong way": (
        CH6, [("lib:transformer_lib.positional:apply_rope", [("x1 * cos - x2 * sin, x2 * cos + x1 * sin",
                                                             "x1 * cos + x2 * sin, x2 * cos - x1 * sin")]),
              ("def closed_form_score", [])],
        "assert abs(rope_score(m, n) - closed_form_score(n - m)) < 1e-9"),
    "6 RoPE layer: apply_rope replaced by the identity inside the layer": (
        CH6, [("lib:transformer_lib.multihead:MultiHeadAttention._extend_cache",
               [("q = apply_rope(q, positions[:, None], self.rope_base)", "q = q"),
                ("k = apply_rope(k, positions[:, None], self.rope_base)", "k = k")]),
              ("from transformers import LlamaConfig", [])],
        "torch.testing.assert_close(w_lib, w_mine"),
    "6 RoPE layer: GPT builds its blocks without RoPE": (
        CH6, [("lib:transformer_lib.model:_make_block", [('rope=c.positional == "rope"', "rope=False")]),
              ("from transformers import LlamaConfig", [])],
        'assert shifts["rope"] < 1e-10 < 0.01 < min(shifts["learned"], stretches["rope"])'),
    "6 ALiBi: signed distance instead of |i − j| in the library": (
        CH6, [("lib:transformer_lib.positional:alibi_bias_at", [("distance = delta.abs() if symmetric else delta",
                                                                "distance = delta")]),
              ("def my_slopes(H)", [])],
        "torch.testing.assert_close(alibi_bias(n_a, 8, dtype=torch.float64), my_bias"),
    "6 ALiBi: six heads completed with the even slopes of twelve": (
        CH6, [("lib:transformer_lib.positional:alibi_slopes", [("geometric(2 * p)[0::2]", "geometric(2 * p)[1::2]")]),
              ("def my_slopes(H)", [])],
        "torch.testing.assert_close(alibi_slopes(H, torch.float64), bloom[:, 0, 1]"),
    "6 extrapolation: the limit left out of the learned model's error": (
        CH6, [("lib:transformer_lib.model:GPT._inputs", [('f"idx: expected at most n_ctx={c.n_ctx} tokens, got {where}"',
                                                         'f"idx: too many tokens, got {where}"')]),
              ("def train_scheme", [])],
        'assert s == "learned" and f > 1 and "n_ctx=16" in str(err)'),
    "6 extrapolation: ALiBi's bias left out of the scores": (
        CH6, [("lib:transformer_lib.multihead:MultiHeadAttention._mask_and_bias", [("if self.alibi:", "if False:")]),
              ("def train_scheme", []), ("alibi_drop = mean_acc", [])],
        "assert all(mean_acc[s, 1] > 0.8 for s in SCHEMES)"),
    # seed 0 comes from the set-up's models; seed 1 is trained with the library broken
    "6 five seeds: RoPE's rotation dropped inside the attention layer": (
        CH6, [("def window(a, first, last)", [("SEEDS = range(5)", "SEEDS = range(2)")])],
        "assert r4.mean() > a4.mean() + 0.05",
        [("transformer_lib.multihead", "apply_rope", lambda original: lambda x, *args, **kwargs: x)]),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a broken cell may meet a nan
@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(CH6, BROKEN) == []
