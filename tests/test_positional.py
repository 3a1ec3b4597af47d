"""Tests for transformer_lib.positional (Chapter 6)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

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
