"""The autograder end to end, through its command line, on adversarial submissions.

One grading run (``--jobs 2 --cell-timeout 10``) covers: a correct and a blank submission, an
infinite loop, a kernel that dies, an edited and a deleted check cell, checks monkeypatched
to no-ops (with a faked record file), a million printed lines, warnings, a hard-coded visible
answer and two files that are not notebooks. A second, short run hits the notebook time limit.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from repo_paths import REPO
from submissions.adversarial import SOURCE, build, ignores_interrupts
from transformer_lib.grading.notebook import check_cells, grade_id, hidden_lines, read

GRADE_IDS = [grade_id(c) for _, c in check_cells(read(SOURCE))]


def _grade(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformer_lib.grading", "grade", str(SOURCE), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp("submissions")
    expected = build(subs)
    out = tmp_path_factory.mktemp("out")
    result = _grade(str(subs), "--out", str(out), "--jobs", "2", "--cell-timeout", "10", "--timeout", "90")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = {row["submission"]: row for row in csv.DictReader(fh)}
    return expected, rows, out, result


def test_progress_bar_and_summary(graded):
    _, _, out, result = graded
    assert "grading: 100%" in result.stderr  # the tqdm progress bar
    assert f"reports written to {out}" in result.stdout


def test_grades_csv_has_one_row_per_submission_and_one_column_per_check(graded):
    expected, rows, _, _ = graded
    assert set(rows) == set(expected)
    assert list(next(iter(rows.values()))) == ["submission", *GRADE_IDS, "total", "max", "notes"]
    assert all(row["max"] == "12" for row in rows.values())


@pytest.mark.parametrize("name", ["correct", "blank", "loop_forever", "kernel_dies", "print_million_lines",
                                  "warnings", "hard_coded", "exfiltrate_hidden_tests", "monkeypatch_checks", "check_edited_to_pass",
                                  "check_deleted", "not_json", "json_not_notebook"])
def test_each_submission_gets_the_right_score_and_note(graded, name):
    expected, rows, _, _ = graded
    score, note = expected[name]
    row = rows[name]
    assert float(row["total"]) == score, f"{name}: {row}"
    if note is None:
        assert row["notes"] == "", f"{name}: unexpected notes {row['notes']!r}"
    else:
        assert note in row["notes"], f"{name}: {note!r} not in {row['notes']!r}"


def test_scores_per_check(graded):
    _, rows, _, _ = graded
    assert rows["loop_forever"]["check_stable_softmax"] == "0"
    assert rows["kernel_dies"]["check_stable_softmax"] == "2" and rows["kernel_dies"]["check_attention"] == "0"
    assert rows["hard_coded"]["check_score_std"] == "0"
    assert rows["check_edited_to_pass"]["check_stable_softmax"] == "0"
    assert rows["check_deleted"]["check_masked_attention"] == "0"


def test_results_json_is_gradescope_format(graded):
    expected, _, out, _ = graded
    for name in expected:
        data = json.loads((out / name / "results.json").read_text(encoding="utf-8"))
        assert set(data) == {"score", "output", "tests"} and data["score"] == expected[name][0]
        assert [t["name"] for t in data["tests"]] == GRADE_IDS
        for t in data["tests"]:
            assert set(t) == {"name", "score", "max_score", "status", "output", "visibility"}
            assert t["status"] == ("passed" if t["score"] == t["max_score"] else "failed")


def test_feedback_shows_check_messages_but_never_hidden_tests(graded):
    expected, _, out, _ = graded
    hidden = [h for _, c in check_cells(read(SOURCE)) for h in hidden_lines(c.source) if len(h) >= 8]
    for name in expected:
        text = (out / name / "feedback.md").read_text(encoding="utf-8")
        leaked = [h for h in hidden if h in text]
        assert not leaked, f"{name}: hidden tests in the feedback: {leaked}"
    exfiltrated = (out / "exfiltrate_hidden_tests" / "feedback.md").read_text(encoding="utf-8")
    assert "checks.check_score_std(score_std)" in exfiltrated  # the visible line is not secret
    hard = (out / "hard_coded" / "feedback.md").read_text(encoding="utf-8")
    assert "AssertionError: score_std(1) is not right" in hard and "expected: 1." in hard
    blank = (out / "blank" / "feedback.md").read_text(encoding="utf-8")
    assert "not implemented yet" in blank and "Score: 0 / 12" in blank


def test_notebook_time_limit_kills_a_kernel_that_ignores_interrupts(tmp_path):
    sub = ignores_interrupts(tmp_path)
    out = tmp_path / "out"
    result = _grade(str(sub), "--out", str(out), "--cell-timeout", "3", "--timeout", "12", "--jobs", "2", "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    row = next(csv.DictReader(open(out / "grades.csv", newline="", encoding="utf-8")))
    assert "ran longer than 12 s and was stopped" in row["notes"]
    assert row["check_hand_qkv"] == "1" and row["check_attention"] == "0"


def test_chapter_1_correct_and_blank(tmp_path):
    from submissions.helpers import as_handed_in
    from transformer_lib.grading.notebook import dumps, release

    source = REPO / "exercises" / "source" / "01_data_independent_weights.ipynb"
    nb = read(source)
    (tmp_path / "right.ipynb").write_text(dumps(as_handed_in(nb)), encoding="utf-8")
    (tmp_path / "blank.ipynb").write_text(dumps(release(nb)), encoding="utf-8")
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "transformer_lib.grading", "grade", str(source),
                             str(tmp_path / "right.ipynb"), str(tmp_path / "blank.ipynb"), "--out", str(out),
                             "--jobs", "2", "--cell-timeout", "10", "--quiet"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["submission"]: r for r in csv.DictReader(open(out / "grades.csv", newline="", encoding="utf-8"))}
    assert (rows["right"]["total"], rows["blank"]["total"], rows["right"]["max"]) == ("4", "0", "4")
    assert rows["right"]["notes"] == "" and rows["blank"]["notes"] == ""
