"""Tests for transformer_lib.attention (Chapter 2).

The four stages of Chapter 2 on batched input against torch, their defaults, and every error
message of `transformer_lib.attention` spelled out (mutation testing showed them unchecked).
"""
import inspect
import math
import re

import pytest
import torch
import torch.nn.functional as F

from torch_helpers import rand
from transformer_lib.data import running_example
from transformer_lib.attention import (
    SelfAttention,
    causal_mask,
    dot_product_attention,
    metric_attention,
    naive_softmax,
    query_key_attention,
    scaled_dot_product_attention,
    softmax,
)

TOL = dict(atol=1e-6, rtol=1e-6)
TIGHT = dict(atol=1e-12, rtol=1e-12)  # float64 against torch: only rounding differs
D64 = torch.float64


# ------------------------------------------------------------------ softmax
def test_softmax_matches_torch():
    x = rand(3, 5, 7) * 10
    for dim in (0, 1, -1):
        torch.testing.assert_close(softmax(x, dim=dim), torch.softmax(x, dim=dim), **TOL)


def test_softmax_stable_where_naive_overflows():
    x = torch.tensor([1000.0, 999.0, 998.0])
    assert torch.isnan(naive_softmax(x)).any()
    p = softmax(x)
    assert torch.isfinite(p).all()
    e = torch.tensor([1.0, math.exp(-1), math.exp(-2)])            # by hand: shift by the max
    torch.testing.assert_close(p, e / e.sum())


@pytest.mark.parametrize("width", [50.0, 200.0, 1000.0])
def test_softmax_on_wide_float32_rows_matches_torch(width):
    """Rows spanning ±width in float32: exp of (x − max) never overflows; exp of (x − min)
    would give inf/inf = nan from a range of about 89 on."""
    x = (torch.rand(4, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1) * width
    p = softmax(x)
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p, torch.softmax(x, dim=-1), atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(softmax(x, dim=0), torch.softmax(x, dim=0), atol=1e-7, rtol=1e-5)


def test_softmax_all_minus_inf_row_is_zero():
    x = torch.tensor([[float("-inf")] * 3, [0.0, 1.0, float("-inf")]])
    p = softmax(x)
    assert torch.equal(p[0], torch.zeros(3))
    assert p[1, 2] == 0 and torch.isclose(p[1].sum(), torch.tensor(1.0))


def test_softmax_syllabus_numbers():
    p = softmax(torch.tensor([30.0, -5, 2, -10], dtype=D64) / 16)
    torch.testing.assert_close(p, torch.tensor([0.731, 0.082, 0.127, 0.060], dtype=D64), atol=5e-4, rtol=0)


# ------------------------------------------------------------------ scaled dot-product attention
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
@pytest.mark.parametrize("n,m,d_k,d_v", [(4, 4, 8, 8), (3, 6, 5, 2), (1, 7, 4, 3)])
def test_sdpa_matches_torch(lead, n, m, d_k, d_v):
    q, k, v = rand(*lead, n, d_k, seed=1), rand(*lead, m, d_k, seed=2), rand(*lead, m, d_v, seed=3)
    out, w = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL)
    assert w.shape == (*lead, n, m)
    torch.testing.assert_close(w.sum(-1), torch.ones(*lead, n, dtype=D64), **TOL)


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
def test_sdpa_bool_mask_broadcast(lead):
    n, m, d = 5, 6, 4
    q, k, v = rand(*lead, n, d, seed=4), rand(*lead, m, d, seed=5), rand(*lead, m, d, seed=6)
    mask = torch.rand(n, m, generator=torch.Generator().manual_seed(7)) > 0.3
    mask[:, 0] = True  # no fully masked row (see test_sdpa_fully_masked_row_matches_torch)
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL)
    assert torch.all(w[..., ~mask] == 0)  # masked weights are exactly zero
    torch.testing.assert_close(w.sum(-1), torch.ones(*lead, n, dtype=D64), **TOL)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_sdpa_causal_matches_is_causal(lead):
    n, d = 6, 4
    q, k, v = rand(*lead, n, d, seed=8), rand(*lead, n, d, seed=9), rand(*lead, n, d, seed=10)
    out, w = scaled_dot_product_attention(q, k, v, mask=causal_mask(n))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TOL)
    assert torch.all(w.triu(1) == 0)


