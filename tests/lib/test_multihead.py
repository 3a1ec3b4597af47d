"""Tests for transformer_lib.multihead (Chapter 5, with the options of Chapters 6, 7 and 9)."""
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import torch.nn.functional as F

from torch_helpers import rand, randomize, ref_mha, ref_rope
from transformer_lib.data import running_example
from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.multihead import MultiHeadAttention, merge_heads, split_heads

TOL = dict(atol=1e-6, rtol=1e-6)
D64 = torch.float64


def make(d, h, seed=0, **kw):
    torch.manual_seed(seed)
    return MultiHeadAttention(d, h, **kw).double().eval()


# ------------------------------------------------------------------ split / merge
def test_split_merge_roundtrip():
    x = rand(2, 5, 12)
    s = split_heads(x, 3)
    assert s.shape == (2, 3, 5, 4)
    torch.testing.assert_close(s[:, 1], x[..., 4:8], atol=0, rtol=0)  # head i = columns i·d_k…
    torch.testing.assert_close(merge_heads(s), x, atol=0, rtol=0)
    assert split_heads(x[0], 3).shape == (3, 5, 4)


def test_running_example_two_heads():
    X, W_Q, W_K, _ = running_example(D64)[1:]
    q, k = split_heads(X @ W_Q, 2), split_heads(X @ W_K, 2)
    S = q @ k.transpose(-2, -1)
    S1 = torch.tensor([[2, 2, 4, 0], [2, 2, 4, 0], [3, 3, 6, 0], [1, 1, 2, 0]], dtype=D64)
    S2 = torch.tensor([[3, 5, 2, 6], [2, 3, 1, 4], [2, 4, 2, 4], [3, 4, 1, 6]], dtype=D64)
    torch.testing.assert_close(S, torch.stack([S1, S2]), atol=0, rtol=0)
    _, A = scaled_dot_product_attention(q, k, q)
    torch.testing.assert_close(A[:, 0], torch.tensor([[.157, .157, .647, .038], [.072, .295, .035, .598]],
                                                     dtype=D64), atol=5e-4, rtol=0)


