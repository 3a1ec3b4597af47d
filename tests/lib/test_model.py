"""The decoder-only GPT (Chapter 7): exact sizes, GPT-2 weights, causality, KV-cache generation."""
from __future__ import annotations

import copy
import math
import re

import pytest
import torch
import transformers  # a pinned test dependency: a missing install must fail, not skip

import torch.nn.functional as F

from torch_helpers import error_message, randomize, ref_gpt, ref_layernorm, ref_rope
from transformer_lib.config import ModelConfig
from transformer_lib.counting import count_params, param_count
from transformer_lib.model import GPT

BASE = dict(vocab_size=23, n_ctx=12, d_model=16, n_layers=2, n_heads=4)

CONFIGS = {
    "gpt2-like": dict(mlp="gelu_tanh"),
    "relu-postnorm": dict(mlp="relu", norm_first=False),
    "llama-like": dict(mlp="swiglu", norm="rmsnorm", bias=False, tied_embeddings=False,
                       positional="rope", n_kv_heads=2, d_ff=24),
    "gqa-alibi": dict(n_kv_heads=1, positional="alibi"),
    "sinusoidal-untied": dict(positional="sinusoidal", tied_embeddings=False),
    "nopos-nobias-layernorm": dict(positional="none", bias=False, n_layers=3),
    "swiglu-bias": dict(mlp="swiglu", d_ff=20, positional="rope"),
    "embedding-norm-no-final": dict(embedding_norm=True, final_norm=False, norm="rmsnorm", norm_eps=0.5),
    "postnorm-eps": dict(norm_first=False, norm_eps=0.3, positional="alibi"),
}


def make(name: str, **extra) -> ModelConfig:
    return ModelConfig(**{**BASE, **CONFIGS[name], **extra})


def _ids(n: int, vocab: int, seed: int = 0, batch: int | None = 1) -> torch.Tensor:
    shape = (n,) if batch is None else (batch, n)
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_param_count_matches_built_model(name):
    config = make(name)
    torch.manual_seed(0)
    assert count_params(GPT(config)) == param_count(config)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_shapes_and_no_leakage(name):
    config = make(name)
    torch.manual_seed(0)
    model = GPT(config).eval()
    idx = _ids(10, config.vocab_size, batch=3)
    logits = model(idx)
    assert logits.shape == (3, 10, config.vocab_size)
    assert model(idx[1]).shape == (10, config.vocab_size)         # unbatched
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % config.vocab_size
    # positions <= 5 never see tokens 6..9: their logits are bit-identical
    torch.testing.assert_close(model(changed)[:, :6], logits[:, :6], atol=0, rtol=0)
    assert not torch.allclose(model(changed)[:, 6:], logits[:, 6:])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_full_and_cached_forward_match_a_hand_assembled_reference(name):
    """Every positional scheme, norm placement, embedding norm and GQA against a forward pass
    written with torch.nn.functional from the weights (tests/torch_helpers.ref_gpt), both for
    the full sequence and for a prefill followed by one token at a time through the cache."""
    config = make(name)
    torch.manual_seed(0)
    model = randomize(GPT(config).double(), seed=1).eval()     # random biases and gains
    idx = _ids(9, config.vocab_size, batch=2)
    # the library's sinusoidal table is computed in float32: 1e-5; everything else is float64
    tol = dict(atol=1e-5, rtol=1e-5) if config.positional == "sinusoidal" else dict(atol=1e-9, rtol=1e-9)
    with torch.no_grad():
        expected = ref_gpt(model, idx)
        torch.testing.assert_close(model(idx), expected, **tol)
        cache = [{} for _ in range(config.n_layers)]
        steps = [model(idx[:, :5], cache=cache)] + [model(idx[:, t:t + 1], cache=cache)
                                                    for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, **tol)
    assert cache[0]["k"].shape == (2, config.n_kv_heads, 9, config.d_head)


