"""`transformer_lib.loading` details the end-to-end tests leave open (Chapter 7): checkpoints
saved by older `transformers` versions carry each layer's RoPE ``inv_freq`` buffer, which the
loader must skip rather than reject as an unused tensor."""
from __future__ import annotations

import torch

from test_reference_models import ids, llama_pair
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
