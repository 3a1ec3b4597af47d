"""Tests for transformer_lib.block (Chapters 3–4)."""
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_helpers import error_message, rand, randomize, ref_block, ref_mlp, ref_rope
from transformer_lib.attention import causal_mask
from transformer_lib.block import MLP, LayerNorm, RMSNorm, TransformerBlock, make_norm

TOL = dict(atol=1e-6, rtol=1e-6)
D64 = torch.float64


# ------------------------------------------------------------------ norms
def test_layernorm_worked_example():
    h = torch.tensor([2.0, -1.0, 0.5, 1.5], dtype=D64)
    mu = h.sum() / 4
    var = ((h - mu) ** 2).sum() / 4  # biased variance
    expected = (h - mu) / torch.sqrt(var + 1e-5)
    torch.testing.assert_close(LayerNorm(4).double()(h), expected, **TOL)
    assert mu.item() == 0.75
    torch.testing.assert_close(var.sqrt(), torch.tensor(1.1456, dtype=D64), atol=5e-5, rtol=0)
    torch.testing.assert_close(expected, torch.tensor([1.091, -1.528, -0.218, 0.655], dtype=D64),
                               atol=5e-4, rtol=0)


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_torch(bias):
    ref = randomize(nn.LayerNorm(6, eps=1e-5, bias=bias).double(), seed=1)
    ours = LayerNorm(6, eps=1e-5, bias=bias).double()
    ours.load_state_dict(ref.state_dict())
    x = rand(2, 3, 6, seed=2) * 3 + 1
    torch.testing.assert_close(ours(x), ref(x), **TOL)


def test_rmsnorm_matches_torch():
    ref = randomize(nn.RMSNorm(6, eps=1e-6).double(), seed=3)
    ours = RMSNorm(6, eps=1e-6).double()
    ours.load_state_dict(ref.state_dict())
    x = rand(2, 3, 6, seed=4)
    torch.testing.assert_close(ours(x), ref(x), **TOL)


@pytest.mark.parametrize("scale,eps", [(1e-3, 1e-6), (1e-3, 1e-5), (1.0, 0.5), (50.0, 1e-6)])
def test_norms_at_small_inputs_and_large_eps_match_torch(scale, eps):
    """At input scale 1e-3 the mean square (~1e-6) is comparable to ε, and with ε = 0.5 at scale
    1 it dominates: where ε sits (inside the root) matters, so compare with torch in float64."""
    x = rand(3, 8, seed=5) * scale + 0.3 * scale
    for ref, ours in ((nn.LayerNorm(8, eps=eps), LayerNorm(8, eps=eps)),
                      (nn.RMSNorm(8, eps=eps), RMSNorm(8, eps=eps))):
        ref = randomize(ref.double(), seed=6)
        ours = ours.double()
        ours.load_state_dict(ref.state_dict())
        torch.testing.assert_close(ours(x), ref(x), atol=1e-12, rtol=1e-9)


# ------------------------------------------------------------------ MLP
@pytest.mark.parametrize("activation,fn", [("relu", F.relu), ("gelu", F.gelu),
                                           ("gelu_tanh", lambda h: F.gelu(h, approximate="tanh"))])
def test_mlp_activations(activation, fn):
    torch.manual_seed(0)
    mlp = MLP(4, 10, activation).double()
    x = rand(3, 4, seed=5)
    torch.testing.assert_close(mlp(x), mlp.fc2(fn(mlp.fc1(x))), **TOL)


def test_mlp_swiglu_and_default_width():
    torch.manual_seed(0)
    mlp = MLP(4, 6, "swiglu", bias=False).double()
    x = rand(3, 4, seed=6)
    W1, W2, W3 = mlp.fc1.weight, mlp.fc2.weight, mlp.fc3.weight
    torch.testing.assert_close(mlp(x), (F.silu(x @ W1.T) * (x @ W3.T)) @ W2.T, **TOL)
    assert MLP(8).fc1.out_features == 32


