"""transformer_lib: the small library behind the course *Attention and Transformers*.

One module per idea; import from the modules, e.g. ``from transformer_lib.attention import softmax``.

- ``embedding``   one-hot, embedding lookup, fixed mixing, Nadaraya–Watson  (Chapter 1)
- ``attention``   softmax, scaled dot-product attention, causal mask, SelfAttention  (Chapter 2)
- ``block``       LayerNorm, RMSNorm, MLP, TransformerBlock  (Chapters 3–4)
- ``stream``      the residual stream: states and writes, logit lens, input gradient  (Chapter 4)
- ``multihead``   split/merge heads, MultiHeadAttention  (Chapter 5)
- ``positional``  sinusoidal, learned, RoPE, ALiBi  (Chapter 6)
- ``config``, ``model``  ModelConfig, the decoder-only GPT  (Chapter 7)
- ``loading``     Hugging Face GPT-2 and LLaMA weights in a GPT  (Chapters 7 and 9)
- ``moe``         Router, MoELayer, load-balancing loss  (Chapter 8)
- ``bert``        BERT-style encoder, the trained all-MiniLM-L6-v2  (Chapters 1, 5 and 9)
- ``hooks``       named hook points, where a run reads or replaces an activation  (Chapter 4)
- ``patching``, ``attribution``  activations cached and patched by name; direct logit
  attribution  (Chapters 4, 5 and 7)
- ``counting``    parameter and FLOP counting  (Chapter 9)
- ``tiled``, ``memory``  tiled online-softmax attention, peak tensor memory  (Chapter 9)
- ``efficient``, ``vision``  sliding-window and linear attention; patches and a ViT  (Chapter 10, appendix)
- ``bpe``, ``tokenizer``, ``wordpiece``  byte-level BPE trained and applied; BERT's WordPiece  (Chapter 11, appendix)
- ``scaling``     a compute-optimal (IsoFLOP) sweep of the lab's GPT and its fits  (Chapter 12, appendix)
- ``viz``, ``data``, ``train``, ``grading``  figures, toy data, training loop, exercise checks
"""

__all__ = [
    "embedding",
    "attention",
    "block",
    "stream",
    "multihead",
    "positional",
    "config",
    "model",
    "loading",
    "moe",
    "bert",
    "hooks",
    "patching",
    "attribution",
    "counting",
    "tiled",
    "memory",
    "efficient",
    "vision",
    "bpe",
    "tokenizer",
    "wordpiece",
    "scaling",
    "viz",
    "data",
    "train",
    "grading",
]