# ------------------------------------------------------------------ equals torch.nn.MultiheadAttention
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("h", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batched", [True, False])
def test_from_torch_matches(bias, h, causal, batched):
    d, n = 8, 5
    ref = randomize(nn.MultiheadAttention(d, h, bias=bias, batch_first=True).double(), seed=h).eval()
    ours = MultiHeadAttention.from_torch(ref).eval()
    x = rand(2, n, d, seed=1) if batched else rand(n, d, seed=1)
    cm = causal_mask(n)
    # torch's attn_mask uses the OPPOSITE convention: True = NOT allowed, hence ~cm
    tmask = ~cm if causal else None
    ref_out, ref_w = ref(x, x, x, attn_mask=tmask, need_weights=True, average_attn_weights=False)
    out, w = ours(x, mask=cm if causal else None, return_weights=True)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(w, ref_w, **TOL)
    _, ref_avg = ref(x, x, x, attn_mask=tmask, need_weights=True, average_attn_weights=True)
    torch.testing.assert_close(w.mean(dim=-3), ref_avg, **TOL)
    if causal:
        assert torch.all(ref_w.triu(1) == 0)  # confirms torch's mask convention
        ours.causal = True
        torch.testing.assert_close(ours(x), ref_out, **TOL)


def test_cross_attention_matches_torch():
    ref = randomize(nn.MultiheadAttention(8, 2, batch_first=True).double()).eval()
    ours = MultiHeadAttention.from_torch(ref)
    x, ctx = rand(3, 4, 8, seed=2), rand(3, 6, 8, seed=3)
    out, w = ours(x, context=ctx, return_weights=True)
    ref_out, ref_w = ref(x, ctx, ctx, average_attn_weights=False)
    assert w.shape == (3, 2, 4, 6)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(w, ref_w, **TOL)


def test_loop_over_heads_equals_reshape():
    d, h, n = 12, 3, 5
    mha = make(d, h)
    x = rand(2, n, d, seed=4)
    d_k = d // h
    heads = []
    for i in range(h):  # one SelfAttention-style head at a time, on its slice of the weights
        rows = slice(i * d_k, (i + 1) * d_k)
        q = x @ mha.q_proj.weight[rows].T + mha.q_proj.bias[rows]
        k = x @ mha.k_proj.weight[rows].T + mha.k_proj.bias[rows]
        v = x @ mha.v_proj.weight[rows].T + mha.v_proj.bias[rows]
        scores = q @ k.transpose(-2, -1) / d_k ** 0.5
        heads.append(torch.softmax(scores, dim=-1) @ v)
    loop = torch.cat(heads, dim=-1) @ mha.out_proj.weight.T + mha.out_proj.bias
    torch.testing.assert_close(mha(x), loop, **TOL)
    # concat-then-W_O equals the sum of per-head full-width writes (W_O split by columns)
    W_O = mha.out_proj.weight
    per_head = sum(heads[i] @ W_O[:, i * d_k:(i + 1) * d_k].T for i in range(h)) + mha.out_proj.bias
    torch.testing.assert_close(per_head, loop, **TOL)


@pytest.mark.parametrize("h", [1, 2, 4, 8, 16])
def test_parameter_count(h):
    d = 32
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(MultiHeadAttention(d, h)) == 4 * d * d + 4 * d
    assert count(MultiHeadAttention(d, h, bias=False)) == 4 * d * d


def test_gqa_parameter_count():
    d, h, h_kv = 32, 8, 2
    d_k = d // h
    m = MultiHeadAttention(d, h, bias=False, n_kv_heads=h_kv)
    assert m.k_proj.weight.shape == (h_kv * d_k, d)
    assert sum(p.numel() for p in m.parameters()) == 2 * d * d + 2 * d * h_kv * d_k


# ------------------------------------------------------------------ Q, K, V in one product
@pytest.mark.parametrize("h_kv, bias", [(4, True), (1, True), (2, False)])
def test_qkv_weights_stack_the_three_projections_row_by_row(h_kv, bias):
    d, h = 16, 4
    kv = h_kv * (d // h)
    m = MultiHeadAttention(d, h, n_kv_heads=h_kv, bias=bias)
    with torch.no_grad():                      # row r of Q, K, V holds r·d + column, counted on from Q to V
        for name, start in (("q_proj", 0), ("k_proj", d), ("v_proj", d + kv)):
            lin = getattr(m, name)
            lin.weight.copy_(torch.arange(float(start * d), float((start + lin.out_features) * d)).view(-1, d))
            if bias:
                lin.bias.copy_(-torch.arange(float(start), float(start + lin.out_features)))
    weight, b = m.qkv_weights()
    assert torch.equal(weight, torch.arange(float((d + 2 * kv) * d)).view(d + 2 * kv, d))
    assert torch.equal(b, -torch.arange(float(d + 2 * kv))) if bias else b is None
    names = [f"{lin}.{p}" for lin in ("q_proj", "k_proj", "v_proj", "out_proj") for p in ("weight", "bias")[:1 + bias]]
    assert [n for n, _ in m.named_parameters()] == names    # the parameters stay those of four nn.Linear


class _Linears(torch.overrides.TorchFunctionMode):
    """The weight shapes of every ``F.linear`` called inside it."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            self.shapes.append(tuple(args[1].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("h_kv", [4, 2])
def test_self_attention_gets_q_k_v_from_one_product(h_kv):
    """One product for Q, K and V, one for the output: as nanoGPT's c_attn and c_proj."""
    m, x = make(16, 4, n_kv_heads=h_kv, causal=True), rand(2, 5, 16, seed=1)
    with _Linears() as seen:
        m(x)
    assert seen.shapes == [(16 + 2 * 4 * h_kv, 16), (16, 16)]
    with _Linears() as seen:                   # cross-attention: K and V come from the context
        m(x, context=rand(2, 7, 16, seed=2))
    assert seen.shapes == [(16, 16), (4 * h_kv, 16), (4 * h_kv, 16), (16, 16)]


def test_gradients_reach_each_projection_as_torch_in_proj_weight():
    """The gradient of the stacked product lands in q_proj, k_proj and v_proj: the rows of
    torch.nn.MultiheadAttention's in_proj_weight gradient."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(8, 2, batch_first=True).double()
    ours = MultiHeadAttention.from_torch(ref)
    x = rand(2, 5, 8, seed=4)
    ref(x, x, x, need_weights=False)[0].pow(2).sum().backward()
    ours(x).pow(2).sum().backward()
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        lin = getattr(ours, name)
        torch.testing.assert_close(lin.weight.grad, ref.in_proj_weight.grad[8 * i:8 * (i + 1)], **TOL)
        torch.testing.assert_close(lin.bias.grad, ref.in_proj_bias.grad[8 * i:8 * (i + 1)], **TOL)


def test_hooks_on_the_projections_see_their_own_calls():
    """hook_q, hook_k, hook_v hold X W_Q + b, … split into heads; a forward hook on a
    projection sees its own call, and what it returns is what the layer uses."""
    m, x = make(16, 4, n_kv_heads=2, causal=True), rand(2, 5, 16, seed=1)
    seen = {}
    handles = [getattr(m, f"hook_{name}").register_forward_hook(
        lambda mod, inp, t, name=name: seen.setdefault(name, t.clone())) for name in "qkv"]
    with torch.no_grad():
        out = m(x)
    for name, heads in (("q", 4), ("k", 2), ("v", 2)):
        lin = getattr(m, f"{name}_proj")
        torch.testing.assert_close(seen[name], (x @ lin.weight.T + lin.bias).view(2, 5, heads, 4), atol=1e-12, rtol=0)
    for handle in handles:
        handle.remove()
    handle = m.k_proj.register_forward_hook(lambda mod, inp, k: torch.zeros_like(k))
    with torch.no_grad():
        hooked = m(x)
        ref = make(16, 4, n_kv_heads=2, causal=True)
        ref.k_proj.weight.zero_(), ref.k_proj.bias.zero_()          # keys 0: every weight uniform
        torch.testing.assert_close(hooked, ref_mha(ref, x), **TOL)
    handle.remove()
    with torch.no_grad():
        torch.testing.assert_close(m(x), out, atol=1e-12, rtol=0)     # the one product again


class _ZeroKeys(nn.Linear):
    def forward(self, x):
        return torch.zeros_like(super().forward(x))


def test_a_replaced_projection_is_called_as_it_is():
    """A projection swapped for another module (here an nn.Linear subclass whose keys are all 0)
    computes through its own forward, not through its weight in the stacked product."""
    m, x = make(16, 4, n_kv_heads=2, causal=True), rand(2, 5, 16, seed=1)
    ref = make(16, 4, n_kv_heads=2, causal=True)
    swapped = _ZeroKeys(16, 8).double()
    with torch.no_grad():
        swapped.load_state_dict(m.k_proj.state_dict())
        m.k_proj = swapped
        ref.k_proj.weight.zero_(), ref.k_proj.bias.zero_()
        torch.testing.assert_close(m(x), ref_mha(ref, x), **TOL)


# ------------------------------------------------------------------ GQA
@pytest.mark.parametrize("h_kv", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_matches_torch_sdpa_with_enable_gqa(h_kv, causal):
    """Grouped-query attention against F.scaled_dot_product_attention(enable_gqa=True), whose
    query head i reads key/value head i // (h / h_kv)."""
    mha = randomize(make(16, 4, causal=causal, n_kv_heads=h_kv), seed=h_kv)
    x = rand(2, 6, 16, seed=5)
    torch.testing.assert_close(mha(x), ref_mha(mha, x), **TOL)


def test_gqa_equals_mha_with_repeated_kv_weights():
    d, h, h_kv = 16, 4, 2
    gqa = make(d, h, n_kv_heads=h_kv, causal=True)
    plain = make(d, h, causal=True)
    d_k, group = d // h, h // h_kv
    with torch.no_grad():
        plain.q_proj.load_state_dict(gqa.q_proj.state_dict())
        plain.out_proj.load_state_dict(gqa.out_proj.state_dict())
        for src, dst in ((gqa.k_proj, plain.k_proj), (gqa.v_proj, plain.v_proj)):
            dst.weight.copy_(src.weight.reshape(h_kv, d_k, d).repeat_interleave(group, 0).reshape(d, d))
            dst.bias.copy_(src.bias.reshape(h_kv, d_k).repeat_interleave(group, 0).reshape(d))
    x = rand(2, 6, d, seed=6)
    torch.testing.assert_close(gqa(x), plain(x), **TOL)


# ------------------------------------------------------------------ KV cache
CACHE_KW = [{}, {"rope": True}, {"n_kv_heads": 2},
            {"rope": True, "n_kv_heads": 1}, {"alibi": True}]


@pytest.mark.parametrize("kw", CACHE_KW)
@pytest.mark.parametrize("batched", [True, False])
def test_kv_cache_one_token_at_a_time(kw, batched):
    """Full and token-by-token cached outputs both against the F.scaled_dot_product_attention
    reference (tests/torch_helpers.ref_mha), not against each other."""
    d, h, n = 16, 4, 7
    mha = randomize(make(d, h, causal=True, **kw), seed=3)
    x = rand(2, n, d, seed=7) if batched else rand(n, d, seed=7)
    expected = ref_mha(mha, x if batched else x[None])
    expected = expected if batched else expected[0]
    torch.testing.assert_close(mha(x), expected, **TOL)
    cache = {}
    steps = [mha(x[..., t:t + 1, :], cache=cache, return_weights=True) for t in range(n)]
    torch.testing.assert_close(torch.cat([s[0] for s in steps], dim=-2), expected, **TOL)
    last = steps[-1][1][..., -1, :]                      # the last query sees all n keys
    torch.testing.assert_close(last.sum(-1), torch.ones_like(last[..., 0]), **TOL)
    h_kv = kw.get("n_kv_heads", h)
    assert cache["k"].shape == ((2,) if batched else (1,)) + (h_kv, n, d // h)


@pytest.mark.parametrize("kw", [{"n_kv_heads": 2}, {"rope": True, "n_kv_heads": 2}])
def test_kv_cache_in_chunks(kw):
    d, h = 16, 4
    mha = randomize(make(d, h, causal=True, **kw), seed=4)
    x = rand(3, 9, d, seed=8)
    cache = {}
    outs = [mha(x[:, a:b], cache=cache) for a, b in ((0, 4), (4, 5), (5, 9))]
    torch.testing.assert_close(torch.cat(outs, dim=1), ref_mha(mha, x), **TOL)


@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_rope_base_and_offset_reach_the_cached_keys(base):
    """The keys stored in the cache are rotated with the layer's rope_base, at their absolute
    positions also when they arrive in chunks (hand-written complex rotation)."""
    d, h = 16, 4
    mha = randomize(make(d, h, causal=True, rope=True, rope_base=base, n_kv_heads=2), seed=5)
    x = rand(2, 6, d, seed=9)
    cache = {}
    mha(x[:, :2], cache=cache)
    mha(x[:, 2:], cache=cache)
    k = F.linear(x, mha.k_proj.weight, mha.k_proj.bias).view(2, 6, 2, -1).transpose(1, 2)
    torch.testing.assert_close(cache["k"], ref_rope(k, torch.arange(6), base), **TOL)


# ------------------------------------------------------------------ masks and ALiBi against references
@pytest.mark.parametrize("causal", [False, True])
def test_padding_mask_matches_torch_sdpa(causal):
    """A key-padding mask (b, 1, 1, m) in a causal layer must be AND-ed with the causal mask:
    reference F.scaled_dot_product_attention with mask & tril."""
    d, h, n = 8, 2, 6
    mha = randomize(make(d, h, causal=causal), seed=6)
    x = rand(2, n, d, seed=10)
    keep = torch.tensor([[True] * 6, [True, True, True, True, False, False]])[:, None, None, :]
    allowed = keep & torch.ones(n, n, dtype=torch.bool).tril() if causal else keep
    q = F.linear(x, mha.q_proj.weight, mha.q_proj.bias).view(2, n, h, -1).transpose(1, 2)
    k = F.linear(x, mha.k_proj.weight, mha.k_proj.bias).view(2, n, h, -1).transpose(1, 2)
    v = F.linear(x, mha.v_proj.weight, mha.v_proj.bias).view(2, n, h, -1).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed).transpose(1, 2).reshape(2, n, d)
    out, w = mha(x, mask=keep, return_weights=True)
    torch.testing.assert_close(out, F.linear(o, mha.out_proj.weight, mha.out_proj.bias), **TOL)
    assert torch.all(w[~allowed.expand_as(w)] == 0)


def test_alibi_in_a_bidirectional_layer_is_symmetric():
    """Non-causal ALiBi penalises distance in both directions: -slope·|i - j| (hand-built)."""
    mha = randomize(make(16, 4, alibi=True), seed=7)
    x = rand(2, 5, 16, seed=11)
    torch.testing.assert_close(mha(x), ref_mha(mha, x), **TOL)
    assert mha.causal is False


def test_rope_and_alibi_change_the_output():
    d, h = 8, 2
    x = rand(1, 5, d, seed=9)
    plain, rope, alibi = make(d, h), make(d, h, rope=True), make(d, h, alibi=True)
    assert not torch.allclose(plain(x), rope(x))
    assert not torch.allclose(plain(x), alibi(x))


def test_flop_counter_sees_attention_matmuls():
    d, h, n, b = 16, 4, 10, 2
    mha = make(d, h, bias=False)
    x = rand(b, n, d, seed=10)
    with FlopCounterMode(display=False) as fc:
        mha(x)
    projections = 4 * 2 * b * n * d * d
    attention = 2 * (2 * b * n * n * d)  # QKᵀ and A·V
    assert fc.get_total_flops() == projections + attention


# ------------------------------------------------------------------ errors
def test_error_d_model_not_divisible():
    with pytest.raises(ValueError, match=r"d_model: expected a multiple of n_heads=3, got d_model=10"):
        MultiHeadAttention(10, 3)


def test_error_n_kv_heads_not_divisor():
    with pytest.raises(ValueError, match=r"n_kv_heads: expected a positive divisor of n_heads=8, got 3"):
        MultiHeadAttention(16, 8, n_kv_heads=3)


def test_error_input_width():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"x: expected shape .*d_model=8, got \(2, 5, 6\)"):
        mha(torch.ones(2, 5, 6))
    with pytest.raises(ValueError, match=r"context: expected shape \(batch, len, d_model\) .*got \(5, 8\)"):
        mha(torch.ones(2, 5, 8), context=torch.ones(5, 8))


@pytest.mark.parametrize("causal", [False, True])  # causal=True combines masks: check first
def test_error_mask_wrong_size_or_dtype(causal):
    mha = MultiHeadAttention(8, 2, causal=causal)
    with pytest.raises(ValueError, match=r"mask: expected a shape broadcastable to \(2, 2, 4, 4\), got \(3, 3\)"):
        mha(torch.ones(2, 4, 8), mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"mask: expected dtype torch.bool \(True = may attend\), got torch.float32"):
        mha(torch.ones(2, 4, 8), mask=torch.ones(4, 4))
    with pytest.raises(TypeError, match=r"mask: expected a torch.Tensor, got list"):
        mha(torch.ones(2, 4, 8), mask=[[True] * 4] * 4)


def test_from_torch_rejects_sequence_first_layers():
    with pytest.raises(ValueError, match=r"m: expected batch_first=True, got False"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2))