@pytest.mark.parametrize("n,m", [(1, 5), (3, 7), (4, 5), (6, 6)])
@pytest.mark.parametrize("lead", [(), (2, 3)])
def test_sdpa_causal_n_ne_m_matches_torch(lead, n, m):
    """n queries after m - n cached keys: the mask is aligned bottom-right, i.e. torch.tril
    with diagonal m - n (not torch's is_causal, which aligns top-left when n != m)."""
    q, k, v = rand(*lead, n, 4, seed=25), rand(*lead, m, 4, seed=26), rand(*lead, m, 3, seed=27)
    mask = causal_mask(n, m)
    assert torch.equal(mask, torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n))
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TIGHT)
    assert torch.all(w[..., ~mask] == 0)


def test_sdpa_mask_with_batch_dims_matches_torch():
    b, h, n, m = 3, 2, 4, 6
    q, k, v = rand(b, h, n, 5, seed=28), rand(b, h, m, 5, seed=29), rand(b, h, m, 3, seed=30)
    mask = torch.rand(b, 1, n, m, generator=torch.Generator().manual_seed(31)) > 0.4  # per sequence
    mask[0, 0, 1] = False                                  # one fully masked row as well
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TIGHT)
    assert torch.all(w.masked_select(~mask) == 0) and torch.all(out[0, :, 1] == 0)


def _random_case(g: torch.Generator):
    """Random leading dims (some broadcast), n <= m, widths, and a mask/bias of a random
    broadcastable shape: q, k, v, mask, bias for one comparison with torch."""
    pick = lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=g))
    lead = tuple(pick(1, 3) for _ in range(pick(0, 3)))
    ones = lambda shape: tuple(1 if pick(0, 2) == 0 else s for s in shape)  # drop some dims to 1
    n, d_k, d_v = pick(1, 6), pick(1, 8), pick(1, 5)
    m = n + pick(0, 4)
    q = torch.randn(*lead, n, d_k, generator=g, dtype=D64)
    k = torch.randn(*ones(lead), m, d_k, generator=g, dtype=D64)
    v = torch.randn(*ones(lead), m, d_v, generator=g, dtype=D64)
    kind = pick(0, 2)
    mask = None if kind == 0 else causal_mask(n, m) if kind == 1 else \
        torch.rand(*ones(lead), n, m, generator=g) > 0.3
    bias = torch.randn(*ones(lead), n, m, generator=g, dtype=D64) if pick(0, 1) else None
    return q, k, v, mask, bias


def test_sdpa_matches_torch_on_random_shapes():
    g = torch.Generator().manual_seed(32)
    for trial in range(200):
        q, k, v, mask, bias = _random_case(g)
        out, w = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
        attn_mask = bias if mask is None else mask if bias is None else \
            bias.masked_fill(~mask, float("-inf"))
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        torch.testing.assert_close(out, ref, **TIGHT, msg=lambda e: f"trial {trial}: {e}")
        assert w.shape == (*out.shape[:-1], k.shape[-2])


def test_sdpa_additive_bias_and_scale():
    q, k, v = rand(2, 4, 5, 3, seed=11), rand(2, 4, 7, 3, seed=12), rand(2, 4, 7, 2, seed=13)
    bias = rand(4, 5, 7, seed=14)  # broadcasts over the batch
    out, _ = scaled_dot_product_attention(q, k, v, bias=bias, scale=0.3)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
    torch.testing.assert_close(out, ref, **TOL)


