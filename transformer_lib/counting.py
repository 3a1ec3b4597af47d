"""Where the parameters and the FLOPs of a transformer live, in closed form.

`param_count(config)` is exact: it counts every weight, bias and norm gain that
`transformer_lib.model.GPT` (or the Hugging Face model of the same architecture) builds,
so it agrees with `count_params(module)` to the last parameter. `flops_per_token` counts
the forward matrix-multiply FLOPs (2 per multiply-add) of every linear layer, the
unembedding, and the attention matmuls Q·Kᵀ and A·V over the full n×n score matrix, as
`torch.utils.flop_counter.FlopCounterMode` sees them in `GPT.forward`. Chapter 9.
"""
from __future__ import annotations

from torch import nn

from transformer_lib._checks import require_bool, require_instance, require_int
from transformer_lib.config import ModelConfig

__all__ = ["count_params", "param_count", "param_breakdown", "flops_breakdown",
           "forward_flops", "flops_per_token", "kv_cache_size", "PRESETS"]


def count_params(module: nn.Module) -> int:
    """Number of distinct parameters of a built model; a tied matrix is counted once.

    Works on models built under `torch.device("meta")`. Chapter 9.
    """
    require_instance("module", module, nn.Module, "a torch.nn.Module")
    return sum(p.numel() for p in module.parameters())  # parameters() skips duplicates


def _check_config(config: object) -> None:
    require_instance("config", config, ModelConfig, "a ModelConfig")


def _norm_params(c: ModelConfig) -> int:
    """One norm: gain (+ shift for a LayerNorm with bias). RMSNorm has a gain only."""
    return c.d_model * (2 if c.norm == "layernorm" and c.bias else 1)


def _attention_params(c: ModelConfig) -> int:
    """W_Q (d×d), W_K and W_V (d×kv_dim each), W_O (d×d), plus biases. Chapter 9."""
    d, kv = c.d_model, c.kv_dim
    weights = 2 * d * d + 2 * d * kv
    return weights + (2 * d + 2 * kv if c.bias else 0)


def _mlp_matrices(c: ModelConfig) -> int:
    """d×d_ff matrices in one MLP: 2 (up, down) or 3 for SwiGLU (gate, up, down)."""
    return 3 if c.mlp == "swiglu" else 2


def _mlp_params(c: ModelConfig) -> int:
    """Up/down (and gate) projections plus biases. Chapter 9."""
    k = _mlp_matrices(c)
    biases = (k - 1) * c.d_ff + c.d_model if c.bias else 0
    return k * c.d_model * c.d_ff + biases


def param_breakdown(config: ModelConfig, active: bool = False) -> dict[str, int]:
    """Exact parameter count by group; the values sum to `param_count(config, active)`.

    Keys: 'embedding' (token + token-type tables), 'positional' (learned table only),
    'attention' (Q, K, V, O of all layers), 'mlp' (with `n_experts`: all E experts of every
    layer), 'norms' (all LayerNorm/RMSNorm gains and shifts), 'unembedding' (0 when tied or
    absent), 'other' (BERT's pooler); a mixture of experts adds 'router' (E·d per layer).
    `active=True` counts what one token uses: in each MoE layer only its K experts (the
    router and everything else is used by every token; for a dense model nothing changes).
    Chapters 8 and 9.
    """
    _check_config(config)
    require_bool("active", active)
    c, d, L = config, config.d_model, config.n_layers
    n_norms = 2 * L + int(c.final_norm) + int(c.embedding_norm)
    untied_head = c.lm_head and not c.tied_embeddings
    experts = (c.top_k if active else c.n_experts) if c.moe else 1
    parts = {
        "embedding": (c.vocab_size + c.n_token_types) * d,
        "positional": c.n_ctx * d if c.positional == "learned" else 0,
        "attention": L * _attention_params(c),
        "mlp": L * experts * _mlp_params(c),
        "norms": n_norms * _norm_params(c),
        "unembedding": c.vocab_size * d if untied_head else 0,
        "other": d * d + (d if c.bias else 0) if c.pooler else 0,
    }
    if c.moe:
        parts["router"] = L * c.n_experts * d
    return parts


def param_count(config: ModelConfig, active: bool = False) -> int:
    """Exact number of parameters of the model `config` describes (≈ 12·L·d² + V·d);
    `active=True`: the parameters one token uses (a mixture of experts' K of E experts).

    Chapters 8 and 9.
    """
    return sum(param_breakdown(config, active).values())