@pytest.mark.parametrize("name", ["llama-like", "swiglu-bias"])
def test_rope_config_rotates_the_cached_keys(name):
    """positional='rope' reaches the attention: the first layer's cached keys are the keys of
    its normalised input rotated by position (hand-written complex rotation)."""
    config = make(name)
    torch.manual_seed(0)
    model = randomize(GPT(config).double(), seed=2).eval()
    idx = _ids(7, config.vocab_size, batch=2)
    cache = [{} for _ in range(config.n_layers)]
    with torch.no_grad():
        model(idx, cache=cache)
        x = ref_layernorm(F.embedding(idx, model.tok_emb.weight), model.blocks[0].norm1, config.norm)
        attn = model.blocks[0].attn
        k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(2, 7, config.n_kv_heads, -1).transpose(1, 2)
    torch.testing.assert_close(cache[0]["k"], ref_rope(k, torch.arange(7), 10000.0), atol=1e-10, rtol=0)
    assert not torch.allclose(cache[0]["k"][..., 1:, :], k[..., 1:, :])


def test_residual_writes_are_scaled_by_one_over_sqrt_2L():
    """GPT-2's initialisation: N(0, 0.02) everywhere except the two projections that write into
    the residual stream, whose std is 0.02/√(2L) (measured on 4k–16k samples, 10 % margin)."""
    L = 4
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, n_ctx=32, d_model=64, n_layers=L, n_heads=4))
    for block in model.blocks:
        for write in (block.attn.out_proj.weight, block.mlp.fc2.weight):
            assert float(write.detach().std()) == pytest.approx(0.02 / (2 * L) ** 0.5, rel=0.1)
        for read in (block.attn.q_proj.weight, block.mlp.fc1.weight):
            assert float(read.detach().std()) == pytest.approx(0.02, rel=0.1)
        assert torch.all(block.attn.out_proj.bias == 0) and torch.all(block.norm1.weight == 1)
    assert float(model.tok_emb.weight.detach().std()) == pytest.approx(0.02, rel=0.1)


@pytest.fixture(scope="module")
def tiny_gpt2():
    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50,
                                        n_positions=16, resid_pdrop=0, embd_pdrop=0,
                                        attn_pdrop=0)
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    with torch.no_grad():  # random biases and norm gains, so that every tensor matters
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    config = ModelConfig(vocab_size=50, n_ctx=16, d_model=32, n_layers=2, n_heads=4,
                         mlp="gelu_tanh")
    return hf, GPT.from_gpt2_state_dict(hf.state_dict(), config).eval()


def test_gpt2_weights_give_same_logits(tiny_gpt2):
    hf, ours = tiny_gpt2
    idx = _ids(16, 50, seed=1, batch=2)
    with torch.no_grad():
        expected = hf(idx).logits
    torch.testing.assert_close(ours(idx), expected, atol=1e-5, rtol=0)
    assert ours.lm_head.weight is ours.tok_emb.weight
    assert count_params(ours) == count_params(hf)


def test_gpt2_gradients_equal_hugging_face_through_the_one_qkv_product(tiny_gpt2):
    """Inside the model, the gradient of each layer's stacked Q, K, V product reaches q_proj,
    k_proj and v_proj as GPT-2's c_attn gradient, whose (d, 3d) columns are Q, K, V."""
    hf, ours = (copy.deepcopy(m) for m in tiny_gpt2)
    idx = _ids(12, 50, seed=3, batch=2)
    for model, logits in ((hf, lambda: hf(idx).logits), (ours, lambda: ours(idx))):
        F.cross_entropy(logits()[:, :-1].flatten(0, 1), idx[:, 1:].flatten()).backward()
    d = ours.config.d_model
    for i, block in enumerate(ours.blocks):
        c_attn = hf.transformer.h[i].attn.c_attn
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            lin = getattr(block.attn, name)
            torch.testing.assert_close(lin.weight.grad, c_attn.weight.grad[:, j * d:(j + 1) * d].T, atol=1e-6, rtol=1e-4)
            torch.testing.assert_close(lin.bias.grad, c_attn.bias.grad[j * d:(j + 1) * d], atol=1e-6, rtol=1e-4)


def test_gpt2_loader_accepts_bare_transformer_keys(tiny_gpt2):
    hf, ours = tiny_gpt2
    bare = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    again = GPT.from_gpt2_state_dict(bare, ours.config).eval()
    idx = _ids(5, 50)
    torch.testing.assert_close(again(idx), ours(idx), atol=0, rtol=0)