def test_error_cache_type_and_context():
    mha = MultiHeadAttention(8, 2, causal=True)
    with pytest.raises(TypeError, match=r"cache: expected a dict, got list"):
        mha(torch.ones(4, 8), cache=[])
    with pytest.raises(ValueError, match=r"cache: expected None with context"):
        mha(torch.ones(4, 8), context=torch.ones(3, 8), cache={})


# ------------------------------------------------------------------ every error names argument, expected, actual
def test_split_and_merge_heads_errors():
    with pytest.raises(ValueError, match=r"^x: expected shape \(…, n, d\) with d divisible by n_heads=3, "
                                         r"got \(2, 5, 8\)$"):
        split_heads(torch.ones(2, 5, 8), 3)
    with pytest.raises(ValueError, match=r"^x: expected shape .*n_heads=2, got \(4,\)$"):
        split_heads(torch.ones(4), 2)
    with pytest.raises(ValueError, match=r"^x: expected shape \(…, h, n, d_k\), got \(4, 6\)$"):
        merge_heads(torch.ones(4, 6))
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got list$"):
        merge_heads([1.0, 2.0])
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got list$"):
        split_heads([1.0, 2.0], 2)
    assert merge_heads(torch.arange(6.0).reshape(2, 1, 3)).tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]


@pytest.mark.parametrize("name", ["bias", "causal", "rope", "alibi"])
def test_error_flags_must_be_bools(name):
    with pytest.raises(TypeError, match=rf"^{name}: expected a bool, got int \(1\)$"):
        MultiHeadAttention(8, 2, **{name: 1})


