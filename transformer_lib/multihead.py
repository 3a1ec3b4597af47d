"""Multi-head attention: h heads of width d_k = d/h computed with one batched matmul.

``MultiHead(X) = Concat(head_1, …, head_h) W_O`` with ``head_i = Attention(X W_Q^i, X W_K^i, X W_V^i)``.
The reshape trick ``(b, n, d) -> (b, n, h, d_k) -> (b, h, n, d_k)`` turns the h heads into a
batch dimension, so all heads run through one call of
``transformer_lib.attention.scaled_dot_product_attention``.

The same module carries the options later chapters need: a causal mask (Chapter 7), RoPE
and ALiBi (Chapter 6), grouped-query attention with ``n_kv_heads < n_heads`` (Chapter 9) and
a key/value cache for generation (Chapter 7).

In self-attention Q, K and V come out of one matrix product, with ``qkv_weights()``: W_Q, W_K
and W_V stacked, as nanoGPT's ``c_attn`` and ``nn.MultiheadAttention``'s ``in_proj_weight`` hold
them. The parameters stay in ``q_proj``, ``k_proj`` and ``v_proj``, three ``nn.Linear`` layers, so
each can be read, loaded, hooked or optimised on its own.

Two paths compute the same attention. The explicit one (scores, softmax, weights times
values, as ``transformer_lib.attention.scaled_dot_product_attention``) returns the weights, passes
the hook points ``hook_scores`` and ``hook_pattern``, and is what ``FlopCounterMode`` counts; the
fused one calls ``torch.nn.functional.scaled_dot_product_attention``, one kernel that never stores
the ``(n, m)`` weights, and is what a model trains with. ``MultiHeadAttention._fused_ok`` chooses,
once per call (Chapter 9).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib import _torch_state
from transformer_lib._checks import (require_bool, require_instance, require_int, require_mask,
                                     require_positions, require_positive, require_tensor)
from transformer_lib.attention import _scores, _weights, causal_mask
from transformer_lib.hooks import HookPoint
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

    ``q_proj: d -> d``, ``k_proj, v_proj: d -> n_kv_heads·d_k`` (stacked by ``qkv_weights`` for
    self-attention's one product), ``out_proj: d -> d``; with
    ``bias=True`` and ``n_kv_heads == n_heads`` that is ``4d² + 4d`` parameters for any number
    of heads (Chapter 5); with fewer key/value heads, ``2d² + 2d·n_kv_heads·d_k`` weights.

    - ``causal``: query i sees keys j ≤ i (bottom-right aligned with a cache). Chapter 7.
    - ``n_kv_heads``: grouped-query attention; each group of ``n_heads / n_kv_heads`` query
      heads shares one key/value head. ``n_kv_heads == n_heads`` is plain MHA. Chapter 9.
    - ``rope``: rotate queries and keys by their positions (``positional.apply_rope``,
      rotate-half pairing, base ``rope_base``, LLaMA's ``rope_theta``); ``alibi``: add
      ``-slope·distance`` to the scores (``positional.alibi_bias_at``). Both need
      self-attention (positions of queries and keys in one sequence). Chapter 6.
    - ``fused``: attend through ``F.scaled_dot_product_attention`` when nothing needs the
      explicit path (module docstring); False: always the explicit path. Chapter 9.

    Chapter 5.
    """

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
        fused: bool = True,
    ):
        super().__init__()
        require_int("d_model", d_model)
        require_int("n_heads", n_heads)
        for name, flag in (("bias", bias), ("causal", causal), ("rope", rope), ("alibi", alibi),
                           ("fused", fused)):
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
        self.fused = fused
        for name in ("q", "k", "v", "scores", "pattern", "z", "result"):
            setattr(self, f"hook_{name}", HookPoint())
        # the points whose activations only the explicit path computes (a plain list: not submodules)
        self._explicit_points = [self.hook_q, self.hook_k, self.hook_v, self.hook_scores, self.hook_pattern]

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

        The hook points, in order: ``hook_q`` ``(b, n, h, d_k)``, ``hook_k`` and ``hook_v``
        ``(b, m, n_kv_heads, d_k)`` (this call's keys and values, before RoPE and the cache),
        ``hook_scores`` and ``hook_pattern`` ``(b, h, n, m)`` (the scaled, masked scores and the
        weights), ``hook_z`` ``(b, n, h, d_k)`` (each head's output, before W_O) and, only while
        something is registered on it, ``hook_result`` ``(b, n, h, d)`` (each head's write;
        their sum plus W_O's bias is the output). Chapter 5.
        """
        self._check_input("x", x)
        if context is not None:
            self._check_context(x, context, cache, positions)
        fused = self._fused_ok(return_weights)
        batched = x if x.ndim == 3 else x.unsqueeze(0)
        src = batched if context is None else context if context.ndim == 3 else context.unsqueeze(0)
        if positions is not None:
            positions = require_positions("positions", positions, batched.shape[0], batched.shape[1])
        (b, n, _), m, h, h_kv = batched.shape, src.shape[1], self.n_heads, self.n_kv_heads
        if context is None and self._one_product():
            q, k, v = F.linear(batched, *self.qkv_weights()).split(         # (b, n, d + 2·h_kv·d_k)
                [self.d_model, h_kv * self.d_k, h_kv * self.d_k], dim=-1)
        else:  # cross-attention (K, V from the context), or a projection hooked or replaced
            q, k, v = self.q_proj(batched), self.k_proj(src), self.v_proj(src)
        q = self.hook_q(q.view(b, n, h, self.d_k)).transpose(1, 2)
        k = self.hook_k(k.view(b, m, h_kv, self.d_k)).transpose(1, 2)
        v = self.hook_v(v.view(b, m, h_kv, self.d_k)).transpose(1, 2)
        q, k, v, q_pos, k_pos = self._extend_cache(q, k, v, cache, positions)  # (b, h, n, d_k) …
        # the fused kernel's own causal flag (top-left aligned) serves when nothing else masks
        is_causal = fused and self.causal and mask is None and not self.alibi and q.shape[-2] == k.shape[-2]
        mask, bias = self._mask_and_bias(mask, q, k, q_pos, k_pos, self.causal and not is_causal)
        if fused:
            if bias is not None:  # ALiBi as an additive mask, -inf where the mask forbids
                mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                               enable_gqa=h_kv < h)
            weights = None
        else:
            if h_kv < h:  # every query head in a group reads the same key/value head
                k, v = k.repeat_interleave(h // h_kv, dim=-3), v.repeat_interleave(h // h_kv, dim=-3)
            weights = self.hook_pattern(_weights(self.hook_scores(_scores(q, k, mask, bias))))
            z = weights @ v                                              # (b, h, n, d_k)
        out = self._write(self.hook_z(z.transpose(1, 2)))                # (b, n, d)
        if x.ndim == 2:
            out = out.squeeze(0)
            weights = None if weights is None else weights.squeeze(0)
        return (out, weights) if return_weights else out

    def qkv_weights(self) -> tuple[Tensor, Tensor | None]:
        """W_Q, W_K and W_V stacked, ``(d + 2·n_kv_heads·d_k, d)`` in ``nn.Linear``'s
        ``(out, in)`` layout (rows: Q, then K, then V, as ``nn.MultiheadAttention``'s
        ``in_proj_weight``), and their biases stacked the same way (None without biases): one
        matrix, so self-attention gets Q, K and V from one product. A new tensor at each call;
        gradients flow back to ``q_proj``, ``k_proj`` and ``v_proj``. Chapter 5."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([p.weight for p in projections])
        bias = None if self.q_proj.bias is None else torch.cat([p.bias for p in projections])
        return weight, bias

    def _one_product(self) -> bool:
        """Whether ``q_proj``, ``k_proj`` and ``v_proj`` are plain ``nn.Linear`` layers without
        forward hooks, so that one product by ``qkv_weights()`` computes what their calls would.
        A projection replaced by another module, or with a hook, is called on its own."""
        return all(type(p) is nn.Linear and not (p._forward_hooks or p._forward_pre_hooks)
                   for p in (self.q_proj, self.k_proj, self.v_proj))

    def _fused_ok(self, return_weights: bool) -> bool:
        """The one place that chooses the path: the fused kernel unless ``fused`` is False, the
        weights are asked for, a hook reads q, k, v, the scores or the pattern, or torch is
        counting or transforming (``_torch_state``). Chapter 9."""
        if not self.fused or return_weights or any(p.active for p in self._explicit_points):
            return False
        return not (_torch_state.dispatch_mode_active() or _torch_state.transform_active())

    def _write(self, z: Tensor) -> Tensor:
        """Each head's output ``(b, n, h, d_k)`` through W_O -> ``(b, n, d)``; with a hook on
        ``hook_result``, head by head: ``(b, n, h, d)``, summed. Chapter 4."""
        if not self.hook_result.active:
            return self.out_proj(z.flatten(2))
        w_o = self.out_proj.weight.T.reshape(self.n_heads, self.d_k, self.d_model)  # (h, d_k, d)
        result = torch.einsum("bnhk,hkd->bnhd", z, w_o)
        new = self.hook_result(result)
        if new is result:
            return self.out_proj(z.flatten(2))                 # the layer's own sum, bit for bit
        return new.sum(2) + (0.0 if self.out_proj.bias is None else self.out_proj.bias)

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
