"""Tiled online-softmax attention and the peak-memory meter (Chapter 9)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.memory import peak_memory
from transformer_lib.tiled import tiled_attention

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
SHAPES = [(37, 37), (100, 130), (129, 129), (5, 200)]  # none divides the tiles below


def _qkv(seed, n, m, dtype, lead=(2, 3), d_k=16, d_v=8):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*lead, n, d_k, generator=g, dtype=dtype),
            torch.randn(*lead, m, d_k, generator=g, dtype=dtype),
            torch.randn(*lead, m, d_v, generator=g, dtype=dtype))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,m", SHAPES)
def test_tiled_equals_explicit_and_torch(seed, dtype, n, m):
    q, k, v = _qkv(seed, n, m, dtype, lead=(2, 3))
    tol = TOL[dtype]
    got = tiled_attention(q, k, v, block_q=32, block_k=16)
    torch.testing.assert_close(got, scaled_dot_product_attention(q, k, v)[0], atol=tol, rtol=tol)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v), atol=tol, rtol=tol)
    cm = causal_mask(n, m)
    expected = scaled_dot_product_attention(q, k, v, mask=cm)[0]
    torch.testing.assert_close(tiled_attention(q, k, v, causal=True, block_q=32, block_k=16),
                               expected, atol=tol, rtol=tol)
    torch.testing.assert_close(tiled_attention(q, k, v, mask=cm, block_q=7, block_k=50),
                               expected, atol=tol, rtol=tol)


def test_tiled_with_a_random_mask_and_fully_masked_rows():
    q, k, v = _qkv(7, 40, 45, torch.float64, lead=(3,))
    mask = torch.rand(3, 40, 45, generator=torch.Generator().manual_seed(1)) < 0.3
    mask[:, 5] = False  # query 5 sees no key: output 0, as in the explicit attention
    got = tiled_attention(q, k, v, mask=mask, block_q=16, block_k=8)
    expected = scaled_dot_product_attention(q, k, v, mask=mask)[0]
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)
    assert torch.equal(got[:, 5], torch.zeros_like(got[:, 5]))


def test_tiled_broadcasts_and_takes_a_scale():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 1, 20, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 5, 33, 8, generator=g, dtype=torch.float64)
    v = torch.randn(33, 6, generator=g, dtype=torch.float64)
    got = tiled_attention(q, k, v, scale=0.3, block_q=6, block_k=10)
    assert got.shape == (4, 5, 20, 6)
    expected = F.scaled_dot_product_attention(q.expand(4, 5, 20, 8), k.expand(4, 5, 33, 8),
                                              v.expand(4, 5, 33, 6), scale=0.3)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)


def test_tiled_gradients_match_explicit():
    q, k, v = (t.requires_grad_() for t in _qkv(2, 19, 19, torch.float64, lead=(2,)))
    tiled_attention(q, k, v, causal=True, block_q=8, block_k=8).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    scaled_dot_product_attention(q, k, v, mask=causal_mask(19))[0].square().sum().backward()
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, atol=1e-12, rtol=1e-12)


def test_tiled_validates_its_arguments():
    q, k, v = _qkv(0, 4, 6, torch.float32, lead=())
    with pytest.raises(TypeError, match="causal: expected a bool"):
        tiled_attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="block_k: expected an int >= 1, got 0"):
        tiled_attention(q, k, v, block_k=0)
    with pytest.raises(TypeError, match="mask: expected dtype torch.bool"):
        tiled_attention(q, k, v, mask=torch.ones(4, 6))
    with pytest.raises(ValueError, match="m: expected m >= n"):
        tiled_attention(k, q, q, causal=True)


# ------------------------------------------------------------------ the memory meter
def test_peak_memory_of_known_allocations():
    def work(x):
        a = torch.empty(1000)  # 4000 bytes
        b = a.view(10, 100).t()  # a view: no new storage
        c = torch.empty(500, dtype=torch.float64)  # 4000 bytes: peak 8000
        del a, b, c
        d = torch.empty(1500)  # 6000 bytes, after the others were freed
        x.add_(1.0)  # in place on an input: nothing new
        return d + 0  # output 6000 bytes while d is alive: peak stays 12000 > 8000
    x = torch.zeros(10)
    assert peak_memory(work, x, exclude_output=False) == 12000
    assert peak_memory(work, x) == 6000


def test_peak_memory_of_explicit_attention_is_two_score_matrices():
    """Scores and weights, n × n float32 each, plus at most a few rows of bookkeeping."""
    for n in (256, 512):
        q, k, v = _qkv(0, n, n, torch.float32, lead=(1,), d_k=32, d_v=32)
        peak = peak_memory(lambda *t: scaled_dot_product_attention(*t)[0], q, k, v)
        assert 2 * 4 * n * n <= peak <= 2 * 4 * n * n + 4 * n * 32 + 1024


def test_tiled_peak_memory_is_flat_in_n():
    peaks = []
    for n in (256, 512, 1024):
        q, k, v = _qkv(0, n, n, torch.float32, lead=(1,), d_k=32, d_v=32)
        peaks.append(peak_memory(tiled_attention, q, k, v, causal=True))
    assert max(peaks) == min(peaks)
    assert peaks[-1] < 4 * 1024 * 1024 / 10  # a tenth of one 1024 × 1024 score matrix