def test_gpt2_loader_rejects_other_layouts(tiny_gpt2):
    hf, ours = tiny_gpt2
    with pytest.raises(ValueError,
                       match=r"config\.mlp: GPT-2 weights need 'gelu_tanh', got 'gelu'"):
        GPT.from_gpt2_state_dict(hf.state_dict(), ModelConfig(**{**ours.config.__dict__,
                                                                 "mlp": "gelu"}))
    wrong = ModelConfig(**{**ours.config.__dict__, "vocab_size": 51})
    with pytest.raises(ValueError, match=r"wte\.weight.*\(51, 32\).*\(50, 32\)"):
        GPT.from_gpt2_state_dict(hf.state_dict(), wrong)
    with pytest.raises(ValueError, match="h.1.ln_2.weight"):
        GPT.from_gpt2_state_dict({k: v for k, v in hf.state_dict().items()
                                  if "h.1.ln_2.weight" not in k}, ours.config)


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0),
                                      dict(temperature=0.8, top_k=5)])
def test_generate_with_and_without_cache_gpt2(tiny_gpt2, sampling):
    _, model = tiny_gpt2
    prompt = _ids(4, 50, seed=2, batch=2)
    runs = [model.generate(prompt, 20, use_cache=cache, generator=torch.Generator().manual_seed(7),
                           **sampling) for cache in (True, False)]
    assert runs[0].shape == (2, 24)      # 24 > n_ctx = 16: the window slides
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0][:, :4], prompt)


def test_greedy_generation_matches_transformers(tiny_gpt2):
    hf, ours = tiny_gpt2
    prompt = _ids(3, 50, seed=3)
    expected = hf.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 8, temperature=0), expected)


@pytest.mark.parametrize("name", ["llama-like", "gqa-alibi", "sinusoidal-untied", "swiglu-bias"])
def test_generate_with_and_without_cache(name):
    """Greedy generation, with and without cache, against argmax of the hand-assembled
    reference over the last n_ctx tokens (the window slides: 3 + 11 > n_ctx = 12)."""
    config = make(name)
    torch.manual_seed(0)
    model = randomize(GPT(config).double(), seed=3).eval()
    prompt = _ids(3, config.vocab_size, seed=4, batch=None)   # unbatched prompt
    expected = prompt[None]
    with torch.no_grad():
        for _ in range(11):
            nxt = ref_gpt(model, expected[:, -config.n_ctx:])[:, -1].argmax(-1, keepdim=True)
            expected = torch.cat([expected, nxt], dim=1)
    for c in (True, False):
        assert torch.equal(model.generate(prompt, 11, temperature=0, use_cache=c), expected[0])
    a, b = (model.generate(prompt, 11, use_cache=c, generator=torch.Generator().manual_seed(1),
                           temperature=1.0, top_k=10) for c in (True, False))
    assert a.shape == (14,) and torch.equal(a, b)


# ------------------------------------------------------------------ sampling: temperature, top-k
def test_top_k_samples_only_the_k_most_likely_tokens(tiny_gpt2):
    _, model = tiny_gpt2
    k, n_new = 3, 6
    prompt = _ids(3, 50, seed=5).expand(400, 3)          # 400 samples of the same prompt
    out = model.generate(prompt, n_new, top_k=k, generator=torch.Generator().manual_seed(0))
    for t in range(3, 3 + n_new):
        with torch.no_grad():
            top = model(out[:, :t])[:, -1].topk(k, dim=-1).indices     # (400, k) at that step
        assert (out[:, t:t + 1] == top).any(dim=1).all(), f"step {t}: a token outside the top {k}"
    assert len(out[:, 3].unique()) == k                  # sampling, not greedy: all k appear


