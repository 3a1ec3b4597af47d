"""End to end, inside the model, against a reference model (Chapters 6, 7 and 9).

Each positional scheme is tested where it is used, in a whole `GPT`: no leakage from future
tokens, the same tokens with and without the KV cache, and for RoPE and ALiBi attention
weights that do not move when every position is shifted by a constant (through the cache
offset and through explicit positions). Then the reference: tiny `LlamaForCausalLM` models
built from a `LlamaConfig` (random weights, nothing downloaded) loaded with
`GPT.from_llama_state_dict` give the same logits and the same greedy tokens as Hugging Face.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
import transformers  # a pinned test dependency: a missing install must fail, not skip
from torch.utils.flop_counter import FlopCounterMode
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import transformer_lib.multihead as multihead
from torch_helpers import D64, rand, randomize
from transformer_lib.block import RMSNorm, TransformerBlock
from transformer_lib.config import POSITIONAL_KINDS, ModelConfig
from transformer_lib.counting import count_params, forward_flops, kv_cache_size, param_count
from transformer_lib.model import GPT
from transformer_lib.multihead import MultiHeadAttention
from transformer_lib.positional import apply_rope

BASE = dict(vocab_size=29, n_ctx=16, d_model=16, n_layers=2, n_heads=4)


def ids(n: int, batch: int = 2, seed: int = 0, vocab: int = 29) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


def gpt(positional: str, seed: int = 0, **extra) -> GPT:
    """A float64 GPT with every weight random and large enough to matter."""
    config = ModelConfig(**{**BASE, "positional": positional, **extra})
    return randomize(GPT(config).double(), seed=seed).eval()


@pytest.fixture
def weights_seen(monkeypatch):
    """Every attention-weight tensor the model computes, layer by layer."""
    seen = []

    def recording(scores):
        w = weights(scores)
        seen.append(w)
        return w

    weights = multihead._weights
    monkeypatch.setattr(multihead, "_weights", recording)
    monkeypatch.setattr(MultiHeadAttention, "_fused_ok", lambda self, _: False)   # the path that computes weights
    return seen


# ------------------------------------------------------------------ every positional scheme
@pytest.mark.parametrize("positional", POSITIONAL_KINDS)
def test_no_leakage_from_future_tokens(positional):
    model, idx = gpt(positional), ids(10)
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % BASE["vocab_size"]
    with torch.no_grad():
        before, after = model(idx), model(changed)
        shifted = model(idx, positions=torch.arange(3, 13)), model(changed, positions=torch.arange(3, 13))
    torch.testing.assert_close(after[:, :6], before[:, :6], atol=0, rtol=0)
    torch.testing.assert_close(shifted[1][:, :6], shifted[0][:, :6], atol=0, rtol=0)
    assert not torch.allclose(after[:, 6:], before[:, 6:])


@pytest.mark.parametrize("positional", POSITIONAL_KINDS)
def test_generation_with_and_without_cache(positional):
    model, prompt = gpt(positional, n_kv_heads=2), ids(4, seed=1)
    for sampling in (dict(temperature=0), dict(temperature=1.0, top_k=8)):
        a, b = (model.generate(prompt, 20, use_cache=c, generator=torch.Generator().manual_seed(2),
                               **sampling) for c in (True, False))
        assert a.shape == (2, 24) and torch.equal(a, b)      # 24 > n_ctx: the window slides


@pytest.mark.parametrize("positional", ["rope", "alibi"])
def test_weights_shift_invariant_inside_the_model(positional, weights_seen):
    """Positions 0…9 and 37…46 give the same attention weights in every layer (and the same
    logits); learned and sinusoidal positions are absolute and must not."""
    model, idx = gpt(positional), ids(10)
    with torch.no_grad():
        logits = model(idx)
        shifted = model(idx, positions=torch.arange(37, 47).expand(2, 10))
    w0, w1 = weights_seen[:2], weights_seen[2:]
    assert len(w1) == BASE["n_layers"]
    for a, b in zip(w0, w1):
        torch.testing.assert_close(b, a, atol=1e-12, rtol=0)
    torch.testing.assert_close(shifted, logits, atol=1e-10, rtol=0)
    for absolute in ("learned", "sinusoidal"):
        m = gpt(absolute)
        with torch.no_grad():
            assert not torch.allclose(m(idx, positions=torch.arange(3, 13)), m(idx))


@pytest.mark.parametrize("positional", ["rope", "alibi"])
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_weights_shift_invariant_through_the_cache(positional, n_kv_heads):
    """t cached keys, hidden by the mask, only offset the positions of the n new tokens: the
    weights over the new keys are those of a fresh layer, and those of explicit positions."""
    d, h, n, t = 16, 4, 5, 7
    mha = randomize(MultiHeadAttention(d, h, causal=True, n_kv_heads=n_kv_heads,
                                       **{positional: True}).double()).eval()
    x = rand(2, n, d, seed=1)
    _, fresh = mha(x, return_weights=True)
    cache = {}
    mha(rand(2, t, d, seed=2), cache=cache)
    hide_cached = torch.arange(t + n) >= t                                 # (t + n,)
    _, offset = mha(x, cache=cache, mask=hide_cached, return_weights=True)
    _, explicit = mha(x, positions=torch.arange(t, t + n), return_weights=True)
    torch.testing.assert_close(offset[..., t:], fresh, atol=1e-12, rtol=0)
    torch.testing.assert_close(explicit, fresh, atol=1e-12, rtol=0)
    assert cache["pos"].tolist() == [list(range(t + n))] * 2


def test_rope_score_depends_only_on_offset_inside_attention():
    """A cached key y at position n and a query x at position m, placed by the layer itself:
    log(w_y / w_x) = (s(m, n) − s(m, m))/√d_k, and s(m, m) does not depend on m, so the
    log-ratio is a function of m − n alone."""
    mha = randomize(MultiHeadAttention(8, 1, bias=False, rope=True).double())
    x, y = rand(1, 1, 8, seed=3), rand(1, 1, 8, seed=4)

    def log_ratio(m: int, n: int) -> float:
        cache = {}
        mha(y, cache=cache, positions=torch.tensor([n]))
        _, w = mha(x, cache=cache, positions=torch.tensor([m]), return_weights=True)
        return float((w[0, 0, 0, 0].log() - w[0, 0, 0, 1].log()).detach())

    assert log_ratio(5, 5) == pytest.approx(log_ratio(0, 0), abs=1e-10)
    assert log_ratio(9, 6) == pytest.approx(log_ratio(3, 0), abs=1e-10)
    assert log_ratio(30, 27) == pytest.approx(log_ratio(3, 0), abs=1e-10)
    assert log_ratio(3, 0) != pytest.approx(log_ratio(0, 0), abs=1e-3)


def test_alibi_uses_the_given_positions():
    """Positions with gaps (as after left padding): the layer's weights equal a float64
    softmax of QKᵀ/√d_k − slope_h·(p_i − p_j) with BLOOM's slopes, causal."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    mha = randomize(MultiHeadAttention(16, 4, causal=True, alibi=True).double())
    x, pos = rand(1, 6, 16, seed=16), torch.tensor([0, 1, 2, 5, 9, 10])
    _, w = mha(x, positions=pos, return_weights=True)
    q = multihead.split_heads(mha.q_proj(x), 4)
    k = multihead.split_heads(mha.k_proj(x), 4)
    slopes = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), 4, D64)[:, 0, 1]
    scores = q @ k.transpose(-1, -2) / 2 - slopes[:, None, None] * (pos[:, None] - pos[None, :])
    scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    torch.testing.assert_close(w, torch.softmax(scores, dim=-1), atol=1e-12, rtol=0)
    _, consecutive = mha(x, return_weights=True)
    assert not torch.allclose(consecutive, w, atol=1e-3)


