"""`make bench`, the training step: the library's `GPT` against the same model built from
`torch.nn` parts, side by side in one run.

The `torch.nn` model has the same shapes and the same parameter count: token and learned
position embeddings, `nn.TransformerEncoderLayer(norm_first=True, activation="gelu",
dropout=0)` blocks run with a causal mask, a final `nn.LayerNorm` and an unembedding tied to
the token embedding. Both train with AdamW at the lab's size and batch (`transformer_lib.lab`'s
defaults: d = 128, 2 layers, 4 heads, context 64, batch 24, no biases). One step is forward, backward
and optimizer step; the two models alternate step by step, so that a busy moment of the
machine hits both alike, and each time is the median over the steps. Reported for 1 and 2
threads as library / torch.nn (goal: at most 1.0x).

    python scripts/bench_train.py [--steps 60] [--threads 1 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.config import ModelConfig
from transformer_lib.counting import count_params
from transformer_lib.lab import LAB_DEFAULTS
from transformer_lib.model import GPT

GOAL = 1.0


class TorchNNGPT(nn.Module):
    """A pre-norm GPT from `torch.nn` parts, with the shapes of `GPT(config)`."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = nn.Embedding(c.n_ctx, c.d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(c.d_model, c.n_heads, c.d_ff, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True, bias=c.bias)
            for _ in range(c.n_layers))
        self.norm_f = nn.LayerNorm(c.d_model, bias=c.bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(c.n_ctx), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        n = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb.weight[:n]
        for block in self.blocks:
            x = block(x, src_mask=self.mask[:n, :n], is_causal=True)
        return self.lm_head(self.norm_f(x))


def step_times(threads: int, steps: int, seed: int = 0) -> tuple[float, float]:
    """Median seconds of one training step: (library GPT, torch.nn GPT)."""
    torch.set_num_threads(threads)
    d = LAB_DEFAULTS
    config = ModelConfig(vocab_size=d["vocab_size"], n_ctx=d["context"], d_model=d["d_model"],
                         n_layers=d["layers"], n_heads=d["heads"], bias=False)
    torch.manual_seed(seed)
    models = {"library": GPT(config), "torch.nn": TorchNNGPT(config)}
    assert count_params(models["library"]) == count_params(models["torch.nn"])
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, foreach=True)
            for name, m in models.items()}
    g = torch.Generator().manual_seed(seed)
    times: dict[str, list[float]] = {name: [] for name in models}
    for i in range(steps + 5):
        x = torch.randint(0, config.vocab_size, (d["batch"], config.n_ctx + 1), generator=g)
        for name, model in models.items():
            start = time.perf_counter()
            logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            opts[name].step()
            if i >= 5:  # warm-up steps not timed
                times[name].append(time.perf_counter() - start)
    return statistics.median(times["library"]), statistics.median(times["torch.nn"])


def report(steps: int = 60, threads: tuple[int, ...] = (1, 2)) -> bool:
    """Print the step times and ratios; True when every ratio meets the goal."""
    ok = True
    for t in threads:
        lib, ref = step_times(t, steps)
        ratio = lib / ref
        ok &= ratio <= GOAL
        print(f"training step, lab size, {t} thread{'s' if t > 1 else ''}: library {lib * 1e3:.1f} ms, "
              f"torch.nn {ref * 1e3:.1f} ms, ratio {ratio:.2f}x"
              f"{'' if ratio <= GOAL else f'  > {GOAL:.1f}x goal'}")
    return ok


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    report(args.steps, tuple(args.threads))