def test_error_constructor_arguments():
    with pytest.raises(TypeError, match=r"^d_model: expected an int, got float \(8.0\)$"):
        MultiHeadAttention(8.0, 2)
    with pytest.raises(TypeError, match=r"^n_heads: expected an int, got float \(2.0\)$"):
        MultiHeadAttention(8, 2.0)
    with pytest.raises(ValueError, match=r"^rope_base: expected a finite number > 0, got 0"):
        MultiHeadAttention(8, 2, rope_base=0.0)
    with pytest.raises(TypeError, match=r"^n_kv_heads: expected an int, got float \(1.0\)$"):
        MultiHeadAttention(8, 2, n_kv_heads=1.0)
    with pytest.raises(ValueError, match=r"^rope: expected an even head width d_k, got d_k=3$"):
        MultiHeadAttention(6, 2, rope=True)
    MultiHeadAttention(6, 2, alibi=True)                    # an odd d_k is fine without RoPE
    MultiHeadAttention(6, 3, rope=True)                     # d_k = 2 is even


def test_repr_names_the_options():
    m = MultiHeadAttention(8, 4, causal=True, n_kv_heads=2, rope=True)
    assert m.extra_repr() == "d_model=8, n_heads=4, n_kv_heads=2, causal=True, rope=True, alibi=False"


