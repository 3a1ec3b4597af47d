"""The transformer block: attention communicates between tokens, the MLP computes per token.

Pre-norm (``norm_first=True``, GPT-2 and most modern models)::

    x1  = x  + Attn(LN1(x))
    out = x1 + MLP(LN2(x1))

Post-norm (``norm_first=False``, the original Transformer and BERT)::

    x1  = LN1(x  + Attn(x))
    out = LN2(x1 + MLP(x1))

Chapter 3 builds the block (LayerNorm, MLP, both norm placements); Chapter 4 studies the
residual stream (``residual=False`` removes the skip connections, ``return_stream=True``
exposes what each sub-layer writes).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib._checks import (require_bool, require_choice, require_instance, require_int,
                                     require_positive, require_width)
from transformer_lib.config import MLP_KINDS as ACTIVATIONS
from transformer_lib.config import NORM_KINDS as NORMS
from transformer_lib.hooks import HookPoint
from transformer_lib.multihead import MultiHeadAttention

__all__ = ["LayerNorm", "RMSNorm", "MLP", "make_norm", "TransformerBlock", "ACTIVATIONS", "NORMS"]


class LayerNorm(nn.Module):
    """``γ ⊙ (h − μ) / √(σ² + ε) + β`` with μ, σ² the mean and (biased) variance over the
    features of each token, not over the batch. Chapter 3 writes the formula out; the layer
    computes it with torch's fused ``F.layer_norm`` (one kernel forward and one backward instead
    of six, a tenth of a training step of the lab's model). ``(…, d) -> (…, d)``. Chapter 3.
    """

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.d, self.eps = require_int("d", d), require_positive("eps", eps)
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """Normalise each token's features: ``(…, d) -> (…, d)``. Chapter 3."""
        require_width("x", x, self.d)
        return F.layer_norm(x, (self.d,), self.weight, self.bias, self.eps)  # biased variance

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """``γ ⊙ h / √(mean(h²) + ε)``: LayerNorm without centring and without β (LLaMA).
    ``(…, d) -> (…, d)``. As in LLaMA, half-precision inputs are normalised in float32 (their
    squares can overflow float16) and the result is returned in the input's dtype. Chapter 3.
    """

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.d, self.eps = require_int("d", d), require_positive("eps", eps)
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        """Rescale each token to unit root mean square: ``(…, d) -> (…, d)``. Chapter 3."""
        require_width("x", x, self.d)
        h = x.to(torch.promote_types(x.dtype, torch.float32))  # float16/bfloat16 -> float32
        h = h * torch.rsqrt((h * h).mean(dim=-1, keepdim=True) + self.eps)
        return h.to(x.dtype) * self.weight.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