def test_tiny_temperature_is_greedy(tiny_gpt2):
    _, model = tiny_gpt2
    prompt = _ids(3, 50, seed=6, batch=8)
    greedy = model.generate(prompt, 10, temperature=0)
    cold = model.generate(prompt, 10, temperature=1e-6, generator=torch.Generator().manual_seed(0))
    warm = model.generate(prompt, 10, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cold, greedy)
    assert not torch.equal(warm, greedy)                 # the check above is not vacuous


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampling_frequencies_match_softmax(tiny_gpt2, temperature):
    """One step, N samples: every token's frequency lies within 5 standard errors
    sqrt(p(1-p)/N) of p = softmax(logits / temperature)."""
    _, model = tiny_gpt2
    N, prompt = 40_000, _ids(3, 50, seed=5)
    out = model.generate(prompt.expand(N, 3), 1, temperature=temperature,
                         generator=torch.Generator().manual_seed(1))
    freq = torch.bincount(out[:, -1], minlength=50).double() / N
    with torch.no_grad():
        p = torch.softmax(model(prompt)[0, -1].double() / temperature, dim=-1)
    assert p.max() < 0.5                                 # a spread-out distribution
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / N).sqrt()).all(), (freq - p).abs().max()


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(temperature=-0.5), ValueError, "temperature: expected a finite number >= 0, got -0.5"),
    (dict(temperature=float("nan")), ValueError, "temperature: expected a finite number >= 0"),
    (dict(temperature="hot"), TypeError, "temperature: expected a number, got str"),
    (dict(top_k=0), ValueError, "top_k: expected an int >= 1, got 0"),
    (dict(top_k=24), ValueError, "top_k: expected at most vocab_size=23, got 24"),
    (dict(top_k=2.0), TypeError, "top_k: expected an int, got float"),
])
def test_bad_sampling_arguments(small, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        small.generate(torch.zeros(1, 2, dtype=torch.long), 1, **kwargs)


def test_generate_really_uses_the_cache():
    config = make("llama-like")
    model = GPT(config).eval()
    seen = []
    model.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(args[0].shape[-1]),
                                    with_kwargs=True)
    model.generate(_ids(5, config.vocab_size), 4, use_cache=True)
    assert seen == [5, 1, 1, 1]           # prefill once, then one token per step
    seen.clear()
    model.generate(_ids(5, config.vocab_size), 4, use_cache=False)
    assert seen == [5, 6, 7, 8]


def test_tied_embeddings_share_storage():
    tied, untied = GPT(make("gpt2-like")), GPT(make("sinusoidal-untied"))
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.lm_head.weight is not untied.tok_emb.weight


# ------------------------------------------------------------------ errors name the argument
@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    return GPT(make("gpt2-like")).eval()


def test_float_ids_rejected(small):
    with pytest.raises(TypeError,
                       match=r"idx: expected an integer dtype \(torch.long or torch.int32\), "
                             r"got torch.float32"):
        small(torch.zeros(1, 3))


@pytest.mark.parametrize("bad,shown", [(23, "min 0 and max 23"), (-1, "min -1 and max 0")])
def test_out_of_vocab_ids_rejected(small, bad, shown):
    idx = torch.tensor([[0, bad]])
    with pytest.raises(ValueError, match=r"idx: expected values in \[0, vocab_size=23\), got " + shown):
        small(idx)