def test_explicit_positions_equal_the_cache_offset():
    """Tokens 5…9 after a cache of 5, or alone at positions 5…9 with the same cache."""
    model, idx = gpt("learned"), ids(10)
    with torch.no_grad():
        full = model(idx)
        cache = [{} for _ in range(BASE["n_layers"])]
        model(idx[:, :5], cache=cache)
        cache2 = [dict(layer) for layer in cache]
        a = model(idx[:, 5:], cache=cache)
        b = model(idx[:, 5:], cache=cache2, positions=torch.arange(5, 10))
    torch.testing.assert_close(a, full[:, 5:], atol=1e-12, rtol=0)
    torch.testing.assert_close(b, a, atol=0, rtol=0)


# ------------------------------------------------------------------ RMSNorm in half precision
def test_rmsnorm_float16_squares_overflow():
    """|x| up to ~2000: x² overflows float16 (max 65504). LLaMA normalises in float32 and
    returns float16; compared with float64 and with Hugging Face's LlamaRMSNorm."""
    x = (rand(3, 5, 64, seed=4) * 600).to(torch.float16)
    assert torch.isinf(x * x).any()                                  # the naive way overflows
    ours, ref = RMSNorm(64).half(), LlamaRMSNorm(64, eps=1e-6).half()
    with torch.no_grad():
        ours.weight.copy_(1 + 0.1 * rand(64, seed=5))
        ref.weight.copy_(ours.weight)
    y = ours(x)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    exact = F.rms_norm(x.double(), (64,), ours.weight.double(), eps=1e-6)
    torch.testing.assert_close(y.double(), exact, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(y, ref(x), atol=0, rtol=0)
    assert RMSNorm(4)(torch.ones(2, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16


# ------------------------------------------------------------------ the two RoPE pairings
def test_interleaved_rope_matches_complex_rotation():
    """Meta's LLaMA: view the features as d/2 complex numbers (2k, 2k+1) and multiply each
    by exp(i·p/base^(2k/d)), in float64."""
    x, pos, base = rand(2, 7, 8, seed=6), torch.tensor([0, 1, 2, 5, 9, 40, 100]), 500.0
    freqs = 1.0 / base ** (torch.arange(0, 8, 2, dtype=D64) / 8)
    rot = torch.polar(torch.ones(7, 4, dtype=D64), pos[:, None].double() * freqs)
    expected = torch.view_as_real(torch.view_as_complex(x.reshape(2, 7, 4, 2)) * rot).flatten(-2)
    torch.testing.assert_close(apply_rope(x, pos, base, interleaved=True), expected)
    assert not torch.allclose(apply_rope(x, pos, base), expected)


def test_pairings_give_the_same_scores_after_permuting_w_q_w_k():
    """Rotate-half on W rows ordered (0, 2, 4, …, 1, 3, 5, …) equals interleaved on W."""
    d_model, d = 12, 8
    w_q, w_k, x = rand(d, d_model, seed=7), rand(d, d_model, seed=8), rand(9, d_model, seed=9)
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    inter = apply_rope(x @ w_q.T, interleaved=True) @ apply_rope(x @ w_k.T, interleaved=True).T
    half = apply_rope(x @ w_q[perm].T) @ apply_rope(x @ w_k[perm].T).T
    torch.testing.assert_close(half, inter, atol=1e-12, rtol=0)
    unpermuted = apply_rope(x @ w_q.T) @ apply_rope(x @ w_k.T).T
    assert not torch.allclose(unpermuted, inter, atol=1e-3)


def test_rope_positions_per_sequence():
    x = rand(2, 3, 5, 4, seed=10)                                    # (b, h, n, d)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 3, 9, 1, 2]])
    rows = torch.stack([apply_rope(x[i], pos[i]) for i in range(2)])
    torch.testing.assert_close(apply_rope(x, pos[:, None]), rows, atol=0, rtol=0)


# ------------------------------------------------------------------ Hugging Face LLaMA
GRID = [dict(heads=h, theta=theta, tied=tied, bias=False)
        for h in ((4, 4), (4, 2)) for theta in (10000.0, 500000.0) for tied in (False, True)]
GRID += [dict(heads=(4, 1), theta=1e6, tied=False, bias=True)]     # MQA, with biases


def llama_pair(heads, theta, tied, bias):
    """A random LlamaForCausalLM (norm gains and biases perturbed too) and our GPT holding
    its weights."""
    (h, kv) = heads
    torch.manual_seed(0)
    hf_config = transformers.LlamaConfig(
        vocab_size=37, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=h, num_key_value_heads=kv, max_position_embeddings=24,
        rope_theta=theta, rms_norm_eps=1e-6, tie_word_embeddings=tied, attention_bias=bias,
        mlp_bias=bias, initializer_range=0.2, pad_token_id=0, bos_token_id=None,
        eos_token_id=None)
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    config = ModelConfig(vocab_size=37, n_ctx=24, d_model=32, n_layers=2, n_heads=h,
                         n_kv_heads=kv, d_ff=48, mlp="swiglu", norm="rmsnorm", bias=bias,
                         tied_embeddings=tied, positional="rope", norm_eps=1e-6,
                         rope_base=theta)
    return hf, GPT.from_llama_state_dict(hf.state_dict(), config).eval()


@pytest.fixture(scope="module", params=GRID, ids=lambda g: "-".join(f"{k}={v}" for k, v in g.items()))
def llama(request):
    return llama_pair(**request.param)


def test_llama_logits_equal(llama):
    hf, ours = llama
    idx = ids(20, seed=11, vocab=37)
    with torch.no_grad():
        expected = hf(idx).logits
        got = ours(idx)
    assert expected.abs().max() > 1                                  # logits that move
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert count_params(ours) == count_params(hf) == param_count(ours.config)
    assert (ours.lm_head.weight is ours.tok_emb.weight) == ours.config.tied_embeddings


def test_llama_logits_equal_at_explicit_positions(llama):
    hf, ours = llama
    idx = ids(8, seed=12, vocab=37)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [3, 4, 6, 7, 11, 12, 13, 19]])  # with gaps
    with torch.no_grad():
        expected = hf(idx, position_ids=pos).logits
        got = ours(idx, positions=pos)
        streamed, _ = ours(idx, positions=pos, return_stream=True)       # the stream's path too
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(streamed, expected, atol=1e-5, rtol=0)


def test_llama_greedy_generation_equal(llama):
    hf, ours = llama
    prompt = ids(5, seed=13, vocab=37)
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                           do_sample=False, pad_token_id=0)
    for use_cache in (True, False):
        assert torch.equal(ours.generate(prompt, 12, temperature=0, use_cache=use_cache), expected)


