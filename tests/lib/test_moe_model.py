"""Mixture of experts inside the model (Chapter 8): a GPT whose blocks use MoELayer, checked
against Hugging Face's Mixtral (the sparse block, the whole causal LM with copied weights, the
exact parameter count of Mixtral 8x7B on the meta device), FlopCounterMode and the counter."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from transformers.models.mixtral import modeling_mixtral  # noqa: E402

from transformer_lib.config import ModelConfig  # noqa: E402
from transformer_lib.counting import (PRESETS, count_params, flops_breakdown, forward_flops,  # noqa: E402
                                      param_breakdown, param_count)
from transformer_lib.model import GPT  # noqa: E402
from transformer_lib.moe import MoELayer, load_balancing_loss, moe_balancing_loss  # noqa: E402


def _mixtral_config(c: ModelConfig) -> transformers.MixtralConfig:
    return transformers.MixtralConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads, num_local_experts=c.n_experts,
        num_experts_per_tok=c.top_k, max_position_embeddings=c.n_ctx, rms_norm_eps=c.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_base},
        tie_word_embeddings=False, experts_implementation="eager", attn_implementation="eager")


# ------------------------------------------------------------- counting Mixtral 8x7B
def test_mixtral_8x7b_total_and_active_against_transformers():
    """46,702,792,704 parameters, 12,879,925,248 active: our closed form, Hugging Face's model
    (meta device) and our GPT (meta device) agree; the active count from Hugging Face's tensors
    removes the E − K = 6 unused experts of each layer."""
    c = PRESETS["mixtral-8x7b"]
    with torch.device("meta"):
        hf = transformers.MixtralForCausalLM(_mixtral_config(c))
        ours = GPT(c)
    total = count_params(hf)
    moe = hf.model.layers[0].mlp.experts
    per_expert = moe.gate_up_proj[0].numel() + moe.down_proj[0].numel()
    active = total - c.n_layers * (c.n_experts - c.top_k) * per_expert
    assert param_count(c) == total == count_params(ours) == 46_702_792_704
    assert param_count(c, active=True) == active == 12_879_925_248
    experts = sum(p.numel() for n, p in hf.named_parameters() if ".experts." in n)
    assert param_breakdown(c)["mlp"] == experts == 45_097_156_608
    assert round(total / 1e9, 1) == 46.7 and round(active / 1e9, 1) == 12.9  # published


@pytest.mark.parametrize("changes", [dict(), dict(mlp="swiglu", norm="rmsnorm", bias=False,
                                                  positional="rope", n_kv_heads=1, top_k=1),
                                     dict(n_experts=5, top_k=5, tied_embeddings=False)])
def test_moe_breakdown_matches_the_built_model_group_by_group(changes):
    config = ModelConfig(**{**dict(vocab_size=37, n_ctx=16, d_model=24, n_layers=3, n_heads=4,
                                   n_experts=4, top_k=2), **changes})
    with torch.device("meta"):
        model = GPT(config)
    counted = dict.fromkeys(param_breakdown(config), 0)
    for name, p in model.named_parameters():
        group = ("router" if ".router." in name else "mlp" if ".mlp." in name else
                 "attention" if ".attn." in name else "norms" if "norm" in name else
                 {"tok_emb.weight": "embedding", "pos_emb.weight": "positional",
                  "lm_head.weight": "unembedding"}[name])
        counted[group] += p.numel()
    assert counted == param_breakdown(config)
    # active = total minus the (E − K) experts per layer no token uses, counted on the model
    expert = sum(p.numel() for p in model.blocks[0].mlp.experts[0].parameters())
    assert param_count(config, active=True) == count_params(model) - \
        config.n_layers * (config.n_experts - config.top_k) * expert
    assert param_count(config, active=True) == param_count(config) or config.top_k < config.n_experts


def test_dense_config_counts_are_unchanged_by_active():
    c = PRESETS["llama2-7b"]
    assert param_breakdown(c, active=True) == param_breakdown(c) and "router" not in param_breakdown(c)
    with pytest.raises(TypeError, match="active: expected a bool"):
        param_count(c, active=1)


# ------------------------------------------------------------------ the FLOPs
@pytest.mark.parametrize("e,k", [(2, 1), (8, 1), (4, 2), (8, 2), (3, 3)])
def test_moe_gpt_flops_match_flop_counter(e, k):
    config = ModelConfig(vocab_size=23, n_ctx=8, d_model=16, n_layers=2, n_heads=2,
                         mlp="swiglu", n_experts=e, top_k=k)
    model = GPT(config).eval()
    idx = torch.randint(0, 23, (1, 7), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(idx)
    assert forward_flops(config, 7) == counter.get_total_flops()
    # by hand: K experts of 3 matrices each per token, and the router's d×E matmul
    assert flops_breakdown(config, 7)["mlp"] == 2 * 2 * 7 * k * 3 * 16 * 64
    assert flops_breakdown(config, 7)["router"] == 2 * 2 * 7 * 16 * e


# -------------------------------------------------------- against Hugging Face Mixtral
def _copy_expert_weights(layer: MoELayer, hf_block) -> None:
    d_ff = layer.experts[0].d_ff
    with torch.no_grad():
        layer.router.gate.weight.copy_(hf_block.gate.weight)
        for e, ex in enumerate(layer.experts):
            ex.fc1.weight.copy_(hf_block.experts.gate_up_proj[e, :d_ff])    # gate
            ex.fc3.weight.copy_(hf_block.experts.gate_up_proj[e, d_ff:])    # up
            ex.fc2.weight.copy_(hf_block.experts.down_proj[e])


@pytest.mark.parametrize("k", [1, 2, 3])
def test_moe_layer_equals_mixtral_sparse_block(k):
    """Mixtral softmaxes over all E experts, keeps the top K and renormalises them: our routing."""
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=5,
                                     num_experts_per_tok=k, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, vocab_size=11)
    hf = modeling_mixtral.MixtralSparseMoeBlock(cfg).double()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ours = MoELayer(16, 24, 5, top_k=k, activation="swiglu", bias=False).double()
    _copy_expert_weights(ours, hf)
    x = torch.randn(3, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out, aux = ours(x)
    # Hugging Face takes the router's softmax in float32, hence 1e-6 and not 1e-12
    torch.testing.assert_close(out, hf(x), atol=1e-6, rtol=0)
    _, weights, index = hf.gate(x.reshape(-1, 16))
    assert torch.equal(aux["expert_index"], index)
    torch.testing.assert_close(aux["expert_weights"], weights.to(torch.float64), atol=1e-6, rtol=0)
    # Hugging Face's Mixtral loss divides the counts by T tokens, Switch's by T·K assignments
    hf_loss = modeling_mixtral.load_balancing_loss_func((hf.gate(x.reshape(-1, 16))[0],), 5, k)
    torch.testing.assert_close(aux["load_balancing_loss"].float() * k, hf_loss, atol=1e-5, rtol=1e-5)


def _mixtral_pair(seed: int = 0):
    config = ModelConfig(vocab_size=29, n_ctx=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                         d_ff=40, mlp="swiglu", norm="rmsnorm", bias=False, positional="rope",
                         tied_embeddings=False, rope_base=1e6, n_experts=4, top_k=2)
    torch.manual_seed(seed)
    hf = transformers.MixtralForCausalLM(_mixtral_config(config)).double().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    ours = GPT(config).double().eval()
    sd = hf.state_dict()
    with torch.no_grad():
        ours.tok_emb.weight.copy_(sd["model.embed_tokens.weight"])
        ours.lm_head.weight.copy_(sd["lm_head.weight"])
        ours.norm_f.weight.copy_(sd["model.norm.weight"])
        for i, block in enumerate(ours.blocks):
            pre = f"model.layers.{i}."
            for mine, theirs in [("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"),
                                 ("out_proj", "o_proj")]:
                getattr(block.attn, mine).weight.copy_(sd[pre + f"self_attn.{theirs}.weight"])
            block.norm1.weight.copy_(sd[pre + "input_layernorm.weight"])
            block.norm2.weight.copy_(sd[pre + "post_attention_layernorm.weight"])
            _copy_expert_weights(block.mlp, hf.model.layers[i].mlp)
    return config, hf, ours


def test_moe_gpt_equals_mixtral_for_causal_lm():
    """A whole GPT with MoE blocks against MixtralForCausalLM with the same random weights:
    the logits and the model's balancing loss (Hugging Face pools both layers' tokens; with a
    mean over layers instead, compare layer by layer)."""
    config, hf, ours = _mixtral_pair()
    idx = torch.randint(0, 29, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(idx, output_router_logits=True)
        logits = ours(idx)
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=0)   # its router in float32
    per_layer = [modeling_mixtral.load_balancing_loss_func((g,), 4, 2) / 2 for g in ref.router_logits]
    torch.testing.assert_close(moe_balancing_loss(ours).float(), torch.stack(per_layer).mean(),
                               atol=1e-5, rtol=1e-5)
    for block, g in zip(ours.blocks, ref.router_logits):
        torch.testing.assert_close(block.mlp.last_aux["router_probs"], torch.softmax(g.double(), -1),
                                   atol=1e-6, rtol=0)


def test_moe_gpt_generates_the_same_with_and_without_cache():
    config, _, ours = _mixtral_pair(seed=1)
    start = torch.randint(0, 29, (1, 3), generator=torch.Generator().manual_seed(4))
    assert torch.equal(ours.generate(start, 8, temperature=0, use_cache=True),
                       ours.generate(start, 8, temperature=0, use_cache=False))


def test_moe_gpt_trains_with_the_balancing_loss():
    """The balancing loss reaches every router by backpropagation and lowers when minimised."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=13, n_ctx=8, d_model=16, n_layers=2, n_heads=2,
                            n_experts=4, top_k=1))
    with torch.no_grad():
        for block in model.blocks:
            block.norm2.bias.fill_(0.2)                       # LN output has mean 0: shift it,
            block.mlp.router.gate.weight[0] += 1.0           # so that the router prefers expert 0
    idx = torch.randint(0, 13, (8, 8), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if "router" in n], lr=0.5)
    losses = []
    for _ in range(30):
        model(idx)
        loss = moe_balancing_loss(model)
        opt.zero_grad()
        loss.backward()
        losses.append(float(loss.detach()))
        opt.step()
    assert all(b.mlp.router.gate.weight.grad.abs().sum() > 0 for b in model.blocks)
    assert losses[0] > 3 and losses[-1] < 1.1


