"""Tests for transformer_lib.moe (Chapter 8)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from transformer_lib.moe import MoELayer, Router, load_balancing_loss, moe_block  # noqa: E402


def _layer(d=8, d_ff=16, e=4, k=2, seed=0, **kw):
    torch.manual_seed(seed)
    return MoELayer(d, d_ff, e, top_k=k, **kw).double()


def _x(*shape, seed=1):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _loop_reference(layer, x, kept=None):
    """Per-token loop: y_t = Σ_j w_tj · expert_{i_tj}(x_t), skipping dropped assignments."""
    flat = x.reshape(-1, layer.d_model)
    logits = flat @ layer.router.gate.weight.T
    probs = torch.softmax(logits, dim=-1)
    out = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        idx = sorted(range(layer.n_experts), key=lambda e: -float(probs[t, e].detach()))[:layer.top_k]
        top = probs[t, idx]
        w = top / top.sum()
        for j in range(layer.top_k):
            if kept is not None and not kept[t, j]:
                continue
            out[t] += w[j] * layer.experts[int(idx[j])](flat[t])
    return out.reshape(x.shape)


# ------------------------------------------------------------------- router
def test_router_shapes_and_renormalisation():
    torch.manual_seed(0)
    router = Router(8, 5, 2)
    w, idx, probs = router(torch.randn(3, 4, 8))
    assert w.shape == idx.shape == (12, 2) and probs.shape == (12, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(12))
    torch.testing.assert_close(probs.sum(-1), torch.ones(12))
    assert (w[:, 0] >= w[:, 1]).all()
    torch.testing.assert_close(probs.gather(1, idx), probs.topk(2).values)


def test_router_errors():
    with pytest.raises(ValueError, match="top_k"):
        Router(8, 4, 5)
    with pytest.raises(ValueError, match=r"x: expected shape \(…, d_model=8\)"):
        Router(8, 4, 2)(torch.randn(3, 7))


# ---------------------------------------------------------------- dispatch
@pytest.mark.parametrize("k", [1, 2, 3])
def test_batched_dispatch_equals_per_token_loop(k):
    layer = _layer(e=5, k=k)
    x = _x(2, 6, 8)
    out, aux = layer(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, _loop_reference(layer, x), atol=1e-12, rtol=0)
    assert aux["kept"].all()
    assert int(aux["tokens_per_expert"].sum()) == 12 * k


def test_uniform_router_with_all_experts_is_the_mean():
    layer = _layer(e=4, k=4)
    with torch.no_grad():
        layer.router.gate.weight.zero_()
    x = _x(7, 8)
    out, aux = layer(x)
    mean = torch.stack([expert(x) for expert in layer.experts]).mean(0)
    torch.testing.assert_close(out, mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(aux["expert_weights"], torch.full((7, 4), 0.25, dtype=torch.float64))


def test_top1_uses_exactly_one_expert_per_token():
    layer = _layer(e=4, k=1)
    x = _x(10, 8)
    out, aux = layer(x)
    idx = aux["expert_index"]
    assert idx.shape == (10, 1)
    torch.testing.assert_close(aux["expert_weights"], torch.ones(10, 1, dtype=torch.float64))
    for t in range(10):
        torch.testing.assert_close(out[t], layer.experts[int(idx[t, 0])](x[t]), atol=1e-12, rtol=0)


def test_capacity_drops_overflow_in_priority_order():
    layer = _layer(e=4, k=2, capacity_factor=0.5)
    x = _x(12, 8)
    out, aux = layer(x)
    cap = layer.capacity(12)
    assert cap == 3  # ceil(0.5 * 12 * 2 / 4)
    kept, idx = aux["kept"], aux["expert_index"]
    for e in range(4):
        assert int((kept & (idx == e)).sum()) == min(cap, int((idx == e).sum()))
    assert not kept.all()
    torch.testing.assert_close(out, _loop_reference(layer, x, kept), atol=1e-12, rtol=0)
    # first choices are served before any second choice
    for e in range(4):
        first = (idx[:, 0] == e)
        if int(first.sum()) >= cap:
            assert not (kept[:, 1] & (idx[:, 1] == e)).any()
    dropped_tokens = ~kept.any(dim=1)
    assert (out[dropped_tokens] == 0).all()


def _kept_by_hand(idx, cap, n_experts):
    """Serve every token's first choice in token order, then the second choices, … up to cap."""
    used, kept = [0] * n_experts, torch.zeros(idx.shape, dtype=torch.bool)
    for j in range(idx.shape[1]):
        for t in range(idx.shape[0]):
            e = int(idx[t, j])
            if used[e] < cap:
                used[e] += 1
                kept[t, j] = True
    return kept


