"""Bad inputs at the library's public boundary (transformer_lib._checks): each raises a
TypeError (wrong kind of object) or ValueError (wrong value or shape) whose message names
the argument, never a raw RuntimeError, AttributeError or ZeroDivisionError from inside."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from torch_helpers import error_message
from transformer_lib.attention import SelfAttention, causal_mask, scaled_dot_product_attention
from transformer_lib.block import MLP, LayerNorm, RMSNorm, TransformerBlock
from transformer_lib.config import ModelConfig
from transformer_lib.data import copy_task, text_batch
from transformer_lib.embedding import FixedMixing, embed, gaussian_kernel, one_hot
from transformer_lib.model import GPT
from transformer_lib.moe import MoELayer, Router, load_balancing_loss
from transformer_lib.multihead import MultiHeadAttention, split_heads
from transformer_lib.positional import (LearnedPositionalEmbedding, alibi_bias, apply_rope,
                                        sinusoidal_encoding)
from transformer_lib.train import train
from transformer_lib.viz import head_grid

BASE = dict(vocab_size=23, n_ctx=12, d_model=16, n_layers=1, n_heads=4)
GPT2 = ModelConfig(**BASE, mlp="gelu_tanh")
D64 = torch.float64
sdpa = scaled_dot_product_attention


def ones(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype)


def ids(*shape, dtype=torch.long):
    return torch.zeros(*shape, dtype=dtype)


def gpt():
    torch.manual_seed(0)
    return GPT(ModelConfig(**BASE))


def causal_mha():
    return MultiHeadAttention(8, 2, causal=True)


def tiny_model():
    return nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))


# (call, exception, start of the message): the message begins with the argument's name
BAD_INPUTS = {
    # attention
    "sdpa q/k batch dims": (lambda: sdpa(ones(2, 3, 4), ones(3, 5, 4), ones(3, 5, 2)),
                            ValueError, "k: expected leading dims that broadcast with (2,) (those of q), got (3,)"),
    "sdpa v batch dims": (lambda: sdpa(ones(2, 3, 4), ones(2, 5, 4), ones(3, 5, 2)),
                          ValueError, "v: expected leading dims that broadcast with (2,) (those of q), got (3,)"),
    "sdpa k dtype": (lambda: sdpa(ones(3, 4, dtype=D64), ones(5, 4), ones(5, 2)),
                     TypeError, "k: expected dtype torch.float64 (the dtype of q), got torch.float32"),
    "sdpa v dtype": (lambda: sdpa(ones(3, 4), ones(5, 4), ones(5, 2, dtype=D64)),
                     TypeError, "v: expected dtype torch.float32 (the dtype of q), got torch.float64"),
    "sdpa integer q": (lambda: sdpa(ids(3, 4), ids(5, 4), ids(5, 2)),
                       TypeError, "q: expected a floating dtype, got torch.int64"),
    "sdpa bias dtype": (lambda: sdpa(ones(3, 4), ones(3, 4), ones(3, 4), bias=ones(3, 3, dtype=D64)),
                        TypeError, "bias: expected dtype torch.float32 (the dtype of q)"),
    "causal_mask m < n": (lambda: causal_mask(5, 3), ValueError, "m: expected m >= n=5"),
    "causal_mask float n": (lambda: causal_mask(5.0), TypeError, "n: expected an int, got float"),
    "causal_mask bool m": (lambda: causal_mask(2, True), TypeError, "m: expected an int, got bool"),
    "SelfAttention d_k=0": (lambda: SelfAttention(8, 0), ValueError, "d_k: expected an int >= 1, got 0"),
    "SelfAttention context batch": (lambda: SelfAttention(8, 4)(ones(2, 3, 8), context=ones(3, 4, 8)),
                                    ValueError, "context: expected leading dims that broadcast with (2,) (those of x), "
                                                "got (3,)"),
    # multi-head attention
    "MHA bool d_model": (lambda: MultiHeadAttention(True, 1),
                         TypeError, "d_model: expected an int, got bool"),
    "MHA causal='yes'": (lambda: MultiHeadAttention(8, 2, causal="yes"),
                         TypeError, "causal: expected a bool, got str"),
    "MHA rope_base=0": (lambda: MultiHeadAttention(8, 2, rope=True, rope_base=0),
                        ValueError, "rope_base: expected a finite number > 0"),
    "MHA n_kv_heads=0": (lambda: MultiHeadAttention(8, 2, n_kv_heads=0),
                         ValueError, "n_kv_heads: expected an int >= 1, got 0"),
    "MHA context batch": (lambda: MultiHeadAttention(8, 2)(ones(2, 4, 8), context=ones(3, 5, 8)),
                          ValueError, "context: expected batch size 2 (as x), got 3"),
    "MHA causal context shorter": (lambda: causal_mha()(ones(2, 4, 8), context=ones(2, 3, 8)),
                                   ValueError, "context: expected at least n=4 positions"),
    "MHA causal float mask": (lambda: causal_mha()(ones(2, 4, 8), mask=ones(4, 4)),
                              TypeError, "mask: expected dtype torch.bool"),
    "MHA causal mask size": (lambda: causal_mha()(ones(2, 4, 8), mask=ones(3, 3).bool()),
                             ValueError, "mask: expected a shape broadcastable to (2, 2, 4, 4), got (3, 3)"),
    "split_heads n_heads=0": (lambda: split_heads(ones(2, 4), 0),
                              ValueError, "n_heads: expected an int >= 1, got 0"),
    "split_heads float n_heads": (lambda: split_heads(ones(2, 4), 2.0),
                                  TypeError, "n_heads: expected an int, got float"),
    # block
    "TransformerBlock d_ff=0": (lambda: TransformerBlock(8, 2, d_ff=0),
                                ValueError, "d_ff: expected an int >= 1, got 0"),
    "TransformerBlock norm_first='yes'": (lambda: TransformerBlock(8, 2, norm_first="yes"),
                                          TypeError, "norm_first: expected a bool"),
    "TransformerBlock causal float mask": (lambda: TransformerBlock(8, 2, causal=True)(ones(2, 4, 8),
                                                                                    mask=ones(4, 4)),
                                           TypeError, "mask: expected dtype torch.bool"),
    "MLP(0)": (lambda: MLP(0), ValueError, "d_model: expected an int >= 1, got 0"),
    "MLP float d_ff": (lambda: MLP(8, 16.0), TypeError, "d_ff: expected an int, got float"),
    "LayerNorm(0)": (lambda: LayerNorm(0), ValueError, "d: expected an int >= 1, got 0"),
    "LayerNorm non-tensor": (lambda: LayerNorm(4)([1.0] * 4),
                             TypeError, "x: expected a torch.Tensor, got list"),
    "RMSNorm eps=0": (lambda: RMSNorm(4, eps=0.0),
                      ValueError, "eps: expected a finite number > 0, got 0.0"),
    # mixture of experts
    "MoELayer d_ff=0": (lambda: MoELayer(8, 0, 4), ValueError, "d_ff: expected an int >= 1, got 0"),
    "MoELayer non-tensor": (lambda: MoELayer(8, 16, 4)([[0.0] * 8]),
                            TypeError, "x: expected a torch.Tensor, got list"),
    "MoELayer no tokens": (lambda: MoELayer(8, 16, 4)(ones(0, 8)),
                           ValueError, "x: expected at least one token"),
    "MoELayer capacity_factor str": (lambda: MoELayer(8, 16, 4, capacity_factor="big"),
                                     TypeError, "capacity_factor: expected a number"),
    "Router bool top_k": (lambda: Router(8, 4, True), TypeError, "top_k: expected an int, got bool"),
    "load_balancing_loss probs list": (lambda: load_balancing_loss([[0.5, 0.5]], ids(1), 2),
                                       TypeError, "router_probs: expected a torch.Tensor, got list"),
    "load_balancing_loss index list": (lambda: load_balancing_loss(ones(2, 2) / 2, [0, 1], 2),
                                       TypeError, "expert_index: expected a torch.Tensor, got list"),
    "load_balancing_loss float index": (lambda: load_balancing_loss(ones(2, 2) / 2, ones(2), 2),
                                        TypeError, "expert_index: expected an integer dtype"),
    # positions
    "apply_rope non-tensor": (lambda: apply_rope([[1.0, 2.0]]),
                              TypeError, "x: expected a torch.Tensor, got list"),
    "apply_rope base=0": (lambda: apply_rope(ones(3, 4), base=0),
                          ValueError, "base: expected a finite number > 0, got 0"),
    "apply_rope negative offset": (lambda: apply_rope(ones(3, 4), -1),
                                   ValueError, "positions: expected an int >= 0, got -1"),
    "alibi_bias m < n": (lambda: alibi_bias(5, 2, m=3), ValueError, "m: expected m >= n=5"),
    "sinusoidal float d": (lambda: sinusoidal_encoding(4, 2.0), TypeError, "d: expected an int, got float"),
    "learned uint8 positions": (lambda: LearnedPositionalEmbedding(6, 4)(ids(2, dtype=torch.uint8)),
                                TypeError, "positions: expected an integer dtype (torch.long or torch.int32)"),
    # config and model
    "ModelConfig norm_first='yes'": (lambda: ModelConfig(**BASE, norm_first="yes"),
                                     TypeError, "norm_first: expected a bool, got str"),
    "ModelConfig tied_embeddings=1": (lambda: ModelConfig(**BASE, tied_embeddings=1),
                                      TypeError, "tied_embeddings: expected a bool, got int"),
    "ModelConfig norm_eps='x'": (lambda: ModelConfig(**BASE, norm_eps="x"),
                                 TypeError, "norm_eps: expected a number, got str"),
    "ModelConfig norm_eps=0": (lambda: ModelConfig(**BASE, norm_eps=0.0),
                               ValueError, "norm_eps: expected a finite number > 0"),
    "GPT uint8 ids": (lambda: gpt()(ids(1, 3, dtype=torch.uint8)),
                      TypeError, "idx: expected an integer dtype (torch.long or torch.int32), got"),
    "GPT int16 ids": (lambda: gpt()(ids(1, 3, dtype=torch.int16)),
                      TypeError, "idx: expected an integer dtype"),
    "GPT empty batch": (lambda: gpt()(ids(0, 3)),
                        ValueError, "idx: expected at least one id, got shape (0, 3)"),
    "GPT empty sequence": (lambda: gpt()(ids(2, 0)),
                           ValueError, "idx: expected at least one id, got shape (2, 0)"),
    "from_gpt2_state_dict list": (lambda: GPT.from_gpt2_state_dict([], GPT2),
                                  TypeError, "state_dict: expected a dict of tensors, got list"),
    "from_gpt2_state_dict non-tensor": (lambda: GPT.from_gpt2_state_dict({"wte.weight": 0}, GPT2),
                                        TypeError, "state_dict['wte.weight']: expected a torch.Tensor, got int"),
    # embeddings
    "embed uint8 ids": (lambda: embed(ids(3, dtype=torch.uint8), ones(5, 2)),
                        TypeError, "ids: expected an integer dtype"),
    "embed W_E list": (lambda: embed(ids(3), [[0.0, 1.0]]),
                       TypeError, "W_E: expected a torch.Tensor, got list"),
    "one_hot no ids": (lambda: one_hot(ids(0), 3),
                       ValueError, "ids: expected at least one id, got shape (0,)"),
    "FixedMixing non-tensor": (lambda: FixedMixing(2)([[1.0], [2.0]]),
                               TypeError, "x: expected a torch.Tensor, got list"),
    "gaussian_kernel bandwidth str": (lambda: gaussian_kernel(ones(3), "wide"),
                                      TypeError, "bandwidth: expected a number"),
    # data and training
    "copy_task float batch": (lambda: copy_task(2.0, 3, 5), TypeError, "batch: expected an int, got float"),
    "text_batch float block": (lambda: text_batch(ids(10), 1, 2.5),
                               TypeError, "block: expected an int, got float"),
    "train bool steps": (lambda: train(tiny_model(), copy_task(2, 2, 4), steps=True),
                         TypeError, "steps: expected an int, got bool"),
    "train lr=0": (lambda: train(tiny_model(), copy_task(2, 2, 4), steps=1, lr=0),
                   ValueError, "lr: expected a finite number > 0"),
    # figures
    "head_grid ncols=0": (lambda: head_grid(ones(2, 2, 2), ["a", "b"], ncols=0),
                          ValueError, "ncols: expected an int >= 1, got 0"),
}


@pytest.mark.parametrize("call,error,message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_raises_naming_the_argument(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
    assert str(info.value).startswith(message), f"got {str(info.value)!r}"
    assert re.match(r"[\w.\[\]']+: expected ", str(info.value))


def test_broadcast_shapes_agrees_with_torch():
    """The plain-Python broadcast (torch's imports sympy) gives torch's shape or torch's refusal,
    over every pair of shapes up to rank 3 with sizes 0, 1, 2 and 3."""
    import itertools

    from transformer_lib._checks import broadcast_shapes

    shapes = [s for r in range(4) for s in itertools.product((0, 1, 2, 3), repeat=r)]
    for a, b in itertools.product(shapes, repeat=2):
        try:
            want = torch.broadcast_shapes(a, b)
        except RuntimeError:
            with pytest.raises(RuntimeError, match="do not broadcast"):
                broadcast_shapes(a, b)
            continue
        assert broadcast_shapes(a, b) == want, (a, b)
    assert broadcast_shapes((2, 1, 3), (4, 1), (1, 1, 1, 3)) == torch.broadcast_shapes((2, 1, 3), (4, 1), (1, 1, 1, 3))


def test_library_checks_do_not_import_sympy():
    """Validating shapes must not cost a chapter or a graded submission the ~0.6 s import of sympy
    that torch.broadcast_shapes triggers on first use."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from transformer_lib.attention import scaled_dot_product_attention\n"
            "from transformer_lib.positional import sinusoidal_encoding\n"
            "q = torch.randn(2, 3, 4)\n"
            "scaled_dot_product_attention(q, q, q, mask=torch.ones(3, 3, dtype=torch.bool))\n"
            "print('sympy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_ids_and_positions_rules_by_hand():
    """require_ids without a label names the bare bound; require_positions takes (n,), (1, n)
    and (batch, n), and nothing else, e.g. (2, n) for a batch of 3."""
    from transformer_lib._checks import require_ids, require_positions

    assert error_message(require_ids, "ids", torch.tensor([5, 1]), 3, exc=ValueError) == (
        "ids: expected values in [0, 3), got min 1 and max 5")
    for shape in ((4,), (1, 4), (3, 4)):
        assert require_positions("p", torch.zeros(shape, dtype=torch.long), 3, 4).shape == (3, 4)
    assert error_message(require_positions, "p", torch.zeros(2, 4, dtype=torch.long), 3, 4, exc=ValueError) == (
        "p: expected shape (batch, n) = (3, 4) or (n,) = (4,), got (2, 4)")
