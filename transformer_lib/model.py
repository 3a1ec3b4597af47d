"""A decoder-only transformer language model (GPT) with a real KV cache.

    token ids (b, n) -> token embedding (+ positions) -> L causal blocks -> final norm
                     -> unembedding (tied to the token embedding) -> logits (b, n, V)

Every architectural choice comes from a `ModelConfig`, so the same class builds GPT-2
(learned positions, GELU, LayerNorm, biases) and a small LLaMA (RoPE, SwiGLU, RMSNorm,
grouped-query attention, no biases, untied unembedding). `generate` samples one token at a
time; with `use_cache=True` it runs the prompt once and then feeds only the newest token,
reusing the keys and values stored by each layer. `GPT.from_gpt2_state_dict` and
`GPT.from_llama_state_dict` load Hugging Face weights (`transformer_lib.loading`).

To read the forward pass, start with Chapter 7's `my_gpt`, the same computation written out in
one function; here it runs `GPT.forward` -> `TransformerBlock.forward` (block.py) ->
`MultiHeadAttention.forward` (multihead.py), which ends in the attention product. The hook
points met on the way (`transformer_lib.hooks`) are identities unless a run registers on them.
Chapter 7.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
import torch
from torch import Tensor, nn

from transformer_lib import loading
from transformer_lib._checks import (require_bool, require_ids, require_instance, require_int,
                                     require_positions, require_positive)
from transformer_lib.block import TransformerBlock, make_norm
from transformer_lib.config import ModelConfig
from transformer_lib.moe import moe_block
from transformer_lib.positional import LearnedPositionalEmbedding, sinusoidal_encoding
from transformer_lib.stream import Stream, recording

__all__ = ["GPT"]

Cache = list[dict]  # one dict per layer; each layer stores cache["k"], cache["v"] (b, h_kv, t, d_k)


def _make_norm(c: ModelConfig) -> nn.Module:
    """The norm a config asks for, built as the blocks build theirs. Chapter 7."""
    return make_norm(c.norm, c.d_model, c.norm_eps, c.bias)


def _check_decoder_config(config: object) -> None:
    """GPT builds decoder-only LMs: the encoder extras (token types, pooler, no LM head) are
    `BertEncoder`'s. Chapter 7."""
    require_instance("config", config, ModelConfig, "a ModelConfig")
    wanted = {"causal": True, "n_token_types": 0, "pooler": False, "lm_head": True}
    for field, value in wanted.items():
        if getattr(config, field) != value:
            raise ValueError(f"config.{field}: GPT is a decoder-only LM and expects {value!r}, "
                             f"got {getattr(config, field)!r}")


def _make_block(c: ModelConfig, residual: bool) -> TransformerBlock:
    """One causal block as the config asks; with `n_experts` its MLP is an `MoELayer`.

    Chapters 7 and 8."""
    kwargs = dict(norm_first=c.norm_first, activation=c.mlp, causal=True, bias=c.bias,
                  norm=c.norm, n_kv_heads=c.n_kv_heads, rope=c.positional == "rope",
                  rope_base=c.rope_base, alibi=c.positional == "alibi", norm_eps=c.norm_eps,
                  residual=residual, fused=c.fused)
    if c.moe:
        return moe_block(c.d_model, c.n_heads, c.n_experts, c.top_k, c.d_ff,
                         c.capacity_factor, **kwargs)
    return TransformerBlock(c.d_model, c.n_heads, c.d_ff, **kwargs)