def flops_breakdown(config: ModelConfig, n: int) -> dict[str, int]:
    """Forward matmul FLOPs of one sequence of n tokens (batch 1), by group.

    Keys: 'attention_proj' (Q, K, V, O projections), 'attention_scores' (Q·Kᵀ and A·V over
    the full n×n scores: 2·2·n²·d per layer, masked entries included), 'mlp', 'unembedding'
    (2·n·d·V), 'other' (pooler on the first token). A mixture of experts runs K experts per
    token ('mlp' grows with K, not E; exact when no capacity limit drops a token) and adds
    'router' (2·n·d·E per layer). Embedding lookups, norms, softmax and elementwise work are
    not matmuls and count 0. Chapters 9 and 11.
    """
    _check_config(config)
    require_int("n", n)
    c, d, L = config, config.d_model, config.n_layers
    parts = {
        "attention_proj": L * 2 * n * (2 * d * d + 2 * d * c.kv_dim),
        "attention_scores": L * 2 * 2 * n * n * d,
        "mlp": L * 2 * n * (c.top_k if c.moe else 1) * _mlp_matrices(c) * d * c.d_ff,
        "unembedding": 2 * n * d * c.vocab_size if c.lm_head else 0,
        "other": 2 * d * d if c.pooler else 0,
    }
    if c.moe:
        parts["router"] = L * 2 * n * d * c.n_experts
    return parts


def forward_flops(config: ModelConfig, n: int) -> int:
    """Total forward matmul FLOPs for one sequence of n tokens, an exact int. Chapter 9."""
    return sum(flops_breakdown(config, n).values())


def flops_per_token(config: ModelConfig, n: int) -> int | float:
    """Forward matmul FLOPs per token, averaged over a length-n sequence.

    ≈ 2·N_matmul + 4·L·n·d: two FLOPs per multiply-add of every weight matrix plus the
    attention matmuls, which grow with n. An int whenever it divides evenly (always for a
    model without pooler), so `flops_per_token(c, n) * n == forward_flops(c, n)`. Chapter 9.
    """
    total = forward_flops(config, n)
    return total // n if total % n == 0 else total / n


def kv_cache_size(config: ModelConfig, n: int) -> int:
    """Numbers stored in the KV cache after n tokens: 2 (K, V) · L · n · kv_dim. Chapter 9."""
    _check_config(config)
    require_int("n", n)
    return 2 * config.n_layers * n * config.kv_dim


_GPT2 = dict(vocab_size=50257, mlp="gelu_tanh")
_LLAMA = dict(mlp="swiglu", norm="rmsnorm", bias=False, tied_embeddings=False, positional="rope")

PRESETS: dict[str, ModelConfig] = {
    # Radford et al. (2019); "117M" in the paper, 124,439,808 counted.
    "gpt2": ModelConfig(n_ctx=1024, d_model=768, n_layers=12, n_heads=12, **_GPT2),
    "gpt2-medium": ModelConfig(n_ctx=1024, d_model=1024, n_layers=24, n_heads=16, **_GPT2),
    # Brown et al. (2020): GPT-2 layout at L=96, d=12288 (dense attention counted).
    "gpt3": ModelConfig(n_ctx=2048, d_model=12288, n_layers=96, n_heads=96, **_GPT2),
    # Devlin et al. (2019): post-norm encoder, segment embeddings, embedding norm, pooler.
    "bert-base": ModelConfig(vocab_size=30522, n_ctx=512, d_model=768, n_layers=12, n_heads=12,
                             norm_first=False, causal=False, norm_eps=1e-12, n_token_types=2,
                             embedding_norm=True, final_norm=False, pooler=True, lm_head=False),
    # Touvron et al. (2023): SwiGLU, RMSNorm, RoPE, no biases, untied unembedding.
    "llama2-7b": ModelConfig(vocab_size=32000, n_ctx=4096, d_model=4096, n_layers=32,
                             n_heads=32, d_ff=11008, **_LLAMA),
    "llama3-70b": ModelConfig(vocab_size=128256, n_ctx=8192, d_model=8192, n_layers=80,
                              n_heads=64, n_kv_heads=8, d_ff=28672, rope_base=500000.0,
                              **_LLAMA),
    # Jiang et al. (2024): LLaMA layout, GQA, each MLP 8 SwiGLU experts, 2 per token.
    "mixtral-8x7b": ModelConfig(vocab_size=32000, n_ctx=32768, d_model=4096, n_layers=32,
                                n_heads=32, n_kv_heads=8, d_ff=14336, rope_base=1e6,
                                n_experts=8, top_k=2, **_LLAMA),
    # A character-level model that trains on a CPU in seconds.
    "tiny": ModelConfig(vocab_size=65, n_ctx=64, d_model=64, n_layers=2, n_heads=4),
}
