"""The autograder end to end, through its command line, on adversarial submissions.

The main run uses generous limits (120 s per cell), so that a busy machine cannot make a correct
submission time out. It covers a correct and a blank submission, a kernel that dies, edited and
deleted check cells, checks monkeypatched (module attributes, or ``sys.modules``) to call the
real checks with correct answers, a million printed lines, warnings, a hard-coded visible
answer, the hidden tests smuggled into the feedback (plain, reversed, base64, as a class name),
forged events, daemons, files that are not notebooks and output names that collide; it and the
run a submission stops by SIGTERM use ``--sandbox none``. A run with short limits, started
first in the background (``limits`` in conftest.py: it mostly waits), covers the time limits and a
forged ``kernel_pid``; it is judged in test_grading_time_limits.py, after the sandbox's tests.
(Every notebook, correct, blank and attacked, is graded sandboxed in test_grading_notebooks.py.)
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import psutil
import pytest

from repo_paths import REPO
from submissions.adversarial import FULL, GRADE_IDS, SOURCE, build, sigterm
from submissions.helpers import grade_command, grades
GENEROUS = ("--cell-timeout", "120", "--timeout", "600")
UNSANDBOXED = ("--sandbox", "none")  # the defences that hold without bubblewrap (the sandbox: test_grading_sandbox.py)


def _grade(subs, out, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(grade_command(SOURCE, subs, out, *args), cwd=REPO, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def graded(tmp_path_factory, limits):  # the short-limits run (conftest.py) starts first, and waits beside this file
    subs, out = tmp_path_factory.mktemp("submissions"), tmp_path_factory.mktemp("out")
    pid_file = tmp_path_factory.mktemp("daemons") / "pids"
    expected = build(subs, pid_file)
    result = _grade(subs, out, "--jobs", "2", *GENEROUS, *UNSANDBOXED)
    assert result.returncode == 0, result.stderr[-3000:]
    return expected, grades(out), out, result, pid_file


def test_progress_bar_and_summary(graded):
    _, _, out, result, _ = graded
    assert "grading: 100%" in result.stderr  # the tqdm progress bar
    assert f"reports written to {out}" in result.stdout


def test_grades_csv_has_one_row_per_submission_and_one_column_per_check(graded):
    expected, rows, _, _, _ = graded
    assert set(rows) == set(expected)
    assert list(next(iter(rows.values()))) == ["submission", *GRADE_IDS, "total", "max", "notes"]
    assert all(row["max"] == str(FULL) for row in rows.values())


@pytest.mark.parametrize("name", ["correct", "blank", "kernel_dies", "print_million_lines", "warnings",
                                  "hard_coded", "exfiltrate_hidden_tests", "monkeypatch_checks",
                                  "monkeypatch_sys_modules", "forged_events", "daemons", "check_edited_to_pass",
                                  "check_deleted", "not_json", "json_not_notebook"])
def test_each_submission_gets_the_right_score_and_note(graded, name):
    expected, rows, _, _, _ = graded
    score, note = expected[name]
    row = rows[name]
    assert float(row["total"]) == score, f"{name}: {row}"
    if note is None:
        assert row["notes"] == "", f"{name}: unexpected notes {row['notes']!r}"
    else:
        assert note in row["notes"], f"{name}: {note!r} not in {row['notes']!r}"


def test_scores_per_check(graded):
    _, rows, _, _, _ = graded
    assert rows["kernel_dies"]["check_stable_softmax"] == "2" and rows["kernel_dies"]["check_attention"] == "0"
    assert rows["hard_coded"]["check_score_std"] == "0"
    assert rows["check_edited_to_pass"]["check_stable_softmax"] == "0"
    assert rows["check_deleted"]["check_masked_attention"] == "0"
    for name in ("monkeypatch_checks", "monkeypatch_sys_modules"):  # the check cells use fresh checks
        assert {rows[name][g] for g in GRADE_IDS} == {"0"}, rows[name]


def test_refused_code_still_runs_and_is_judged_for_the_record(graded):
    """forged_events and daemons use what the grader refuses (before the first exercise: every check scores
    0); their notebooks ran all the same, and every check passed but for what the kernel's watch noted (the
    daemons' fork: from there on, no check can trust the kernel)."""
    _, _, out, _, _ = graded
    for name in ("forged_events", "daemons"):
        tests = json.loads((out / name / "results.json").read_text(encoding="utf-8"))["tests"]
        assert all(t["score"] == 0 and "the grader refuses" in t["output"]
                   and ("(judged without regard to that: passed)" in t["output"]
                        or "the grader's watch noted" in t["output"]) for t in tests), (name, tests)
    monkeypatched = json.loads((out / "monkeypatch_checks" / "results.json").read_text(encoding="utf-8"))["tests"]
    assert all("from transformer_lib.grading import checks as _c" in t["output"] for t in monkeypatched)