# ------------------------------------------------------------------ equals torch.nn.TransformerEncoderLayer
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_block_matches_torch(norm_first, activation, causal, bias):
    d, h, d_ff, n = 8, 2, 16, 5
    ref = nn.TransformerEncoderLayer(d, h, d_ff, dropout=0.0, activation=activation, batch_first=True,
                                     norm_first=norm_first, bias=bias).double()
    randomize(ref, 1).eval()  # every parameter, so that each bias and gain copied is checked
    ours = TransformerBlock.from_torch(ref, causal=causal).eval()
    x = rand(2, n, d, seed=7)
    cm = causal_mask(n)
    src_mask = ~cm if causal else None  # torch: True = NOT allowed
    expected = ref(x, src_mask=src_mask)
    torch.testing.assert_close(ours(x), expected, **TOL)
    torch.testing.assert_close(ours(x[0]), ref(x[0], src_mask=src_mask), **TOL)  # unbatched
    ours.attn.causal = False  # the same mask passed explicitly
    torch.testing.assert_close(ours(x, mask=cm if causal else None), expected, **TOL)


def test_block_parameter_count_bert_base():
    d, h, d_ff = 768, 12, 3072
    with torch.device("meta"):
        block = TransformerBlock(d, h, d_ff, norm_first=False)
    counts = {name: sum(p.numel() for p in getattr(block, name).parameters())
              for name in ("attn", "mlp", "norm1", "norm2")}
    assert counts["attn"] == 4 * d * d + 4 * d
    assert counts["mlp"] == 2 * d * d_ff + d_ff + d == 4_722_432
    assert counts["norm1"] + counts["norm2"] == 4 * d == 3_072
    assert sum(counts.values()) == 7_084_800 + 4 * d  # the syllabus table counts 4d² without Q/K/V/O biases


# ------------------------------------------------------------------ residual stream (Chapter 4)
@pytest.mark.parametrize("kw", [{}, {"norm": "rmsnorm", "activation": "swiglu", "bias": False},
                                {"causal": True, "rope": True, "n_kv_heads": 1}])
def test_stream_decomposes_in_pre_norm(kw):
    torch.manual_seed(0)
    block = TransformerBlock(8, 2, **kw).double()
    x = rand(2, 5, 8, seed=8)
    out, writes = block(x, return_stream=True)
    assert len(writes) == 2
    torch.testing.assert_close(out, x + writes[0] + writes[1], **TOL)
    torch.testing.assert_close(out, block(x), atol=0, rtol=0)


def test_stream_in_post_norm_does_not_decompose():
    torch.manual_seed(0)
    block = TransformerBlock(8, 2, norm_first=False).double()
    x = rand(2, 5, 8, seed=9) * 3
    out, (a, m) = block(x, return_stream=True)
    torch.testing.assert_close(a, block.attn(x), atol=0, rtol=0)
    assert not torch.allclose(out, x + a + m)


@pytest.mark.parametrize("norm_first", [True, False])
def test_residual_toggle(norm_first):
    torch.manual_seed(0)
    block = TransformerBlock(8, 2, norm_first=norm_first, residual=False).double()
    x = rand(5, 8, seed=10)
    if norm_first:
        expected = block.mlp(block.norm2(block.attn(block.norm1(x))))
    else:
        x1 = block.norm1(block.attn(x))
        expected = block.norm2(block.mlp(x1))
    torch.testing.assert_close(block(x), expected, **TOL)


@pytest.mark.parametrize("kw", [dict(norm="rmsnorm", activation="swiglu", n_kv_heads=1),
                                dict(norm_first=False, alibi=True, activation="gelu_tanh"),
                                dict(rope=True)])
def test_block_full_and_cached_match_a_functional_reference(kw):
    """Full and token-by-token cached outputs against the block recomputed with
    torch.nn.functional (tests/torch_helpers.ref_block), not against each other."""
    block = randomize(TransformerBlock(8, 2, causal=True, **kw).double(), seed=12).eval()
    x = rand(2, 6, 8, seed=11)
    expected = ref_block(block, x, kw.get("norm", "layernorm"))
    torch.testing.assert_close(block(x), expected, **TOL)
    cache = {}
    steps = torch.cat([block(x[:, t:t + 1], cache=cache) for t in range(6)], dim=1)
    torch.testing.assert_close(steps, expected, **TOL)


# ------------------------------------------------------------------ errors
def test_error_unknown_activation_and_norm():
    with pytest.raises(ValueError, match=r"activation: expected one of 'relu', 'gelu', 'gelu_tanh', 'swiglu', got 'tanh'"):
        TransformerBlock(8, 2, activation="tanh")
    with pytest.raises(ValueError, match=r"norm: expected one of 'layernorm', 'rmsnorm', got 'batchnorm'"):
        TransformerBlock(8, 2, norm="batchnorm")


