"""`make bench`, the training step: the library's `GPT` against the same model built from
`torch.nn` parts, side by side in one run.

The configuration is nanoGPT's CPU Shakespeare-char run: a character vocabulary of 65, 4
layers, 4 heads, d = 128, context 64, batch 12, no biases, no dropout, AdamW (804,096
parameters). The `torch.nn` model has the same shapes and the same parameter count: token and
learned position embeddings, `nn.TransformerEncoderLayer(norm_first=True, activation="gelu",
dropout=0)` blocks run with a causal mask, a final `nn.LayerNorm` and an unembedding tied to
the token embedding. One step is forward, cross-entropy, backward and optimizer step. The two
models alternate step by step, so that a busy moment of the machine hits both alike; a round
takes the median step time of each over `--steps` steps, the rounds alternate the thread
counts, and the ratio library / torch.nn reported is the median over the rounds (each round's
ratio printed too). Goal: at most 0.90x with one thread; two threads are reported.

    python scripts/bench_train.py [--steps 40] [--rounds 5] [--threads 1 2]
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
from transformer_lib.model import GPT

GOAL = 0.90  # library / torch.nn, one thread
NAME = "nanoGPT's CPU Shakespeare-char size (4 layers, 4 heads, d = 128, context 64, batch 12, no bias)"
CONFIG = ModelConfig(vocab_size=65, n_ctx=64, d_model=128, n_layers=4, n_heads=4, bias=False)
BATCH = 12


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


class Pair:
    """Both models with their AdamW optimizers and one stream of random batches."""

    def __init__(self, seed: int = 0):
        torch.manual_seed(seed)
        self.models = {"library": GPT(CONFIG), "torch.nn": TorchNNGPT(CONFIG)}
        assert count_params(self.models["library"]) == count_params(self.models["torch.nn"])
        self.opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1,
                                             foreach=True) for name, m in self.models.items()}
        self.g = torch.Generator().manual_seed(seed)

    def step(self, name: str, x: torch.Tensor) -> float:
        """Seconds of one training step of model `name` on the batch x (b, n + 1)."""
        start = time.perf_counter()
        logits = self.models[name](x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        self.opts[name].zero_grad(set_to_none=True)
        loss.backward()
        self.opts[name].step()
        return time.perf_counter() - start

    def round(self, threads: int, steps: int, warmup: int = 3) -> tuple[float, float]:
        """Median seconds of a step (library, torch.nn) over `steps` alternating steps."""
        torch.set_num_threads(threads)
        times: dict[str, list[float]] = {name: [] for name in self.models}
        for i in range(warmup + steps):
            x = torch.randint(0, CONFIG.vocab_size, (BATCH, CONFIG.n_ctx + 1), generator=self.g)
            for name in self.models:
                seconds = self.step(name, x)
                if i >= warmup:
                    times[name].append(seconds)
        return statistics.median(times["library"]), statistics.median(times["torch.nn"])


def report(steps: int = 40, rounds: int = 5, threads: tuple[int, ...] = (1, 2)) -> bool:
    """Print each thread count's step times and ratio; True when one thread meets the goal."""
    pair = Pair()
    print(f"training step at {NAME}, {count_params(pair.models['library']):,} parameters each; "
          f"median of {rounds} rounds of {steps} alternating steps")
    results: dict[int, list[tuple[float, float]]] = {t: [] for t in threads}
    for _ in range(rounds):
        for t in threads:
            results[t].append(pair.round(t, steps))
    ok = True
    for t in threads:
        ratios = [lib / ref for lib, ref in results[t]]
        ratio = statistics.median(ratios)
        lib = statistics.median(r[0] for r in results[t])
        ref = statistics.median(r[1] for r in results[t])
        verdict = ""
        if t == 1:
            ok = ratio <= GOAL
            verdict = f"  (goal ≤ {GOAL:.2f}x{'' if ok else ': not met'})"
        print(f"  {t} thread{'s' if t > 1 else ''}: library {lib * 1e3:.1f} ms, torch.nn {ref * 1e3:.1f} ms, "
              f"ratio {ratio:.2f}x{verdict}; rounds: {', '.join(f'{r:.2f}' for r in ratios)}")
    return ok


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    report(args.steps, args.rounds, tuple(args.threads))
