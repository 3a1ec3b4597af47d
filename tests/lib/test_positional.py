"""Tests for transformer_lib.positional (Chapter 6)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from torch_helpers import error_message  # noqa: E402
from transformer_lib.positional import (  # noqa: E402
    LearnedPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    rope_cos_sin,
    sinusoidal_encoding,
)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- sinusoidal
def _sinusoid_np(n, d, base=10000.0):
    p = np.zeros((n, d))
    for i in range(n):
        for k in range(d // 2):
            w = 1.0 / base ** (2 * k / d)
            p[i, 2 * k] = np.sin(i * w)
            p[i, 2 * k + 1] = np.cos(i * w)
    return p


def test_sinusoidal_table_d8_matches_formula():
    p = sinusoidal_encoding(4, 8, dtype=torch.float64).numpy()
    np.testing.assert_allclose(p, _sinusoid_np(4, 8), atol=1e-12, rtol=0)


def test_sinusoidal_table_d8_rounds_to_syllabus_values():
    p = np.round(sinusoidal_encoding(4, 8, dtype=torch.float64).numpy(), 3)
    np.testing.assert_array_equal(p[1], [0.841, 0.540, 0.100, 0.995, 0.010, 1.000, 0.001, 1.000])
    np.testing.assert_array_equal(p[2, :2], [0.909, -0.416])
    np.testing.assert_array_equal(p[3, :2], [0.141, -0.990])
    np.testing.assert_array_equal(p[0], [0, 1, 0, 1, 0, 1, 0, 1])


def test_sinusoidal_odd_d_and_dtype():
    p = sinusoidal_encoding(5, 7)
    assert p.shape == (5, 7) and p.dtype == torch.float32
    np.testing.assert_allclose(p[:, :6].double().numpy(), _sinusoid_np(5, 7)[:, :6], atol=1e-6)
    np.testing.assert_allclose(p[:, 6].double().numpy(), np.sin(np.arange(5) / 10000.0 ** (6 / 7)), atol=1e-6)


def test_sinusoidal_rotation_property():
    d, base = 16, 10000.0
    pe = sinusoidal_encoding(200, d, dtype=torch.float64)
    rng = np.random.default_rng(0)
    for _ in range(5):
        pos, k = int(rng.integers(0, 100)), int(rng.integers(1, 100))
        for pair in range(d // 2):
            w = 1.0 / base ** (2 * pair / d)
            rot = torch.tensor([[np.cos(k * w), np.sin(k * w)], [-np.sin(k * w), np.cos(k * w)]], dtype=torch.float64)
            a = pe[pos, 2 * pair: 2 * pair + 2]
            b = pe[pos + k, 2 * pair: 2 * pair + 2]
            torch.testing.assert_close(b, rot @ a, atol=1e-10, rtol=0)


def test_sinusoidal_dot_product_depends_only_on_offset():
    pe = sinusoidal_encoding(300, 32, dtype=torch.float64)
    for k in (1, 5, 40):
        dots = torch.stack([pe[p] @ pe[p + k] for p in range(0, 200, 17)])
        torch.testing.assert_close(dots, dots[0].expand_as(dots), atol=1e-10, rtol=0)


def test_sinusoidal_validates():
    with pytest.raises(ValueError, match="d"):
        sinusoidal_encoding(4, 0)
    with pytest.raises(ValueError, match="n"):
        sinusoidal_encoding(-1, 4)


# ------------------------------------------------------------------- learned
def test_learned_positional_embedding():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(6, 4)
    assert emb.weight.shape == (6, 4)
    torch.testing.assert_close(emb(3), emb.weight[:3])
    torch.testing.assert_close(emb(6), emb.weight)          # the full context, n = n_ctx
    torch.testing.assert_close(emb(torch.tensor([5, 0])), emb.weight[[5, 0]])
    with pytest.raises(ValueError, match="n_ctx"):
        emb(7)
    with pytest.raises(ValueError, match="n_ctx"):
        emb(torch.tensor([0, 6]))
    with pytest.raises(TypeError, match="positions"):
        emb(torch.tensor([0.0]))
    with pytest.raises(ValueError, match="n_ctx"):
        LearnedPositionalEmbedding(0, 4)


# ---------------------------------------------------------------------- RoPE
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_apply_rope_matches_hf_llama(base):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    b, h, n, d = 2, 3, 7, 16
    cfg = LlamaConfig(hidden_size=h * d, num_attention_heads=h, num_key_value_heads=h,
                      rope_parameters={"rope_type": "default", "rope_theta": base})
    q = torch.randn(b, h, n, d, generator=_gen(1))
    k = torch.randn(b, h, n, d, generator=_gen(2))
    positions = torch.tensor([3, 4, 5, 9, 10, 20, 41])
    cos, sin = LlamaRotaryEmbedding(cfg)(q, positions[None].expand(b, n))
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(apply_rope(q, positions, base=base), q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(apply_rope(k, positions, base=base), k_ref, atol=1e-5, rtol=1e-5)


def test_rope_default_and_offset_positions():
    x = torch.randn(2, 5, 8, generator=_gen(0))
    torch.testing.assert_close(apply_rope(x), apply_rope(x, torch.arange(5)))
    torch.testing.assert_close(apply_rope(x, 3), apply_rope(x, torch.arange(3, 8)))
    torch.testing.assert_close(apply_rope(x, 0), apply_rope(x))
    torch.testing.assert_close(apply_rope(x)[..., 0, :], x[..., 0, :])  # position 0: no rotation


def test_rope_preserves_norm_and_dtype():
    x = torch.randn(4, 10, 12, dtype=torch.float64, generator=_gen(0))
    y = apply_rope(x)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=0)


def test_rope_score_depends_only_on_offset():
    d = 16
    q = torch.randn(d, dtype=torch.float64, generator=_gen(3))
    k = torch.randn(d, dtype=torch.float64, generator=_gen(4))

    def score(m, n):
        qm = apply_rope(q[None], torch.tensor([m]))[0]
        kn = apply_rope(k[None], torch.tensor([n]))[0]
        return qm @ kn

    for m, n in [(5, 2), (9, 4), (3, 7)]:
        for shift in (1, 13, 100):
            torch.testing.assert_close(score(m + shift, n + shift), score(m, n), atol=1e-10, rtol=0)
    assert not torch.isclose(score(5, 2), score(5, 3))  # but it does depend on the offset


def test_rope_scores_shift_invariant():
    n, d = 6, 8
    q = torch.randn(n, d, dtype=torch.float64, generator=_gen(5))
    k = torch.randn(n, d, dtype=torch.float64, generator=_gen(6))
    s0 = apply_rope(q) @ apply_rope(k).T
    s1 = apply_rope(q, 50) @ apply_rope(k, 50).T
    torch.testing.assert_close(s1, s0, atol=1e-10, rtol=0)


def test_rope_cos_sin_layout():
    cos, sin = rope_cos_sin(torch.arange(3), 6, dtype=torch.float64)
    assert cos.shape == (3, 6)
    torch.testing.assert_close(cos[:, :3], cos[:, 3:])
    torch.testing.assert_close(sin[2, 0], torch.tensor(np.sin(2.0), dtype=torch.float64))


def test_rope_errors():
    with pytest.raises(ValueError, match="even"):
        apply_rope(torch.randn(3, 5))
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(3, 4), torch.arange(4))
    with pytest.raises(ValueError, match="x"):
        apply_rope(torch.randn(4))


# --------------------------------------------------------------------- ALiBi
def test_alibi_slopes_8_heads():
    expected = torch.tensor([2.0 ** -(i) for i in range(1, 9)], dtype=torch.float64)
    torch.testing.assert_close(alibi_slopes(8, torch.float64), expected, atol=0, rtol=0)


@pytest.mark.parametrize("h", [1, 2, 4, 6, 8, 12, 16, 24])
def test_alibi_slopes_match_bloom(h):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    bloom = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), h, torch.float32)  # slope * j, j = 0, 1
    torch.testing.assert_close(alibi_slopes(h), bloom[:, 0, 1], atol=1e-7, rtol=1e-6)


def _softmax_rows(scores, bias, mask=None):
    s = scores + bias
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1)


@pytest.mark.parametrize("h", [8, 6, 12])
def test_alibi_bias_matches_bloom_after_softmax(h):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    n = 7
    bloom = build_alibi_tensor(torch.ones(1, n, dtype=torch.long), h, torch.float64)  # (h, 1, n)
    scores = torch.randn(h, n, n, dtype=torch.float64, generator=_gen(h))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    ours_linear = alibi_bias(n, h, symmetric=False, dtype=torch.float64)
    torch.testing.assert_close(_softmax_rows(scores, ours_linear), _softmax_rows(scores, bloom), atol=1e-6, rtol=1e-6)
    ours = alibi_bias(n, h, dtype=torch.float64)  # symmetric: equal where a causal mask lets keys through
    torch.testing.assert_close(_softmax_rows(scores, ours, causal), _softmax_rows(scores, bloom, causal),
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("h", [8, 6, 12, 5])
@pytest.mark.parametrize("n,m", [(7, 7), (3, 7)])
def test_alibi_bias_equals_bloom_minus_a_row_constant(h, n, m):
    """Exactly ``alibi_bias[h, i, j] = bloom[h, 0, j] − slope_h · (i + m − n)``: for every j with
    symmetric=False and on the causal entries j ≤ i + m − n by default. BLOOM computes its
    slopes in float32, hence the float32 tolerance."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    bloom = build_alibi_tensor(torch.ones(1, m, dtype=torch.long), h, torch.float64)  # (h, 1, m)
    slopes = alibi_slopes(h, torch.float64)[:, None, None]
    row = torch.arange(n, dtype=torch.float64)[None, :, None] + (m - n)               # (1, n, 1)
    expected = bloom - slopes * row                                                    # (h, n, m)
    causal = torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n)
    linear = alibi_bias(n, h, m, symmetric=False, dtype=torch.float64)
    torch.testing.assert_close(linear, expected, atol=1e-6, rtol=1e-6)
    symmetric = alibi_bias(n, h, m, dtype=torch.float64)
    torch.testing.assert_close(symmetric[:, causal], expected[:, causal], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(symmetric[:, ~causal], expected[:, ~causal])  # differs off the mask


def test_alibi_bias_values_and_alignment():
    b = alibi_bias(3, 2, dtype=torch.float64)
    slopes = alibi_slopes(2, torch.float64)
    dist = torch.tensor([[0, 1, 2], [1, 0, 1], [2, 1, 0]], dtype=torch.float64)
    torch.testing.assert_close(b, -slopes[:, None, None] * dist)
    # one new query after 4 cached keys sits at position 4
    b2 = alibi_bias(1, 2, m=5, dtype=torch.float64)
    assert b2.shape == (2, 1, 5)
    torch.testing.assert_close(b2[:, 0], -slopes[:, None] * torch.tensor([4.0, 3, 2, 1, 0], dtype=torch.float64))
    torch.testing.assert_close(alibi_bias(4, 2, m=6)[:, :, :], alibi_bias(6, 2)[:, 2:, :])


def test_alibi_errors():
    with pytest.raises(ValueError, match="n_heads"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="m: expected an int >= 1, got 0"):
        alibi_bias(3, 2, m=0)
    with pytest.raises(ValueError, match=r"m: expected m >= n=5 .*got m=3"):
        alibi_bias(5, 2, m=3)


# ------------------------------------------------- exact errors (argument, expected, actual) and defaults
def test_every_positional_error_names_argument_expected_and_actual():
    from transformer_lib.positional import alibi_bias_at, rope_angles, rotate_half

    x = torch.ones(2, 5, 8)
    emb = LearnedPositionalEmbedding(6, 4)
    cases = [
        (ValueError, "n: expected an int >= 1, got 0", sinusoidal_encoding, 0, 4),
        (ValueError, "d: expected an int >= 1, got 0", sinusoidal_encoding, 4, 0),
        (ValueError, "base: expected a finite number > 0, got 0.0", lambda: sinusoidal_encoding(4, 4, base=0.0)),
        (ValueError, "n_ctx: expected an int >= 1, got 0", LearnedPositionalEmbedding, 0, 4),
        (ValueError, "d: expected an int >= 1, got 0", LearnedPositionalEmbedding, 4, 0),
        (ValueError, "n: expected an int >= 1, got 0", emb, 0),
        (ValueError, "n: expected at most n_ctx=6 positions, got 7", emb, 7),
        (TypeError, "positions: expected an integer dtype (torch.long or torch.int32), got torch.float32",
         emb, torch.tensor([0.0])),
        (ValueError, "positions: expected values in [0, n_ctx=6), got min 6 and max 6", emb, torch.tensor([6])),
        (ValueError, "positions: expected an int >= 0, got -1", apply_rope, x, -1),
        (ValueError, "positions: expected shape (5,) or one broadcastable to x's (…, n) = (2, 5), got ()",
         apply_rope, x, torch.tensor(3)),
        (ValueError, "positions: expected shape (5,) or one broadcastable to x's (…, n) = (2, 5), got (4,)",
         apply_rope, x, torch.arange(4)),
        (TypeError, "positions: expected a torch.Tensor, got list", rope_angles, [1, 2], 4),
        (ValueError, "d: expected an even dimension for RoPE, got 5", rope_angles, torch.arange(2), 5),
        (TypeError, "d: expected an int, got float (4.0)", rope_angles, torch.arange(2), 4.0),
        (ValueError, "base: expected a finite number > 0, got 0.0", lambda: rope_angles(torch.arange(2), 4, base=0.0)),
        (ValueError, "x: expected an even last dimension d for RoPE, got shape (3, 5)", apply_rope, torch.ones(3, 5)),
        (ValueError, "x: expected an even last dimension d for RoPE, got shape ()", apply_rope, torch.tensor(1.0)),
        (ValueError, "x: expected an even last dimension d for RoPE, got shape (3,)", rotate_half, torch.ones(3)),
        (TypeError, "x: expected a torch.Tensor, got list", rotate_half, [1.0, 2.0]),
        (ValueError, "x: expected shape (…, n, d), got (4,)", apply_rope, torch.ones(4)),
        (TypeError, "interleaved: expected a bool, got int (1)", lambda: apply_rope(x, interleaved=1)),
        (ValueError, "n_heads: expected an int >= 1, got 0", alibi_slopes, 0),
        (ValueError, "n: expected an int >= 1, got 0", alibi_bias, 0, 2),
        (TypeError, "q_positions: expected a torch.Tensor, got list", alibi_bias_at, [0], torch.arange(2), 2),
        (TypeError, "k_positions: expected a torch.Tensor, got list", alibi_bias_at, torch.arange(2), [0], 2),
        (ValueError, "n_heads: expected an int >= 1, got 0", alibi_bias_at, torch.arange(2), torch.arange(2), 0),
    ]
    for exc, message, fn, *args in cases:
        assert error_message(fn, *args, exc=exc) == message


def test_learned_embedding_init_std_and_repr():
    """Weights start as N(0, init_std²), 0.02 by default (GPT-2's initialisation)."""
    torch.manual_seed(0)
    std = LearnedPositionalEmbedding(256, 64).weight.std().item()
    assert 0.019 < std < 0.021
    torch.manual_seed(0)
    assert 0.49 < LearnedPositionalEmbedding(256, 64, init_std=0.5).weight.std().item() < 0.51
    assert LearnedPositionalEmbedding(6, 4).extra_repr() == "n_ctx=6, d=4"


def test_rope_defaults_by_hand():
    """Default base 10000: at d = 4 the two frequencies are 1 and 1/100 (10000^(2/4) = 100);
    rope_cos_sin repeats each angle for dims k and k + d/2 and returns float32 by default."""
    from transformer_lib.positional import rope_angles

    theta = rope_angles(torch.tensor([1, 3]), 4)
    torch.testing.assert_close(theta, torch.tensor([[1.0, 0.01], [3.0, 0.03]], dtype=torch.float64),
                               atol=1e-15, rtol=0)
    cos, sin = rope_cos_sin(torch.tensor([2]), 4)
    assert cos.dtype == sin.dtype == torch.float32
    angles = torch.tensor([[2.0, 0.02, 2.0, 0.02]], dtype=torch.float64)
    torch.testing.assert_close(cos, angles.cos().float(), atol=1e-7, rtol=0)
    torch.testing.assert_close(sin, angles.sin().float(), atol=1e-7, rtol=0)
    cos2, _ = rope_cos_sin(torch.tensor([[2], [0]]), 4)                    # (b, n) positions -> (b, n, d)
    assert cos2.shape == (2, 1, 4)
    torch.testing.assert_close(cos2[0], cos, atol=0, rtol=0)
    # apply_rope's default base: position 1 rotates pair (0, 2) by 1 rad and pair (1, 3) by 0.01 rad
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    expected = torch.tensor([[0.0, 0.0, 0.0, 0.0],
                             [math.cos(1.0), math.cos(0.01), math.sin(1.0), math.sin(0.01)]], dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x), expected, atol=1e-15, rtol=0)


