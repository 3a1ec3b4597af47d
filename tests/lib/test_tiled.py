"""Tiled online-softmax attention and the peak-memory meter (Chapter 9).

Tiled attention at the extreme tile sizes, and the memory meter's bookkeeping of views
(Chapter 9). Mutation testing found both untested: a causal loop that stops one key early only
shows when a tile can start on the last visible key, which tiles of one key always do.
"""
from __future__ import annotations

import re

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


# ------------------------------------------------------------ extreme tile sizes, and the memory meter's views
TIGHT = dict(atol=1e-12, rtol=1e-12)


def _qkv_extreme(n, m, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, length, 4, generator=g, dtype=torch.float64) for length in (n, m, m))


@pytest.mark.parametrize("n,m", [(6, 6), (4, 9)])
@pytest.mark.parametrize("block_q,block_k", [(1, 1), (1, 3), (2, 1), (64, 64)])
def test_tiled_causal_at_every_tile_size(n, m, block_q, block_k):
    q, k, v = _qkv_extreme(n, m)
    expected = scaled_dot_product_attention(q, k, v, mask=causal_mask(n, m))[0]
    got = tiled_attention(q, k, v, causal=True, block_q=block_q, block_k=block_k)
    torch.testing.assert_close(got, expected, **TIGHT)


def test_tiled_rescales_when_a_later_tile_holds_the_maximum():
    """Scores that grow along the keys: every new key tile raises the running maximum."""
    q = torch.ones(1, 3, 2, dtype=torch.float64)
    k = torch.arange(12, dtype=torch.float64).repeat(2, 1).T.unsqueeze(0) * 3.0     # (1, 12, 2)
    v = torch.randn(1, 12, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = torch.softmax(q @ k.transpose(-2, -1) / 2 ** 0.5, dim=-1) @ v
    torch.testing.assert_close(tiled_attention(q, k, v, block_q=2, block_k=5), expected, **TIGHT)


def test_tiled_block_q_validated():
    q, k, v = _qkv_extreme(3, 3)
    with pytest.raises(ValueError, match="^" + re.escape("block_q: expected an int >= 1, got 0") + "$"):
        tiled_attention(q, k, v, block_q=0)
    with pytest.raises(TypeError, match="^" + re.escape("block_q: expected an int, got float (2.0)") + "$"):
        tiled_attention(q, k, v, block_q=2.0)


def test_peak_memory_keeps_a_storage_alive_through_its_views():
    def view_dropped_first():
        a = torch.empty(1000)            # 4000 bytes
        b = a.view(10, 100)              # a view of the same storage: not charged again
        del b                            # the storage lives on in a
        d = torch.empty(1000)            # 4000 more while a holds the first storage
        del a, d

    def base_dropped_first():
        a = torch.empty(1000)
        b, c = a[:10], a.t()             # two views keep the storage alive after `del a`
        del a
        d = torch.empty(1000)
        del b, c, d
    assert peak_memory(view_dropped_first, exclude_output=False) == 8000
    assert peak_memory(base_dropped_first, exclude_output=False) == 8000


def test_peak_memory_exclude_output_subtracts_each_output_storage_once():
    def work():
        out = torch.empty(250)           # 1000 bytes
        return out, out[:5], torch.empty(100, dtype=torch.float64)  # two storages: 1000 + 800
    assert peak_memory(work, exclude_output=False) == 1800
    assert peak_memory(work) == 0


def test_peak_memory_edges_meta_one_byte_and_returned_inputs():
    meta = peak_memory(lambda: torch.empty(1000, device="meta") * 2, exclude_output=False)
    assert meta == 0                                      # meta tensors hold no memory
    assert peak_memory(lambda: torch.zeros(1, dtype=torch.bool), exclude_output=False) == 1
    x = torch.zeros(10)
    assert peak_memory(lambda t: t, x) == 0               # an input returned is neither charged nor subtracted
    assert peak_memory(lambda t: (t, t + 1), x) == 0      # the new output (40 bytes) is subtracted
    assert peak_memory(lambda t: (t, t + 1), x, exclude_output=False) == 40


def test_peak_memory_passes_keyword_arguments_on():
    assert peak_memory(lambda n=0: torch.empty(n), n=250, exclude_output=False) == 1000


@pytest.mark.parametrize("block_q,block_k", [(2, 3), (64, 64)])
def test_tiled_causal_and_a_padding_mask_together(block_q, block_k):
    """A user mask AND the causal rule, as `mask & causal_mask` in the explicit attention."""
    q, k, v = _qkv_extreme(6, 8, seed=2)
    mask = torch.rand(2, 6, 8, generator=torch.Generator().manual_seed(3)) < 0.7
    expected = scaled_dot_product_attention(q, k, v, mask=mask & causal_mask(6, 8))[0]
    got = tiled_attention(q, k, v, mask=mask, causal=True, block_q=block_q, block_k=block_k)
    torch.testing.assert_close(got, expected, **TIGHT)


def test_tiled_on_the_meta_device():
    """Shapes only: every tile, its causal rule included, stays on the inputs' device."""
    q, k = torch.empty(2, 5, 4, device="meta"), torch.empty(2, 7, 4, device="meta")
    out = tiled_attention(q, k, k, causal=True, block_q=2, block_k=2)
    assert (out.device.type, tuple(out.shape)) == ("meta", (2, 5, 4))


def test_tiled_shifts_each_query_row_by_its_own_maximum():
    """Two rows of one tile whose scores differ by ~700: a shift shared by the tile would
    underflow the small row to exp(-700) = 0 in float32."""
    q = torch.tensor([[[100.0, 0.0], [0.01, 0.0]]])
    k = torch.stack([torch.arange(8.0) + 3, torch.ones(8)], dim=-1).unsqueeze(0)   # (1, 8, 2)
    v = torch.randn(1, 8, 3, generator=torch.Generator().manual_seed(4))
    expected = torch.softmax(q @ k.transpose(-2, -1) / 2 ** 0.5, dim=-1) @ v
    got = tiled_attention(q, k, v, block_q=2, block_k=4)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_peak_memory_leaves_keyword_inputs_and_their_views_uncharged():
    """An input passed by keyword is as external as one passed by position: a view of it costs
    nothing, a new tensor costs its bytes."""
    x = torch.zeros(100)                                        # 400 bytes
    for call in (lambda f: peak_memory(f, x, exclude_output=False),
                 lambda f: peak_memory(f, t=x, exclude_output=False)):
        assert call(lambda t: t.view(10, 10)) == 0
        assert call(lambda t: t[:50]) == 0
        assert call(lambda t: t + 1) == 400


def test_peak_memory_is_measured_without_autograd_even_with_grad_enabled():
    """Three exps in a row: without autograd one intermediate is freed as the next is made (two
    alive at a time); with autograd each would be saved for the backward pass (three alive).
    The measure is the inference memory whatever the caller's grad mode and the input's
    requires_grad, and leaves the grad mode as it found it."""
    x = torch.zeros(256, requires_grad=True)                    # 1024 bytes

    def chain(t):
        return t.exp().exp().exp()
    assert torch.is_grad_enabled()
    assert peak_memory(chain, x, exclude_output=False) == 2 * 1024
    assert peak_memory(chain, x.detach(), exclude_output=False) == 2 * 1024
    assert torch.is_grad_enabled()
    with torch.enable_grad():
        y = chain(x)
    assert y.grad_fn is not None                                 # autograd would have kept them
