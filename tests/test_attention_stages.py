"""The four stages of Chapter 2 on batched input against torch, their defaults, and every error
message of `transformer_lib.attention` spelled out (mutation testing showed them unchecked)."""
from __future__ import annotations

import re

import pytest
import torch

from torch_helpers import rand
from transformer_lib.attention import (SelfAttention, causal_mask, dot_product_attention,
                                       metric_attention, naive_softmax, query_key_attention,
                                       scaled_dot_product_attention, softmax)

TIGHT = dict(atol=1e-12, rtol=1e-12)


def _reference(S: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    A = torch.softmax(S, dim=-1)
    return A @ V, A


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_stages_on_a_batch_match_torch(scale):
    """Batched X (2, 5, 3) with a width (3) that differs from n (5): rows, not columns."""
    X, W_s, W_q, W_k = rand(2, 5, 3, seed=1), rand(3, 4, seed=2), rand(3, 4, seed=3), rand(3, 4, seed=4)
    cases = [
        (lambda **kw: dot_product_attention(X, **kw), X @ X.transpose(-2, -1)),
        (lambda **kw: metric_attention(X, W_s, **kw), (X @ W_s) @ (X @ W_s).transpose(-2, -1)),
        (lambda **kw: query_key_attention(X, W_q, W_k, **kw), (X @ W_q) @ (X @ W_k).transpose(-2, -1)),
    ]
    for stage, S in cases:
        Y, A = _reference(S * scale, X)
        got = stage(scale=scale) if scale != 1.0 else stage()
        assert isinstance(got, torch.Tensor)                     # weights only when asked
        torch.testing.assert_close(got, Y, **TIGHT)
        got_Y, got_A = stage(scale=scale, return_weights=True)
        torch.testing.assert_close(got_Y, Y, **TIGHT)
        torch.testing.assert_close(got_A, A, **TIGHT)


def test_naive_softmax_normalises_each_row_of_a_matrix():
    x = rand(4, 6, seed=5)
    torch.testing.assert_close(naive_softmax(x), torch.softmax(x, dim=-1), **TIGHT)
    torch.testing.assert_close(naive_softmax(x, dim=0), torch.softmax(x, dim=0), **TIGHT)


def test_softmax_rows_of_very_different_scale():
    """Each row shifted by its own maximum: a row near -1000 next to one near +1000 (float32)."""
    x = torch.tensor([[-1000.0, -1001.0, -1003.0], [1000.0, 998.0, 1001.0]])
    torch.testing.assert_close(softmax(x), torch.softmax(x, dim=-1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(softmax(x.T, dim=0), torch.softmax(x.T, dim=0), atol=1e-6, rtol=1e-6)


def test_self_attention_returns_weights_only_when_asked():
    torch.manual_seed(0)
    layer = SelfAttention(3, 4, 2).double()
    x = rand(2, 5, 3, seed=6)
    q, k, v = layer.W_q(x), layer.W_k(x), layer.W_v(x)
    Y, A = _reference(q @ k.transpose(-2, -1) / 2.0, v)
    out = layer(x)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, Y, **TIGHT)
    got_Y, got_A = layer(x, return_weights=True)
    torch.testing.assert_close(got_A, A, **TIGHT)


def test_self_attention_sizes_and_from_matrices():
    layer = SelfAttention(6, 4, bias=True)
    assert (layer.d_model, layer.d_k, layer.d_v) == (6, 4, 4)
    assert [tuple(lin.weight.shape) for lin in (layer.W_q, layer.W_k, layer.W_v)] == [(4, 6)] * 3
    plain = SelfAttention(6, 4)
    for name in ("W_q", "W_k", "W_v"):
        assert getattr(layer, name).bias is not None and getattr(plain, name).bias is None
    W_Q, W_K, W_V = rand(6, 4, seed=7), rand(6, 4, seed=8), rand(6, 2, seed=9)
    head = SelfAttention.from_matrices(W_Q, W_K, W_V)
    assert head.W_q.bias is None and head.W_q.weight.dtype == torch.float64
    x = rand(5, 6, seed=10)
    Y, _ = _reference((x @ W_Q) @ (x @ W_K).T / 2.0, x @ W_V)
    torch.testing.assert_close(head(x), Y, **TIGHT)


X2 = torch.ones(5, 3)
W34 = torch.ones(3, 4)


@pytest.mark.parametrize("call,error,message", [
    (lambda: softmax([1.0]), TypeError, "x: expected a torch.Tensor, got list"),
    (lambda: dot_product_attention([[1.0]]), TypeError, "X: expected a torch.Tensor, got list"),
    (lambda: dot_product_attention(torch.ones(3)), ValueError, "X: expected shape (…, n, d), got (3,)"),
    (lambda: metric_attention(X2, torch.ones(4, 4)), ValueError, "W_s: expected shape (3, d_out), got (4, 4)"),
    (lambda: metric_attention(X2, [1.0]), TypeError, "W_s: expected a torch.Tensor, got list"),
    (lambda: metric_attention(X2, torch.ones(3)), ValueError, "W_s: expected shape (3, d_out), got (3,)"),
    (lambda: query_key_attention(X2, torch.ones(2, 4), W34), ValueError, "W_q: expected shape (3, d_out), got (2, 4)"),
    (lambda: query_key_attention(X2, W34, torch.ones(2, 4)), ValueError, "W_k: expected shape (3, d_out), got (2, 4)"),
    (lambda: query_key_attention(X2, W34, torch.ones(3, 5)), ValueError, "W_k: expected shape (3, 4) (as W_q), got (3, 5)"),
    (lambda: SelfAttention(0, 4), ValueError, "d_model: expected an int >= 1, got 0"),
    (lambda: SelfAttention(3, 0), ValueError, "d_k: expected an int >= 1, got 0"),
    (lambda: SelfAttention(3, 4, 0), ValueError, "d_v: expected an int >= 1, got 0"),
    (lambda: SelfAttention.from_matrices(W34, torch.ones(2, 4), W34), ValueError, "W_K: expected shape (3, d_out), got (2, 4)"),
    (lambda: SelfAttention.from_matrices(W34, W34, torch.ones(2, 4)), ValueError, "W_V: expected shape (3, d_out), got (2, 4)"),
    (lambda: SelfAttention.from_matrices([1.0], W34, W34), TypeError, "W_Q: expected a torch.Tensor, got list"),
    (lambda: SelfAttention.from_matrices(W34, torch.ones(3, 5), W34), ValueError, "W_K: expected shape (3, 4) (as W_Q), got (3, 5)"),
    (lambda: SelfAttention(3, 4)(torch.ones(5, 3), context=torch.ones(5, 4)), ValueError,
     "context: expected shape (…, len, d_model=3), got (5, 4)"),
    (lambda: SelfAttention(3, 4)(torch.ones(3)), ValueError, "x: expected shape (…, len, d_model=3), got (3,)"),
    (lambda: SelfAttention(3, 4)(X2, context=[1.0]), TypeError, "context: expected a torch.Tensor, got list"),
    (lambda: scaled_dot_product_attention(torch.ones(3), X2, X2), ValueError,
     "q: expected at least 2 dims (…, len, dim), got (3,)"),
    (lambda: scaled_dot_product_attention(X2, torch.ones(3), X2), ValueError,
     "k: expected at least 2 dims (…, len, dim), got (3,)"),
    (lambda: scaled_dot_product_attention(X2, X2, torch.ones(5, 3, dtype=torch.long)), TypeError,
     "v: expected a floating dtype, got torch.int64"),
    (lambda: scaled_dot_product_attention(X2, X2, X2, bias=[0.0]), TypeError, "bias: expected a torch.Tensor, got list"),
    (lambda: scaled_dot_product_attention(X2, X2, X2, mask=[True]), TypeError, "mask: expected a torch.Tensor, got list"),
    (lambda: causal_mask(-1), ValueError, "n: expected an int >= 0, got -1"),
    (lambda: causal_mask(2, -1), ValueError, "m: expected an int >= 0, got -1"),
])
def test_attention_errors_name_the_argument(call, error, message):
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        call()


def test_causal_mask_of_zero_queries():
    assert causal_mask(0).shape == (0, 0)
    assert causal_mask(0, 3).shape == (0, 3)
    assert causal_mask(1, 3).tolist() == [[True, True, True]]


def test_attention_on_the_meta_device():
    """Shapes without values (how large models are counted): masks and attention stay on meta."""
    assert causal_mask(2, 3, device="meta").device.type == "meta"
    q = torch.empty(2, 4, 3, 8, device="meta")
    mask = causal_mask(3, device="meta")
    out, weights = scaled_dot_product_attention(q, q, q, mask=mask)
    assert (out.device.type, tuple(out.shape), tuple(weights.shape)) == ("meta", (2, 4, 3, 8), (2, 4, 3, 3))