def test_error_input_width():
    block = TransformerBlock(8, 2)
    with pytest.raises(ValueError, match=r"x: expected shape \(…, d_model=8\), got \(2, 5, 6\)"):
        block(torch.ones(2, 5, 6))
    with pytest.raises(ValueError, match=r"x: expected shape \(…, d_model=4\), got \(3, 5\)"):
        LayerNorm(4)(torch.ones(3, 5))


def test_error_from_torch_type():
    with pytest.raises(TypeError, match=r"layer: expected nn.TransformerEncoderLayer, got Linear"):
        TransformerBlock.from_torch(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"layer: expected batch_first=True, got False"):
        TransformerBlock.from_torch(nn.TransformerEncoderLayer(8, 2, 16))


@pytest.mark.parametrize("mask,error,message", [
    (torch.ones(5, 5), TypeError, "mask: expected dtype torch.bool"),
    (torch.ones(3, 3, dtype=torch.bool), ValueError, "mask: expected a shape broadcastable to (2, 2, 5, 5)"),
])
def test_error_mask_checked_before_the_causal_mask_is_combined(mask, error, message):
    block = TransformerBlock(8, 2, causal=True)
    with pytest.raises(error, match=re.escape(message)):
        block(torch.ones(2, 5, 8), mask=mask)


# ------------------------------------------------------------------ defaults, exact errors, dtypes
def test_norm_defaults_match_torch_where_eps_matters():
    """LayerNorm's default ε is 1e-5 with a bias, RMSNorm's 1e-6 (torch's and LLaMA's values):
    at input scale 1e-3 the variance (1e-6) is comparable to ε, so a wrong default shows."""
    x = rand(3, 16, seed=30) * 1e-3
    ln, rms = randomize(LayerNorm(16).double(), seed=1), randomize(RMSNorm(16).double(), seed=2)
    assert ln.bias is not None
    torch.testing.assert_close(ln(x), F.layer_norm(x, (16,), ln.weight, ln.bias, 1e-5), **TOL)
    torch.testing.assert_close(rms(x), F.rms_norm(x, (16,), rms.weight, 1e-6), **TOL)
    assert ln.extra_repr() == "16, eps=1e-05, bias=True"
    assert LayerNorm(4, bias=False).extra_repr() == "4, eps=1e-05, bias=False"
    assert rms.extra_repr() == "16, eps=1e-06"
    assert make_norm("layernorm", 4, 1e-5).bias is not None                  # bias=True by default
    assert isinstance(make_norm("rmsnorm", 4, 1e-6), RMSNorm)


def test_rmsnorm_in_float16_squares_in_float32():
    """float16 inputs of size 1000 have squares (1e6) past float16's maximum (65504): RMSNorm
    squares them in float32 and returns float16, like F.rms_norm on float32 then cast."""
    x = rand(4, 8, seed=31) * 1000
    rms = randomize(RMSNorm(8), seed=3)
    out = rms.half()(x.half())
    assert out.dtype == torch.float16
    expected = F.rms_norm(x.half().float(), (8,), rms.weight.float(), 1e-6).half()
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)
    assert torch.isfinite(out).all()


