"""The measured claims of Chapter 4, with the chapter's settings, over 5 seeds:

- the gradient highway: at initialisation the gradient reaching the input of a stack of
  blocks stays O(1) with residuals and vanishes without them, faster the deeper the stack;
- pre-norm vs post-norm: at initialisation the blocks of a 12-layer pre-norm GPT receive
  gradients of nearly equal size, those of a post-norm GPT do not.
"""
from __future__ import annotations

import pytest
import torch

from transformer_lib.config import ModelConfig
from transformer_lib.model import GPT
from transformer_lib.stream import block_gradient_norms, input_gradient_norm

torch.set_num_threads(1)  # tiny models: one thread is faster than two competing ones
SEEDS = range(5)
D, HEADS, V, N, BATCH = 32, 4, 16, 16, 4       # as in the chapter


def _config(n_layers: int, **kw) -> ModelConfig:
    return ModelConfig(vocab_size=V, n_ctx=N, d_model=D, n_layers=n_layers, n_heads=HEADS, **kw)


def _highway(seed: int, depths: tuple[int, ...], residual: bool) -> list[float]:
    torch.manual_seed(seed)
    model = GPT(_config(max(depths)), residual=residual).double()
    x = torch.randn(BATCH, N, D, generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64)
    return [input_gradient_norm(list(model.blocks[:L]), x, seed=seed) for L in depths]


@pytest.mark.parametrize("seed", SEEDS)
def test_gradient_highway(seed):
    depths = (2, 16, 48)
    with_res, without = _highway(seed, depths, True), _highway(seed, depths, False)
    assert all(0.5 < g < 2.0 for g in with_res), with_res             # O(1) at every depth
    assert without[0] > without[1] > without[2], without               # shrinks with depth
    assert without[0] < 0.1 and without[2] < 1e-25, without           # vanishes
    assert with_res[1] / without[1] > 1e5                              # the highway, by ratio


def _per_block(seed: int, norm_first: bool) -> list[float]:
    torch.manual_seed(seed)
    model = GPT(_config(12, norm_first=norm_first)).double()
    gen = torch.Generator().manual_seed(200 + seed)
    idx, targets = (torch.randint(0, V, (8, N), generator=gen) for _ in range(2))
    return block_gradient_norms(model, idx, targets)


@pytest.mark.parametrize("seed", SEEDS)
def test_post_norm_gradients_are_uneven_across_depth_pre_norm_not(seed):
    pre, post = _per_block(seed, True), _per_block(seed, False)
    assert max(pre) / min(pre) < 1.3, pre
    assert max(post) / min(post) > 5.0, post
    assert post[0] == max(post)            # the bottom block, where the small embedding is normalised
