"""`transformer_lib.loading` details the end-to-end tests leave open (Chapter 7): checkpoints
saved by older `transformers` versions carry each layer's RoPE ``inv_freq`` buffer, which the
loader must skip rather than reject as an unused tensor; every loader error in full."""
from __future__ import annotations

import torch
import transformers  # a pinned test dependency: a missing install must fail, not skip

from test_reference_models import ids, llama_pair
from torch_helpers import error_message
from transformer_lib.config import ModelConfig
from transformer_lib.model import GPT


def test_llama_loader_skips_stored_rope_inv_freq():
    hf, ours = llama_pair((4, 2), 10000.0, False, False)
    sd = dict(hf.state_dict())
    d_head = ours.config.d_model // ours.config.n_heads
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
    for i in range(ours.config.n_layers):
        sd[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = inv_freq
    again = GPT.from_llama_state_dict(sd, ours.config).eval()
    idx = ids(6, seed=3, vocab=37)
    with torch.no_grad():
        torch.testing.assert_close(again(idx), hf(idx).logits, atol=1e-5, rtol=0)


# ------------------------------------------------ every loader error: argument, expected, actual
def test_gpt2_loader_errors_name_the_key_expected_and_actual():
    c = ModelConfig(vocab_size=11, n_ctx=8, d_model=8, n_layers=1, n_heads=2, mlp="gelu_tanh")
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=11, n_positions=8, n_embd=8,
                                                              n_layer=1, n_head=2))
    sd = hf.state_dict()                                                  # Hugging Face's keys and layout
    assert GPT.from_gpt2_state_dict(sd, c).config == c                    # the right shapes load
    cases = [
        ({k: v for k, v in sd.items() if k != "transformer.h.0.ln_1.bias"}, c,
         "state_dict: expected a GPT-2 key 'h.0.ln_1.bias' (with or without 'transformer.'), not found"),
        ({**sd, "transformer.h.0.attn.c_attn.weight": torch.zeros(9, 24)}, c,
         "state_dict['h.0.attn.c_attn.weight']: expected shape (8, 8) (from config), got (8, 9)"),
        ({**sd, "transformer.h.0.attn.c_attn.bias": torch.zeros(23)}, c,
         "state_dict['h.0.attn.c_attn.bias']: expected shape (8,) (from config), got (7,)"),
        (sd, ModelConfig(**{**c.__dict__, "n_kv_heads": 1}),
         "config: GPT-2 weights need n_kv_heads=n_heads and d_ff=4·d_model, got n_kv_heads=1, d_ff=32"),
        (sd, ModelConfig(**{**c.__dict__, "d_ff": 16}),
         "config: GPT-2 weights need n_kv_heads=n_heads and d_ff=4·d_model, got n_kv_heads=2, d_ff=16"),
        (sd, {"n_layers": 1}, "config: expected a ModelConfig, got dict"),
    ]
    for state_dict, config, message in cases:
        assert error_message(GPT.from_gpt2_state_dict, state_dict, config) == message
    from transformer_lib.loading import check_gpt2_config, check_llama_config

    for check in (check_gpt2_config, check_llama_config):
        assert error_message(check, {"n_layers": 1}) == "config: expected a ModelConfig, got dict"


def test_llama_loader_errors_name_the_key_expected_and_actual():
    hf, ours = llama_pair((4, 2), 10000.0, False, True)                  # biases in the projections
    sd, c = dict(hf.state_dict()), ours.config
    extra = {f"model.layers.0.{norm}.bias": torch.zeros(c.d_model)            # norms never have biases
             for norm in ("input_layernorm", "post_attention_layernorm")}
    extra |= {f"model.layers.{i}.mlp.extra": torch.zeros(1) for i in range(3)}
    assert error_message(GPT.from_llama_state_dict, {**sd, **extra}, c) == (
        f"state_dict: expected only tensors of the config's LLaMA layout (n_layers={c.n_layers}, bias=True), "
        "got unused keys ['layers.0.input_layernorm.bias', 'layers.0.mlp.extra', "
        "'layers.0.post_attention_layernorm.bias', 'layers.1.mlp.extra']")
    missing = {k: v for k, v in sd.items() if k != "model.norm.weight"}
    assert error_message(GPT.from_llama_state_dict, missing, c) == (
        "state_dict: expected a LLaMA key 'norm.weight' (with or without 'model.'), not found")
    tied = ModelConfig(**{**c.__dict__, "tied_embeddings": True})
    assert error_message(GPT.from_llama_state_dict, sd, tied) == (
        "state_dict['lm_head.weight']: expected it equal to 'embed_tokens.weight' "
        "(config.tied_embeddings=True), got another matrix")
