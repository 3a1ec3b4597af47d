"""Time the autograder: 20 sandboxed submissions of the chapter 2 exercises with --jobs 2 (>= 30 a minute)."""
from __future__ import annotations

import sys

from transformer_lib.grading.bench import bench_grading

if __name__ == "__main__":
    sys.exit(0 if bench_grading(n=20, jobs=2) else 1)
