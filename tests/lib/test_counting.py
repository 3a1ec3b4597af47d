"""Exact parameter and FLOP counts (Chapter 9): closed form vs built models vs FlopCounterMode."""
from __future__ import annotations

import pytest
import torch
import transformers  # a pinned test dependency: a missing install must fail, not skip
from torch.utils.flop_counter import FlopCounterMode

from transformer_lib.config import ModelConfig
from transformer_lib.counting import (PRESETS, count_params, flops_breakdown, flops_per_token,
                                      forward_flops, kv_cache_size, param_breakdown, param_count)
from transformer_lib.model import GPT


def _gpt2_like(c: ModelConfig) -> torch.nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.n_ctx, n_embd=c.d_model, n_layer=c.n_layers,
        n_head=c.n_heads))


def _bert_like(c: ModelConfig) -> torch.nn.Module:
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=c.vocab_size, max_position_embeddings=c.n_ctx, hidden_size=c.d_model,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, intermediate_size=c.d_ff,
        type_vocab_size=c.n_token_types))


def _llama_like(c: ModelConfig) -> torch.nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=c.vocab_size, max_position_embeddings=c.n_ctx, hidden_size=c.d_model,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads, intermediate_size=c.d_ff,
        tie_word_embeddings=c.tied_embeddings))


# preset -> (Hugging Face builder, total stated in the syllabus)
REFERENCE = {
    "gpt2": (_gpt2_like, 124_439_808),
    "gpt2-medium": (_gpt2_like, 354_823_168),
    "bert-base": (_bert_like, 109_482_240),
    "llama2-7b": (_llama_like, 6_738_415_616),
    "llama3-70b": (_llama_like, 70_553_706_496),
    "gpt3": (_gpt2_like, 174_604_259_328),
}


@pytest.mark.parametrize("name", list(REFERENCE))
def test_param_count_matches_transformers(name):
    build, stated = REFERENCE[name]
    config = PRESETS[name]
    with torch.device("meta"):
        reference = build(config)
    assert param_count(config) == count_params(reference)
    assert param_count(config) == stated


@pytest.mark.parametrize("name", ["gpt2", "llama2-7b", "llama3-70b", "gpt3", "tiny"])
def test_param_count_matches_our_gpt_on_meta(name):
    with torch.device("meta"):
        model = GPT(PRESETS[name])
    assert count_params(model) == param_count(PRESETS[name])


def test_gpt2_breakdown_by_hand():
    """GPT-2 small, each group worked out by hand (V = 50257, n_ctx = 1024, d = 768, L = 12)."""
    assert param_breakdown(PRESETS["gpt2"]) == {
        "embedding": 50257 * 768,                            # 38,597,376
        "positional": 1024 * 768,                            # 786,432
        "attention": 12 * (4 * 768 * 768 + 4 * 768),         # Q, K, V, O and their biases
        "mlp": 12 * (2 * 768 * 3072 + 3072 + 768),           # up, down and their biases
        "norms": (2 * 12 + 1) * 2 * 768,                     # 25 LayerNorms, gain and shift
        "unembedding": 0,                                    # tied
        "other": 0,
    }


GROUPS = {"tok_emb": "embedding", "pos_emb": "positional", "attn": "attention", "mlp": "mlp",
          "norm1": "norms", "norm2": "norms", "norm_f": "norms", "emb_norm": "norms", "lm_head": "unembedding"}


@pytest.mark.parametrize("changes", [{}, dict(positional="sinusoidal", embedding_norm=True, tied_embeddings=False),
                                     dict(mlp="swiglu", norm="rmsnorm", bias=False, n_kv_heads=1,
                                          positional="rope", final_norm=False),
                                     dict(positional="alibi", n_kv_heads=2, d_ff=40),
                                     dict(norm="rmsnorm", bias=True, mlp="swiglu", n_kv_heads=2),
                                     dict(norm="layernorm", bias=False, embedding_norm=True)])
def test_breakdown_matches_the_built_model_group_by_group(changes):
    """Each group against the parameters of the GPT submodules it names (meta device)."""
    config = ModelConfig(vocab_size=37, n_ctx=16, d_model=24, n_layers=3, n_heads=4, **changes)
    with torch.device("meta"):
        model = GPT(config)
    counted = dict.fromkeys(param_breakdown(config), 0)
    for name, p in model.named_parameters():
        part = next(GROUPS[key] for key in name.split(".") if key in GROUPS)
        counted[part] += p.numel()
    assert counted == param_breakdown(config)


