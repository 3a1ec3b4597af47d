"""Every exercise notebook graded as an instructor grades it: through the command line, sandboxed.

Per notebook one grading run takes the instructor version handed in as a student would (full
marks), the released student version (zero), and the attacks of ``submissions/attacks.py`` on that
chapter: each scores 0 on the checks it attacks and exactly the honest points elsewhere, and the class
report lists the submissions whose code the grader refused. Without a working bubblewrap these tests
are skipped, unless GRADING_SANDBOX_REQUIRED=1 (as in CI).
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from repo_paths import REPO
from submissions.attacks import ATTACKS
from submissions.helpers import as_handed_in, substitute
from transformer_lib.grading import sandbox
from transformer_lib.grading.notebook import check_cells, dumps, grade_id, read, release

STEMS = sorted(p.stem for p in (REPO / "exercises" / "source").glob("*.ipynb"))
WHY = sandbox.probe()
if WHY is not None and os.environ.get("GRADING_SANDBOX_REQUIRED") == "1":
    raise RuntimeError(f"GRADING_SANDBOX_REQUIRED=1 but {WHY}")
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no sandbox here: {WHY}")


def _slug(name: str) -> str:
    return "attack_" + "".join(c if c.isalnum() else "_" for c in name)


@pytest.fixture(scope="module", params=STEMS)
def graded(request, tmp_path_factory):
    stem = request.param
    source = REPO / "exercises" / "source" / f"{stem}.ipynb"
    instructor = read(source)
    subs, out = tmp_path_factory.mktemp(f"{stem[:10]}_subs"), tmp_path_factory.mktemp(f"{stem[:10]}_out")
    (subs / "correct.ipynb").write_text(dumps(as_handed_in(instructor)), encoding="utf-8")
    (subs / "blank.ipynb").write_text(dumps(release(instructor)), encoding="utf-8")
    for name, (edits, _) in ATTACKS.get(stem, {}).items():
        (subs / f"{_slug(name)}.ipynb").write_text(dumps(as_handed_in(substitute(instructor, edits))), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "transformer_lib.grading", "grade", str(source), str(subs),
                             "--out", str(out), "--jobs", "2", "--sandbox", "bwrap", "--quiet", "--cell-timeout", "120",
                             "--timeout", "600"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = {row["submission"]: row for row in csv.DictReader(fh)}
    points = {grade_id(c): float(c.metadata["nbgrader"]["points"]) for _, c in check_cells(instructor)}
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
        messages = " ".join(t["output"] for t in tests if t["name"] in attacked)
        assert "refuses" in messages or "raised" in messages or "fails" in messages, (name, messages)


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