def test_default_rope_base_is_10000():
    """The default base is LLaMA-2's θ = 10000: the cached keys of a default RoPE layer equal a
    hand-written rotation with base 10000 (ref_mha would read the layer's own base)."""
    mha = randomize(make(8, 2, causal=True, rope=True), seed=1)
    assert mha.rope_base == 10000.0
    x = rand(1, 5, 8, seed=2)
    cache = {}
    mha(x, cache=cache)
    k = F.linear(x, mha.k_proj.weight, mha.k_proj.bias).view(1, 5, 2, -1).transpose(1, 2)
    torch.testing.assert_close(cache["k"], ref_rope(k, torch.arange(5), 10000.0), **TOL)


def test_error_input_shapes_name_what_was_expected():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"^x: expected shape \(batch, len, d_model\) or \(len, d_model\) "
                                         r"with d_model=8, got \(8,\)$"):
        mha(torch.ones(8))
    with pytest.raises(ValueError, match=r"^context: expected shape \(len, d_model\) with d_model=8, "
                                         r"got \(1, 3, 8\)$"):
        mha(torch.ones(4, 8), context=torch.ones(1, 3, 8))
    with pytest.raises(ValueError, match=r"^context: expected shape \(batch, len, d_model\) with d_model=8, "
                                         r"got \(2, 3, 6\)$"):
        mha(torch.ones(2, 4, 8), context=torch.ones(2, 3, 6))
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got list$"):
        mha([[0.0] * 8])


