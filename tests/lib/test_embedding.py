"""Tests for transformer_lib.embedding (Chapter 1)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_helpers import error_message
from transformer_lib.embedding import (
    FixedMixing,
    embed,
    gaussian_kernel,
    nadaraya_watson,
    one_hot,
)


def test_one_hot_matches_torch():
    ids = torch.tensor([[0, 3, 2], [4, 4, 1]])
    expected = F.one_hot(ids, num_classes=5).float()
    assert torch.equal(one_hot(ids, 5), expected)
    assert one_hot(ids, 5, dtype=torch.float64).dtype == torch.float64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_embed_equals_one_hot_product_and_nn_embedding(dtype):
    g = torch.Generator().manual_seed(0)
    W_E = torch.randn(7, 4, generator=g, dtype=dtype)
    ids = torch.tensor([[6, 0, 3], [3, 3, 5]])
    table = nn.Embedding(7, 4).to(dtype)
    with torch.no_grad():
        table.weight.copy_(W_E)
    assert torch.equal(embed(ids, W_E), table(ids))
    assert torch.equal(one_hot(ids, 7, dtype=dtype) @ W_E, W_E[ids])
    assert embed(ids, W_E).shape == (2, 3, 4)


def test_same_token_same_vector():
    W_E = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    out = embed(torch.tensor([2, 0, 2, 4, 2]), W_E)
    assert torch.equal(out[0], out[2]) and torch.equal(out[0], out[4])


@pytest.mark.parametrize("fn", [lambda ids: one_hot(ids, 5), lambda ids: embed(ids, torch.zeros(5, 2))])
def test_float_ids_raise_type_error(fn):
    with pytest.raises(TypeError, match=r"ids: expected an integer dtype.*got torch.float32"):
        fn(torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match=r"ids: expected an integer dtype.*got torch.bool"):
        fn(torch.tensor([True, False]))
    with pytest.raises(TypeError, match=r"ids: expected a torch.Tensor, got list"):
        fn([0, 1])


@pytest.mark.parametrize("bad", [[0, 5], [-1, 2]])
def test_ids_out_of_range_raise_value_error(bad):
    ids = torch.tensor(bad)
    with pytest.raises(ValueError, match=r"ids: expected values in \[0, num_classes=5\), got min -?\d+ and max \d+"):
        one_hot(ids, 5)
    with pytest.raises(ValueError, match=r"ids: expected values in \[0, C=5\)"):
        embed(ids, torch.zeros(5, 2))


def test_bad_num_classes_and_table():
    with pytest.raises(ValueError, match=r"num_classes: expected an int >= 1, got 0"):
        one_hot(torch.tensor([0]), 0)
    with pytest.raises(ValueError, match=r"W_E: expected a 2-D tensor of shape \(C, d\), got \(5,\)"):
        embed(torch.tensor([0]), torch.zeros(5))


def test_fixed_mixing_forward_matches_matmul():
    layer = FixedMixing(4, generator=torch.Generator().manual_seed(0))
    assert layer.weight.shape == (4, 4)
    x = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(layer(x), layer.weight @ x, atol=0, rtol=0)
    expected = torch.einsum("ij,bjd->bid", layer.weight, x)
    torch.testing.assert_close(layer(x), expected, atol=1e-6, rtol=1e-6)
    assert layer(x.double()).dtype == torch.float64


def test_fixed_mixing_seeded_and_from_weight():
    a = FixedMixing(3, generator=torch.Generator().manual_seed(5))
    b = FixedMixing(3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.weight, b.weight)
    W = torch.arange(9.0).reshape(3, 3)
    layer = FixedMixing.from_weight(W)
    assert torch.equal(layer.weight, W) and layer.weight.data_ptr() != W.data_ptr()


def test_fixed_mixing_wrong_set_size_message():
    layer = FixedMixing(5)
    with pytest.raises(ValueError, match=r"x: expected a set of n=5 elements.*got shape \(7, 3\) with 7 elements"):
        layer(torch.zeros(7, 3))
    with pytest.raises(ValueError, match=r"x: expected a set of n=5 elements.*got shape \(5,\)"):
        layer(torch.zeros(5))
    with pytest.raises(ValueError, match=r"x: expected feature width d=2, got shape \(5, 3\)"):
        FixedMixing(5, d=2)(torch.zeros(5, 3))


def test_fixed_mixing_bad_arguments():
    with pytest.raises(ValueError, match=r"n: expected an int >= 1, got 0"):
        FixedMixing(0)
    with pytest.raises(ValueError, match=r"d: expected an int >= 1, got -1"):
        FixedMixing(3, d=-1)
    with pytest.raises(ValueError, match=r"weight: expected a square 2-D tensor \(n, n\), got \(2, 3\)"):
        FixedMixing.from_weight(torch.zeros(2, 3))


def test_fixed_mixing_permutation():
    g = torch.Generator().manual_seed(0)
    n = 5
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    P = torch.eye(n, dtype=torch.float64)[torch.tensor([3, 0, 4, 1, 2])]
    random_layer = FixedMixing.from_weight(torch.randn(n, n, generator=g, dtype=torch.float64))
    assert (random_layer(P @ x) - P @ random_layer(x)).abs().max() > 0.1
    ones = torch.ones(n, n, dtype=torch.float64)
    commuting = FixedMixing.from_weight(0.7 * torch.eye(n, dtype=torch.float64) - 0.2 * ones)
    torch.testing.assert_close(commuting(P @ x), P @ commuting(x), atol=1e-12, rtol=0)


def test_gaussian_kernel_values_and_errors():
    u = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    expected = torch.exp(-(u**2) / (2 * 0.5**2))
    torch.testing.assert_close(gaussian_kernel(u, 0.5), expected, atol=1e-15, rtol=0)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"bandwidth: expected a finite number > 0, got"):
            gaussian_kernel(u, bad)


def _toy(m=20, q=7):
    g = torch.Generator().manual_seed(0)
    x_train = torch.rand(m, generator=g, dtype=torch.float64) * 6
    y_train = torch.sin(x_train) + 0.3 * torch.randn(m, generator=g, dtype=torch.float64)
    x_query = torch.linspace(-1, 7, q, dtype=torch.float64)
    return x_query, x_train, y_train


def test_nadaraya_watson_weights_are_distributions():
    x_query, x_train, y_train = _toy()
    pred, weights = nadaraya_watson(x_query, x_train, y_train, 0.4)
    assert pred.shape == (7,) and weights.shape == (7, 20)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(7, dtype=torch.float64), atol=1e-12, rtol=0)
    assert (pred >= y_train.min()).all() and (pred <= y_train.max()).all()


def test_nadaraya_watson_equals_explicit_loop():
    x_query, x_train, y_train = _toy()
    h = 0.7
    pred, weights = nadaraya_watson(x_query, x_train, y_train, h)
    for a, xq in enumerate(x_query):
        k = [math.exp(-float(xq - xi) ** 2 / (2 * h * h)) for xi in x_train]  # by hand
        total = sum(k)
        expected_pred = sum(ki * float(yi) for ki, yi in zip(k, y_train)) / total
        assert abs(float(pred[a]) - expected_pred) < 1e-12
        for i, ki in enumerate(k):
            assert abs(float(weights[a, i]) - ki / total) < 1e-12


def test_nadaraya_watson_bandwidth_limits():
    _, x_train, y_train = _toy()
    pred_small, _ = nadaraya_watson(x_train, x_train, y_train, 1e-4)
    torch.testing.assert_close(pred_small, y_train, atol=1e-12, rtol=0)
    pred_large, _ = nadaraya_watson(x_train, x_train, y_train, 1e5)
    torch.testing.assert_close(pred_large, y_train.mean().expand(20), atol=1e-8, rtol=0)


def test_nadaraya_watson_errors():
    x = torch.zeros(4)
    with pytest.raises(ValueError, match=r"x_query: expected a 1-D tensor, got shape \(2, 2\)"):
        nadaraya_watson(torch.zeros(2, 2), x, x, 1.0)
    with pytest.raises(ValueError, match=r"x_train: expected a 1-D tensor, got shape \(4, 1\)"):
        nadaraya_watson(x, torch.zeros(4, 1), x, 1.0)
    with pytest.raises(ValueError, match=r"y_train: expected shape \(4,\) like x_train, got \(3,\)"):
        nadaraya_watson(x, x, torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match=r"x_train: expected at least one training point"):
        nadaraya_watson(x, torch.zeros(0), torch.zeros(0), 1.0)
    with pytest.raises(ValueError, match=r"bandwidth: expected a finite number > 0, got 0"):
        nadaraya_watson(x, x, x, 0)


# ------------------------------------------------------------------ exact errors, initialisation, devices
def test_every_embedding_error_names_argument_expected_and_actual():
    mixing = FixedMixing(5, d=2)
    tail = "; a fixed (n, n) mixing matrix cannot handle another set size"
    cases = [
        (ValueError, "ids: expected values in [0, num_classes=5), got min 5 and max 5", one_hot, torch.tensor([5]), 5),
        (ValueError, "num_classes: expected an int >= 1, got 0", one_hot, torch.tensor([0]), 0),
        (ValueError, "ids: expected values in [0, C=5), got min 5 and max 5", embed, torch.tensor([5]), torch.zeros(5, 2)),
        (ValueError, "W_E: expected a 2-D tensor of shape (C, d), got (5,)", embed, torch.tensor([0]), torch.zeros(5)),
        (ValueError, "W_E: expected a 2-D tensor of shape (C, d), got (1, 5, 2)", embed, torch.tensor([0]),
         torch.zeros(1, 5, 2)),
        (TypeError, "W_E: expected a torch.Tensor, got list", embed, torch.tensor([0]), [[0.0]]),
        (ValueError, "n: expected an int >= 1, got 0", FixedMixing, 0),
        (ValueError, "d: expected an int >= 1, got 0", FixedMixing, 3, 0),
        (ValueError, "weight: expected a square 2-D tensor (n, n), got (2, 3)", FixedMixing.from_weight, torch.ones(2, 3)),
        (ValueError, "weight: expected a square 2-D tensor (n, n), got (2, 2, 2)", FixedMixing.from_weight,
         torch.ones(2, 2, 2)),
        (TypeError, "weight: expected a torch.Tensor, got list", FixedMixing.from_weight, [[1.0]]),
        (ValueError, "x: expected a set of n=5 elements, shape (..., 5, d), got shape (7, 2) with 7 elements" + tail,
         mixing, torch.ones(7, 2)),
        (ValueError, "x: expected a set of n=5 elements, shape (..., 5, d), got shape (5,) with no elements" + tail,
         mixing, torch.ones(5)),
        (ValueError, "x: expected feature width d=2, got shape (5, 3)", mixing, torch.ones(5, 3)),
        (TypeError, "x: expected a torch.Tensor, got list", mixing, [1.0]),
        (ValueError, "bandwidth: expected a finite number > 0, got 0.0", gaussian_kernel, torch.ones(1), 0.0),
        (ValueError, "x_query: expected a 1-D tensor, got shape (2, 2)", nadaraya_watson,
         torch.ones(2, 2), torch.ones(3), torch.ones(3), 1.0),
        (ValueError, "x_train: expected a 1-D tensor, got shape (4, 1)", nadaraya_watson,
         torch.ones(2), torch.ones(4, 1), torch.ones(3), 1.0),
        (ValueError, "y_train: expected a 1-D tensor, got shape (3, 1)", nadaraya_watson,
         torch.ones(2), torch.ones(3), torch.ones(3, 1), 1.0),
        (ValueError, "y_train: expected shape (4,) like x_train, got (3,)", nadaraya_watson,
         torch.ones(2), torch.ones(4), torch.ones(3), 1.0),
        (ValueError, "x_train: expected at least one training point, got shape (0,)", nadaraya_watson,
         torch.ones(2), torch.ones(0), torch.ones(0), 1.0),
        (ValueError, "bandwidth: expected a finite number > 0, got 0.0", nadaraya_watson,
         torch.ones(2), torch.ones(3), torch.ones(3), 0.0),
    ]
    for exc, message, fn, *args in cases:
        assert error_message(fn, *args, exc=exc) == message


def test_one_hot_and_embed_on_batches_and_wide_tables():
    """(b, k) ids against F.one_hot; a table wider than it is tall (C = 3 < d = 8) accepts ids
    up to C - 1 only."""
    ids = torch.tensor([[0, 4, 2], [3, 3, 1]])
    torch.testing.assert_close(one_hot(ids, 5), F.one_hot(ids, 5).float(), atol=0, rtol=0)
    assert one_hot(ids, 5).dtype == torch.float32
    W_E = torch.arange(24.0).reshape(3, 8)
    torch.testing.assert_close(embed(torch.tensor([2, 0]), W_E), F.embedding(torch.tensor([2, 0]), W_E))
    with pytest.raises(ValueError):
        embed(torch.tensor([3]), W_E)


def test_fixed_mixing_initialisation_is_nn_linear_range():
    """Weights uniform in [-1/√n, 1/√n] (nn.Linear's default range), covering both signs."""
    layer = FixedMixing(64, generator=torch.Generator().manual_seed(0))
    w, bound = layer.weight, 1 / math.sqrt(64)
    assert w.abs().max() <= bound and w.min() < -0.9 * bound and w.max() > 0.9 * bound
    assert abs(w.mean().item()) < 0.01


def test_from_weight_leaves_the_global_random_state_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    FixedMixing.from_weight(torch.eye(4))
    torch.testing.assert_close(torch.rand(3), expected, atol=0, rtol=0)


def test_fixed_mixing_checks_the_width_on_batches():
    """With d given, a batch (b, n, d) with n != d passes and mixes along n; another width fails,
    also when the layer comes from a weight."""
    W = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    x = torch.arange(30, dtype=torch.float32).reshape(5, 2, 3)
    assert torch.equal(FixedMixing.from_weight(W, d=3)(x), x.flip(-2))        # the swap W exchanges the rows
    assert error_message(FixedMixing.from_weight(W, d=4), x, exc=ValueError) == (
        "x: expected feature width d=4, got shape (5, 2, 3)")


def test_nadaraya_watson_with_integer_targets():
    """Class labels 0/1 as targets: the prediction is the weight on the points labelled 1."""
    pred, weights = nadaraya_watson(torch.tensor([0.0, 2.0]), torch.tensor([0.0, 1.0, 2.0]),
                                    torch.tensor([0, 1, 1]), bandwidth=1.0)
    assert pred.dtype == torch.float32
    torch.testing.assert_close(pred, weights[:, 1] + weights[:, 2], atol=1e-7, rtol=0)
