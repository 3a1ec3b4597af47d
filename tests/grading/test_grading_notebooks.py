"""Every exercise notebook graded as an instructor grades it: through the command line, sandboxed.

Per notebook one grading run takes the instructor version handed in as a student would (full
marks), the released student version (zero), and the attacks of ``submissions/attacks.py``,
``submissions/attacks_static.py`` and ``submissions/attacks_runtime.py`` on that chapter: each scores 0
on the checks it attacks and exactly the honest points elsewhere, and the class report lists the
submissions whose code the grader refused (for those of ``attacks_static.py``, with the cell and line of
the refused code). Without a working bubblewrap these tests
are skipped, unless GRADING_SANDBOX_REQUIRED=1 (as in CI).
"""
from __future__ import annotations

import concurrent.futures as cf
import csv
import json
import os
import subprocess
import sys

import pytest

from repo_paths import REPO
from submissions import attacks, attacks_runtime, attacks_static
from submissions.helpers import as_handed_in, substitute
from transformer_lib.grading.run import sandbox
from transformer_lib.grading.prepare.notebook import check_cells, dumps, grade_id, read, release

ATTACKS = {stem: {**attacks.ATTACKS.get(stem, {}), **attacks_runtime.ATTACKS.get(stem, {}),
                  **{name: (edit, attacked) for name, (edit, attacked, _) in attacks_static.ATTACKS.get(stem, {}).items()}}
           for stem in {*attacks.ATTACKS, *attacks_runtime.ATTACKS, *attacks_static.ATTACKS}}
STEMS = sorted(p.stem for p in (REPO / "exercises" / "source").glob("*.ipynb"))
WHY = sandbox.probe()
if WHY is not None and os.environ.get("GRADING_SANDBOX_REQUIRED") == "1":
    raise RuntimeError(f"GRADING_SANDBOX_REQUIRED=1 but {WHY}")
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no sandbox here: {WHY}")


def _slug(name: str) -> str:
    return "attack_" + "".join(c if c.isalnum() else "_" for c in name)


def _grade(stem: str, folder) -> tuple:
    source = REPO / "exercises" / "source" / f"{stem}.ipynb"
    instructor = read(source)
    subs, out = folder / f"{stem}_subs", folder / f"{stem}_out"
    subs.mkdir()
    (subs / "correct.ipynb").write_text(dumps(as_handed_in(instructor)), encoding="utf-8")
    (subs / "blank.ipynb").write_text(dumps(release(instructor)), encoding="utf-8")
    for name, (edit, _) in ATTACKS.get(stem, {}).items():
        nb = edit(instructor) if callable(edit) else substitute(instructor, edit)
        (subs / f"{_slug(name)}.ipynb").write_text(dumps(as_handed_in(nb)), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "transformer_lib.grading", "grade", str(source), str(subs),
                             "--out", str(out), "--jobs", "2", "--sandbox", "bwrap", "--quiet", "--cell-timeout", "120",
                             "--timeout", "600"], cwd=REPO, capture_output=True, text=True, timeout=1200)
    points = {grade_id(c): float(c.metadata["nbgrader"]["points"]) for _, c in check_cells(instructor)}
    return result, points, out


@pytest.fixture(scope="module")
def every_run(tmp_path_factory):
    """All the notebooks' grading runs, three at a time (each instructor run alone keeps one core busy)."""
    folder = tmp_path_factory.mktemp("notebooks")
    with cf.ThreadPoolExecutor(max_workers=3) as pool:
        futures = {stem: pool.submit(_grade, stem, folder) for stem in STEMS}
    return {stem: fut.result() for stem, fut in futures.items()}


@pytest.fixture(params=STEMS)
def graded(request, every_run):
    stem = request.param
    result, points, out = every_run[stem]
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = {row["submission"]: row for row in csv.DictReader(fh)}
    return stem, rows, points, out


def test_the_instructor_version_scores_full_marks_and_the_student_version_zero(graded):
    _, rows, points, _ = graded
    assert float(rows["correct"]["total"]) == sum(points.values()), rows["correct"]
    assert rows["correct"]["notes"] == "" and float(rows["blank"]["total"]) == 0, rows["blank"]


def test_each_attack_scores_zero_where_it_attacks_and_its_honest_points_elsewhere(graded):
    stem, rows, points, out = graded
    for name, (_, attacked) in ATTACKS.get(stem, {}).items():
        row = rows[_slug(name)]
        for gid, full in points.items():
            assert float(row[gid]) == (0.0 if gid in attacked else full), f"{name}: {gid} = {row[gid]}"
        tests = json.loads((out / _slug(name) / "results.json").read_text())["tests"]
        assert all(t["output"] != "passed" for t in tests if t["name"] in attacked), name


def test_the_class_report_lists_the_refused_submissions(graded):
    stem, rows, _, out = graded
    report = (out / "class_report.md").read_text()
    refused = [name for name in ATTACKS.get(stem, {})
               if any("refuses" in t["output"] for t in json.loads((out / _slug(name) / "results.json").read_text())["tests"])]
    if refused:
        assert "## Refused constructs" in report
        for name in refused:
            assert _slug(name) in report
    assert "Graded in the sandbox" in report


def test_the_class_report_names_the_cell_and_line_of_each_static_attack(graded):
    stem, _, _, out = graded
    report = (out / "class_report.md").read_text()
    for name, (_, _, marker) in attacks_static.ATTACKS.get(stem, {}).items():
        handed_in = read(out.parent / f"{stem}_subs" / f"{_slug(name)}.ipynb")
        cell, line = next((c, n) for c, cell in enumerate(handed_in.cells)
                          for n, text in enumerate(cell.source.splitlines(), 1) if marker in text)
        assert f"| {_slug(name)} | cell {cell + 1}, line {line} |" in report, (name, cell + 1, line)


def test_a_hidden_test_sends_nothing_back(every_run):
    """An answer that encodes its hidden inputs fails, and its feedback carries no number at all."""
    out = every_run["09_parameter_and_flop_counting"][2]
    tests = json.loads((out / _slug("smuggle the hidden inputs out through the answer") / "results.json").read_text())["tests"]
    message = next(t["output"] for t in tests if t["name"] == "check_param_count")
    assert message.startswith("a hidden test (other inputs) fails") and not any(ch.isdigit() for ch in message)