def test_error_cross_attention_arguments():
    x, ctx = torch.ones(2, 4, 8), torch.ones(2, 3, 8)
    with pytest.raises(ValueError, match=r"^context: expected batch size 2 \(as x\), got 3 \(shape \(3, 3, 8\)\)$"):
        MultiHeadAttention(8, 2)(x, context=torch.ones(3, 3, 8))
    with pytest.raises(ValueError, match=r"^cache: expected None with context \(the cache is for self-attention\)$"):
        MultiHeadAttention(8, 2)(x, context=ctx, cache={})
    with pytest.raises(ValueError, match=r"^positions: expected None with context \(positions are for self-attention\)$"):
        MultiHeadAttention(8, 2)(x, context=ctx, positions=torch.arange(4))
    for flag in ("rope", "alibi"):
        with pytest.raises(ValueError, match=r"^context: rope/alibi positions need self-attention, got a context$"):
            MultiHeadAttention(8, 2, **{flag: True})(x, context=ctx)
    with pytest.raises(ValueError, match=r"^context: expected at least n=4 positions for causal attention "
                                         r"\(queries are the last n\), got 3$"):
        MultiHeadAttention(8, 2, causal=True)(x, context=ctx)
    MultiHeadAttention(8, 2, causal=True)(x, context=torch.ones(2, 4, 8))       # m == n is allowed
    assert MultiHeadAttention(8, 2)(x, context=ctx).shape == (2, 4, 8)         # m < n: fine without a causal mask