def test_too_long_rejected(small):
    with pytest.raises(ValueError, match=r"idx: expected at most n_ctx=12 tokens, got n=13"):
        small(torch.zeros(1, 13, dtype=torch.long))
    cache = [{} for _ in range(2)]
    small(torch.zeros(1, 10, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"n_ctx=12 tokens, got 10 cached \+ 3 new = 13"):
        small(torch.zeros(1, 3, dtype=torch.long), cache=cache)


def test_bad_shapes_and_arguments(small):
    with pytest.raises(TypeError, match="idx: expected a torch.Tensor, got list"):
        small([1, 2, 3])
    with pytest.raises(ValueError,
                       match=r"idx: expected shape \(batch, n\) or \(n,\).*\(1, 2, 3\)"):
        small(torch.zeros(1, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_new_tokens: expected an int >= 0, got -1"):
        small.generate(torch.zeros(1, 2, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="cache: expected a list of 2 dicts"):
        small(torch.zeros(1, 2, dtype=torch.long), cache=[{}])


@pytest.mark.parametrize("changes,pattern", [
    (dict(d_model=18), r"d_model: expected a multiple of n_heads=4, got d_model=18"),
    (dict(n_kv_heads=3), r"n_kv_heads: expected a divisor of n_heads=4, got n_kv_heads=3"),
    (dict(mlp="geglu"), r"mlp: expected one of 'relu', 'gelu', 'gelu_tanh', 'swiglu', got 'geglu'"),
    (dict(norm="batchnorm"), r"norm: expected one of 'layernorm', 'rmsnorm', got 'batchnorm'"),
    (dict(positional="rotary"), r"positional: expected one of .*'alibi', 'none', got 'rotary'"),
    (dict(n_layers=0), r"n_layers: expected an int >= 1, got 0"),
    (dict(d_model=12, n_heads=4, positional="rope"), r"d_model: expected an even d_head"),
])
def test_bad_config_rejected(changes, pattern):
    with pytest.raises(ValueError, match=pattern):
        ModelConfig(**{**BASE, **changes})


def test_config_defaults_and_encoder_rejected():
    c = ModelConfig(**BASE)
    assert (c.d_ff, c.n_kv_heads, c.d_head, c.kv_dim, c.n_groups) == (64, 4, 4, 16, 1)
    with pytest.raises(TypeError, match="d_model: expected an int, got float"):
        ModelConfig(**{**BASE, "d_model": 16.0})
    with pytest.raises(ValueError, match=r"config\.causal: GPT is a decoder-only LM and expects "
                                         r"True, got False"):
        GPT(ModelConfig(**{**BASE, "causal": False}))
    with pytest.raises(TypeError, match="config: expected a ModelConfig, got dict"):
        GPT(BASE)


# ------------------------------------------------------------------ exact errors, unbatched, buffers, sampling
def test_every_model_error_names_argument_expected_and_actual(small):
    z = lambda *shape: torch.zeros(*shape, dtype=torch.long)  # noqa: E731
    cache = [{} for _ in range(2)]
    small(z(1, 10), cache=cache)
    cases = [
        (ValueError, "config.causal: GPT is a decoder-only LM and expects True, got False",
         lambda: GPT(ModelConfig(**BASE, causal=False))),
        (ValueError, "config.n_token_types: GPT is a decoder-only LM and expects 0, got 2",
         lambda: GPT(ModelConfig(**BASE, n_token_types=2))),
        (ValueError, "config.pooler: GPT is a decoder-only LM and expects False, got True",
         lambda: GPT(ModelConfig(**BASE, pooler=True))),
        (ValueError, "config.lm_head: GPT is a decoder-only LM and expects True, got False",
         lambda: GPT(ModelConfig(**BASE, lm_head=False))),
        (TypeError, "config: expected a ModelConfig, got dict", lambda: GPT(BASE)),
        (TypeError, "residual: expected a bool, got int (1)", lambda: GPT(ModelConfig(**BASE), residual=1)),
        (ValueError, "idx: expected at most n_ctx=12 tokens, got n=13", lambda: small(z(1, 13))),
        (ValueError, "idx: expected at most n_ctx=12 tokens, got 10 cached + 3 new = 13",
         lambda: small(z(1, 3), cache=cache)),
        (ValueError, "idx: expected shape (batch, n) or (n,), got (1, 2, 3)", lambda: small(z(1, 2, 3))),
        (ValueError, "cache: expected a list of 2 dicts (one per layer), got list of length 1",
         lambda: small(z(1, 2), cache=[{}])),
        (ValueError, "cache: expected a list of 2 dicts (one per layer), got dict of length ?",
         lambda: small(z(1, 2), cache={})),
        (ValueError, "cache: expected a list of 2 dicts (one per layer), got list of length 2",
         lambda: small(z(1, 2), cache=[{}, 3])),
        (ValueError, "positions: expected values in [0, n_ctx=12), got min 0 and max 12",
         lambda: small(z(1, 2), positions=torch.tensor([0, 12]))),
        (TypeError, "return_stream: expected a bool, got int (1)", lambda: small(z(1, 2), return_stream=1)),
        (ValueError, "top_k: expected at most vocab_size=23, got 24", lambda: small.generate(z(1, 2), 1, top_k=24)),
        (ValueError, "top_k: expected an int >= 1, got 0", lambda: small.generate(z(1, 2), 1, top_k=0)),
        (ValueError, "temperature: expected a finite number >= 0, got -1.0",
         lambda: small.generate(z(1, 2), 1, temperature=-1.0)),
    ]
    for exc, message, fn in cases:
        assert error_message(fn, exc=exc) == message
    assert small(z(1, 12)).shape == (1, 12, 23)                      # exactly n_ctx tokens is fine


@pytest.mark.parametrize("name", ["sinusoidal-untied", "llama-like", "gpt2-like"])
def test_unbatched_forward_and_stream_match_the_reference(name):
    torch.manual_seed(0)
    model = randomize(GPT(make(name)).double(), seed=3).eval()
    idx = _ids(7, 23, seed=4, batch=None)
    expected = ref_gpt(model, idx[None])[0]
    torch.testing.assert_close(model(idx), expected, atol=1e-6, rtol=1e-6)
    logits, stream = model(idx, return_stream=True)
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=1e-6)
    assert len(stream.states) == 1 + 2 * len(model.blocks) and stream.states[0].shape == (7, 16)


def test_sinusoidal_table_is_a_buffer_outside_the_state_dict():
    """The sinusoidal table is fixed: not a parameter and not saved (persistent=False), so GPT-2
    style checkpoints load without it."""
    model = GPT(make("sinusoidal-untied"))
    assert "pos_enc" in dict(model.named_buffers()) and "pos_enc" not in model.state_dict()
    assert not any("pos" in name for name, _ in model.named_parameters())
    torch.testing.assert_close(model.pos_enc[3, :2].double(), torch.tensor([math.sin(3.0), math.cos(3.0)],
                                                                          dtype=torch.float64), atol=1e-6, rtol=0)
    assert model.lm_head.bias is None and model.residual is True


def test_sampling_rows_are_independent():
    """Each sequence of a batch samples from its own softmax: a batch of two different prompts
    draws, per row, the frequencies of that row's distribution (not of the batch's)."""
    logits = torch.tensor([[4.0, 0.0, 0.0], [0.0, 0.0, 4.0]])
    g = torch.Generator().manual_seed(0)
    draws = torch.cat([GPT._sample(logits, 1.0, None, g) for _ in range(400)], dim=1)
    p = torch.softmax(logits, -1)
    freq0 = (draws[0] == 0).float().mean().item()
    freq2 = (draws[1] == 2).float().mean().item()
    assert abs(freq0 - p[0, 0].item()) < 0.06 and abs(freq2 - p[1, 2].item()) < 0.06
    assert GPT._sample(logits, 0.0, None, None).tolist() == [[0], [2]]
    assert GPT._sample(logits, 1.0, 1, g).tolist() == [[0], [2]]                # top_k = 1 is greedy


def test_one_layer_model_generates_the_same_with_and_without_cache():
    """A single block: the cache length is read from the only layer's dict."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(**{**BASE, "n_layers": 1})).eval()
    prompt = _ids(3, 23, seed=5)
    cached = model.generate(prompt, 8, temperature=0.0, use_cache=True)       # 11 <= n_ctx tokens
    torch.testing.assert_close(cached, model.generate(prompt, 8, temperature=0.0, use_cache=False))
    expected = ref_gpt(model, cached[:, :-1]).argmax(-1)[:, 2:]                # greedy, hand-assembled
    assert torch.equal(cached[:, 3:], expected)


def test_every_config_error_names_argument_expected_and_actual():
    from transformer_lib.config import FLAGS

    cases = [
        (dict(vocab_size=0), ValueError, "vocab_size: expected an int >= 1, got 0"),
        (dict(n_ctx=0), ValueError, "n_ctx: expected an int >= 1, got 0"),
        (dict(d_model=0), ValueError, "d_model: expected an int >= 1, got 0"),
        (dict(n_heads=0), ValueError, "n_heads: expected an int >= 1, got 0"),
        (dict(n_token_types=-1), ValueError, "n_token_types: expected an int >= 0, got -1"),
        (dict(n_experts=-1), ValueError, "n_experts: expected an int >= 0, got -1"),
        (dict(top_k=0), ValueError, "top_k: expected an int >= 1, got 0"),
        (dict(n_experts=2, top_k=3), ValueError, "top_k: expected at most n_experts=2, got 3"),
        (dict(capacity_factor=0.0), ValueError, "capacity_factor: expected a finite number > 0, got 0.0"),
        (dict(d_ff=0), ValueError, "d_ff: expected an int >= 1, got 0"),
        (dict(n_kv_heads=0), ValueError, "n_kv_heads: expected an int >= 1, got 0"),
        (dict(norm_eps=0.0), ValueError, "norm_eps: expected a finite number > 0, got 0.0"),
        (dict(rope_base=0.0), ValueError, "rope_base: expected a finite number > 0, got 0.0"),
        (dict(mlp="x"), ValueError, "mlp: expected one of 'relu', 'gelu', 'gelu_tanh', 'swiglu', got 'x'"),
        (dict(norm="x"), ValueError, "norm: expected one of 'layernorm', 'rmsnorm', got 'x'"),
        (dict(positional="x"), ValueError,
         "positional: expected one of 'learned', 'sinusoidal', 'rope', 'alibi', 'none', got 'x'"),
        (dict(d_model=18), ValueError, "d_model: expected a multiple of n_heads=4, got d_model=18"),
        (dict(n_kv_heads=3), ValueError, "n_kv_heads: expected a divisor of n_heads=4, got n_kv_heads=3"),
        (dict(d_model=12, positional="rope"), ValueError,
         "d_model: expected an even d_head for positional='rope', got d_head=3"),
    ] + [(dict([(flag, 1)]), TypeError, f"{flag}: expected a bool, got int (1)") for flag in FLAGS]
    assert FLAGS == ("norm_first", "bias", "tied_embeddings", "causal", "embedding_norm", "final_norm",
                     "pooler", "lm_head", "fused")
    for changes, exc, message in cases:
        assert error_message(lambda: ModelConfig(**{**BASE, **changes}), exc=exc) == message, changes
    for ok in (dict(n_token_types=0), dict(n_experts=0, top_k=5), dict(n_experts=2, top_k=2),
               dict(d_model=12, positional="learned")):
        ModelConfig(**{**BASE, **ok})                                   # the boundaries are allowed


def test_config_documented_defaults_and_derived_sizes():
    """The defaults the docstring promises: a GPT-2-like pre-norm decoder."""
    c = ModelConfig(**BASE)
    assert (c.mlp, c.norm, c.norm_first, c.bias, c.tied_embeddings, c.positional, c.causal) == \
        ("gelu", "layernorm", True, True, True, "learned", True)
    assert (c.norm_eps, c.n_token_types, c.embedding_norm, c.final_norm, c.pooler, c.lm_head) == \
        (1e-5, 0, False, True, False, True)
    assert (c.rope_base, c.n_experts, c.top_k, c.capacity_factor, c.moe) == (10000.0, 0, 2, None, False)
    g = ModelConfig(**{**BASE, "n_kv_heads": 2, "n_experts": 4})
    assert (g.d_head, g.kv_dim, g.n_groups, g.moe) == (4, 8, 2, True)


# ----------------------------------------------------------------------------- low precision
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("top_k", [None, 10])
def test_sampling_probabilities_are_computed_in_float32_for_half_precision_logits(dtype, top_k):
    """Half-precision logits are sampled as their float32 values: divided by the temperature,
    filtered and turned into probabilities in float32, so the draws are those of the float32
    logits with the same generator. Divided in half precision first, 20 000 draws would differ
    in some rows."""
    logits = (3 * torch.randn(20_000, 50, generator=torch.Generator().manual_seed(0))).to(dtype)

    def draws(t):
        return GPT._sample(t, 0.7, top_k, torch.Generator().manual_seed(1))
    assert torch.equal(draws(logits), draws(logits.float()))
    assert torch.equal(GPT._sample(logits, 0, None, None), logits.float().argmax(-1, keepdim=True))