def test_rotate_half_by_hand():
    from transformer_lib.positional import rotate_half

    assert rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [-3.0, -4.0, 1.0, 2.0]
    assert rotate_half(torch.tensor([[1.0, 2.0], [3.0, 4.0]])).tolist() == [[-2.0, 1.0], [-4.0, 3.0]]


def test_interleaved_rope_matches_a_complex_rotation():
    """interleaved=True rotates pairs (2k, 2k+1) as the complex numbers x_2k + i·x_2k+1 times
    e^{i p θ_k} (RoFormer, Meta's LLaMA code), by torch.view_as_complex."""
    b, n, d, base = 2, 6, 8, 500.0
    x = torch.randn(b, n, d, dtype=torch.float64, generator=_gen(7))
    positions = torch.tensor([0, 1, 2, 5, 9, 30])
    theta = positions.double()[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.view_as_complex(x.reshape(b, n, d // 2, 2).contiguous()) * torch.polar(torch.ones_like(theta), theta)
    expected = torch.view_as_real(z).reshape(b, n, d)
    torch.testing.assert_close(apply_rope(x, positions, base=base, interleaved=True), expected, atol=1e-12, rtol=0)
    # and the same rotation as the default layout once features are permuted to (evens, odds)
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    torch.testing.assert_close(apply_rope(x[..., perm], positions, base=base), expected[..., perm], atol=1e-12, rtol=0)


def test_rope_of_integer_input_is_float32_and_positions_broadcast():
    x = torch.arange(12).reshape(1, 3, 4)
    y = apply_rope(x, torch.tensor([2, 0, 1]))
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, apply_rope(x.float(), torch.tensor([2, 0, 1])))
    xb = torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=_gen(8))      # (b, h, n, d)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])[:, None]          # (b, 1, n): a row per sequence
    torch.testing.assert_close(apply_rope(xb, pos)[1], apply_rope(xb[1], 7), atol=1e-12, rtol=0)


def test_positional_functions_stay_on_the_input_device():
    """Every tensor built inside follows the input's device (the meta device stands in for a GPU)."""
    from transformer_lib.positional import alibi_bias_at, rope_angles

    x = torch.ones(2, 5, 8, device="meta")
    assert apply_rope(x).device.type == "meta"
    assert apply_rope(x, 3).device.type == "meta"
    assert apply_rope(x, torch.arange(5, device="meta")).device.type == "meta"
    assert apply_rope(x, torch.arange(5)).device.type == "meta"                # positions moved to x's device
    assert rope_angles(torch.arange(5, device="meta"), 8).device.type == "meta"
    assert alibi_bias(3, 2, m=5, device="meta").device.type == "meta"
    pos = torch.arange(4, device="meta")
    assert alibi_bias_at(pos, pos, 2).device.type == "meta"


def test_alibi_slopes_in_float64_for_16_heads():
    """16 heads: 2^(-i/2), not powers of two, so a float32 intermediate would show."""
    expected = torch.tensor([2.0 ** (-0.5 * i) for i in range(1, 17)], dtype=torch.float64)
    torch.testing.assert_close(alibi_slopes(16, torch.float64), expected, atol=0, rtol=1e-15)
    assert alibi_slopes(4).dtype == torch.float32


def test_alibi_bias_at_positions_by_hand():
    """Default symmetric: -slope·|p_i - p_j|; symmetric=False: -slope·(p_i - p_j); float32 by
    default; leading dims broadcast: (b, n), (b, m) -> (b, h, n, m)."""
    from transformer_lib.positional import alibi_bias_at

    q, k = torch.tensor([[3, 5]]), torch.tensor([[0, 4, 9]])
    delta = torch.tensor([[3.0, -1.0, -6.0], [5.0, 1.0, -4.0]], dtype=torch.float64)
    slopes = torch.tensor([0.0625, 0.00390625], dtype=torch.float64)[:, None, None]  # h = 2: 2^-4, 2^-8
    sym = alibi_bias_at(q, k, 2)
    assert sym.shape == (1, 2, 2, 3) and sym.dtype == torch.float32
    torch.testing.assert_close(sym[0], (-slopes * delta.abs()).float(), atol=0, rtol=0)
    lin = alibi_bias_at(q, k, 2, symmetric=False, dtype=torch.float64)
    torch.testing.assert_close(lin[0], -slopes * delta, atol=0, rtol=0)
    # alibi_bias's query block after m - n cached keys: rows at positions 2, 3 of 4
    torch.testing.assert_close(alibi_bias(2, 2, 4, symmetric=False, dtype=torch.float64),
                               -slopes * torch.tensor([[2.0, 1, 0, -1], [3, 2, 1, 0]], dtype=torch.float64),
                               atol=0, rtol=0)


def test_rope_cos_sin_uses_its_base():
    """base = 100 at d = 4: frequencies 1 and 1/10, so position 3 has angles 3 and 0.3."""
    cos, sin = rope_cos_sin(torch.tensor([3]), 4, base=100.0, dtype=torch.float64)
    angles = torch.tensor([[3.0, 0.3, 3.0, 0.3]], dtype=torch.float64)
    torch.testing.assert_close(cos, angles.cos(), atol=1e-15, rtol=0)
    torch.testing.assert_close(sin, angles.sin(), atol=1e-15, rtol=0)


def test_alibi_bias_dtype_and_exact_differences():
    """alibi_bias is float32 unless asked; alibi_bias_at takes differences and slopes in float64,
    so 16 heads (slopes 2^(-i/2)) and float32 positions 1e8 and 1 (difference 99999999, which
    float32 cannot hold) come out exact."""
    from transformer_lib.positional import alibi_bias_at

    assert alibi_bias(3, 2).dtype == torch.float32
    assert alibi_bias(3, 2, dtype=torch.float64).dtype == torch.float64
    slopes = torch.tensor([2.0 ** (-0.5 * i) for i in range(1, 17)], dtype=torch.float64)
    bias = alibi_bias_at(torch.tensor([1e8]), torch.tensor([1.0]), 16, dtype=torch.float64)
    torch.testing.assert_close(bias[:, 0, 0], -slopes * 99999999.0, atol=0, rtol=1e-15)


# ----------------------------------------------------------------------------- low precision
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 0.02), (torch.bfloat16, 0.1)])
def test_rope_angles_are_computed_in_float64_whatever_the_input_dtype(dtype, tol):
    """At positions near 4000 an angle held in float16 is off by up to 1 rad (its spacing there
    is 2; bfloat16's, 16): the rotation of a half-precision input must match the float64
    rotation rounded to that precision, through `apply_rope`, `rope_cos_sin` and the attention
    layer, which rotates its queries and keys with it."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 16, generator=g, dtype=torch.float64)
    far = torch.arange(3990, 3995)
    want = apply_rope(x, far)
    got = apply_rope(x.to(dtype), far)
    assert got.dtype == dtype
    assert (got.double() - want).abs().max() < tol
    cos, sin = rope_cos_sin(far, 16, dtype=dtype)
    want_cos, want_sin = rope_cos_sin(far, 16, dtype=torch.float64)
    assert cos.dtype == dtype and (cos.double() - want_cos).abs().max() < tol / 4
    assert (sin.double() - want_sin).abs().max() < tol / 4
    from transformer_lib.multihead import MultiHeadAttention

    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, causal=True, rope=True, fused=False).double()
    with torch.no_grad():
        exact = layer(x, positions=far)
        low = layer.to(dtype)(x.to(dtype), positions=far)
    assert (low.double() - exact).abs().max() < 2 * tol