def test_causal_cross_attention_is_bottom_right_aligned():
    """Causal cross-attention with m >= n context positions: query i sees keys j <= i + m - n
    (F.scaled_dot_product_attention with tril(m - n))."""
    d, h, n, m = 8, 2, 3, 5
    mha = randomize(make(d, h, causal=True), seed=8)
    x, ctx = rand(2, n, d, seed=12), rand(2, m, d, seed=13)
    out, w = mha(x, context=ctx, return_weights=True)
    torch.testing.assert_close(out, ref_mha(mha, x, context=ctx), **TOL)
    allowed = torch.ones(n, m, dtype=torch.bool).tril(m - n)
    assert torch.all(w[..., ~allowed] == 0) and torch.all(w[..., allowed] > 0)


def test_error_cache_from_another_layer_shape():
    mha = MultiHeadAttention(8, 2, causal=True)
    cache = {"k": torch.zeros(1, 4, 3, 4), "v": torch.zeros(1, 4, 3, 4), "pos": torch.zeros(1, 3)}
    with pytest.raises(ValueError, match=r"^cache: expected cached keys of shape \(2, 2, t, 4\), "
                                         r"got \(1, 4, 3, 4\)$"):
        mha(torch.ones(2, 1, 8), cache=cache)
    with pytest.raises(ValueError, match=r"^cache: expected cached keys of shape \(3, 2, t, 4\), "):
        mha(torch.ones(3, 1, 8), cache=cache)                               # batch 3, 2 heads


def test_from_torch_errors():
    with pytest.raises(ValueError, match=r"^m: expected batch_first=True, got False$"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2))
    with pytest.raises(TypeError, match=r"^m: expected nn.MultiheadAttention, got Linear$"):
        MultiHeadAttention.from_torch(nn.Linear(8, 8))
    for kw in (dict(kdim=4), dict(add_bias_kv=True), dict(add_zero_attn=True)):
        with pytest.raises(ValueError, match=r"^m: expected kdim == vdim == embed_dim, add_bias_kv=False, "
                                             r"add_zero_attn=False$"):
            MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, batch_first=True, **kw))


def test_unbatched_cross_attention_matches_torch():
    ref = randomize(nn.MultiheadAttention(8, 2, batch_first=True).double(), seed=4).eval()
    ours = MultiHeadAttention.from_torch(ref)
    x, ctx = rand(4, 8, seed=14), rand(6, 8, seed=15)
    out, w = ours(x, context=ctx, return_weights=True)
    ref_out, ref_w = ref(x[None], ctx[None], ctx[None], average_attn_weights=False)
    assert out.shape == (4, 8) and w.shape == (2, 4, 6)
    torch.testing.assert_close(out, ref_out[0], **TOL)
    torch.testing.assert_close(w, ref_w[0], **TOL)