@pytest.mark.parametrize("factor,T,k,e,cap", [(1.25, 10, 2, 4, 7), (1.0, 5, 1, 3, 2), (0.3, 7, 2, 4, 2),
                                              (2.0, 6, 2, 4, 6)])
def test_capacity_rounds_up_non_integer_products(factor, T, k, e, cap):
    """ceil(factor·T·k/E) by hand: 6.25 -> 7, 5/3 -> 2, 1.05 -> 2, and exactly 6 stays 6."""
    layer = _layer(e=e, k=k, capacity_factor=factor)
    assert layer.capacity(T) == cap
    out, aux = layer(_x(T, 8, seed=T))
    assert torch.equal(aux["kept"], _kept_by_hand(aux["expert_index"], cap, e))


@pytest.mark.parametrize("factor,T,k,e,cap", [(1.1, 100, 2, 4, 55), (2.2, 50, 2, 4, 55), (2.2, 25, 2, 2, 55),
                                              (2.2, 90, 1, 2, 99), (1.1, 200, 2, 8, 55), (1.1, 180, 2, 4, 99)])
def test_capacity_is_exact_where_float_rounding_crosses_an_integer(factor, T, k, e, cap):
    """The products are whole numbers (1.1·100·2/4 = 55, 1.1·180·2/4 = 99), but in floats they come
    out just above (55.00000000000001, 99.00000000000001) and a float ceil would give one more."""
    import math
    assert math.ceil(factor * T * k / e) == cap + 1        # the float arithmetic the layer must avoid
    layer = _layer(e=e, k=k, capacity_factor=factor)
    assert layer.capacity(T) == cap
    out, aux = layer(_x(T, 8, seed=T))
    assert torch.equal(aux["kept"], _kept_by_hand(aux["expert_index"], cap, e))


def test_capacity_counts_every_token_of_a_batch():
    """A (b, n, d) input has b·n tokens: 3·5 = 15, capacity ceil(0.5·15·2/4) = 4 (not the 2 of n = 5)."""
    layer = _layer(e=4, k=2, capacity_factor=0.5)
    x = _x(3, 5, 8, seed=7)
    _, aux = layer(x)
    assert layer.capacity(15) == 4
    assert torch.equal(aux["kept"], _kept_by_hand(aux["expert_index"], 4, 4))
    with pytest.raises(ValueError, match=r"^n_tokens: expected an int >= 1, got 0$"):
        layer.capacity(0)
    with pytest.raises(TypeError, match=r"^n_tokens: expected an int, got float \(15.0\)$"):
        layer.capacity(15.0)


def test_capacity_output_and_counts_against_a_hand_dispatch():
    """With capacity 3 (1.2·10·2/8 = 3): kept assignments from a hand priority loop, the output
    from a per-token loop over them, and tokens_per_expert counting every routed assignment
    (dropped ones included), i.e. a bincount of the chosen experts."""
    layer = _layer(e=8, k=2, capacity_factor=1.2, seed=3)
    with torch.no_grad():
        layer.router.gate.weight[0] += 2.0                 # skew the router so expert 0 overflows
    x = _x(10, 8, seed=4) + 1.0
    out, aux = layer(x)
    idx = aux["expert_index"]
    kept = _kept_by_hand(idx, 3, 8)
    assert not kept.all()
    assert torch.equal(aux["kept"], kept)
    torch.testing.assert_close(out, _loop_reference(layer, x, kept), atol=1e-12, rtol=0)
    by_hand = torch.tensor([int((idx == e).sum()) for e in range(8)])
    assert torch.equal(aux["tokens_per_expert"].cpu().long(), by_hand)
    assert int(aux["tokens_per_expert"].sum()) == 20 > int(kept.sum())


