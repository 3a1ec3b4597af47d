"""Multi-head attention: h heads of width d_k = d/h computed with one batched matmul.

``MultiHead(X) = Concat(head_1, …, head_h) W_O`` with ``head_i = Attention(X W_Q^i, X W_K^i, X W_V^i)``.
The reshape trick ``(b, n, d) -> (b, n, h, d_k) -> (b, h, n, d_k)`` turns the h heads into a
batch dimension, so all heads run through one call of
``transformer_lib.attention.scaled_dot_product_attention``.

The same module carries the options later chapters need: a causal mask (Chapter 7), RoPE
and ALiBi (Chapter 6), grouped-query attention with ``n_kv_heads < n_heads`` (Chapter 9) and
a key/value cache for generation (Chapter 7).

Two paths compute the same attention. The explicit one (the library's own
``scaled_dot_product_attention``, two matrix products and a softmax) returns the weights and
is what ``FlopCounterMode`` counts; the fused one calls ``torch.nn.functional.
scaled_dot_product_attention``, one kernel that never stores the ``(n, m)`` weights, and is
what a model trains with. The layer takes the fused path unless the weights are requested,
``fused`` is False, a torch dispatch mode is active (``FlopCounterMode`` is one: it has no
formula for the CPU fused kernel, so counting FLOPs takes the explicit path) or a ``torch.func``
transform (``jacrev``, ``vmap``) is running.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._C._functorch import maybe_current_level
from torch.utils._python_dispatch import _get_current_dispatch_mode

from transformer_lib._checks import (require_bool, require_instance, require_int, require_mask,
                                     require_positions, require_positive, require_tensor)
from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.positional import alibi_bias_at, apply_rope

__all__ = ["split_heads", "merge_heads", "MultiHeadAttention"]


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """Split the feature dimension into heads: ``(…, n, d) -> (…, h, n, d/h)``. Chapter 5."""
    require_tensor("x", x)
    require_int("n_heads", n_heads)
    if x.ndim < 2 or x.shape[-1] % n_heads != 0:
        raise ValueError(f"x: expected shape (…, n, d) with d divisible by n_heads={n_heads}, got {tuple(x.shape)}")
    *lead, n, d = x.shape
    return x.reshape(*lead, n, n_heads, d // n_heads).transpose(-3, -2)


def merge_heads(x: Tensor) -> Tensor:
    """Inverse of ``split_heads``: ``(…, h, n, d_k) -> (…, n, h·d_k)``. Chapter 5."""
    require_tensor("x", x)
    if x.ndim < 3:
        raise ValueError(f"x: expected shape (…, h, n, d_k), got {tuple(x.shape)}")
    *lead, h, n, d_k = x.shape
    return x.transpose(-3, -2).reshape(*lead, n, h * d_k)


class MultiHeadAttention(nn.Module):
    """Multi-head (self- or cross-) attention.

    ``q_proj: d -> d``, ``k_proj, v_proj: d -> n_kv_heads·d_k``, ``out_proj: d -> d``; with
    ``bias=True`` that is ``4d² + 4d`` parameters for any number of heads (Chapter 5).

    - ``causal``: query i sees keys j ≤ i (bottom-right aligned with a cache). Chapter 7.
    - ``n_kv_heads``: grouped-query attention; each group of ``n_heads / n_kv_heads`` query
      heads shares one key/value head. ``n_kv_heads == n_heads`` is plain MHA. Chapter 9.
    - ``rope``: rotate queries and keys by their positions (``positional.apply_rope``,
      rotate-half pairing, base ``rope_base``, LLaMA's ``rope_theta``); ``alibi``: add
      ``-slope·distance`` to the scores (``positional.alibi_bias_at``). Both need
      self-attention (positions of queries and keys in one sequence). Chapter 6.
    - ``fused`` (attribute, default True): attend through ``F.scaled_dot_product_attention``
      when no weights are requested (module docstring). Chapter 7.

    Chapter 5.
    """

    fused: bool = True  # a class default; set it on a layer (or on the class) to choose the path

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        bias: bool = True,
        causal: bool = False,
        *,
        n_kv_heads: int | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        alibi: bool = False,
    ):
        super().__init__()
        require_int("d_model", d_model)
        require_int("n_heads", n_heads)
        for name, flag in (("bias", bias), ("causal", causal), ("rope", rope), ("alibi", alibi)):
            require_bool(name, flag)
        require_positive("rope_base", rope_base)
        if d_model % n_heads != 0:
            raise ValueError(
                f"d_model: expected a multiple of n_heads={n_heads}, got d_model={d_model}"
            )
        n_kv_heads = n_heads if n_kv_heads is None else require_int("n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads != 0:
            raise ValueError(
                f"n_kv_heads: expected a positive divisor of n_heads={n_heads}, got {n_kv_heads!r}"
            )
        if rope and (d_model // n_heads) % 2 != 0:
            raise ValueError(f"rope: expected an even head width d_k, got d_k={d_model // n_heads}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_k = d_model // n_heads
        self.causal, self.rope, self.rope_base, self.alibi = causal, rope, rope_base, alibi
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_k, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_k, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"causal={self.causal}, rope={self.rope}, alibi={self.alibi}")

    def _check_input(self, name: str, t: Tensor, ndim: int | None = None) -> None:
        require_tensor(name, t)
        if t.ndim not in (2, 3) or t.shape[-1] != self.d_model or (ndim and t.ndim != ndim):
            want = "(batch, len, d_model)" if ndim == 3 else "(len, d_model)" if ndim == 2 else \
                "(batch, len, d_model) or (len, d_model)"
            raise ValueError(
                f"{name}: expected shape {want} with d_model={self.d_model}, got {tuple(t.shape)}"
            )

    def _check_context(self, x: Tensor, context: Tensor, cache: dict | None,
                       positions: Tensor | None) -> None:
        """Cross-attention: same batch as x, no cache, no positions. Chapter 5."""
        self._check_input("context", context, ndim=x.ndim)
        if x.ndim == 3 and context.shape[0] != x.shape[0]:
            raise ValueError(f"context: expected batch size {x.shape[0]} (as x), "
                             f"got {context.shape[0]} (shape {tuple(context.shape)})")
        if cache is not None:
            raise ValueError("cache: expected None with context (the cache is for self-attention)")
        if positions is not None:
            raise ValueError("positions: expected None with context (positions are for self-attention)")
        if self.rope or self.alibi:
            raise ValueError("context: rope/alibi positions need self-attention, got a context")
        if self.causal and context.shape[-2] < x.shape[-2]:
            raise ValueError(f"context: expected at least n={x.shape[-2]} positions for causal "
                             f"attention (queries are the last n), got {context.shape[-2]}")

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        return_weights: bool = False,
        cache: dict | None = None,
        positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``(b, n, d) -> (b, n, d)``, or unbatched ``(n, d) -> (n, d)``.

        - ``context`` ``(b, m, d)``: cross-attention (queries from x, keys/values from context).
        - ``mask``: bool, True = may attend, broadcastable to ``(b, h, n, m)``; combined with
          the causal mask when ``causal=True``.
        - ``cache``: a dict, empty at the first call; the layer appends this call's keys and
          values to ``cache["k"], cache["v"]`` ``(b, n_kv_heads, t, d_k)`` (keys after RoPE; b = 1
          for unbatched input) and their positions to ``cache["pos"]`` ``(b, t)``; positions
          then start at the cached length t and the causal mask is bottom-right aligned.
        - ``positions``: integer positions ``(b, n)`` or ``(n,)`` of the n new tokens for RoPE
          and ALiBi (Hugging Face's ``position_ids``); default ``t, …, t + n − 1``.
        - ``return_weights``: also return the attention weights ``(b, h, n, m)``.

        Chapter 5.
        """
        fused = (self.fused and not return_weights and _get_current_dispatch_mode() is None
                 and maybe_current_level() is None)  # torch.func: no batching rule for the fused backward
        q, k, v, mask, bias, is_causal = self._prepare(x, context, mask, cache, positions, fused)
        if fused:
            if bias is not None:  # ALiBi as an additive mask, -inf where the mask forbids
                mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            out, weights = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                          enable_gqa=self.n_kv_heads < self.n_heads), None
        else:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
        out = self.out_proj(merge_heads(out))  # (b, n, d)
        if x.ndim == 2:
            out = out.squeeze(0)
            weights = None if weights is None else weights.squeeze(0)
        return (out, weights) if return_weights else out

    def project(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        cache: dict | None = None,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
        """Everything ``forward`` does before the attention itself: the arguments as in
        ``forward`` -> ``(q, k, v, mask, bias)``, ready for ``scaled_dot_product_attention``.

        q ``(b, h, n, d_k)``; k, v ``(b, h, m, d_k)`` with the cache prepended and each
        key/value head repeated for its group of query heads; the boolean mask (the causal
        mask included) and the ALiBi bias, each broadcastable to ``(b, h, n, m)`` or None.
        Unbatched input gives b = 1. ``transformer_lib.patching`` calls it to reach each
        head's weights and output. Chapters 4 and 5.
        """
        return self._prepare(x, context, mask, cache, positions, fused=False)[:5]

    def _prepare(
        self, x: Tensor, context: Tensor | None, mask: Tensor | None, cache: dict | None,
        positions: Tensor | None, fused: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None, bool]:
        """``project``'s work and whether the fused kernel's causal flag replaces the causal mask;
        for the fused kernel (``fused``) k and v keep their ``n_kv_heads``. Chapter 7."""
        self._check_input("x", x)
        if context is not None:
            self._check_context(x, context, cache, positions)
        if x.ndim == 2:
            x = x.unsqueeze(0)
            context = None if context is None else context.unsqueeze(0)
        src = x if context is None else context

        q = split_heads(self.q_proj(x), self.n_heads)  # (b, h, n, d_k)
        k = split_heads(self.k_proj(src), self.n_kv_heads)  # (b, h_kv, n_src, d_k)
        v = split_heads(self.v_proj(src), self.n_kv_heads)
        if positions is not None:
            positions = require_positions("positions", positions, x.shape[0], x.shape[1])
        q, k, v, q_pos, k_pos = self._extend_cache(q, k, v, cache, positions)
        # the fused kernel's own causal flag (top-left aligned) serves when nothing else masks
        is_causal = fused and self.causal and mask is None and not self.alibi and q.shape[-2] == k.shape[-2]
        mask, bias = self._mask_and_bias(mask, q, k, q_pos, k_pos, self.causal and not is_causal)

        group = self.n_heads // self.n_kv_heads
        if group > 1 and not fused:  # every query head in a group reads the same key/value head
            k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
        return q, k, v, mask, bias, is_causal

    def _mask_and_bias(
        self, mask: Tensor | None, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool
    ) -> tuple[Tensor | None, Tensor | None]:
        """Check the user's mask, add the causal mask (if ``causal``), build ALiBi's bias. Chapter 7."""
        b, n, m = q.shape[0], q.shape[-2], k.shape[-2]
        if mask is not None:
            require_mask("mask", mask, (b, self.n_heads, n, m))
        if causal:
            cm = causal_mask(n, m, device=q.device)
            mask = cm if mask is None else mask & cm
        bias = None
        if self.alibi:  # (b, h, n, m): -slope·|p_i - p_j| from the positions of queries and keys
            bias = alibi_bias_at(q_pos, k_pos, self.n_heads, dtype=q.dtype)
        return mask, bias

    def _extend_cache(
        self, q: Tensor, k: Tensor, v: Tensor, cache: dict | None, positions: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Rotate queries and keys (RoPE) at their positions, then prepend the cached keys,
        values and positions. Returns ``q, k, v`` and the positions of the queries ``(b, n)``
        and of all keys ``(b, m)``. Chapter 7."""
        if cache is not None:
            require_instance("cache", cache, dict, "a dict")
        (b, _, n, _), offset = q.shape, 0
        if cache is not None and "k" in cache:
            offset = cache["k"].shape[-2]
            if cache["k"].shape[:2] != k.shape[:2]:
                raise ValueError(
                    f"cache: expected cached keys of shape ({k.shape[0]}, {k.shape[1]}, t, {self.d_k}), "
                    f"got {tuple(cache['k'].shape)}"
                )
        if positions is None:
            positions = torch.arange(offset, offset + n, device=q.device).expand(b, n)
        if self.rope:  # (b, 1, n): one row of positions per sequence, shared by the heads
            q = apply_rope(q, positions[:, None], self.rope_base)
            k = apply_rope(k, positions[:, None], self.rope_base)
        k_pos = positions
        if cache is not None:
            if offset:
                k = torch.cat([cache["k"], k], dim=-2)
                v = torch.cat([cache["v"], v], dim=-2)
                k_pos = torch.cat([cache["pos"], positions], dim=-1)
            cache["k"], cache["v"], cache["pos"] = k, v, k_pos
        return q, k, v, positions, k_pos

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadAttention":
        """Copy the weights of a ``torch.nn.MultiheadAttention`` built with ``batch_first=True``
        (a ``(n, b, d)`` layer would read the same tensor differently, so it is rejected).
        Note torch's ``attn_mask`` marks *forbidden* positions with True, the opposite of this
        library's mask. Chapter 5.
        """
        require_instance("m", m, nn.MultiheadAttention, "nn.MultiheadAttention")
        if not m.batch_first:
            raise ValueError("m: expected batch_first=True, got False")
        if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
            raise ValueError("m: expected kdim == vdim == embed_dim, add_bias_kv=False, add_zero_attn=False")
        bias = m.in_proj_bias is not None
        new = cls(m.embed_dim, m.num_heads, bias=bias).to(m.in_proj_weight)
        d = m.embed_dim
        with torch.no_grad():
            for i, lin in enumerate((new.q_proj, new.k_proj, new.v_proj)):
                lin.weight.copy_(m.in_proj_weight[i * d:(i + 1) * d])
                if bias:
                    lin.bias.copy_(m.in_proj_bias[i * d:(i + 1) * d])
            new.out_proj.weight.copy_(m.out_proj.weight)
            if bias:
                new.out_proj.bias.copy_(m.out_proj.bias)
        return new
