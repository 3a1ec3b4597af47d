"""The runtime side of grading, end to end: chapter-2 submissions that attack the watch, the records,
the hidden inputs, the judges and the grader's machine (``submissions/attacks_runtime.py``), in one
grading run through the command line, sandboxed.

Each scores 0 on the checks it attacks and its honest points elsewhere, and is listed in the class
report with its cell and line. The checks it attacks fail at run time too, not only because the
grader's reading refuses the code: the message's "judged without regard to that" part is never
"passed". While it runs, the grader's memory stays under 500 MB and the run folders on its disk
under 300 MB (an attack writes 800 MB, another 100 zip bombs), and the reports show no markup a
submission wrote. Without a working bubblewrap these tests are skipped, unless
GRADING_SANDBOX_REQUIRED=1 (as in CI).
"""
from __future__ import annotations

import csv
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

import psutil
import pytest

from repo_paths import REPO
from submissions.adversarial import SOURCE
from submissions.attacks_runtime import CHAPTER_2, HTML
from transformer_lib.grading.run import sandbox
from transformer_lib.grading.prepare.notebook import check_cells, dumps, grade_id, read

WHY = sandbox.probe()
if WHY is not None and os.environ.get("GRADING_SANDBOX_REQUIRED") == "1":
    raise RuntimeError(f"GRADING_SANDBOX_REQUIRED=1 but {WHY}")
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no sandbox here: {WHY}")
POINTS = {grade_id(c): float(c.metadata["nbgrader"]["points"]) for _, c in check_cells(read(SOURCE))}


def _grading_folders() -> int:
    """Bytes in the folders grading runs make in the host's temporary folder."""
    pattern = os.path.join(tempfile.gettempdir(), "grading-*")
    return sum(sandbox.folder_bytes(p) for p in glob.glob(pattern) if os.path.isdir(p))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs, out = tmp_path_factory.mktemp("runtime"), tmp_path_factory.mktemp("runtime_out")
    instructor = read(SOURCE)
    for name, (build, _, _) in CHAPTER_2.items():
        (subs / f"{name}.ipynb").write_text(dumps(build(instructor)), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "transformer_lib.grading", "grade", str(SOURCE), str(subs),
                             "--out", str(out), "--jobs", "2", "--sandbox", "bwrap", "--quiet", "--cell-timeout",
                             "120", "--timeout", "600"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peaks = {"memory": 0, "disk": 0}
    done = threading.Event()

    def watch() -> None:
        grader = psutil.Process(proc.pid)
        while not done.wait(0.1):
            try:
                peaks["memory"] = max(peaks["memory"], grader.memory_info().rss)
            except psutil.Error:
                return
            peaks["disk"] = max(peaks["disk"], _grading_folders())

    watcher = threading.Thread(target=watch)
    watcher.start()
    stdout, stderr = proc.communicate(timeout=1200)
    done.set()
    watcher.join()
    assert proc.returncode == 0, stderr[-3000:]
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = {row["submission"]: row for row in csv.DictReader(fh)}
    return rows, out, peaks


def _tests(out, name: str) -> dict[str, str]:
    data = json.loads((out / name / "results.json").read_text(encoding="utf-8"))
    return {t["name"]: t["output"] for t in data["tests"]}


@pytest.mark.parametrize("name", sorted(CHAPTER_2))
def test_each_attack_scores_zero_where_it_attacks_and_its_points_elsewhere(graded, name):
    rows, out, _ = graded
    _, attacked, _ = CHAPTER_2[name]
    row = rows[name]
    assert {g: float(row[g]) for g in POINTS} == {g: 0.0 if g in attacked else p for g, p in POINTS.items()}, row
    for gid, message in _tests(out, name).items():  # failed at run time too, whatever the grader's reading said
        if gid in attacked:
            assert message != "passed" and not message.endswith("(judged without regard to that: passed)"), message


@pytest.mark.parametrize("name", sorted(CHAPTER_2))
def test_the_class_report_lists_each_attack_with_its_cell_and_line(graded, name):
    _, out, _ = graded
    refused = (out / "class_report.md").read_text(encoding="utf-8").split("## Refused constructs")[1].split("\n## ")[0]
    rows = [line.replace("\\", "") for line in refused.splitlines()
            if re.match(rf"^\| {name} \| cell \d+, line \d+ \|", line)]
    for phrase in CHAPTER_2[name][2]:
        assert [row for row in rows if phrase in row], (phrase, rows)


def test_the_grader_stays_small_and_its_disk_untouched(graded):
    rows, _, peaks = graded
    assert peaks["memory"] < 500 * 2**20, peaks
    assert peaks["disk"] < 300 * 2**20, peaks


def test_the_reports_show_no_markup_a_submission_wrote(graded):
    rows, out, _ = graded
    for path in [out / "class_report.md", out / "harm" / "feedback.md"]:
        text = path.read_text(encoding="utf-8")
        assert "\\<img" in text and not re.search(r"(?<!\\)<img", text), path
        assert max(len(line) for line in text.splitlines()) < 3000, path
    assert all(len(n) <= 600 for n in rows["harm"]["notes"].split(" | ")), rows["harm"]["notes"]
    assert "(<img src=x" in rows["harm"]["notes"] and HTML * 2 not in (out / "grades.csv").read_text(encoding="utf-8")
    results = json.loads((out / "harm" / "results.json").read_text(encoding="utf-8"))
    assert results["output_format"] == results["test_output_format"] == "text" and HTML * 2 not in results["output"]