def test_no_capacity_limit_by_default():
    layer = _layer()
    assert layer.capacity(100) is None


# --------------------------------------------------------- balancing loss
def test_load_balancing_loss_is_one_at_perfect_balance():
    e, t = 4, 8
    probs = torch.full((t, e), 1 / e)
    idx = torch.arange(t) % e
    assert float(load_balancing_loss(probs, idx, e)) == pytest.approx(1.0)
    idx2 = torch.stack([torch.arange(t) % e, (torch.arange(t) + 1) % e], dim=1)
    assert float(load_balancing_loss(probs, idx2, e)) == pytest.approx(1.0)
    # balanced assignments make the loss 1 whatever the probabilities
    skewed_probs = torch.softmax(torch.randn(t, e), dim=-1)
    assert float(load_balancing_loss(skewed_probs, idx, e)) == pytest.approx(1.0, abs=1e-6)


def test_load_balancing_loss_grows_when_skewed():
    e, t = 4, 8
    probs = torch.tensor([[0.7, 0.1, 0.1, 0.1]]).repeat(t, 1)
    idx = torch.zeros(t, dtype=torch.long)
    loss = float(load_balancing_loss(probs, idx, e))
    assert loss == pytest.approx(e * 0.7) and loss > 1
    assert float(load_balancing_loss(torch.eye(e)[[0] * t], idx, e)) == pytest.approx(e)  # the maximum


def test_load_balancing_loss_matches_switch_transformers():
    from transformers.models.switch_transformers.modeling_switch_transformers import load_balancing_loss_func

    e, t = 6, 20
    probs = torch.softmax(torch.randn(t, e, generator=torch.Generator().manual_seed(0)), dim=-1)
    idx = probs.argmax(-1)
    ref = load_balancing_loss_func(probs[None], idx[None])
    torch.testing.assert_close(load_balancing_loss(probs, idx, e), ref, atol=1e-6, rtol=1e-6)


def test_load_balancing_loss_is_differentiable_and_in_aux():
    layer = _layer()
    out, aux = layer(_x(5, 8))
    loss = aux["load_balancing_loss"]
    torch.testing.assert_close(loss, load_balancing_loss(aux["router_probs"], aux["expert_index"], 4))
    loss.backward()
    assert layer.router.gate.weight.grad is not None and layer.router.gate.weight.grad.abs().sum() > 0


