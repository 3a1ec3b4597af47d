"""transformer_lib.efficient against independent references: linear attention against its
quadratic form and a per-query loop, the sliding window against torch's masked attention."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from torch_helpers import error_message
from transformer_lib.efficient import (elu_feature_map, linear_attention, sliding_window_attention,
                                       sliding_window_mask)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_elu_feature_map_is_elu_plus_one_and_positive():
    x = torch.linspace(-30, 5, 101, dtype=torch.float64)
    expected = torch.where(x > 0, x + 1, torch.exp(x))
    torch.testing.assert_close(elu_feature_map(x), expected, atol=0, rtol=1e-12)
    torch.testing.assert_close(elu_feature_map(x), F.elu(x) + 1, atol=1e-15, rtol=1e-12)
    assert (elu_feature_map(torch.tensor([-50.0, -100.0])) > 0).all()   # elu(x) + 1 would be 0 here


@pytest.mark.parametrize("lead", [(), (3,), (2, 4)])
def test_linear_attention_equals_its_quadratic_form(lead):
    q, k, v = _rand(*lead, 7, 5, seed=1), _rand(*lead, 9, 5, seed=2), _rand(*lead, 9, 3, seed=3)
    phi_q = torch.where(q > 0, q + 1, torch.exp(q))
    phi_k = torch.where(k > 0, k + 1, torch.exp(k))
    kernel = phi_q @ phi_k.transpose(-2, -1)                      # (…, n, m)
    expected = kernel / kernel.sum(-1, keepdim=True) @ v
    torch.testing.assert_close(linear_attention(q, k, v), expected, atol=1e-12, rtol=1e-12)


def test_linear_attention_per_query_loop_and_broadcast():
    q, k, v = _rand(2, 6, 4, seed=4), _rand(1, 8, 4, seed=5), _rand(1, 8, 2, seed=6)
    out = linear_attention(q, k, v)
    for b in range(2):
        for i in range(6):
            w = torch.tensor([float((F.elu(q[b, i]) + 1) @ (F.elu(k[0, j]) + 1)) for j in range(8)],
                             dtype=torch.float64)
            torch.testing.assert_close(out[b, i], (w / w.sum()) @ v[0], atol=1e-12, rtol=1e-12)


def test_linear_attention_gradient_matches_quadratic_form():
    q, k, v = (_rand(5, 4, seed=s).requires_grad_() for s in (7, 8, 9))
    linear_attention(q, k, v).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    kernel = (F.elu(q) + 1) @ (F.elu(k) + 1).T
    (kernel / kernel.sum(-1, keepdim=True) @ v).sum().backward()
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, atol=1e-12, rtol=1e-10)


def test_sliding_window_mask_by_loop():
    n, w = 9, 2
    expected = torch.tensor([[abs(i - j) <= w for j in range(n)] for i in range(n)])
    assert torch.equal(sliding_window_mask(n, w), expected)
    assert torch.equal(sliding_window_mask(4, 0), torch.eye(4, dtype=torch.bool))
    assert sliding_window_mask(4, 10).all()


@pytest.mark.parametrize("n,window", [(1, 0), (7, 0), (7, 1), (10, 3), (12, 3), (5, 9), (33, 4), (64, 16)])
def test_sliding_window_attention_equals_torch_masked_attention(n, window):
    q, k, v = _rand(2, 3, n, 8, seed=n), _rand(2, 3, n, 8, seed=n + 1), _rand(2, 3, n, 5, seed=n + 2)
    band = torch.tensor([[abs(i - j) <= window for j in range(n)] for i in range(n)])
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
    torch.testing.assert_close(sliding_window_attention(q, k, v, window), expected, atol=1e-12, rtol=1e-12)


def test_sliding_window_attention_gradient_and_broadcast():
    q = _rand(2, 20, 4, seed=1).requires_grad_()
    k, v = _rand(1, 20, 4, seed=2), _rand(1, 20, 3, seed=3)
    sliding_window_attention(q, k, v, 3).square().sum().backward()
    got = q.grad.clone()
    q.grad = None
    band = sliding_window_mask(20, 3)
    F.scaled_dot_product_attention(q, k.expand(2, -1, -1), v.expand(2, -1, -1), attn_mask=band).square().sum().backward()
    torch.testing.assert_close(got, q.grad, atol=1e-12, rtol=1e-10)


def test_sliding_window_work_is_linear_in_n():
    """The scores it builds grow like n·window, not n² (checked on the element count of the
    largest intermediate through the FLOPs of its products)."""
    from torch.utils.flop_counter import FlopCounterMode
    counts = []
    for n in (256, 512):
        q = torch.randn(1, n, 8)
        with FlopCounterMode(display=False) as counter:
            sliding_window_attention(q, q, q, 8)
        counts.append(counter.get_total_flops())
    assert counts[1] == 2 * counts[0]
    assert counts[0] == 2 * 2 * (256 // 8) * 8 * 24 * 8   # two products of (8 × 8)·(8 × 24) per block


def test_errors_name_the_argument():
    q = torch.randn(4, 3)
    with pytest.raises(ValueError, match="window: expected an int >= 0, got -1"):
        sliding_window_attention(q, q, q, -1)
    with pytest.raises(TypeError, match="window: expected an int"):
        sliding_window_mask(4, 1.5)
    with pytest.raises(ValueError, match="k: expected n=4 keys"):
        sliding_window_attention(q, torch.randn(5, 3), torch.randn(5, 3), 1)
    with pytest.raises(ValueError, match="eps"):
        linear_attention(q, q, q, eps=0.0)
    with pytest.raises(ValueError, match="k"):
        linear_attention(q, torch.randn(4, 2), q)
    assert math.isfinite(float(linear_attention(q, q, q).sum()))


def test_linear_attention_with_tiny_normalisers():
    """Very negative queries and keys make every φ about e^-10, so the normaliser φ(q)ᵀΣφ(k) is
    about 1e-8: the output is still the weighted average of the values, by a float64 loop."""
    gen = torch.Generator().manual_seed(5)
    q = -10 + 0.1 * torch.randn(3, 4, dtype=torch.float64, generator=gen)
    k = -10 + 0.1 * torch.randn(5, 4, dtype=torch.float64, generator=gen)
    v = torch.randn(5, 2, dtype=torch.float64, generator=gen)
    expected = torch.zeros(3, 2, dtype=torch.float64)
    for i in range(3):
        scores = torch.stack([(torch.exp(q[i]) * torch.exp(k[j])).sum() for j in range(5)])
        expected[i] = (scores / scores.sum()) @ v
    torch.testing.assert_close(linear_attention(q, k, v), expected, atol=1e-12, rtol=0)


def test_efficient_functions_stay_on_the_input_device():
    """The index tensors follow the input's device (the meta device stands in for a GPU)."""
    q = torch.ones(2, 7, 4, device="meta")
    assert sliding_window_mask(5, 1, device="meta").device.type == "meta"
    assert sliding_window_attention(q, q, q, 2).device.type == "meta"


def test_efficient_errors_in_full():
    for fn, exc, message in [
        (lambda: sliding_window_mask(2.0, 1), TypeError, "n: expected an int, got float (2.0)"),
        (lambda: linear_attention(torch.ones(2, 4), torch.ones(2, 4), torch.ones(2, 4), eps=0), ValueError,
         "eps: expected a finite number > 0, got 0"),
    ]:
        assert error_message(fn, exc=exc) == message
