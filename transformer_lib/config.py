"""One dataclass that describes a transformer's architecture.

`ModelConfig` holds every choice that changes a parameter or FLOP count: widths, depth,
heads and key/value heads (GQA), MLP kind (GELU or SwiGLU), norm kind, biases, tied
embeddings, positional scheme, plus the extras of BERT-style encoders (token types, an
embedding norm, a pooler) and the experts of a mixture-of-experts MLP.
`transformer_lib.model.GPT` builds a model from it and `transformer_lib.counting` counts it.
Chapters 7, 8 and 9.
"""
from __future__ import annotations

from dataclasses import dataclass

from transformer_lib._checks import require_bool, require_choice, require_int, require_positive

MLP_KINDS = ("relu", "gelu", "gelu_tanh", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITIONAL_KINDS = ("learned", "sinusoidal", "rope", "alibi", "none")
FLAGS = ("norm_first", "bias", "tied_embeddings", "causal", "embedding_norm", "final_norm",
         "pooler", "lm_head", "fused")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only (GPT, LLaMA) or encoder-only (BERT) transformer.

    Required: `vocab_size` V, `n_ctx` (maximum sequence length), `d_model` d, `n_layers` L,
    `n_heads` h. Defaults give a GPT-2-like pre-norm decoder:
    - `d_ff=None` -> 4·d_model; `n_kv_heads=None` -> n_heads (fewer = grouped-query attention);
    - `mlp`: 'relu' | 'gelu' | 'gelu_tanh' (GPT-2's `gelu_new`) | 'swiglu' (three matrices);
    - `norm`: 'layernorm' | 'rmsnorm'; `norm_first` (pre-norm) or post-norm; `norm_eps`;
    - `bias`: biases in every linear layer (and LayerNorm); `tied_embeddings`: the
      unembedding reuses the token embedding matrix;
    - `positional`: 'learned' | 'sinusoidal' | 'rope' | 'alibi' | 'none'; `rope_base`: RoPE's
      base θ (Hugging Face's `rope_theta`: 10000 in LLaMA-2, 500000 in LLaMA-3);
    - `causal`: decoder (True) or bidirectional encoder (False);
    - BERT extras: `n_token_types` (segment embeddings, 0 = none), `embedding_norm` (a norm
      right after the embeddings), `final_norm` (a norm after the last block), `pooler`
      (a d×d tanh layer on the first token), `lm_head` (an unembedding to V logits);
    - mixture of experts: `n_experts` E (0 = a dense MLP in every block; otherwise every
      block's MLP is an `MoELayer` of E experts, each of width `d_ff`), `top_k` K experts per
      token, `capacity_factor` (None = no limit; see `MoELayer`);
    - `fused`: the attention layers may take torch's fused kernel (False: always the explicit
      path; the same numbers up to float rounding, no parameter or FLOP changes).
    Derived: `d_head` = d_model / n_heads, `kv_dim` = n_kv_heads · d_head, `n_groups`.
    Chapters 7, 8 and 9.
    """

    vocab_size: int
    n_ctx: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int | None = None
    n_kv_heads: int | None = None
    mlp: str = "gelu"
    norm: str = "layernorm"
    norm_first: bool = True
    bias: bool = True
    tied_embeddings: bool = True
    positional: str = "learned"
    causal: bool = True
    norm_eps: float = 1e-5
    n_token_types: int = 0
    embedding_norm: bool = False
    final_norm: bool = True
    pooler: bool = False
    lm_head: bool = True
    rope_base: float = 10000.0
    n_experts: int = 0
    top_k: int = 2
    capacity_factor: float | None = None
    fused: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_ctx", "d_model", "n_layers", "n_heads"):
            require_int(name, getattr(self, name))
        require_int("n_token_types", self.n_token_types, low=0)
        require_int("n_experts", self.n_experts, low=0)
        require_int("top_k", self.top_k)
        if self.n_experts and self.top_k > self.n_experts:
            raise ValueError(f"top_k: expected at most n_experts={self.n_experts}, got {self.top_k}")
        if self.capacity_factor is not None:
            require_positive("capacity_factor", self.capacity_factor)
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        require_int("d_ff", self.d_ff)
        require_int("n_kv_heads", self.n_kv_heads)
        for name in FLAGS:
            require_bool(name, getattr(self, name))
        require_positive("norm_eps", self.norm_eps)
        require_positive("rope_base", self.rope_base)
        require_choice("mlp", self.mlp, MLP_KINDS)
        require_choice("norm", self.norm, NORM_KINDS)
        require_choice("positional", self.positional, POSITIONAL_KINDS)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model: expected a multiple of n_heads={self.n_heads}, "
                             f"got d_model={self.d_model}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads: expected a divisor of n_heads={self.n_heads}, "
                             f"got n_kv_heads={self.n_kv_heads}")
        if self.positional == "rope" and self.d_head % 2:
            raise ValueError(f"d_model: expected an even d_head for positional='rope', "
                             f"got d_head={self.d_head}")

    @property
    def moe(self) -> bool:
        """True when every block's MLP is a mixture of experts (n_experts > 0). Chapter 8."""
        return self.n_experts > 0

    @property
    def d_head(self) -> int:
        """Width of one head, d_k = d_model / n_heads. Chapter 7."""
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Output width of W_K and W_V: n_kv_heads · d_head (= d_model without GQA). Chapter 9."""
        return self.n_kv_heads * self.d_head

    @property
    def n_groups(self) -> int:
        """Query heads that share one key/value head (1 = plain multi-head). Library: no chapter names it."""
        return self.n_heads // self.n_kv_heads
