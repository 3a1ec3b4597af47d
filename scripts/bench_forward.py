"""Does a change move the speed of `GPT.forward`? Times the forward pass of the working tree's
library against the library of another commit, in alternating fresh processes.

    .venv/bin/python scripts/bench_forward.py BASE_COMMIT [--rounds 6]

Two models, one thread, no gradient: chapter 7's GPT (4 layers, 4 heads, d = 128, a batch of
12 sequences of 64 tokens), where the matrix products dominate, and a tiny one (2 layers,
d = 32, 2 × 16 tokens), where the Python overhead of each call does. Each round times both
trees once (the median of many calls each); the rounds alternate which tree goes first, so a
busy moment of the machine hits both alike. Prints the median over rounds and the ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TIMER = r"""
import json, statistics, sys, time
import torch
from transformer_lib.config import ModelConfig
from transformer_lib.model import GPT
torch.set_num_threads(1)
times = {}
for name, cfg, shape, calls in [
        ("chapter 7 GPT (b=12, n=64, d=128, L=4)",
         ModelConfig(vocab_size=84, n_ctx=64, d_model=128, n_layers=4, n_heads=4, bias=False), (12, 64), 40),
        ("tiny GPT (b=2, n=16, d=32, L=2)",
         ModelConfig(vocab_size=50, n_ctx=16, d_model=32, n_layers=2, n_heads=4), (2, 16), 400)]:
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for _ in range(calls // 4):
            model(idx)
        t = []
        for _ in range(calls):
            start = time.perf_counter()
            model(idx)
            t.append(time.perf_counter() - start)
    times[name] = statistics.median(t)
print(json.dumps(times))
"""


def _time(tree: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", TIMER], cwd=tree, check=True, capture_output=True,
                         text=True, env={"PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the commit to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "base.tar"
        subprocess.run(["git", "archive", "-o", str(archive), args.base, "transformer_lib"],
                       cwd=REPO, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(Path(tmp) / "base", filter="data")
        trees = {"base": Path(tmp) / "base", "here": REPO}
        runs: dict[str, list[dict[str, float]]] = {"base": [], "here": []}
        for r in range(args.rounds):
            for label in (("base", "here") if r % 2 == 0 else ("here", "base")):
                runs[label].append(_time(trees[label]))
    print(f"{'model':<42} {'base ms':>9} {'here ms':>9} {'here/base':>10}")
    for name in runs["base"][0]:
        base, here = (statistics.median(t[name] for t in runs[k]) * 1e3 for k in ("base", "here"))
        print(f"{name:<42} {base:9.3f} {here:9.3f} {here / base:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