def test_llama_cache_and_flops_agree_with_counting(llama):
    _, ours = llama
    c, n = ours.config, 7
    cache = [{} for _ in range(c.n_layers)]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        ours(ids(n, batch=1, seed=14, vocab=37), cache=cache)
    assert counter.get_total_flops() == forward_flops(c, n)
    assert sum(layer["k"].numel() + layer["v"].numel() for layer in cache) == kv_cache_size(c, n)


def test_llama_model_without_head_and_prefix():
    hf, ours = llama_pair((4, 2), 10000.0, True, False)
    bare = hf.model.state_dict()                                     # LlamaModel: no 'model.', no lm_head
    assert not any(k.startswith(("model.", "lm_head")) for k in bare)
    again = GPT.from_llama_state_dict(bare, ours.config).eval()
    idx = ids(6, seed=15, vocab=37)
    with torch.no_grad():
        torch.testing.assert_close(again(idx), ours(idx), atol=0, rtol=0)


# ------------------------------------------------------------------ bad input, named errors
@pytest.fixture(scope="module")
def llama_sd():
    hf, ours = llama_pair((4, 2), 10000.0, False, False)
    return hf.state_dict(), ours.config


def _config(config, **changes):
    return ModelConfig(**{**config.__dict__, **changes})


def test_llama_loader_names_the_bad_tensor(llama_sd):
    sd, config = llama_sd
    missing = {k: v for k, v in sd.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ValueError, match=re.escape("state_dict: expected a LLaMA key "
                                                   "'layers.1.mlp.up_proj.weight'")):
        GPT.from_llama_state_dict(missing, config)
    with pytest.raises(ValueError, match=re.escape("state_dict['layers.0.self_attn.k_proj.weight']: "
                                                   "expected shape (32, 32) (from config), got (16, 32)")):
        GPT.from_llama_state_dict(sd, _config(config, n_kv_heads=4))
    with pytest.raises(ValueError, match=re.escape("state_dict['lm_head.weight']: expected shape "
                                                   "(38, 32)")):
        GPT.from_llama_state_dict({**sd, "model.embed_tokens.weight": torch.zeros(38, 32)},
                                  _config(config, vocab_size=38))
    with pytest.raises(ValueError, match=r"state_dict: expected only tensors .*bias=False.*"
                                         r"'layers\.0\.self_attn\.q_proj\.bias'"):
        GPT.from_llama_state_dict({**sd, "model.layers.0.self_attn.q_proj.bias": torch.zeros(32)},
                                  config)
    with pytest.raises(ValueError, match=re.escape("state_dict['lm_head.weight']: expected it equal "
                                                   "to 'embed_tokens.weight'")):
        GPT.from_llama_state_dict(sd, _config(config, tied_embeddings=True))
    with pytest.raises(TypeError, match=re.escape("state_dict['norm.weight']: expected a torch.Tensor")):
        GPT.from_llama_state_dict({**sd, "model.norm.weight": [1.0] * 32}, config)
    with pytest.raises(TypeError, match="state_dict: expected a dict of tensors, got list"):
        GPT.from_llama_state_dict([], config)


