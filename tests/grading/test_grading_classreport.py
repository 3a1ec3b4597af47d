"""The class report: misconceptions counted by message class, the score histogram, how the run was
made, the refused code; and, end to end, a folder of known-wrong submissions whose report counts
exactly the misconceptions planted in it."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

from repo_paths import REPO  # noqa: E402
from submissions.helpers import as_handed_in, run_inprocess, substitute  # noqa: E402
from submissions.wrong import WRONG  # noqa: E402
from transformer_lib.grading.report.classreport import (class_report_markdown, histogram, message_class,  # noqa: E402
                                                 summarise, write_class_report)
from transformer_lib.grading.grade import bans, unique_names  # noqa: E402
from transformer_lib.grading.judges.verdicts import Check, CheckResult, SubmissionResult  # noqa: E402
from transformer_lib.grading.prepare.notebook import check_cells, dumps, grade_id, read  # noqa: E402
from transformer_lib.grading.prepare.submission import restore_checks  # noqa: E402
from transformer_lib.grading.prepare.costs import refusals  # noqa: E402
from transformer_lib.grading.prepare.rules import Refusal  # noqa: E402

STEM = "02_building_up_attention"
SOURCE = REPO / "exercises" / "source" / f"{STEM}.ipynb"
PLANTED = ["softmax over the wrong axis", "softmax via torch.softmax", "softmax via logsumexp",
           "softmax via torch.softmax, torch function modes switched off", "attention missing 1/sqrt(d_k)",
           "score std hard-coded to the visible answer"]  # a few, to keep the run short


def _result(name: str, outcomes: dict[str, str], checks: list[Check]) -> SubmissionResult:
    return SubmissionResult(name, Path(f"{name}.ipynb"), [
        CheckResult(c.grade_id, 0.0 if c.grade_id in outcomes else c.points, c.points,
                    outcomes.get(c.grade_id, "passed"))
        for c in checks])


def test_the_message_class_is_the_first_line_with_numbers_replaced():
    assert message_class("AssertionError: did you forget to divide by √d_k = √8?\n  expected: [1, 2]") == \
        message_class("AssertionError: did you forget to divide by √d_k = √4?\n  expected: [3]") == \
        "did you forget to divide by √d_k = √#?"
    assert message_class("A: wrong entries (2 of 9), S[0, 1] = −4.5, 1e-09") == \
        "A: wrong entries (# of #), S[#, #] = #, #"
    assert message_class("the values W_V1 and LN2 differ") == "the values W_V1 and LN2 differ"  # names keep digits
    assert message_class("") == "(no message)"


def test_misconceptions_are_counted_per_check_and_sorted_by_frequency():
    checks = [Check("check_a", 2.0), Check("check_b", 1.0)]
    axis = "AssertionError: softmax over the wrong axis (dim={})\n  expected: 1\n  got:      {}"
    results = [_result("s1", {"check_a": axis.format(0, 3)}, checks),
               _result("s2", {"check_a": axis.format(1, 5), "check_b": "AssertionError: forgot √d_k"}, checks),
               _result("s3", {"check_a": "AssertionError: overflow"}, checks),
               _result("s4", {}, checks)]
    a, b = summarise(results, checks)
    assert (a.passed, a.submissions, [(m.text, m.count) for m in a.misconceptions]) == \
           (1, 4, [("softmax over the wrong axis (dim=0)", 2), ("overflow", 1)])
    assert (b.passed, [(m.text, m.count) for m in b.misconceptions]) == (3, [("forgot √d_k", 1)])
    text = class_report_markdown("ex", results, checks)
    assert "softmax over the wrong axis (dim=0): **2 of 4**" in text
    assert text.index("softmax over the wrong axis") < text.index("overflow")


def test_the_histogram_has_one_bar_per_point():
    rows = histogram([0, 3, 3, 12, 11.5], 12)
    assert len(rows) == 14 and rows[4].split() == ["3", "█" * 40, "2"] and rows[1].split() == ["0", "█" * 20, "1"]
    assert rows[12].split()[-1] == "1" and rows[13].split()[-1] == "1" and rows[2].split() == ["1", "0"]
    assert len(histogram([0, 30], 30)) == 11  # ten bins above 20 points


def test_the_report_says_how_the_run_was_made_lists_refused_code_and_keeps_the_table_intact(tmp_path):
    checks = [Check("check_a", 1.0)]
    results = [_result("s1", {"check_a": "0 points: the grader refuses …"}, checks),
               _result("s2", {"check_a": "AssertionError: |x| | y is off"}, checks)]
    results[0].costs = {"check_a": [Refusal(3, 2, "import threading", "threads are out of bounds")]}
    write_class_report(tmp_path, results, checks, "ex", sandboxed=False, seed="abc123")
    text = (tmp_path / "class_report.md").read_text(encoding="utf-8")
    assert "\\|x\\| \\| y is off" in text
    assert "**without a sandbox**" in text and "seed `abc123`" in text
    assert "| s1 | cell 4, line 2 | import threading — threads are out of bounds |" in text and "| s2 |" not in \
        text.split("## Refused constructs")[1]


def test_report_names_are_reserved():
    names = unique_names([Path("class_report.md.ipynb"), Path("class_report.csv.ipynb")])
    assert not {"class_report.md", "class_report.csv"} & {n.lower() for n in names}


# ------------------------------------------------------------------ end to end

@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Grade a folder of known-wrong chapter 2 submissions and a correct one, through the command line."""
    nb = read(SOURCE)
    subs, out = tmp_path_factory.mktemp("planted"), tmp_path_factory.mktemp("planted_out")
    expected: dict[str, Counter] = {grade_id(c): Counter() for _, c in check_cells(nb)}
    for i, name in enumerate(PLANTED):
        edits, caught_by, _ = WRONG[STEM][name]
        wrong = substitute(nb, edits)
        (subs / f"wrong{i}.ipynb").write_text(dumps(as_handed_in(wrong)), encoding="utf-8")
        failures = {g: e for g, e in run_inprocess(wrong).items() if e}  # the checks run in-process, hidden tests too
        assert set(failures) == caught_by, name
        refused = refusals(restore_checks(wrong, nb)[0], nb, bans())  # the grader reads the source first
        for gid, message in failures.items():
            if refused[gid]:
                more = len(refused[gid]) - 1
                message = f"0 points: the grader refuses {refused[gid][0]}" + (f" (and {more} more)" if more else "")
            elif "hidden test" not in message:
                message = message.removeprefix("AssertionError: ")
            expected[gid][message_class(message)] += 1
    (subs / "correct.ipynb").write_text(dumps(as_handed_in(nb)), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "transformer_lib.grading", "grade", str(SOURCE), str(subs),
                             "--out", str(out), "--jobs", "2", "--quiet", "--cell-timeout", "120", "--timeout", "600"],
                            cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "class_report.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return expected, rows, (out / "class_report.md").read_text(encoding="utf-8")


def test_the_counts_equal_the_misconceptions_planted(planted):
    expected, rows, _ = planted
    got: dict[str, Counter] = {gid: Counter() for gid in expected}
    for row in rows:
        assert row["submissions"] == str(len(PLANTED) + 1)
        assert int(row["passed"]) == len(PLANTED) + 1 - sum(expected[row["check"]].values()), row
        if row["misconception"]:
            got[row["check"]][message_class(row["misconception"])] += int(row["count"])
    assert got == expected


def test_the_report_reads_as_the_instructor_needs_it(planted):
    _, rows, text = planted
    softmax = [(r["misconception"], int(r["count"])) for r in rows if r["check"] == "check_stable_softmax"]
    assert sum(m.startswith("0 points: the grader refuses") for m, _ in softmax) == 3, softmax
    assert [c for _, c in softmax] == sorted((c for _, c in softmax), reverse=True)  # the most frequent first
    assert "| `check_stable_softmax` | 2 | 3 of 7 |" in text and "## Scores" in text and "```text" in text
    assert "a hidden test (other inputs) fails: score_std(#) is not right" in text  # never the hidden inputs
    assert "## Refused constructs" in text
