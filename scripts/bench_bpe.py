"""Time byte-level BPE training (`transformer_lib.bpe.train_bpe`, Chapter 11) on the Shakespeare
corpus: its first 130,000 characters to a 500-token vocabulary (limit 0.5 s) and all of it,
5 MB, to 10,000 tokens (limit 60 s). Each run prints its measured wall-clock and CPU seconds
next to its limit; the limits apply to CPU time, which a busy machine does not inflate."""
from __future__ import annotations

import sys
import time

from transformer_lib.bpe import train_bpe
from transformer_lib.data import shakespeare_text

RUNS = ((130_000, 500, 0.5), (None, 10_000, 60.0))  # characters (None: all), vocabulary size, limit in s


def bench_bpe() -> bool:
    """Print one line per run; True if every run is within its limit."""
    text, ok = shakespeare_text(), True
    for chars, vocab_size, limit in RUNS:
        corpus = text if chars is None else text[:chars]
        wall, cpu = time.perf_counter(), time.process_time()
        vocab, merges = train_bpe(corpus, vocab_size)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        within = cpu <= limit
        ok &= within
        print(f"BPE on {len(corpus.encode()):>9,} bytes of Shakespeare -> {len(vocab):>6,} tokens: "
              f"{wall:6.2f} s wall, {cpu:6.2f} s CPU (limit {limit:g} s CPU)"
              f"{'' if within else '  > limit'}")
    return ok


if __name__ == "__main__":
    sys.exit(0 if bench_bpe() else 1)