def test_kv_cache_size_by_hand_and_in_a_built_cache():
    """Numbers stored for K and V: 2 · L · n · n_kv_heads · d_head, worked out by hand for
    GPT-2 and LLaMA-3-70B (8 KV heads of 128), and counted in a real cache of a GQA model."""
    assert kv_cache_size(PRESETS["gpt2"], 1024) == 2 * 12 * 1024 * 768 == 18_874_368
    assert kv_cache_size(PRESETS["llama3-70b"], 8192) == 2 * 80 * 8192 * (8 * 128) == 1_342_177_280
    c = PRESETS["llama3-70b"]                     # 64 query heads of 128 share 8 KV heads
    assert (c.d_head, c.kv_dim, c.n_groups) == (128, 1024, 8)
    config = ModelConfig(vocab_size=11, n_ctx=16, d_model=24, n_layers=3, n_heads=6, n_kv_heads=2)
    cache = [{} for _ in range(3)]
    with torch.no_grad():
        GPT(config)(torch.zeros(1, 10, dtype=torch.long), cache=cache)
    stored = sum(layer["k"].numel() + layer["v"].numel() for layer in cache)
    assert kv_cache_size(config, 10) == stored == 2 * 3 * 10 * 8


def test_gpt3_rough_formula_and_mlp_share():
    c = PRESETS["gpt3"]
    assert 12 * c.n_layers * c.d_model**2 == 173_946_175_488
    parts = param_breakdown(c)
    share = parts["mlp"] / (parts["mlp"] + parts["attention"])
    assert share == pytest.approx(2 / 3, abs=1e-3)


def test_llama_gqa_shrinks_attention():
    c = PRESETS["llama3-70b"]
    full = ModelConfig(**{**c.__dict__, "n_kv_heads": c.n_heads})
    saved = param_count(full) - param_count(c)
    assert saved == c.n_layers * 2 * c.d_model * (c.d_model - c.kv_dim)


def test_count_params_counts_tied_once():
    config = ModelConfig(vocab_size=11, n_ctx=8, d_model=16, n_layers=1, n_heads=2)
    tied, untied = GPT(config), GPT(ModelConfig(**{**config.__dict__, "tied_embeddings": False}))
    assert count_params(untied) - count_params(tied) == 11 * 16
    with pytest.raises(TypeError, match="module"):
        count_params("not a module")


# (config, n) pairs covering every branch that changes the matmul FLOPs.
FLOP_CASES = [
    (dict(), 5),
    (dict(mlp="swiglu", norm="rmsnorm", bias=False, positional="rope", tied_embeddings=False), 7),
    (dict(n_heads=4, n_kv_heads=2, positional="alibi"), 6),
    (dict(n_heads=4, n_kv_heads=1, positional="rope", d_ff=40), 1),
    (dict(positional="sinusoidal", mlp="relu", norm_first=False), 8),
    (dict(positional="none", mlp="gelu_tanh", n_layers=3), 3),
]


