"""`make bench`: how long each notebook takes to execute on this machine, and the total.

Each chapter must execute in at most 20 s and the whole book in at most 3 minutes on a
2-core machine. The script also times grading 20 submissions (see scripts/bench_grading.py).
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
BOOK_LIMIT_S = 180.0


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
    print(f"{'all chapters (the book)':<55} {total:8.1f}" + ("  > 3 min limit" if total > BOOK_LIMIT_S else ""))
    grading = REPO / "scripts" / "bench_grading.py"
    status = 0
    if grading.exists():
        status = subprocess.run([sys.executable, str(grading)], cwd=REPO).returncode
    return 1 if slow or total > BOOK_LIMIT_S or status else 0


if __name__ == "__main__":
    sys.exit(main())
