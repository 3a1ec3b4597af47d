"""`transformer_lib.stream`'s argument checks, each message in full, and the seed of
`input_gradient_norm` (Chapter 4; mutation testing found the messages unchecked)."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from torch_helpers import rand
from transformer_lib.block import TransformerBlock
from transformer_lib.config import ModelConfig
from transformer_lib.model import GPT
from transformer_lib.stream import (block_gradient_norms, input_gradient_norm, logit_lens,
                                    residual_jacobian_norms)

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