@pytest.mark.parametrize("changes,n", FLOP_CASES)
def test_flops_match_flop_counter(changes, n):
    config = ModelConfig(**{**dict(vocab_size=23, n_ctx=8, d_model=16, n_layers=2,
                                   n_heads=2), **changes})
    model = GPT(config).eval()
    idx = torch.randint(0, config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(idx)
    assert flops_per_token(config, n) * n == counter.get_total_flops()
    assert forward_flops(config, n) == counter.get_total_flops()


def test_flops_approximately_2n_for_short_sequences():
    c = PRESETS["gpt2"]
    matmul_params = param_count(c) - param_breakdown(c)["positional"] - param_breakdown(c)["norms"]
    fpt = flops_per_token(c, 1)
    # biases are not matmul FLOPs, attention on 1 token is tiny: 2N within 0.1%
    assert fpt == pytest.approx(2 * matmul_params, rel=1e-3)
    # attention matmuls grow linearly with n: 4·L·d per extra token
    assert flops_per_token(c, 101) - flops_per_token(c, 100) == 4 * c.n_layers * c.d_model


def test_attention_dominates_when_n_exceeds_d():
    c = PRESETS["llama2-7b"]
    short, long = flops_breakdown(c, 512), flops_breakdown(c, 128 * 1024)
    assert short["attention_scores"] < short["mlp"]
    assert long["attention_scores"] > long["mlp"]
    assert kv_cache_size(c, 2048) == 2 * kv_cache_size(c, 1024)


def test_pooler_flops_are_averaged():
    c = PRESETS["bert-base"]
    assert flops_per_token(c, 7) * 7 == pytest.approx(forward_flops(c, 7), rel=1e-15)
    assert flops_breakdown(c, 7)["unembedding"] == 0


@pytest.mark.parametrize("bad,error", [(0, ValueError), (-3, ValueError), (2.5, TypeError),
                                       (True, TypeError)])
def test_bad_sequence_length(bad, error):
    with pytest.raises(error, match="n: expected an int"):
        flops_per_token(PRESETS["tiny"], bad)


def test_bad_config_argument():
    with pytest.raises(TypeError, match="config: expected a ModelConfig"):
        param_count({"d_model": 8})


def test_argument_errors_name_the_argument_the_expected_and_the_actual_value():
    tiny = PRESETS["tiny"]
    cases = [(count_params, ("not a module",), TypeError, "module: expected a torch.nn.Module, got str"),
             (param_count, ({},), TypeError, "config: expected a ModelConfig, got dict"),
             (param_breakdown, (tiny, 1), TypeError, r"active: expected a bool, got int \(1\)"),
             (flops_breakdown, ({}, 3), TypeError, "config: expected a ModelConfig, got dict"),
             (flops_breakdown, (tiny, 0), ValueError, "n: expected an int >= 1, got 0"),
             (kv_cache_size, ({}, 3), TypeError, "config: expected a ModelConfig, got dict"),
             (kv_cache_size, (tiny, 0), ValueError, "n: expected an int >= 1, got 0")]
    for fn, args, error, message in cases:
        with pytest.raises(error, match=f"^{message}$"):
            fn(*args)


def test_flops_breakdown_of_the_tiny_preset_by_hand():
    """"tiny" (V = 65, d = 64, L = 2, d_ff = 256, GELU, tied head) on n = 5 tokens, every key."""
    assert flops_breakdown(PRESETS["tiny"], 5) == {
        "attention_proj": 2 * 2 * 5 * 4 * 64 * 64,        # Q, K, V, O: 4 d×d matmuls per token
        "attention_scores": 2 * 2 * 2 * 5 * 5 * 64,       # Q·Kᵀ and A·V over 5×5 scores
        "mlp": 2 * 2 * 5 * 2 * 64 * 256,                  # up and down
        "unembedding": 2 * 5 * 64 * 65,
        "other": 0,
    }
    total = sum(flops_breakdown(PRESETS["tiny"], 5).values())
    assert flops_per_token(PRESETS["tiny"], 5) == total // 5 and isinstance(flops_per_token(PRESETS["tiny"], 5), int)


def test_bert_pooler_flops_by_hand():
    """BERT's pooler is one d×d matmul on the first token: 2·768² FLOPs, whatever n; 7 tokens
    do not divide the total, so the per-token value is the float total / 7."""
    c = PRESETS["bert-base"]
    parts = flops_breakdown(c, 7)
    assert parts["other"] == 2 * 768 * 768 == flops_breakdown(c, 1)["other"]
    total = sum(parts.values())
    assert total % 7 != 0 and flops_per_token(c, 7) == total / 7 and isinstance(flops_per_token(c, 7), float)


@pytest.mark.parametrize("bias", [True, False])
def test_pooler_params_are_one_d_by_d_linear(bias):
    """'other' is the pooler, a d×d nn.Linear with a bias exactly when the config has biases."""
    c = ModelConfig(vocab_size=10, n_ctx=8, d_model=16, n_layers=1, n_heads=2, pooler=True, bias=bias,
                    lm_head=False, causal=False)
    assert param_breakdown(c)["other"] == count_params(torch.nn.Linear(16, 16, bias=bias)) == 16 * 16 + 16 * bias


def _counted(model: torch.nn.Module, idx: torch.Tensor, backward: bool = False) -> int:
    with FlopCounterMode(display=False) as counter:
        logits = model(idx)
        if backward:
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("changes", [dict(), dict(mlp="swiglu", norm="rmsnorm", bias=False, n_kv_heads=1,
                                                  tied_embeddings=False, positional="rope", d_ff=40)])
def test_the_n_squared_term_is_4Ld_as_measured(changes):
    """FlopCounterMode at n, 2n and 4n: total(n) = a·n + b·n², and b = (C(2n) − 2C(n)) / 2n² is the
    4·L·d of the attention matmuls, in the counter and in the formula."""
    config = ModelConfig(**{**dict(vocab_size=23, n_ctx=64, d_model=16, n_layers=3, n_heads=2), **changes})
    model = GPT(config).eval()
    with torch.no_grad():
        counted = {n: _counted(model, torch.zeros(1, n, dtype=torch.long)) for n in (8, 16, 32)}
    for n in (8, 16):
        assert (counted[2 * n] - 2 * counted[n]) / (2 * n * n) == 4 * config.n_layers * config.d_model
        assert (forward_flops(config, 2 * n) - 2 * forward_flops(config, n)) / (2 * n * n) \
            == 4 * config.n_layers * config.d_model


@pytest.mark.parametrize("changes", [dict(), dict(d_model=32, n_layers=3, n_heads=4, n_kv_heads=2,
                                                  mlp="swiglu", norm="rmsnorm", bias=False, tied_embeddings=False)])
def test_training_costs_three_forward_passes(changes):
    """Forward + backward of a cross-entropy loss: every matmul of the forward pass has two of the
    same size in the backward pass (input and weight gradients), so exactly 3 × forward = 6N + 12Lnd
    per token."""
    config = ModelConfig(**{**dict(vocab_size=23, n_ctx=16, d_model=16, n_layers=2, n_heads=2), **changes})
    torch.manual_seed(0)
    model = GPT(config)
    idx = torch.randint(0, config.vocab_size, (3, 16), generator=torch.Generator().manual_seed(0))
    forward = _counted(model, idx)
    assert forward == 3 * forward_flops(config, 16)
    assert _counted(model, idx, backward=True) == 3 * forward


@pytest.mark.parametrize("n,block", [(256, 64), (256, 32), (192, 64)])
def test_a_causal_mask_halves_the_attention_work_of_tiled_attention(n, block):
    """Tiled attention with causal=True skips the tiles above the diagonal: of m² tiles it computes
    m(m + 1)/2, so (m + 1)/2m of the FLOPs, which tends to one half."""
    from transformer_lib.tiled import tiled_attention
    q, k, v = (torch.randn(1, n, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    flops = {}
    for causal in (False, True):
        with FlopCounterMode(display=False) as counter:
            tiled_attention(q, k, v, causal=causal, block_q=block, block_k=block)
        flops[causal] = counter.get_total_flops()
    m = n // block
    assert flops[False] == 2 * 2 * n * n * 8
    assert flops[True] * 2 * m == flops[False] * (m + 1)


@pytest.mark.parametrize("tied", [True, False])
def test_a_model_without_an_lm_head_counts_no_unembedding(tied):
    """An encoder (no LM head) has no unembedding, whether or not the config says "tied":
    the parameters of the built `BertEncoder` and the FLOPs the counter sees in its forward pass
    (on the explicit attention path) are the closed forms', with 0 for the unembedding."""
    from transformer_lib.bert import BertEncoder

    c = ModelConfig(vocab_size=50, n_ctx=12, d_model=16, n_layers=2, n_heads=2, norm_first=False,
                    causal=False, n_token_types=2, embedding_norm=True, final_norm=False,
                    pooler=True, lm_head=False, tied_embeddings=tied)
    parts = param_breakdown(c)
    assert parts["unembedding"] == 0 and flops_breakdown(c, 9)["unembedding"] == 0
    torch.manual_seed(0)
    encoder = BertEncoder(c).eval()
    assert param_count(c) == count_params(encoder) == sum(parts.values())
    with FlopCounterMode(display=False) as counter:
        encoder(torch.randint(0, 50, (1, 9)))
    assert counter.get_total_flops() == forward_flops(c, 9)
