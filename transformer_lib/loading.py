"""Hugging Face checkpoints in a `GPT`: GPT-2 (`GPT2LMHeadModel`) and LLaMA (`LlamaForCausalLM`).

A loader pairs every parameter of a `GPT` built from the config with one Hugging Face tensor,
in `nn.Linear`'s `(out, in)` layout, and copies it after checking its shape; a missing or
mis-shaped tensor raises an error that names the Hugging Face key. What has no tensor
(`n_heads`, `norm_eps`, `rope_base`) must come from the config. `GPT.from_gpt2_state_dict`
and `GPT.from_llama_state_dict` call these functions. Chapters 7 and 9.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from transformer_lib._checks import require_instance, require_tensor
from transformer_lib.config import ModelConfig

__all__ = ["check_gpt2_config", "check_llama_config", "gpt2_tensors", "llama_key",
           "llama_tensors", "copy_tensors"]

Source = Callable[[str], tuple[str, Tensor]]  # our parameter name -> (their key, tensor)

# (our name inside blocks.i, Hugging Face's name inside model.layers.i) for LLaMA
LLAMA_LAYER_NAMES = (("attn.q_proj", "self_attn.q_proj"), ("attn.k_proj", "self_attn.k_proj"),
                     ("attn.v_proj", "self_attn.v_proj"), ("attn.out_proj", "self_attn.o_proj"),
                     ("mlp.fc1", "mlp.gate_proj"), ("mlp.fc3", "mlp.up_proj"),
                     ("mlp.fc2", "mlp.down_proj"), ("norm1", "input_layernorm"),
                     ("norm2", "post_attention_layernorm"))
LLAMA_TOP_NAMES = {"tok_emb.weight": "embed_tokens.weight", "norm_f.weight": "norm.weight",
                   "lm_head.weight": "lm_head.weight"}


def _require_layout(config: object, wanted: dict, what: str) -> None:
    require_instance("config", config, ModelConfig, "a ModelConfig")
    for field, value in wanted.items():
        if getattr(config, field) != value:
            raise ValueError(f"config.{field}: {what} weights need {value!r}, "
                             f"got {getattr(config, field)!r}")


def check_gpt2_config(config: ModelConfig) -> None:
    """Reject configs whose layout differs from GPT-2's (GELU-tanh, LayerNorm with biases,
    learned positions, tied embeddings, d_ff = 4d, no GQA). Library: no chapter names it."""
    _require_layout(config, {"mlp": "gelu_tanh", "norm": "layernorm", "norm_first": True,
                             "bias": True, "tied_embeddings": True, "positional": "learned",
                             "final_norm": True, "embedding_norm": False}, "GPT-2")
    if config.n_kv_heads != config.n_heads or config.d_ff != 4 * config.d_model:
        raise ValueError(f"config: GPT-2 weights need n_kv_heads=n_heads and d_ff=4·d_model, got "
                         f"n_kv_heads={config.n_kv_heads}, d_ff={config.d_ff}")


def check_llama_config(config: ModelConfig) -> None:
    """Reject configs whose layout differs from LLaMA's (pre-norm RMSNorm, SwiGLU, RoPE, a
    final norm). Biases, tied embeddings and GQA are free: the tensors decide. Library: no chapter names it."""
    _require_layout(config, {"mlp": "swiglu", "norm": "rmsnorm", "norm_first": True,
                             "positional": "rope", "final_norm": True, "embedding_norm": False},
                    "LLaMA")


def _getter(sd: Mapping[str, object], what: str, prefix: str) -> Callable[[str], Tensor]:
    def get(key: str) -> Tensor:
        if key not in sd:
            raise ValueError(f"state_dict: expected a {what} key {key!r} "
                             f"(with or without {prefix!r}), not found")
        return require_tensor(f"state_dict[{key!r}]", sd[key])
    return get


def gpt2_tensors(state_dict: Mapping[str, Tensor], c: ModelConfig) -> dict[str, tuple[str, Tensor]]:
    """Our parameter name -> (Hugging Face key, tensor in our layout) for GPT-2.

    `Conv1D` stores weights as `(in, out)`, the transpose of `nn.Linear`'s `(out, in)`;
    `attn.c_attn` packs Q, K, V along its output dimension, `(d, 3d) -> 3 × (d, d)`; keys
    with or without the `transformer.` prefix. Library: no chapter names it.
    """
    require_instance("state_dict", state_dict, Mapping, "a dict of tensors")
    get = _getter({k.removeprefix("transformer."): v for k, v in state_dict.items()},
                  "GPT-2", "transformer.")
    out = {f"{ours}.{p}": (f"{theirs}.{p}", get(f"{theirs}.{p}"))
           for ours, theirs, params in (("tok_emb", "wte", ("weight",)),
                                        ("pos_emb", "wpe", ("weight",)),
                                        ("norm_f", "ln_f", ("weight", "bias")))
           for p in params}
    for i in range(c.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        for ours, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
            for p in ("weight", "bias"):
                out[f"{b}{ours}.{p}"] = (f"{h}{theirs}.{p}", get(f"{h}{theirs}.{p}"))
        key = f"{h}attn.c_attn."
        w = get(key + "weight")                                    # (d, 3d): x @ w = [q|k|v]
        biases = get(key + "bias").split(c.d_model)
        for name, wp, bp in zip("qkv", w.split(c.d_model, dim=-1), biases):
            out[f"{b}attn.{name}_proj.weight"] = (key + "weight", wp.t())
            out[f"{b}attn.{name}_proj.bias"] = (key + "bias", bp)
        for ours, theirs in (("attn.out_proj", "attn.c_proj"), ("mlp.fc1", "mlp.c_fc"),
                             ("mlp.fc2", "mlp.c_proj")):
            out[f"{b}{ours}.weight"] = (f"{h}{theirs}.weight", get(f"{h}{theirs}.weight").t())
            out[f"{b}{ours}.bias"] = (f"{h}{theirs}.bias", get(f"{h}{theirs}.bias"))
    return out


def _renamed(name: str, layer_names: Sequence[tuple[str, str]], top_names: Mapping[str, str],
             layer_prefix: str) -> str:
    """Another model's key for our parameter `name`: `blocks.i.<ours>…` becomes
    `<layer_prefix>i.<theirs>…` by the first matching pair of `layer_names`; any other name is
    looked up in `top_names`."""
    if name.startswith("blocks."):
        _, i, rest = name.split(".", 2)
        for ours, theirs in layer_names:
            if rest.startswith(ours + "."):
                return f"{layer_prefix}{i}.{theirs}{rest[len(ours):]}"
    return top_names[name]


def llama_key(name: str) -> str:
    """Hugging Face's `LlamaModel` key for one of our parameter names, e.g.
    `blocks.0.mlp.fc1.weight -> layers.0.mlp.gate_proj.weight`. Library: no chapter names it."""
    return _renamed(name, LLAMA_LAYER_NAMES, LLAMA_TOP_NAMES, "layers.")


def llama_tensors(state_dict: Mapping[str, Tensor], c: ModelConfig) -> Source:
    """Our parameter name -> (Hugging Face key, tensor) for `LlamaForCausalLM`.

    Hugging Face's LLaMA already uses `nn.Linear`'s `(out, in)` layout and the rotate-half
    RoPE pairing of `positional.apply_rope`, so tensors copy as they are: q_proj `(d, d)`,
    k_proj and v_proj `(n_kv_heads·d_head, d)` (GQA), o_proj, gate/up/down -> fc1/fc3/fc2.
    Keys with or without the `model.` prefix (`LlamaModel` has no `lm_head`, fine when
    tied). With tied embeddings a stored `lm_head.weight` must equal `embed_tokens.weight`;
    a tensor nothing reads (a bias with `bias=False`) is an error. Library: no chapter names it.
    """
    require_instance("state_dict", state_dict, Mapping, "a dict of tensors")
    sd = {k.removeprefix("model."): v for k, v in state_dict.items()}
    get = _getter(sd, "LLaMA", "model.")
    params = {False: ("weight",), True: ("weight", "bias")}
    used = {llama_key(f"blocks.{i}.{ours}.{p}") for i in range(c.n_layers)
            for ours, _ in LLAMA_LAYER_NAMES for p in params[c.bias and "norm" not in ours]}
    used |= set(LLAMA_TOP_NAMES.values())
    extra = sorted(k for k in sd if k not in used and not k.endswith("rotary_emb.inv_freq"))
    if extra:
        raise ValueError(f"state_dict: expected only tensors of the config's LLaMA layout "
                         f"(n_layers={c.n_layers}, bias={c.bias}), got unused keys {extra[:4]}")
    if c.tied_embeddings and "lm_head.weight" in sd and not torch.equal(
            get("lm_head.weight"), get("embed_tokens.weight")):
        raise ValueError("state_dict['lm_head.weight']: expected it equal to "
                         "'embed_tokens.weight' (config.tied_embeddings=True), got another matrix")
    return lambda name: (llama_key(name), get(llama_key(name)))


def copy_tensors(model: nn.Module, source: Source) -> nn.Module:
    """Copy into each parameter of `model` the tensor `source(name)` returns, after checking
    that its shape equals the parameter's `(out, in)`; a tied matrix is copied once.
    Returns `model`. Chapter 9, through `BertEncoder`."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            key, tensor = source(name)
            if tensor.shape != param.shape:
                raise ValueError(f"state_dict[{key!r}]: expected shape {tuple(param.shape)} "
                                 f"(from config), got {tuple(tensor.shape)}")
            param.copy_(tensor)
    return model