def test_moe_config_validation_and_errors():
    with pytest.raises(ValueError, match="top_k: expected at most n_experts=4, got 5"):
        ModelConfig(vocab_size=5, n_ctx=4, d_model=8, n_layers=1, n_heads=2, n_experts=4, top_k=5)
    with pytest.raises(ValueError, match="n_experts: expected an int >= 0, got -1"):
        ModelConfig(vocab_size=5, n_ctx=4, d_model=8, n_layers=1, n_heads=2, n_experts=-1)
    with pytest.raises(ValueError, match="capacity_factor"):
        ModelConfig(vocab_size=5, n_ctx=4, d_model=8, n_layers=1, n_heads=2, n_experts=2,
                    capacity_factor=0.0)
    dense = GPT(ModelConfig(vocab_size=5, n_ctx=4, d_model=8, n_layers=1, n_heads=2))
    with pytest.raises(ValueError, match="model: expected at least one MoELayer"):
        moe_balancing_loss(dense)
    fresh = GPT(ModelConfig(vocab_size=5, n_ctx=4, d_model=8, n_layers=1, n_heads=2, n_experts=2))
    with pytest.raises(ValueError, match="forward pass"):
        moe_balancing_loss(fresh)
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        moe_balancing_loss("gpt")


def test_capacity_in_the_model_drops_tokens_that_then_pass_through():
    """capacity_factor from the config reaches every layer; with a tiny capacity most
    assignments are dropped and the layer's output for a fully dropped token is 0."""
    config = ModelConfig(vocab_size=13, n_ctx=8, d_model=16, n_layers=1, n_heads=2,
                         n_experts=4, top_k=1, capacity_factor=0.25)
    torch.manual_seed(0)
    model = GPT(config).eval()
    idx = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(2))
    seen = {}
    model.blocks[0].mlp.register_forward_hook(lambda m, i, o: seen.update(x=i[0], y=o))
    with torch.no_grad():
        model(idx)
    layer = model.blocks[0].mlp
    aux = layer.last_aux
    assert layer.capacity(16) == 1                       # ceil(0.25 · 16 · 1 / 4)
    assert int(aux["kept"].sum()) <= 4 < 16
    dropped = ~aux["kept"].any(dim=1)
    assert (seen["y"].reshape(16, -1)[dropped] == 0).all()
    assert load_balancing_loss(aux["router_probs"], aux["expert_index"], 4) == aux["load_balancing_loss"]


def test_moe_gpt_initialises_experts_like_the_dense_mlp():
    """GPT-2's init inside every expert: N(0, 0.02) weights, and the down projection that writes
    into the residual stream scaled by 1/√(2L), as the dense MLP's fc2; the router N(0, 0.02)."""
    torch.manual_seed(0)
    L = 4
    model = GPT(ModelConfig(vocab_size=11, n_ctx=8, d_model=64, n_layers=L, n_heads=4, n_experts=3))
    stds = {"fc1": [], "fc2": []}
    for block in model.blocks:
        for ex in block.mlp.experts:
            stds["fc1"].append(float(ex.fc1.weight.std()))
            stds["fc2"].append(float(ex.fc2.weight.std()))
            assert torch.count_nonzero(ex.fc1.bias) == 0
    assert all(abs(s - 0.02) < 0.002 for s in stds["fc1"])
    assert all(abs(s - 0.02 / (2 * L) ** 0.5) < 0.0007 for s in stds["fc2"])
    assert abs(float(model.blocks[0].mlp.router.gate.weight.std()) - 0.02) < 0.004