def test_block_defaults_are_a_gpt2_style_pre_norm_block():
    """TransformerBlock(d, h): pre-norm, GELU MLP of width 4d, LayerNorm with ε = 1e-5 and
    biases, non-causal, no RoPE/ALiBi, residuals; checked against the functional reference with
    those values written out (inputs at scale 1e-3, where ε matters)."""
    block = randomize(TransformerBlock(16, 4).double(), seed=4)
    assert block.attn.q_proj.bias is not None and block.mlp.fc1.bias is not None
    assert block.norm1.bias is not None and block.mlp.activation == "gelu" and block.mlp.d_ff == 64
    assert block.attn.rope_base == 10000.0
    x = rand(2, 5, 16, seed=32) * 1e-3
    expected = ref_block(block, x, "layernorm", norm_first=True, eps=1e-5, causal=False, rope=False, alibi=False)
    torch.testing.assert_close(block(x), expected, **TOL)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_block_passes_mask_and_positions_to_attention(norm_first, kind):
    """Explicit positions (not 0…n−1) and a key-padding mask reach the attention, in both norm
    placements: a reference with F.scaled_dot_product_attention, a complex-number RoPE and a
    hand-built ALiBi bias at those positions."""
    d, h, n = 16, 4, 5
    block = randomize(TransformerBlock(d, h, norm_first=norm_first, causal=True, **{kind: True}).double(), seed=5)
    x = rand(2, n, d, seed=33)
    pos = torch.tensor([0, 2, 3, 7, 8])
    keep = torch.tensor([[True] * 5, [True, False, True, True, True]])[:, None, None, :]
    mha = block.attn

    def attention(y):
        q = F.linear(y, mha.q_proj.weight, mha.q_proj.bias).view(2, n, h, -1).transpose(1, 2)
        k = F.linear(y, mha.k_proj.weight, mha.k_proj.bias).view(2, n, h, -1).transpose(1, 2)
        v = F.linear(y, mha.v_proj.weight, mha.v_proj.bias).view(2, n, h, -1).transpose(1, 2)
        allowed = keep & torch.ones(n, n, dtype=torch.bool).tril()
        bias = torch.zeros(2, h, n, n, dtype=D64).masked_fill(~allowed, float("-inf"))
        if kind == "rope":
            q, k = ref_rope(q, pos, 10000.0), ref_rope(k, pos, 10000.0)
        else:
            slopes = torch.tensor([2.0 ** (-8.0 * i / h) for i in range(1, h + 1)], dtype=D64)
            bias = bias - slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs().to(D64)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(2, n, d)
        return F.linear(o, mha.out_proj.weight, mha.out_proj.bias)

    ln = lambda y, norm: F.layer_norm(y, (d,), norm.weight, norm.bias, 1e-5)  # noqa: E731
    if norm_first:
        x1 = x + attention(ln(x, block.norm1))
        expected = x1 + ref_mlp(block.mlp, ln(x1, block.norm2))
    else:
        x1 = ln(x + attention(x), block.norm1)
        expected = ln(x1 + ref_mlp(block.mlp, x1), block.norm2)
    torch.testing.assert_close(block(x, mask=keep, positions=pos), expected, **TOL)


def test_from_torch_errors_and_default_causal():
    with pytest.raises(ValueError, match=r"^layer: expected batch_first=True, got False$"):
        TransformerBlock.from_torch(nn.TransformerEncoderLayer(8, 2, 16))
    with pytest.raises(ValueError, match=r"^layer: expected activation relu or gelu, got <built-in method tanh"):
        TransformerBlock.from_torch(nn.TransformerEncoderLayer(8, 2, 16, activation=torch.tanh, batch_first=True))
    layer = randomize(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double(), seed=6).eval()
    block = TransformerBlock.from_torch(layer)
    assert block.attn.causal is False and block.mlp.activation == "relu"
    assert TransformerBlock.from_torch(nn.TransformerEncoderLayer(8, 2, 16, activation="gelu",
                                                                  batch_first=True)).mlp.activation == "gelu"
    x = rand(2, 4, 8, seed=34)
    torch.testing.assert_close(block(x), layer(x), **TOL)


def test_mlp_has_biases_by_default():
    mlp = MLP(8)
    assert mlp.fc1.bias is not None and mlp.fc2.bias is not None
    assert MLP(8, bias=False).fc1.bias is None


def test_norm_errors_name_the_argument_expected_and_actual():
    cases = [
        (ValueError, "eps: expected a finite number > 0, got 0.0", lambda: LayerNorm(4, eps=0.0)),
        (TypeError, "d: expected an int, got float (2.0)", lambda: RMSNorm(2.0)),
        (ValueError, "x: expected shape (…, d_model=4), got (3, 5)", lambda: RMSNorm(4)(torch.ones(3, 5))),
        (TypeError, "residual: expected a bool, got int (1)", lambda: TransformerBlock(8, 2, residual=1)),
        (TypeError, "norm_first: expected a bool, got int (1)", lambda: TransformerBlock(8, 2, norm_first=1)),
    ]
    for exc, message, fn in cases:
        assert error_message(fn, exc=exc) == message


def test_from_torch_copies_the_norm_eps():
    """layer_norm_eps = 0.5 at input scale 0.1: ε dominates the variance, so a block left at
    the default 1e-5 would differ from torch by far more than the tolerance."""
    layer = randomize(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, layer_norm_eps=0.5,
                                                 norm_first=True).double(), seed=9).eval()
    block = TransformerBlock.from_torch(layer).eval()
    x = 0.1 * rand(2, 4, 8, seed=35)
    torch.testing.assert_close(block(x), layer(x), **TOL)


def test_mlp_width_error_in_full():
    assert error_message(MLP(4), torch.ones(3, 5), exc=ValueError) == "x: expected shape (…, d_model=4), got (3, 5)"