class MLP(nn.Module):
    """Position-wise feed-forward network ``d -> d_ff -> d`` (``d_ff`` defaults to 4d).

    - relu | gelu | gelu_tanh: ``fc2(σ(fc1 x))`` (gelu_tanh is GPT-2's tanh approximation).
    - swiglu: ``fc2(silu(fc1 x) ⊙ fc3 x)`` (LLaMA's ``w2(silu(w1 x) * w3 x)``: fc1 is the
      gate, fc3 the up projection, fc2 the down projection).

    ``(…, d_model) -> (…, d_model)``. Chapter 3.
    """

    def __init__(self, d_model: int, d_ff: int | None = None, activation: str = "gelu", bias: bool = True):
        super().__init__()
        require_choice("activation", activation, ACTIVATIONS)
        require_int("d_model", d_model)
        d_ff = 4 * d_model if d_ff is None else require_int("d_ff", d_ff)
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        if activation == "swiglu":
            self.fc3 = nn.Linear(d_model, d_ff, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """The same two-layer network on every token: ``(…, d_model) -> (…, d_model)``. Chapter 3."""
        require_width("x", x, self.d_model)
        h = self.fc1(x)
        if self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        else:
            h = F.silu(h) * self.fc3(x)
        return self.fc2(h)


def make_norm(norm: str, d: int, eps: float, bias: bool = True) -> nn.Module:
    """``"layernorm"`` -> ``LayerNorm(d, eps, bias)``, ``"rmsnorm"`` -> ``RMSNorm(d, eps)``. Chapter 3, through `TransformerBlock`."""
    require_choice("norm", norm, NORMS)
    return LayerNorm(d, eps=eps, bias=bias) if norm == "layernorm" else RMSNorm(d, eps=eps)


class TransformerBlock(nn.Module):
    """One transformer block: multi-head attention then MLP, each with a norm and a residual.

    ``(batch, n, d_model) -> (batch, n, d_model)`` (unbatched ``(n, d_model)`` works too).
    ``residual=False`` drops both skip connections (``x1 = Attn(LN1(x))`` etc.), for the
    Chapter 4 experiments. Other keywords are passed to ``MultiHeadAttention`` (``rope_base``
    is RoPE's θ, ``fused`` chooses its path) and ``MLP``.

    Chapters 3–4.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        norm_first: bool = True,
        activation: str = "gelu",
        causal: bool = False,
        *,
        bias: bool = True,
        norm: str = "layernorm",
        n_kv_heads: int | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        alibi: bool = False,
        norm_eps: float = 1e-5,
        residual: bool = True,
        fused: bool = True,
    ):
        super().__init__()
        require_bool("norm_first", norm_first)
        require_bool("residual", residual)
        self.d_model, self.norm_first, self.residual = d_model, norm_first, residual
        self.hook_resid_pre = HookPoint()
        self.attn = MultiHeadAttention(d_model, n_heads, bias=bias, causal=causal,
                                       n_kv_heads=n_kv_heads, rope=rope, rope_base=rope_base,
                                       alibi=alibi, fused=fused)
        self.norm1 = make_norm(norm, d_model, norm_eps, bias)
        self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint()
        self.mlp = MLP(d_model, d_ff, activation, bias)
        self.norm2 = make_norm(norm, d_model, norm_eps, bias)
        self.hook_mlp_out, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        cache: dict | None = None,
        return_stream: bool = False,
        positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """``(b, n, d) -> (b, n, d)``; ``mask``, ``cache`` and ``positions`` (b, n) go to the
        attention.

        With ``return_stream=True`` returns ``(out, [attn_write, mlp_write])``: each write is
        the sub-layer's output, the ``f(·)`` of ``x + f(·)``, before it meets the residual.
        In pre-norm with residuals the stream decomposes exactly,
        ``out == x + attn_write + mlp_write``. In post-norm the norms after each addition
        rescale the whole stream (input and writes together), so no such sum holds; the
        writes are still what each sub-layer produced. Hook points (``transformer_lib.hooks``):
        ``hook_resid_pre``, ``hook_attn_out``, ``hook_resid_mid`` (the state between the two
        sub-layers, after ``norm1`` in post-norm), ``hook_mlp_out``, ``hook_resid_post``, all
        ``(b, n, d)``. Chapter 4.
        """
        x = self.hook_resid_pre(x)
        skip = (lambda h: h) if self.residual else torch.zeros_like
        if self.norm_first:
            a = self.hook_attn_out(self.attn(self.norm1(x), mask=mask, cache=cache, positions=positions))
            x1 = self.hook_resid_mid(skip(x) + a)
            m = self.hook_mlp_out(self.mlp(self.norm2(x1)))
            out = self.hook_resid_post(skip(x1) + m)
        else:
            a = self.hook_attn_out(self.attn(x, mask=mask, cache=cache, positions=positions))
            x1 = self.hook_resid_mid(self.norm1(skip(x) + a))
            m = self.hook_mlp_out(self.mlp(x1))
            out = self.hook_resid_post(self.norm2(skip(x1) + m))
        return (out, [a, m]) if return_stream else out

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer, causal: bool = False) -> "TransformerBlock":
        """Copy a ``torch.nn.TransformerEncoderLayer`` (relu or gelu, either ``norm_first``,
        ``batch_first=True``).

        Compare in ``eval()`` mode or with ``dropout=0.0``; torch's ``src_mask`` marks
        forbidden positions with True, the opposite of this library's mask. Chapter 3.
        """
        require_instance("layer", layer, nn.TransformerEncoderLayer, "nn.TransformerEncoderLayer")
        act = {1: "relu", 2: "gelu"}.get(getattr(layer, "activation_relu_or_gelu", 0))
        if act is None:
            raise ValueError(f"layer: expected activation relu or gelu, got {layer.activation!r}")
        if not layer.self_attn.batch_first:
            raise ValueError("layer: expected batch_first=True, got False")
        bias = layer.linear1.bias is not None
        block = cls(layer.linear1.in_features, layer.self_attn.num_heads, layer.linear1.out_features,
                    norm_first=layer.norm_first, activation=act, causal=causal, bias=bias,
                    norm_eps=layer.norm1.eps)
        block.attn = MultiHeadAttention.from_torch(layer.self_attn)
        block.attn.causal = causal
        block = block.to(layer.linear1.weight)
        pairs = [(block.mlp.fc1, layer.linear1), (block.mlp.fc2, layer.linear2),
                 (block.norm1, layer.norm1), (block.norm2, layer.norm2)]
        with torch.no_grad():
            for ours, theirs in pairs:
                ours.weight.copy_(theirs.weight)
                if ours.bias is not None:
                    ours.bias.copy_(theirs.bias)
        return block