def test_load_balancing_loss_errors():
    with pytest.raises(ValueError, match="router_probs"):
        load_balancing_loss(torch.rand(4, 3), torch.zeros(4, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="expert_index"):
        load_balancing_loss(torch.rand(4, 4), torch.zeros(5, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="expert_index"):
        load_balancing_loss(torch.rand(4, 4), torch.full((4,), 4), 4)


# ---------------------------------------------------------- cost scaling
def _flops(layer, x):
    with FlopCounterMode(display=False) as counter:
        layer(x)
    return counter.get_total_flops()


def test_flops_scale_with_k_not_e():
    d, d_ff, t = 16, 32, 24
    x = torch.randn(t, d)
    per_assignment = 2 * (2 * d * d_ff)  # fc1 and fc2 matmuls

    def expert_flops(e, k):
        torch.manual_seed(0)
        layer = MoELayer(d, d_ff, e, top_k=k)
        return _flops(layer, x) - 2 * t * d * e  # minus the router's matmul

    assert expert_flops(4, 1) == expert_flops(16, 1) == t * per_assignment
    assert expert_flops(8, 2) == expert_flops(16, 2) == 2 * t * per_assignment


def test_param_counts_active_fraction():
    layer = MoELayer(16, 64, 8, top_k=2)
    c = layer.param_counts()
    assert c["total"] == sum(p.numel() for p in layer.parameters())
    assert c["active"] - c["router"] == (c["total"] - c["router"]) * 2 // 8


# ------------------------------------------------------------ validation
def test_moe_layer_errors():
    layer = _layer()
    with pytest.raises(ValueError, match=r"x: expected shape \(…, d_model=8\)"):
        layer(_x(3, 5))
    with pytest.raises(ValueError, match="capacity_factor"):
        MoELayer(8, 16, 4, capacity_factor=0)
    with pytest.raises(ValueError, match="top_k"):
        MoELayer(8, 16, 4, top_k=5)


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_moe_block_experts_use_the_block_activation(activation):
    """moe_block(..., activation=a) builds a-experts: each expert against F written by hand."""
    torch.manual_seed(0)
    block = moe_block(8, 2, n_experts=3, top_k=1, d_ff=12, activation=activation).double()
    x = _x(5, 8, seed=6)
    for ex in block.mlp.experts:
        h = x @ ex.fc1.weight.T + ex.fc1.bias
        h = torch.relu(h) if activation == "relu" else torch.nn.functional.silu(h) * (x @ ex.fc3.weight.T + ex.fc3.bias)
        torch.testing.assert_close(ex(x), h @ ex.fc2.weight.T + ex.fc2.bias, atol=1e-12, rtol=0)


def test_moe_block():
    torch.manual_seed(0)
    block = moe_block(8, 2, n_experts=4, top_k=2)
    x = torch.randn(2, 5, 8)
    y = block(x)
    assert y.shape == x.shape
    assert block.mlp.last_aux["router_probs"].shape == (10, 4)


@pytest.mark.parametrize("d,d_ff,e,k,per_expert", [(8, 16, 1, 1, 8 * 16 + 16 + 16 * 8 + 8),
                                                   (16, 64, 8, 2, 16 * 64 + 64 + 64 * 16 + 16)])
def test_param_counts_by_hand(d, d_ff, e, k, per_expert):
    """Each key worked out by hand: an expert is fc1 (d·d_ff + d_ff) and fc2 (d_ff·d + d), the
    router d·E; a single expert (E = 1) is counted too."""
    c = MoELayer(d, d_ff, e, top_k=k).param_counts()
    assert c == {"total": d * e + e * per_expert, "active": d * e + k * per_expert,
                 "router": d * e, "per_expert": per_expert}


def test_moe_block_defaults_route_to_two_experts_and_return_only_the_output():
    """moe_block's documented defaults: top_k = 2 (each token's output mixes 2 experts) and
    a layer built with return_aux=False, so the block returns a tensor, not a tuple."""
    torch.manual_seed(0)
    block = moe_block(8, 2, n_experts=4).double()
    y = block(_x(1, 5, 8))
    assert isinstance(y, torch.Tensor) and y.shape == (1, 5, 8)
    assert block.mlp.return_aux is False and block.mlp.top_k == 2
    assert block.mlp.last_aux["expert_index"].shape == (5, 2)


def test_moe_balancing_loss_errors_name_the_problem():
    from transformer_lib.moe import moe_balancing_loss

    with pytest.raises(ValueError, match=r"^model: expected at least one MoELayer, got none$"):
        moe_balancing_loss(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"^model: expected a forward pass before the balancing loss, "
                                         r"got an MoELayer that has not run$"):
        moe_balancing_loss(moe_block(8, 2, n_experts=2))


def test_error_messages_name_the_argument_the_expected_and_the_actual_value():
    with pytest.raises(ValueError, match=r"^top_k: expected at most n_experts=4, got 5$"):
        Router(8, 4, 5)
    with pytest.raises(ValueError, match=r"^router_probs: expected shape \(T, 4\), got \(4, 3\)$"):
        load_balancing_loss(torch.rand(4, 3), torch.zeros(4, dtype=torch.long), 4)
    with pytest.raises(ValueError, match=r"^expert_index: expected shape \(5,\) or \(5, k\), got \(3,\)$"):
        load_balancing_loss(torch.rand(5, 4), torch.zeros(3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match=r"^expert_index: expected shape \(4,\) or \(4, k\), got \(4, 1, 1\)$"):
        load_balancing_loss(torch.rand(4, 4), torch.zeros(4, 1, 1, dtype=torch.long), 4)
    with pytest.raises(ValueError, match=r"^x: expected at least one token, got shape \(0, 8\)$"):
        _layer()(_x(0, 8))
    assert repr(Router(8, 4, 2)) == "Router(\n  d_model=8, n_experts=4, top_k=2\n  (gate): Linear(in_features=8, out_features=4, bias=False)\n)"
    assert repr(_layer(capacity_factor=0.5)).splitlines()[1] == "  capacity_factor=0.5, return_aux=True"


def test_moe_layer_runs_under_bfloat16_autocast():
    """Mixed precision: under CPU autocast the router weights and the experts come out in
    bfloat16 while x stays float32; the layer still accumulates into x's dtype and agrees with
    the float32 per-token loop to bfloat16 precision."""
    torch.manual_seed(0)
    layer = MoELayer(8, 16, 4, top_k=2)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = _loop_reference(layer, x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, aux = layer(x)
    assert out.dtype == torch.float32 and aux["expert_weights"].dtype == torch.bfloat16
    torch.testing.assert_close(out, reference, atol=3e-2, rtol=0)


def test_argument_checks_name_the_argument():
    ids = torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^n_experts: expected an int >= 1, got 0$"):
        load_balancing_loss(torch.rand(4, 4), ids, 0)
    with pytest.raises(TypeError, match=r"^router_probs: expected a torch.Tensor, got list$"):
        load_balancing_loss([[0.5]], ids[:1], 1)
    with pytest.raises(ValueError, match=r"^expert_index: expected values in \[0, n_experts=4\), got min 4 and max 4$"):
        load_balancing_loss(torch.rand(4, 4), torch.full((4,), 4), 4)
    with pytest.raises(ValueError, match=r"^capacity_factor: expected a finite number > 0, got -1.0$"):
        MoELayer(8, 16, 4, capacity_factor=-1.0)
    for name, args in [("d_model", (0, 4, 1)), ("n_experts", (8, 0, 1)), ("top_k", (8, 4, 0))]:
        with pytest.raises(ValueError, match=rf"^{name}: expected an int >= 1, got 0$"):
            Router(*args)


def test_load_balancing_loss_keeps_float64_precision():
    """T = 3 tokens, E = 3: fractions 1/3 and 2/3 are not float32 numbers, so the loss
    E·Σ f_e·P_e by hand in float64 is matched to 1e-15 only if the counts stay float64."""
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.7, 0.2], [0.2, 0.2, 0.6]], dtype=torch.float64)
    idx = torch.tensor([0, 1, 1])
    p = [(0.5 + 0.1 + 0.2) / 3, (0.3 + 0.7 + 0.2) / 3]
    by_hand = 3 * (1 / 3 * p[0] + 2 / 3 * p[1])
    loss = load_balancing_loss(probs, idx, 3)
    assert loss.dtype == torch.float64 and abs(float(loss) - by_hand) < 1e-15


def test_moe_layer_defaults():
    """Documented defaults: top_k = 2 (Mixtral's), GELU experts with biases, aux returned,
    no capacity limit."""
    torch.manual_seed(0)
    layer = MoELayer(8, 16, 4).double()
    out, aux = layer(_x(3, 8))
    assert layer.top_k == layer.router.top_k == 2 and aux["expert_index"].shape == (3, 2)
    assert all(ex.fc1.bias is not None and ex.fc2.bias is not None for ex in layer.experts)
    assert layer.experts[0].activation == "gelu" and layer.capacity(10) is None


def test_a_batch_is_one_pool_of_tokens_for_the_capacity():
    """(b, n, d) gives what the b·n tokens give as one (b·n, d) input, and not what each sequence
    gives alone: capacity 0.5 binds, and the sequences compete for the same expert slots."""
    layer = _layer(e=4, k=2, capacity_factor=0.5, seed=2)
    x = _x(4, 6, 8, seed=5)
    with torch.no_grad():
        batched, aux = layer(x)
        flat, flat_aux = layer(x.reshape(24, 8))
        alone = torch.stack([layer(seq)[0] for seq in x])
    torch.testing.assert_close(batched, flat.reshape(4, 6, 8), atol=0, rtol=0)
    assert torch.equal(aux["kept"], flat_aux["kept"]) and int(aux["kept"].sum()) < aux["kept"].numel()
    assert (batched - alone).abs().max() > 1e-3