@pytest.mark.parametrize("changes,message", [
    (dict(mlp="gelu"), "config.mlp: LLaMA weights need 'swiglu', got 'gelu'"),
    (dict(positional="alibi"), "config.positional: LLaMA weights need 'rope', got 'alibi'"),
    (dict(norm="layernorm"), "config.norm: LLaMA weights need 'rmsnorm', got 'layernorm'"),
])
def test_llama_loader_rejects_other_layouts(llama_sd, changes, message):
    sd, config = llama_sd
    with pytest.raises(ValueError, match=re.escape(message)):
        GPT.from_llama_state_dict(sd, _config(config, **changes))


@pytest.mark.parametrize("positional,positions,error,message", [
    ("learned", torch.arange(10, 20), ValueError, "positions: expected values in [0, n_ctx=16), got min 10 and max 19"),
    ("sinusoidal", torch.arange(10, 20), ValueError, "positions: expected values in [0, n_ctx=16)"),
    ("rope", torch.arange(9), ValueError, "positions: expected shape (batch, n) = (2, 10) or (n,) = (10,), got (9,)"),
    ("alibi", torch.zeros(3, 10, dtype=torch.long), ValueError, "positions: expected shape (batch, n) = (2, 10)"),
    ("rope", torch.arange(-1, 9), ValueError, "positions: expected values >= 0, got min -1"),
    ("none", torch.arange(10.0), TypeError, "positions: expected an integer dtype"),
    ("learned", [0, 1], TypeError, "positions: expected a torch.Tensor, got list"),
])
def test_bad_positions_named(positional, positions, error, message):
    with pytest.raises(error, match=re.escape(message)):
        gpt(positional)(ids(10), positions=positions)


def test_far_positions_allowed_where_they_exist():
    for positional in ("rope", "alibi", "none"):                     # no table to run off
        assert gpt(positional)(ids(10), positions=torch.arange(100, 110)).shape == (2, 10, 29)


def test_positions_in_the_layers_named():
    mha = MultiHeadAttention(8, 2, rope=True)
    with pytest.raises(ValueError, match=re.escape("positions: expected shape (batch, n) = (1, 3)")):
        mha(torch.zeros(3, 8), positions=torch.arange(4))
    with pytest.raises(ValueError, match="positions: expected None with context"):
        MultiHeadAttention(8, 2)(torch.zeros(3, 8), context=torch.zeros(4, 8),
                                 positions=torch.arange(3))
    block = TransformerBlock(8, 2, causal=True, rope=True, rope_base=0.5)
    assert block.attn.rope_base == 0.5
    with pytest.raises(ValueError, match="rope_base: expected a finite number > 0"):
        ModelConfig(**BASE, rope_base=-1.0)
    with pytest.raises(ValueError, match=re.escape("positions: expected shape (5,) or one broadcastable")):
        apply_rope(torch.zeros(2, 5, 4), torch.zeros(3, 5))
