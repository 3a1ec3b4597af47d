"""Random tensors and parameters shared by the library's tests (seeded, float64)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

D64 = torch.float64


def error_message(fn, *args, exc: type | tuple = (TypeError, ValueError, ImportError)) -> str:
    """The message of the ``exc`` that ``fn(*args)`` raises, to be compared in full (the
    argument, the expected and the actual value); fails if it raises nothing or another error."""
    with pytest.raises(exc) as info:
        fn(*args)
    return str(info.value)


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    """A seeded standard-normal float64 tensor of the given shape."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=D64)


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random values for every parameter (norm gains stay near 1), so that copying each one,
    biases included, is actually tested: torch initialises biases and norm shifts to 0 (and
    ``nn.MultiheadAttention``'s ``in_proj_bias`` and ``out_proj.bias`` too), so copying the wrong
    one would go unseen."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5 + (p == 1).to(p.dtype))
    return module


# --------------------------------------------------------------------------- independent references
# Forward passes assembled from the weights with torch.nn.functional only (no library code), so
# that a bug shared by the library's cached and uncached paths still shows up.
def ref_layernorm(x: torch.Tensor, norm: nn.Module, kind: str, eps: float | None = None) -> torch.Tensor:
    """LayerNorm via ``F.layer_norm``, RMSNorm via ``F.rms_norm``, with the module's gain (and
    its eps unless ``eps`` is given: a model's reference passes its config's)."""
    eps = norm.eps if eps is None else eps
    if kind == "layernorm":
        return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, eps)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)


def ref_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate dimension pairs (k, k + d/2) of ``(…, n, d)`` by ``p / base^(2k/d)`` (complex form)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=D64) / d)
    angle = positions.to(D64)[:, None] * inv[None, :]                       # (n, d/2)
    z = torch.complex(x[..., : d // 2].to(D64), x[..., d // 2:].to(D64)) * torch.polar(
        torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def ref_alibi(n_heads: int, n: int, m: int, symmetric: bool = True) -> torch.Tensor:
    """``-slope_h · |δ|`` (or ``-slope_h · δ``) with δ = query position − key position, queries
    the last n of m positions; slopes ``2^(-8i/h)`` for h a power of two. ``(h, n, m)``."""
    assert n_heads & (n_heads - 1) == 0, "power-of-two heads only"
    slopes = torch.tensor([2.0 ** (-8.0 * i / n_heads) for i in range(1, n_heads + 1)], dtype=D64)
    delta = (torch.arange(n, dtype=D64)[:, None] + m - n) - torch.arange(m, dtype=D64)[None, :]
    return -slopes[:, None, None] * (delta.abs() if symmetric else delta)


def ref_mha(mha: nn.Module, x: torch.Tensor, mask: torch.Tensor | None = None,
            context: torch.Tensor | None = None, **flags) -> torch.Tensor:
    """A library ``MultiHeadAttention`` recomputed with ``F.scaled_dot_product_attention``:
    its weights, queries at positions 0…n−1, and ``flags`` (causal, rope, alibi, rope_base)
    taken from the module unless given (a model's reference passes its config's)."""
    causal, rope, alibi, rope_base = (flags.get(f, getattr(mha, f)) for f in ("causal", "rope", "alibi", "rope_base"))
    src = x if context is None else context
    b, n, _ = x.shape
    m, h, h_kv = src.shape[1], mha.n_heads, mha.n_kv_heads
    q = F.linear(x, mha.q_proj.weight, mha.q_proj.bias).view(b, n, h, -1).transpose(1, 2)
    k = F.linear(src, mha.k_proj.weight, mha.k_proj.bias).view(b, m, h_kv, -1).transpose(1, 2)
    v = F.linear(src, mha.v_proj.weight, mha.v_proj.bias).view(b, m, h_kv, -1).transpose(1, 2)
    if rope:
        q = ref_rope(q, torch.arange(n), rope_base)
        k = ref_rope(k, torch.arange(m), rope_base)
    allowed = torch.ones(n, m, dtype=torch.bool)
    if causal:
        allowed = torch.ones(n, m, dtype=torch.bool).tril(m - n)
    if mask is not None:
        allowed = allowed & mask
    bias = torch.zeros(n, m, dtype=x.dtype).masked_fill(~allowed, float("-inf"))
    if alibi:
        bias = bias + ref_alibi(h, n, m).to(x.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=h_kv != h)
    return F.linear(out.transpose(1, 2).reshape(b, n, -1), mha.out_proj.weight, mha.out_proj.bias)


def ref_mlp(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The library ``MLP`` recomputed: relu/gelu/gelu_tanh/SwiGLU (LLaMA's w2(silu(w1 x) * w3 x))."""
    h = F.linear(x, mlp.fc1.weight, mlp.fc1.bias)
    act = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}
    if mlp.activation == "swiglu":
        h = F.silu(h) * F.linear(x, mlp.fc3.weight, mlp.fc3.bias)
    else:
        h = act[mlp.activation](h)
    return F.linear(h, mlp.fc2.weight, mlp.fc2.bias)


def ref_block(block: nn.Module, x: torch.Tensor, kind: str, mask: torch.Tensor | None = None,
              norm_first: bool | None = None, eps: float | None = None, **flags) -> torch.Tensor:
    """A library ``TransformerBlock`` (pre- or post-norm, with residuals) recomputed; ``flags``
    go to :func:`ref_mha`, ``eps`` to :func:`ref_layernorm`."""
    if block.norm_first if norm_first is None else norm_first:
        x = x + ref_mha(block.attn, ref_layernorm(x, block.norm1, kind, eps), mask, **flags)
        return x + ref_mlp(block.mlp, ref_layernorm(x, block.norm2, kind, eps))
    x = ref_layernorm(x + ref_mha(block.attn, x, mask, **flags), block.norm1, kind, eps)
    return ref_layernorm(x + ref_mlp(block.mlp, x), block.norm2, kind, eps)


def ref_sinusoidal(n: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """``p[i, 2k] = sin(i / base^(2k/d))``, ``p[i, 2k+1] = cos(…)`` by a loop, float64."""
    p = torch.zeros(n, d, dtype=D64)
    for i in range(n):
        for c in range(d):
            angle = torch.tensor(i / base ** ((c - c % 2) / d), dtype=D64)
            p[i, c] = torch.sin(angle) if c % 2 == 0 else torch.cos(angle)
    return p


def ref_gpt(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """A library ``GPT`` recomputed from its config and weights: ``(b, n) -> (b, n, V)``."""
    c = model.config
    n = idx.shape[1]
    x = F.embedding(idx, model.tok_emb.weight)
    if c.positional == "learned":
        x = x + model.pos_emb.weight[:n]
    elif c.positional == "sinusoidal":
        x = x + ref_sinusoidal(n, c.d_model).to(x.dtype)
    if c.embedding_norm:
        x = ref_layernorm(x, model.emb_norm, c.norm, c.norm_eps)
    flags = dict(causal=True, rope=c.positional == "rope", alibi=c.positional == "alibi",
                 rope_base=getattr(c, "rope_base", 10000.0), norm_first=c.norm_first, eps=c.norm_eps)
    for block in model.blocks:
        x = ref_block(block, x, c.norm, **flags)
    if c.final_norm:
        x = ref_layernorm(x, model.norm_f, c.norm, c.norm_eps)
    return F.linear(x, model.lm_head.weight)
