"""The residual stream of a GPT (Chapter 4): `return_stream=True`, the residual switch,
the logit lens, the gradient reaching the input of a stack, the Jacobian norms of its blocks and
the gradient each block's parameters receive.

`transformer_lib.stream`'s argument checks, each message in full, and the seed of
`input_gradient_norm` (Chapter 4; mutation testing found the messages unchecked).
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_helpers import rand
from transformer_lib.block import TransformerBlock
from transformer_lib.config import ModelConfig
from transformer_lib.model import GPT
from transformer_lib.stream import (Stream, block_gradient_norms, input_gradient_norm, logit_lens,
                                    recording, residual_jacobian_norms)

BASE = dict(vocab_size=13, n_ctx=10, d_model=16, n_layers=3, n_heads=4)
PRE_NORM = {
    "gpt2-like": dict(mlp="gelu_tanh"),
    "llama-like": dict(mlp="swiglu", norm="rmsnorm", bias=False, tied_embeddings=False,
                       positional="rope", n_kv_heads=2, d_ff=24),
    "sinusoidal-embedding-norm": dict(positional="sinusoidal", embedding_norm=True),
}


def _model(seed: int = 0, residual: bool = True, **kw) -> GPT:
    torch.manual_seed(seed)
    model = GPT(ModelConfig(**{**BASE, **kw}), residual=residual).double().eval()
    with torch.no_grad():  # GPT-2's init writes almost nothing: make every write count
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _ids(batch: int = 2, n: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, BASE["vocab_size"], (batch, n), generator=torch.Generator().manual_seed(seed))


def _by_hand(model: GPT, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """States and writes of a pre- or post-norm GPT written out sub-layer by sub-layer."""
    x = model.tok_emb(idx)
    if hasattr(model, "pos_emb"):
        x = x + model.pos_emb.weight[: idx.shape[-1]]
    if hasattr(model, "pos_enc"):
        x = x + model.pos_enc[: idx.shape[-1]]
    x = model.emb_norm(x)
    states, writes = [x], []
    keep = 1.0 if model.residual else 0.0
    for b in model.blocks:
        if b.norm_first:
            a = b.attn(b.norm1(x)); x1 = keep * x + a
            m = b.mlp(b.norm2(x1)); x = keep * x1 + m
        else:
            a = b.attn(x); x1 = b.norm1(keep * x + a)
            m = b.mlp(x1); x = b.norm2(keep * x1 + m)
        states += [x1, x]; writes += [a, m]
    return x, states, writes


@pytest.mark.parametrize("name", list(PRE_NORM))
def test_stream_decomposes_exactly_and_reproduces_the_logits(name):
    model, idx = _model(**PRE_NORM[name]), _ids()
    logits, stream = model(idx, return_stream=True)
    L = model.config.n_layers
    assert isinstance(stream, Stream) and len(stream.states) == 2 * L + 1 and len(stream.writes) == 2 * L
    assert all(t.shape == (2, 7, 16) for t in stream.states + stream.writes)
    final = stream.states[0] + sum(stream.writes)            # embedding + every sub-layer's write
    torch.testing.assert_close(final, stream.states[-1], atol=1e-12, rtol=0)
    torch.testing.assert_close(model.lm_head(model.norm_f(final)), logits, atol=1e-12, rtol=0)
    torch.testing.assert_close(logits, model(idx), atol=0, rtol=0)  # the stream changes nothing
    assert float(sum(w.detach().norm() for w in stream.writes)) > 1.0  # the writes are not negligible


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("residual", [True, False])
def test_states_and_writes_match_a_hand_written_forward(norm_first, residual):
    model, idx = _model(norm_first=norm_first, residual=residual), _ids()
    logits, stream = model(idx, return_stream=True)
    out, states, writes = _by_hand(model, idx)
    for ours, theirs in zip(stream.states[1:] + stream.writes, states[1:] + writes, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
    torch.testing.assert_close(logits, F.linear(model.norm_f(out), model.lm_head.weight), atol=1e-12, rtol=0)
    if not (norm_first and residual):                        # no exact sum outside pre-norm + residual
        assert (stream.states[0] + sum(stream.writes) - stream.states[-1]).abs().max() > 1e-3


def test_residual_off_block_is_the_composition_of_its_sublayers():
    model = _model(residual=False)
    x = rand(2, 5, 16, seed=3)
    b = model.blocks[0]
    torch.testing.assert_close(b(x), b.mlp(b.norm2(b.attn(b.norm1(x)))), atol=1e-12, rtol=0)
    assert all(not blk.residual for blk in model.blocks) and not model.residual
    assert all(blk.residual for blk in _model().blocks)


def test_unbatched_stream_and_no_hooks_left_behind():
    model, idx = _model(), _ids(batch=1)
    logits, stream = model(idx[0], return_stream=True)
    ref_logits, ref = model(idx, return_stream=True)
    torch.testing.assert_close(logits, ref_logits[0], atol=0, rtol=0)
    assert all(s.shape == (7, 16) for s in stream.states + stream.writes)
    torch.testing.assert_close(stream.states[3], ref.states[3][0], atol=0, rtol=0)
    assert all(not b.norm2._forward_pre_hooks and not b.mlp._forward_pre_hooks for b in model.blocks)


def test_stream_with_a_kv_cache_matches_the_full_pass():
    model, idx = _model(), _ids(batch=1, n=6)
    _, full = model(idx, return_stream=True)
    cache = [{} for _ in model.blocks]
    model(idx[:, :4], cache=cache)
    _, last = model(idx[:, 4:], cache=cache, return_stream=True)
    for a, b in zip(last.states, full.states, strict=True):
        torch.testing.assert_close(a, b[:, 4:], atol=1e-12, rtol=0)


def test_logit_lens_on_the_last_state_gives_the_logits():
    model, idx = _model(), _ids()
    logits, stream = model(idx, return_stream=True)
    torch.testing.assert_close(logit_lens(model, stream.states[-1]), logits, atol=0, rtol=0)
    w = model.lm_head.weight
    h = stream.states[2]
    mu, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
    by_hand = ((h - mu) / torch.sqrt(var + 1e-5) * model.norm_f.weight + model.norm_f.bias) @ w.T
    torch.testing.assert_close(logit_lens(model, h), by_hand, atol=1e-12, rtol=0)
    with pytest.raises(TypeError, match="model: expected a GPT"):
        logit_lens(torch.nn.Linear(2, 2), h)


def test_recording_reads_the_blocks_own_values_and_leaves_no_hook_behind():
    """Inside `recording` a block's states and writes are appended as its forward makes them
    (state between the sub-layers, output; attention's and MLP's writes); afterwards, and after
    an error, no hook is left on the block, so its later calls run as before."""
    block = TransformerBlock(8, 2).double()
    x = rand(2, 3, 8, seed=4)
    stream = Stream([x], [])
    with recording([block], stream):
        out, (a, m) = block(x, return_stream=True)
    assert [s is t for s, t in zip(stream.states, [x, x + a, out])] == [True, False, True]
    torch.testing.assert_close(stream.states[1], x + a, atol=0, rtol=0)
    assert stream.writes[0] is a and stream.writes[1] is m
    with pytest.raises(RuntimeError), recording([block], stream):
        block(torch.ones(2, 3, 8, dtype=torch.float32))
    assert not any(m._forward_hooks for m in block.modules())
    torch.testing.assert_close(block(x), out, atol=0, rtol=0)


def test_input_gradient_norm_against_autograd_jacobian():
    torch.manual_seed(0)
    blocks = [TransformerBlock(4, 2).double() for _ in range(2)]
    x = rand(1, 3, 4, seed=5)
    J = torch.autograd.functional.jacobian(lambda t: blocks[1](blocks[0](t)), x).reshape(12, 12)
    g = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64).reshape(12)
    expected = float((g @ J).norm() / g.norm())
    assert input_gradient_norm(blocks, x, seed=7) == pytest.approx(expected, rel=1e-12)
    # one linear "block" f(x) = -x inside a residual: y = x + f(x) = 0, no gradient at all
    assert input_gradient_norm([lambda t: t + (-t)], x) == 0.0


@pytest.mark.parametrize("bad,error,match", [
    ("yes", TypeError, "residual: expected a bool"),
    (1, TypeError, "residual: expected a bool, got int"),
])
def test_residual_flag_is_validated(bad, error, match):
    with pytest.raises(error, match=match):
        GPT(ModelConfig(**BASE), residual=bad)


def test_return_stream_flag_is_validated():
    with pytest.raises(TypeError, match="return_stream: expected a bool"):
        _model()(_ids(), return_stream="yes")


def test_block_gradient_norms_match_backward():
    model, idx = _model(), _ids()
    targets = _ids(seed=2)
    norms = block_gradient_norms(model, idx, targets)
    assert all(p.grad is None for p in model.parameters())
    F.cross_entropy(model(idx).reshape(-1, 13), targets.reshape(-1)).backward()
    for got, block in zip(norms, model.blocks, strict=True):
        expected = torch.cat([p.grad.reshape(-1) for p in block.parameters()]).norm()
        assert got == pytest.approx(float(expected), rel=1e-10)
    with pytest.raises(ValueError, match="targets: expected shape"):
        block_gradient_norms(model, idx, targets[:, :3])


class _LinearResidual(torch.nn.Module):
    """x ↦ x + x Wᵀ: its J is I ⊗ W on the flattened input, so ‖J‖₂ = ‖W‖₂."""

    def __init__(self, W: torch.Tensor):
        super().__init__()
        self.W = W

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x @ self.W.T


def test_residual_jacobian_norms_of_linear_residual_layers_are_the_norms_of_their_maps():
    Ws = [rand(4, 4, seed=s) for s in (1, 2)]
    got = residual_jacobian_norms([_LinearResidual(W) for W in Ws], rand(2, 3, 4, seed=3))
    expected = [torch.linalg.matrix_norm(W, ord=2).item() for W in Ws]
    assert got == pytest.approx(expected, rel=1e-12)


def test_residual_jacobian_norms_are_taken_where_each_block_is_reached():
    torch.manual_seed(0)
    blocks = [TransformerBlock(4, 2).double() for _ in range(2)]
    with torch.no_grad():
        for p in blocks[0].parameters():
            p.add_(0.5 * torch.randn_like(p))     # block 0 moves the state block 1 sees
    x = rand(1, 3, 4, seed=5)
    eye = torch.eye(12, dtype=torch.float64)
    at_x1 = torch.autograd.functional.jacobian(blocks[1], blocks[0](x).detach()).reshape(12, 12)
    at_x0 = torch.autograd.functional.jacobian(blocks[1], x).reshape(12, 12)
    got = residual_jacobian_norms(blocks, x)
    assert got[1] == pytest.approx(torch.linalg.matrix_norm(at_x1 - eye, ord=2).item(), rel=1e-10)
    assert got[1] != pytest.approx(torch.linalg.matrix_norm(at_x0 - eye, ord=2).item(), rel=1e-3)
    zeroed = TransformerBlock(4, 2).double()
    with torch.no_grad():
        zeroed.attn.out_proj.weight.zero_(); zeroed.mlp.fc2.weight.zero_()
    assert residual_jacobian_norms([zeroed], x) == [0.0]     # writes nothing: J = 0 exactly


def test_block_gradient_norms_of_one_parameter_match_backward():
    model, idx, targets = _model(), _ids(), _ids(seed=2)
    norms = block_gradient_norms(model, idx, targets, parameter="mlp.fc2.weight")
    F.cross_entropy(model(idx).reshape(-1, 13), targets.reshape(-1)).backward()
    assert norms == pytest.approx([float(b.mlp.fc2.weight.grad.norm()) for b in model.blocks], rel=1e-10)


# ------------------------------------------------------------ argument checks, each message in full
MODEL = GPT(ModelConfig(vocab_size=13, n_ctx=10, d_model=8, n_layers=1, n_heads=2)).double()
IDS = torch.zeros(2, 3, dtype=torch.long)


class _NormOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm_f = nn.Identity()


@pytest.mark.parametrize("call,error,message", [
    (lambda: logit_lens(MODEL, [0.0]), TypeError, "state: expected a torch.Tensor, got list"),
    (lambda: logit_lens(nn.Linear(2, 2), torch.ones(2)), TypeError, "model: expected a GPT with a `norm_f`, got Linear"),
    (lambda: logit_lens(_NormOnly(), torch.ones(2)), TypeError, "model: expected a GPT with a `lm_head`, got _NormOnly"),
    (lambda: input_gradient_norm([], [0.0]), TypeError, "x: expected a torch.Tensor, got list"),
    (lambda: input_gradient_norm(3, torch.ones(1, 2, 8)), TypeError,
     "blocks: expected an iterable of modules (a ModuleList), got int"),
    (lambda: input_gradient_norm([], torch.ones(1, 2, 8), seed=-1), ValueError, "seed: expected an int >= 0, got -1"),
    (lambda: block_gradient_norms(MODEL, [0], IDS), TypeError, "idx: expected a torch.Tensor, got list"),
    (lambda: block_gradient_norms(MODEL, IDS, [0]), TypeError, "targets: expected a torch.Tensor, got list"),
    (lambda: block_gradient_norms(MODEL, IDS, IDS[:, :2]), ValueError,
     "targets: expected shape (2, 3) (that of idx), got (2, 2)"),
    (lambda: block_gradient_norms(MODEL, IDS, IDS, parameter=3), TypeError, "parameter: expected a str, got int"),
    (lambda: block_gradient_norms(MODEL, IDS, IDS, parameter="mlp.fc3.weight"), ValueError,
     "parameter: expected the name of a parameter of every block, such as 'attn.q_proj.weight', "
     "got 'mlp.fc3.weight'"),
    (lambda: residual_jacobian_norms([], [0.0]), TypeError, "x: expected a torch.Tensor, got list"),
    (lambda: residual_jacobian_norms(3, torch.ones(1, 2, 8)), TypeError,
     "blocks: expected an iterable of modules (a ModuleList), got int"),
])
def test_stream_errors_name_the_argument(call, error, message):
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        call()


def test_input_gradient_norm_seed_zero_is_allowed_and_seeds_the_output_gradient():
    torch.manual_seed(0)
    block = TransformerBlock(8, 2).double()
    x = rand(1, 3, 8, seed=1)
    by_seed = [input_gradient_norm([block], x, seed=s) for s in (0, 0, 1)]
    assert by_seed[0] == by_seed[1] != by_seed[2]
    assert input_gradient_norm([block], x) == by_seed[0]                 # the default seed is 0