def test_padding_mask_with_batch_unlike_heads():
    """b = 3 sequences, h = 2 heads: the mask is checked against (b, h, n, m) and a key-padding
    mask (b, 1, 1, m) reaches each sequence (F.scaled_dot_product_attention with mask & tril)."""
    d, h, n = 8, 2, 5
    mha = randomize(make(d, h, causal=True), seed=9)
    x = rand(3, n, d, seed=16)
    keep = torch.tensor([[True] * 5, [True, True, True, False, False], [True, False, True, True, True]])
    keep = keep[:, None, None, :]
    with pytest.raises(ValueError, match=r"^mask: expected a shape broadcastable to \(3, 2, 5, 5\), got \(2, 1, 1, 5\)$"):
        mha(x, mask=keep[:2])
    allowed = keep & torch.ones(n, n, dtype=torch.bool).tril()
    q = F.linear(x, mha.q_proj.weight, mha.q_proj.bias).view(3, n, h, -1).transpose(1, 2)
    k = F.linear(x, mha.k_proj.weight, mha.k_proj.bias).view(3, n, h, -1).transpose(1, 2)
    v = F.linear(x, mha.v_proj.weight, mha.v_proj.bias).view(3, n, h, -1).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed).transpose(1, 2).reshape(3, n, d)
    torch.testing.assert_close(mha(x, mask=keep), F.linear(o, mha.out_proj.weight, mha.out_proj.bias), **TOL)


@pytest.mark.parametrize("kw", [{}, {"rope": True}, {"alibi": True}, {"n_kv_heads": 1}])
def test_forward_and_cache_stay_on_the_input_device(kw):
    """Every tensor the layer builds (causal mask, positions, ALiBi bias) follows the input's
    device: the meta device stands in for a GPU (a CPU tensor mixed in would raise)."""
    with torch.device("meta"):
        mha = MultiHeadAttention(8, 2, causal=True, **kw)
        x = torch.ones(2, 5, 8)
    assert mha(x).device.type == "meta"
    cache = {}
    assert mha(x[:, :3], cache=cache).device.type == "meta"
    assert mha(x[:, 3:], cache=cache).device.type == "meta"
    assert cache["pos"].device.type == "meta" and cache["pos"].shape == (2, 5)


def test_cache_positions_are_stored_per_sequence():
    mha = make(8, 2, causal=True, alibi=True)
    cache = {}
    mha(rand(2, 3, 8, seed=17), cache=cache)
    mha(rand(2, 1, 8, seed=18), cache=cache)
    assert cache["pos"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert cache["k"].shape == cache["v"].shape == (2, 2, 4, 4)


@pytest.mark.parametrize("kw", [{"alibi": True}, {"rope": True}])
def test_bfloat16_layer_keeps_its_dtype(kw):
    """In bfloat16 the ALiBi bias and the RoPE rotation are built in the layer's dtype: the
    output stays bfloat16 and matches the float64 reference to bfloat16 precision."""
    mha = randomize(make(16, 4, causal=True, **kw), seed=10)
    x = rand(2, 6, 16, seed=19)
    expected = ref_mha(mha, x)
    out = mha.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, atol=0.1, rtol=0.05)


def test_rope_base_reaches_the_queries_too():
    """rope_base = 100 rotates queries and keys alike: the output equals the reference built
    with base 100 (hand-written rotation), and differs from the default base's."""
    mha = randomize(make(16, 4, causal=True, rope=True, rope_base=100.0), seed=11)
    x = rand(2, 6, 16, seed=20)
    torch.testing.assert_close(mha(x), ref_mha(mha, x, rope_base=100.0), **TOL)
    assert not torch.allclose(mha(x), ref_mha(mha, x, rope_base=10000.0))