def test_sdpa_bias_and_mask_together():
    q, k, v = rand(3, 4, seed=15), rand(5, 4, seed=16), rand(5, 2, seed=17)
    bias, mask = rand(3, 5, seed=18), causal_mask(3, 5)
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~mask, float("-inf")))
    torch.testing.assert_close(out, ref, **TOL)
    assert torch.all(w[~mask] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, D64])
def test_sdpa_fully_masked_row_matches_torch(dtype):
    """A query that may attend to no key: weights 0 and output 0, exactly what
    F.scaled_dot_product_attention returns (for a bool mask and for an all -inf bias)."""
    q, k, v = (rand(*s, seed=i).to(dtype) for i, s in ((19, (3, 4)), (20, (5, 4)), (21, (5, 2))))
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert torch.equal(w[1], torch.zeros(5, dtype=dtype)) and torch.equal(out[1], torch.zeros(2, dtype=dtype))
    additive = torch.zeros(3, 5, dtype=dtype).masked_fill(~mask, float("-inf"))
    for ref in (F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                F.scaled_dot_product_attention(q, k, v, attn_mask=additive)):
        assert torch.equal(ref[1], torch.zeros(2, dtype=dtype))
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_sdpa_float32_works():
    q = torch.randn(2, 3, 4)
    out, w = scaled_dot_product_attention(q, q, q)
    assert out.dtype == w.dtype == torch.float32