def test_output_names_never_collide(graded):
    _, rows, out, _, _ = graded
    collided = {"grades.csv-2", "a_b", "a_b-2", "a_b-3"}  # grades.csv.ipynb, a b, a_b-2, a_b
    assert collided <= set(rows) and (out / "grades.csv").is_file()
    assert all((out / name / "results.json").is_file() for name in collided)


def test_results_json_is_gradescope_format(graded):
    expected, _, out, _, _ = graded
    for name in expected:
        data = json.loads((out / name / "results.json").read_text(encoding="utf-8"))
        assert set(data) == {"score", "output", "output_format", "test_output_format", "tests"}
        assert data["score"] == expected[name][0] and data["output_format"] == "text"  # shown as it is
        assert [t["name"] for t in data["tests"]] == GRADE_IDS
        for t in data["tests"]:
            assert set(t) == {"name", "score", "max_score", "status", "output", "visibility"}
            assert t["status"] == ("passed" if t["score"] == t["max_score"] else "failed")


def test_feedback_shows_check_messages_but_never_hidden_tests(graded):
    expected, _, out, _, _ = graded
    for name in expected:
        text = (out / name / "feedback.md").read_text(encoding="utf-8")
        assert "checks.check_" not in text and "hidden=" not in text, f"{name}: a check cell in the feedback"
        assert not re.search(r"[A-Za-z0-9+/]{40,}", text), f"{name}: an encoded blob in the feedback"
    exfiltrated = (out / "exfiltrate_hidden_tests" / "feedback.md").read_text(encoding="utf-8")
    assert exfiltrated.count("your code raised AssertionError while the check ran") == 3
    assert "your code raised an exception while the check ran" in exfiltrated  # a made-up class name
    hard = (out / "hard_coded" / "feedback.md").read_text(encoding="utf-8")
    assert "a hidden test (other inputs) fails: score_std(#) is not right" in hard
    assert "expected" not in hard.split("check_score_std")[1] and "got" not in hard.split("check_score_std")[1]
    blank = (out / "blank" / "feedback.md").read_text(encoding="utf-8")
    assert "not implemented yet" in blank and f"Score: 0 / {FULL}" in blank


def test_the_class_report_counts_every_submission_and_lists_the_refused_code(graded):
    expected, rows, out, _, _ = graded
    text = (out / "class_report.md").read_text(encoding="utf-8")
    assert "checks.check_" not in text and "without a sandbox" in text
    refused = text.split("## Refused constructs")[1].split("###")[0]
    for name in ("forged_events", "daemons", "monkeypatch_checks", "kernel_dies", "exfiltrate_hidden_tests"):
        assert f"| {name} |" in refused, name
    assert "| correct |" not in refused and "| warnings |" not in refused
    passed = sum(row["check_stable_softmax"] == "2" for row in rows.values())
    assert f"| `check_stable_softmax` | 2 | {passed} of {len(expected)} |" in text


def test_no_process_outlives_the_grading_run(graded):
    """Daemons (setsid, an empty environment, a double fork) are killed before the reports are written."""
    pids = [int(line) for line in graded[4].read_text().split()]
    assert len(pids) == 3, pids  # the daemons did start

    def alive(pid: int) -> bool:
        try:
            proc = psutil.Process(pid)
            return proc.status() != psutil.STATUS_ZOMBIE and proc.cmdline()[:1] in (["sleep"], [sys.executable])
        except psutil.Error:
            return False

    deadline = time.monotonic() + 5
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)]


def test_sigterm_writes_partial_reports(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    sigterm(subs)
    result = _grade(subs, out, "--jobs", "1", "--quiet", *GENEROUS, *UNSANDBOXED)
    assert result.returncode == 130, result.stderr[-3000:]
    assert "partial reports written" in result.stderr and "1 of 2 submissions graded" in result.stderr
    rows = grades(out)
    assert (rows["a_correct"]["total"], rows["a_correct"]["notes"]) == (str(FULL), "")
    assert rows["b_sigterm"]["total"] == "0" and "interrupted" in rows["b_sigterm"]["notes"]
    assert "interrupted" in (out / "b_sigterm" / "feedback.md").read_text(encoding="utf-8")