class GPT(nn.Module):
    """Decoder-only language model: `(batch, n)` token ids -> `(batch, n, vocab_size)` logits.

    Submodules: `tok_emb` (nn.Embedding V×d), `pos_emb` (LearnedPositionalEmbedding, only for
    positional='learned'; 'sinusoidal' adds a fixed buffer, 'rope'/'alibi' act inside
    attention, 'none' adds nothing), `emb_norm` (only with embedding_norm), `blocks`
    (ModuleList of causal TransformerBlocks; with `config.n_experts` each block's `mlp` is
    an `MoELayer`, see `moe_balancing_loss`), `norm_f` (final norm or Identity), `lm_head`
    (nn.Linear d→V without bias, its weight *is* `tok_emb.weight` when tied).
    `residual=False` removes every block's skip connections (`y = f(x)`). Chapters 4, 7 and 8.
    """

    def __init__(self, config: ModelConfig, *, residual: bool = True) -> None:
        super().__init__()
        _check_decoder_config(config)
        self.residual = require_bool("residual", residual)
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        if c.positional == "learned":
            self.pos_emb = LearnedPositionalEmbedding(c.n_ctx, c.d_model)
        elif c.positional == "sinusoidal":
            pos_enc = sinusoidal_encoding(c.n_ctx, c.d_model)          # fixed, not a parameter
            self.register_buffer("pos_enc", pos_enc, persistent=False)
        self.emb_norm = _make_norm(c) if c.embedding_norm else nn.Identity()
        self.blocks = nn.ModuleList(_make_block(c, residual) for _ in range(c.n_layers))
        self.norm_f = _make_norm(c) if c.final_norm else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tied_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        if not self.tok_emb.weight.is_meta:   # built on the meta device (to count): no values
            self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights, zero biases, and the projections that
        write into the residual stream scaled by 1/√(2L) so the stream's variance does not
        grow with depth. Norms keep gain 1. Chapter 7."""
        std = 0.02
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                # the layers that write to the stream: out_proj and every MLP's (or expert's) fc2
                writes = name.endswith(("attn.out_proj", ".fc2"))
                nn.init.normal_(module.weight, 0.0, std / math.sqrt(2 * self.config.n_layers)
                                if writes else std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ forward
    def _check_idx(self, idx: object) -> tuple[Tensor, bool]:
        """Validate token ids; return them as (b, n) and whether the input was unbatched."""
        require_ids("idx", idx, self.config.vocab_size, "vocab_size")
        if idx.dim() not in (1, 2):
            raise ValueError(f"idx: expected shape (batch, n) or (n,), got {tuple(idx.shape)}")
        return (idx.unsqueeze(0), True) if idx.dim() == 1 else (idx, False)

    def _cache_len(self, cache: Cache | None) -> int:
        """Number of positions already stored in the KV cache (0 without cache)."""
        if cache is None:
            return 0
        if not isinstance(cache, list) or len(cache) != self.config.n_layers \
                or not all(isinstance(layer, dict) for layer in cache):
            raise ValueError(f"cache: expected a list of {self.config.n_layers} dicts (one per "
                             f"layer), got {type(cache).__name__} of length "
                             f"{len(cache) if isinstance(cache, list) else '?'}")
        k = cache[0].get("k")
        return 0 if k is None else k.shape[-2]

    def _inputs(self, idx: object, cache: Cache | None,
                positions: Tensor | None) -> tuple[Tensor, bool, Tensor]:
        """The checks of `forward`'s inputs: ids, cache and positions ``-> (idx (b, n), unbatched,
        positions (b, n))``, positions by default ``t, …, t + n − 1`` after t cached tokens."""
        idx, unbatched = self._check_idx(idx)
        c, n = self.config, idx.shape[1]
        t = self._cache_len(cache)
        if t + n > c.n_ctx:
            where = f"n={n}" if t == 0 else f"{t} cached + {n} new = {t + n}"
            raise ValueError(f"idx: expected at most n_ctx={c.n_ctx} tokens, got {where}")
        if positions is None:
            positions = torch.arange(t, t + n, device=idx.device).expand(idx.shape[0], n)
        positions = require_positions("positions", positions, idx.shape[0], n)    # (b, n)
        if c.positional in ("learned", "sinusoidal"):
            require_ids("positions", positions, c.n_ctx, "n_ctx")
        return idx, unbatched, positions

    def embed(self, idx: Tensor, positions: Tensor) -> Tensor:
        """The stream's first state: token embeddings plus learned or sinusoidal position
        vectors (none for RoPE, ALiBi and 'none'), then the embedding norm if any:
        ids ``(b, n)`` at positions ``(b, n)`` -> ``(b, n, d)``. Library: no chapter names it."""
        x = self.tok_emb(idx)                                        # (b, n, d)
        if self.config.positional == "learned":
            x = x + self.pos_emb(positions)
        elif self.config.positional == "sinusoidal":
            x = x + self.pos_enc[positions]
        return self.emb_norm(x)

    def forward(self, idx: Tensor, cache: Cache | None = None,
                positions: Tensor | None = None,
                return_stream: bool = False) -> Tensor | tuple[Tensor, Stream]:
        """Logits for the next token at every position: `(b, n) -> (b, n, V)`, `(n,) -> (n, V)`.

        `cache`: a list of `n_layers` dicts, empty at first, that the layers extend with the
        keys and values of `idx`; positions then start after the cached ones.
        `positions`: integer positions `(b, n)` or `(n,)` of the tokens (Hugging Face's
        `position_ids`), default `t, …, t + n − 1` after t cached tokens; below `n_ctx` for
        learned and sinusoidal positions, any `>= 0` for RoPE and ALiBi.
        `return_stream=True` returns `(logits, Stream(states, writes))`. Chapters 4 and 7.
        """
        idx, unbatched, positions = self._inputs(idx, cache, positions)
        x = self.embed(idx, positions)                               # (b, n, d)
        stream = Stream([x], []) if require_bool("return_stream", return_stream) else None
        with nullcontext() if stream is None else recording(self.blocks, stream):
            for i, block in enumerate(self.blocks):
                x = block(x, cache=None if cache is None else cache[i], positions=positions)
        logits = self.lm_head(self.norm_f(x))                        # (b, n, V)
        if stream is None:
            return logits[0] if unbatched else logits
        return (logits[0], stream.unbatched()) if unbatched else (logits, stream)

    # ------------------------------------------------------------------ generation
    @staticmethod
    def _sample(logits: Tensor, temperature: float, top_k: int | None,
                generator: torch.Generator | None) -> Tensor:
        """`(b, V)` logits -> `(b, 1)` token ids; temperature 0 is greedy. Half-precision logits
        are divided, filtered and normalised in float32. Chapter 7."""
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
        if top_k is not None:
            kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits.float(), dim=-1)
        return torch.multinomial(probs, 1, generator=generator)

    @torch.no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, use_cache: bool = True,
                 generator: torch.Generator | None = None) -> Tensor:
        """Extend `idx` by sampling: `(b, n) -> (b, n + max_new_tokens)`, `(n,) -> (n + …,)`.

        Each step conditions on the last `n_ctx` tokens. Without cache every step runs the
        whole window again (O(n²·d) per token); with `use_cache` the prompt is run once
        (prefill) and each later step feeds one token through the stored keys and values
        (O(n·d)). Once the window is full the cache is rebuilt from the last `n_ctx`
        tokens, so both paths always see the same context and give the same tokens.
        `temperature` (a number >= 0) divides the logits, and `temperature=0` picks the
        argmax; `top_k` (None or 1 … vocab_size) keeps the k most likely tokens; `generator`
        seeds the sampling. Chapter 7.
        """
        idx, unbatched = self._check_idx(idx)
        require_int("max_new_tokens", max_new_tokens, low=0)
        require_positive("temperature", temperature, allow_zero=True)
        if top_k is not None and require_int("top_k", top_k) > self.config.vocab_size:
            raise ValueError(f"top_k: expected at most vocab_size={self.config.vocab_size}, "
                             f"got {top_k}")
        n_ctx, cache = self.config.n_ctx, None
        for _ in range(max_new_tokens):
            if not use_cache:
                logits = self(idx[:, -n_ctx:])
            elif cache is None or self._cache_len(cache) >= n_ctx:
                cache = [{} for _ in self.blocks]                    # prefill
                logits = self(idx[:, -n_ctx:], cache=cache)
            else:
                logits = self(idx[:, -1:], cache=cache)              # one new token
            next_id = self._sample(logits[:, -1], temperature, top_k, generator)
            idx = torch.cat([idx, next_id], dim=1)
        return idx[0] if unbatched else idx

    # ------------------------------------------------------------------ pretrained weights
    @classmethod
    def from_gpt2_state_dict(cls, state_dict: dict[str, Tensor], config: ModelConfig) -> "GPT":
        """A GPT holding the weights of a Hugging Face `GPT2LMHeadModel` (or `GPT2Model`).

        `config` must describe GPT-2's layout (mlp='gelu_tanh' for `gelu_new`, LayerNorm with
        biases, learned positions, tied embeddings); `loading.gpt2_tensors` transposes the
        `(in, out)` Conv1D weights and splits `c_attn` into Q, K, V. Library: no chapter names it.
        """
        _check_decoder_config(config)
        loading.check_gpt2_config(config)
        tensors = loading.gpt2_tensors(state_dict, config)
        return loading.copy_tensors(cls(config), tensors.__getitem__)

    @classmethod
    def from_llama_state_dict(cls, state_dict: dict[str, Tensor], config: ModelConfig) -> "GPT":
        """A GPT holding the weights of a Hugging Face `LlamaForCausalLM` (or `LlamaModel`).

        `config` must give LLaMA's layout (mlp='swiglu', norm='rmsnorm', positional='rope')
        and the numbers no tensor carries: `n_heads`, `n_kv_heads`, `norm_eps`
        (`rms_norm_eps`) and `rope_base` (`rope_theta`). Tensor names and `(out, in)`
        layouts: `loading.llama_tensors`. Library: no chapter names it.
        """
        _check_decoder_config(config)
        loading.check_llama_config(config)
        source = loading.llama_tensors(state_dict, config)
        return loading.copy_tensors(cls(config), source)