# ------------------------------------------------------------------ causal mask
def test_causal_mask_square_is_tril():
    assert torch.equal(causal_mask(5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_causal_mask_bottom_right_aligned():
    mask = causal_mask(2, 5)  # two new queries after three cached keys
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)
    assert torch.equal(causal_mask(3, 7), causal_mask(7)[-3:])


# ------------------------------------------------------------------ running example (syllabus)
X, W_Q, W_K, W_V = running_example(D64)[1:]


def test_running_example_self_attention():
    layer = SelfAttention.from_matrices(W_Q, W_K, W_V)
    Z, A = layer(X, return_weights=True)
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    S = Q @ K.T
    assert S[0, 1] != S[1, 0]  # asymmetric
    torch.testing.assert_close(A, torch.softmax(S / 2, dim=-1), **TOL)
    torch.testing.assert_close(Z, A @ V, **TOL)
    A_rounded = torch.tensor([[.143, .387, .235, .235], [.189, .311, .311, .189],
                              [.114, .309, .509, .069], [.167, .276, .102, .455]], dtype=D64)
    torch.testing.assert_close(A, A_rounded, atol=5e-4, rtol=0)


def test_four_stages():
    Y1, A1 = dot_product_attention(X, return_weights=True)
    torch.testing.assert_close(Y1, torch.softmax(X @ X.T, -1) @ X, **TOL)
    torch.testing.assert_close(A1.sum(-1), torch.ones(4, dtype=D64), **TOL)
    W_s = rand(8, 3, seed=22)
    Y2 = metric_attention(X, W_s)
    torch.testing.assert_close(Y2, torch.softmax(X @ W_s @ W_s.T @ X.T, -1) @ X, **TOL)
    Y3, A3 = query_key_attention(X, W_Q, W_K, return_weights=True)
    torch.testing.assert_close(Y3, torch.softmax((X @ W_Q) @ (X @ W_K).T, -1) @ X, **TOL)
    assert not torch.allclose(A3, A3.T)


def test_self_attention_value_width_defaults_to_d_k():
    """SelfAttention(d_model=8, d_k=3): W_v is 8 -> 3 unless d_v is given, as in the book."""
    head = SelfAttention(8, 3)
    assert head.W_v.weight.shape == (3, 8) and head(rand(4, 8, seed=30).float()).shape == (4, 3)
    assert SelfAttention(8, 3, d_v=5).W_v.weight.shape == (5, 8)


def test_self_attention_cross_and_mask():
    torch.manual_seed(0)
    layer = SelfAttention(6, 4, 3, bias=True).double()
    x, ctx = rand(2, 5, 6, seed=23), rand(2, 7, 6, seed=24)
    out, w = layer(x, context=ctx, return_weights=True)
    assert out.shape == (2, 5, 3) and w.shape == (2, 5, 7)
    ref = F.scaled_dot_product_attention(layer.W_q(x), layer.W_k(ctx), layer.W_v(ctx))
    torch.testing.assert_close(out, ref, **TOL)
    out_c = layer(x, mask=causal_mask(5))
    ref_c = F.scaled_dot_product_attention(layer.W_q(x), layer.W_k(x), layer.W_v(x), is_causal=True)
    torch.testing.assert_close(out_c, ref_c, **TOL)


def test_self_attention_argument_order_is_multihead_attention_order():
    """(x, context, mask, return_weights) in both layers, so positional calls mean the same."""
    from transformer_lib.multihead import MultiHeadAttention

    names = lambda f: list(inspect.signature(f).parameters)[1:5]
    assert names(SelfAttention.forward) == names(MultiHeadAttention.forward)
    torch.manual_seed(0)
    layer = SelfAttention(6, 4).double()
    x, ctx = rand(5, 6, seed=33), rand(7, 6, seed=34)
    mask = causal_mask(5, 7)
    out, w = layer(x, ctx, mask, True)
    torch.testing.assert_close(out, layer(x, context=ctx, mask=mask), atol=0, rtol=0)
    assert w.shape == (5, 7) and torch.all(w[~mask] == 0)


def test_permutation_equivariance():
    layer = SelfAttention.from_matrices(W_Q, W_K, W_V)
    P = torch.eye(4, dtype=D64)[torch.tensor([2, 0, 3, 1])]
    torch.testing.assert_close(layer(P @ X), P @ layer(X), **TOL)


# ------------------------------------------------------------------ errors
def test_error_qk_width_mismatch():
    with pytest.raises(ValueError, match=r"k: expected last dim d_k=4 .*got 5"):
        scaled_dot_product_attention(torch.ones(3, 4), torch.ones(3, 5), torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"^k: expected last dim d_k=4 \(the width of q\), got 5$"):   # batched
        scaled_dot_product_attention(torch.ones(2, 3, 4), torch.ones(2, 3, 5), torch.ones(2, 3, 2))


def test_error_v_length_mismatch():
    with pytest.raises(ValueError, match=r"v: expected 3 rows .*got 4"):
        scaled_dot_product_attention(torch.ones(3, 4), torch.ones(3, 4), torch.ones(4, 2))


def test_error_mask_wrong_size():
    with pytest.raises(ValueError, match=r"mask: expected a shape broadcastable to \(2, 3, 5\), got \(3, 3\)"):
        scaled_dot_product_attention(torch.ones(2, 3, 4), torch.ones(2, 5, 4), torch.ones(2, 5, 2),
                                     mask=torch.ones(3, 3, dtype=torch.bool))


def test_error_mask_not_bool_and_bias_shape():
    q = torch.ones(3, 4)
    with pytest.raises(TypeError, match=r"mask: expected dtype torch.bool"):
        scaled_dot_product_attention(q, q, q, mask=torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"bias: expected a shape broadcastable to \(3, 3\), got \(2, 3\)"):
        scaled_dot_product_attention(q, q, q, bias=torch.ones(2, 3))
    with pytest.raises(TypeError, match=r"q: expected a torch.Tensor, got list"):
        scaled_dot_product_attention([[1.0]], q, q)


def test_error_self_attention_input_width():
    layer = SelfAttention(6, 4)
    with pytest.raises(ValueError, match=r"x: expected shape \(…, len, d_model=6\), got \(5, 4\)"):
        layer(torch.ones(5, 4))


# ------------------------------------------------------------ the four stages on batched input, and every error message
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
