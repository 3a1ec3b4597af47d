"""Time the grading of n submissions of the chapter 2 exercises (``make bench``).

The submissions are made from the committed notebooks: most are correct (the instructor
solutions under the student's check cells), a few are the blank student version. The
instructor notebook is run too, as in every grading run, and counted in the time. Every run is
sandboxed (bubblewrap; without it, the bench says so and grades unsandboxed); as root, in warm
sandboxes (:mod:`~transformer_lib.grading.run.slots`), whose start is counted too. The target: at
least 30 submissions a minute (20 in at most 40 s) with ``--jobs 2`` on an idle 2-core machine.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from . import grade as grade_module
from .prepare.notebook import dumps, read, release, strip_hidden, is_check

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "exercises" / "source" / "02_building_up_attention.ipynb"
MIN_PER_MINUTE = 30.0


def _correct_submission(source: Path) -> str:
    """The instructor notebook as a student who solved everything would hand it in."""
    nb = read(source)
    for cell in nb.cells:
        if is_check(cell):
            cell.source = strip_hidden(cell.source)
    return dumps(nb)


def bench_grading(n: int = 20, jobs: int = 2, source: Path = SOURCE, rate: float = MIN_PER_MINUTE) -> bool:
    """Grade ``n`` submissions with ``jobs`` workers, sandboxed; print the time and the rate;
    True if at least ``rate`` submissions a minute got their expected scores."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    try:
        subs = tmp / "submissions"
        subs.mkdir()
        correct, blank = _correct_submission(source), dumps(release(read(source)))
        for i in range(n):
            (subs / f"student_{i:02d}.ipynb").write_text(blank if i % 5 == 4 else correct, encoding="utf-8")
        start = time.perf_counter()
        results = grade_module.grade(source, [subs], tmp / "out", jobs=jobs, cell_timeout=30, timeout=120,
                                     progress=False, sandbox="auto")
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    full = sum(r.total == r.max_score for r in results)
    per_minute = 60 * n / seconds
    ok = per_minute >= rate and full == n - n // 5
    print(f"{'grading ' + str(n) + ' chapter-2 submissions (--jobs ' + str(jobs) + ', sandboxed)':<55} {seconds:8.1f}"
          f"  {per_minute:.1f} a minute{'' if per_minute >= rate else f'  < {rate:.0f} a minute'}  ({full} full marks)")
    return ok
