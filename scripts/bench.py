"""`make bench`: how long each notebook takes to execute on this machine, and the total.

Each chapter must execute in at most 20 s and the whole book in at most 150 s on a
2-core machine. The script also times BPE training on the Shakespeare corpus and prints the
measured wall-clock and CPU seconds of each run next to its limit (scripts/bench_bpe.py: 130 kB
to 500 tokens within 0.5 s of CPU, 5 MB to 10,000 within a minute),
grading 20 submissions (see scripts/bench_grading.py), reports the speed of the library's
explicit attention at n = 512 against a minimal ``softmax(Q Kᵀ/√d_k) V`` and against
``F.scaled_dot_product_attention`` (limit 1.25×), and a training step of the library's GPT
against the same model from torch.nn parts at nanoGPT's CPU Shakespeare-char size
(scripts/bench_train.py, goal ≤ 0.90× with one thread, reported, not enforced: the ratio
depends on the load).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent
CHAPTER_LIMIT_S = 20.0
BOOK_LIMIT_S = 150.0
ATTENTION_LIMIT = 1.25  # the library's attention vs a minimal explicit one


def attention_ratios(n: int = 512, repeats: int = 30) -> tuple[float, float]:
    """(library / minimal explicit, library / torch's fused) median times, one thread, n = 512."""
    import math
    import statistics

    import torch
    import torch.nn.functional as F

    from transformer_lib.attention import scaled_dot_product_attention

    def minimal(q, k, v):  # noqa: ANN001, ANN202
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, generator=g) for _ in range(3))
    runs = {"library": lambda: scaled_dot_product_attention(q, k, v), "minimal": lambda: minimal(q, k, v),
            "fused": lambda: F.scaled_dot_product_attention(q, k, v)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(3):
        for run in runs.values():
            run()
    for _ in range(repeats):  # interleaved, so a busy moment hits all three alike
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    return med["library"] / med["minimal"], med["library"] / med["fused"]


def time_notebook(path: Path) -> float:
    """Execute one notebook in a fresh kernel (started in its own folder); return seconds."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute(stderr=subprocess.DEVNULL)  # the kernel's own log lines, not results
    return time.perf_counter() - start


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    notebooks = sorted((REPO / "chapters").glob("*.ipynb")) + sorted((REPO / "exercises" / "source").glob("*.ipynb"))
    total, slow = 0.0, []
    print(f"{'notebook':<55} {'seconds':>8}")
    for path in notebooks:
        seconds = time_notebook(path)
        total += seconds if path.parent.name == "chapters" else 0.0
        flag = ""
        if path.parent.name == "chapters" and seconds > CHAPTER_LIMIT_S:
            flag, _ = f"  > {CHAPTER_LIMIT_S:.0f} s limit", slow.append(path.name)
        print(f"{str(path.relative_to(REPO)):<55} {seconds:8.1f}{flag}")
    print(f"{'all chapters (the book)':<55} {total:8.1f}" + (f"  > {BOOK_LIMIT_S:.0f} s limit" if total > BOOK_LIMIT_S else ""))
    vs_minimal, vs_fused = attention_ratios()
    print(f"attention at n = 512: library / minimal explicit {vs_minimal:.2f}x"
          f"{'  > %.2fx limit' % ATTENTION_LIMIT if vs_minimal > ATTENTION_LIMIT else ''}, "
          f"library / F.scaled_dot_product_attention {vs_fused:.2f}x")
    # the training step of the library's GPT against a torch.nn model (scripts/bench_train.py)
    subprocess.run([sys.executable, str(REPO / "scripts" / "bench_train.py")], cwd=REPO)
    status = 0
    for script in ("bench_bpe.py", "bench_grading.py"):
        status |= subprocess.run([sys.executable, str(REPO / "scripts" / script)], cwd=REPO).returncode
    return 1 if slow or total > BOOK_LIMIT_S or status or vs_minimal > ATTENTION_LIMIT else 0


if __name__ == "__main__":
    sys.exit(main())
