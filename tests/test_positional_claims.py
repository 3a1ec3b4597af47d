"""Chapter 6's measured claims about extrapolation hold across seeds.

The same one-block GPT with learned, sinusoidal, RoPE or ALiBi positions is trained to output
the previous token on sequences of length 16 and evaluated on lengths 16, 32 and 64. Across
five seeds: all four learn the rule; learned positions refuse lengths past n_ctx; sinusoidal
positions lose more than 0.4 of accuracy at 4× (they fail past the training length); RoPE stays
above 0.9; ALiBi stays within 0.1 of its accuracy at 1×, which is more than 0.05 below
RoPE's.

The recipe is that of chapters/06_positional_information.ipynb (same sizes, steps and rates)."""
from __future__ import annotations

import pytest
import torch

from transformer_lib.config import ModelConfig
from transformer_lib.model import GPT
from transformer_lib.train import train

SEEDS = range(5)
L_TRAIN, V_TASK = 16, 16


def _batch(batch: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(1, V_TASK, (batch, n), generator=gen)
    y = torch.full_like(x, -100)
    y[:, 1:] = x[:, :-1]
    return x, y


def _train(scheme: str, seed: int) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=V_TASK, n_ctx=L_TRAIN if scheme == "learned" else 4 * L_TRAIN,
                      d_model=32, n_layers=1, n_heads=8, d_ff=64, positional=scheme)
    model = GPT(cfg)
    if scheme == "sinusoidal":
        model.pos_enc.mul_(0.2)
    gen = torch.Generator().manual_seed(seed)
    train(model, lambda step: _batch(32, L_TRAIN, gen), steps=150, lr=1e-2, seed=seed)
    return model.eval()


def _by_position(model: GPT, n: int, seed: int = 123) -> torch.Tensor:
    x, y = _batch(256, n, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return (model(x).argmax(-1) == y).double()[:, 1:].mean(0)


@pytest.mark.parametrize("seed", SEEDS)
def test_extrapolation_claims(seed):
    torch.set_num_threads(1)
    models = {s: _train(s, seed) for s in ("learned", "sinusoidal", "rope", "alibi")}
    acc = {s: {f: float(_by_position(m, f * L_TRAIN).mean()) for f in (1, 4) if s != "learned" or f == 1}
           for s, m in models.items()}
    assert all(a[1] > 0.8 for a in acc.values()), acc
    with pytest.raises(ValueError, match="n_ctx=16"):
        _by_position(models["learned"], 2 * L_TRAIN)
    assert acc["sinusoidal"][4] < acc["sinusoidal"][1] - 0.4, acc
    sin4 = _by_position(models["sinusoidal"], 4 * L_TRAIN)
    assert sin4[:L_TRAIN - 1].mean() > 0.8 and sin4[L_TRAIN - 1:].mean() < 0.3, sin4
    assert acc["rope"][4] > 0.9, acc
    assert acc["alibi"][4] > acc["alibi"][1] - 0.1, acc
    assert acc["alibi"][1] < acc["rope"][1] - 0.05, acc
