"""The class report: what a whole class got wrong, per check, for the instructor.

Every ``grade`` run writes, next to ``grades.csv``::

    class_report.md    per check: how many submissions passed, and the misconceptions the
                       failing ones hit, most frequent first; the score distribution as a
                       text histogram
    class_report.csv   one row per (check, misconception): check, points, submissions,
                       passed, misconception, count

A misconception is counted by its **message class**: the first line of the message the
student reads (the check's own misconception sentence; expected and actual values follow on
later lines), with numbers replaced by ``#`` so that the same mistake made on other inputs, or
with other wrong values, counts once (:func:`message_class`). The report shows the most
common wording of each class. It is built only from the messages the students' feedback
already shows (a hidden test's message never shows its inputs or expected values).

It also says how the run was made (sandboxed or not, the seed of the hidden inputs, with which
the run can be repeated) and lists the submissions whose code used a construct the grader
refuses (:mod:`~transformer_lib.grading.prepare.rules`), with the place and the construct, so that the
instructor can look at them.
"""
from __future__ import annotations

import csv
import re
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..judges.verdicts import Check, SubmissionResult, describe
from .escaping import csv_field, markdown

__all__ = ["message_class", "Misconception", "CheckSummary", "summarise", "histogram", "class_report_markdown",
           "write_class_report", "REPORT_FILES"]

REPORT_FILES = ("class_report.md", "class_report.csv")
_PREFIX = "AssertionError: "
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+−]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_MAX_TEXT = 300
_BAR = 40  # characters of the longest histogram bar


def _first_line(message: str) -> str:
    text = message.strip()
    text = text[len(_PREFIX):] if text.startswith(_PREFIX) else text
    line = text.splitlines()[0].strip() if text else ""
    return (line[:_MAX_TEXT] + " …") if len(line) > _MAX_TEXT else (line or "(no message)")


def message_class(message: str) -> str:
    """The key a failure is counted by: the message's first line, numbers replaced by ``#``.

    >>> message_class("AssertionError: did you forget to divide the scores by √d_k = √8?\\n  expected: 1")
    'did you forget to divide the scores by √d_k = √#?'
    """
    return _NUMBER.sub("#", _first_line(message))


@dataclass
class Misconception:
    """One message class of one check: the most common wording, and how many submissions hit it."""

    text: str
    count: int


@dataclass
class CheckSummary:
    grade_id: str
    points: float
    submissions: int
    passed: int
    misconceptions: list[Misconception]


def summarise(results: list[SubmissionResult], checks: list[Check]) -> list[CheckSummary]:
    """Per check, the passes and the failures' message classes, most frequent first."""
    summaries = []
    for check in checks:
        outcomes = [c for r in results for c in r.checks if c.grade_id == check.grade_id]
        failed = [c for c in outcomes if c.score < c.max_score]
        counts: Counter[str] = Counter()
        wordings: dict[str, Counter[str]] = {}
        for c in failed:
            text = _first_line(c.message)
            key = _NUMBER.sub("#", text)
            counts[key] += 1
            wordings.setdefault(key, Counter())[text] += 1
        ranked = sorted(counts, key=lambda k: (-counts[k], k))
        summaries.append(CheckSummary(check.grade_id, check.points, len(results), len(outcomes) - len(failed),
                                      [Misconception(wordings[k].most_common(1)[0][0], counts[k]) for k in ranked]))
    return summaries


def _fmt(x: float) -> str:
    return f"{x:g}"


def _points(x: float) -> str:
    return f"{x:g} point{'' if x == 1 else 's'}"


def histogram(totals: list[float], max_score: float) -> list[str]:
    """A text histogram of the scores: one bar per whole point (ten bins above 20 points)."""
    if max_score <= 20:
        edges = [float(p) for p in range(int(max_score) + 1)]
        labels = [_fmt(p) for p in edges]
    else:
        step = max_score / 10
        edges = [i * step for i in range(10)]
        labels = [f"{_fmt(round(e, 1))}–{_fmt(round(e + step, 1))}" for e in edges]
    counts = [0] * len(edges)
    for t in totals:
        i = max((j for j, e in enumerate(edges) if t >= e - 1e-9), default=0)
        counts[i] += 1
    width, peak = max([len("score")] + [len(label) for label in labels]), max(counts + [1])
    rows = [f"{'score'.rjust(width)}  submissions"]
    for label, n in zip(labels, counts):
        bar = "█" * round(_BAR * n / peak) if n else ""
        rows.append(f"{label.rjust(width)}  {bar}{' ' if bar else ''}{n}")
    return rows


def _cell(text: str) -> str:
    """Text that stays inside one Markdown table cell, shown as it is."""
    return markdown(text, _MAX_TEXT + 2)


def class_report_markdown(title: str, results: list[SubmissionResult], checks: list[Check],
                          sandboxed: bool = True, seed: str = "") -> str:
    """The Markdown class report of one exercise notebook."""
    n, max_score = len(results), sum(c.points for c in checks)
    totals = [r.total for r in results]
    summaries = summarise(results, checks)
    how = "in the sandbox" if sandboxed else "**without a sandbox** (student code ran as the grader's user)"
    lines = [f"# Class report: {title}", "",
             f"{n} submission(s), {len(checks)} check(s), {_fmt(max_score)} points. A misconception is "
             "the first line of the message a failing check gave (numbers in it may differ between "
             "submissions).", "",
             f"Graded {how}; hidden inputs drawn with seed `{seed}` "
             "(`--seed` repeats them).", "", "## Scores", ""]
    if totals:
        lines += [f"Mean {statistics.mean(totals):.1f}, median {_fmt(statistics.median(totals))} of "
                  f"{_fmt(max_score)}; {sum(t == max_score for t in totals)} full score(s).", ""]
    lines += ["```text", *histogram(totals, max_score), "```", "", "## Checks", "",
              "| check | points | passed | misconceptions hit |", "|---|---|---|---|"]
    for s in summaries:
        lines.append(f"| `{s.grade_id}` | {_fmt(s.points)} | {s.passed} of {n} | {len(s.misconceptions)} |")
    everything = sorted(((m.count, s.grade_id, m.text) for s in summaries for m in s.misconceptions),
                        key=lambda x: (-x[0], x[1], x[2]))
    if everything:
        lines += ["", "## Misconceptions, most frequent first", "", "| submissions | check | misconception |",
                  "|---|---|---|"]
        lines += [f"| {count} of {n} | `{gid}` | {_cell(text)} |" for count, gid, text in everything]
    refused = [r for r in results if r.refused]
    if refused:
        lines += ["", "## Refused constructs", "",
                  f"{len(refused)} submission(s) used code the grader refuses; the checks of the exercise it is in, "
                  "and of the exercises after it, scored 0. Worth a look:", "",
                  "| submission | where | construct |", "|---|---|---|"]
        lines += [f"| {_cell(r.name)} | {_cell(describe(x).partition(': ')[0])} | {markdown(x.code, 120)} — "
                  f"{markdown(x.reason, 200)} |" for r in refused for x in r.refused]
    for s in summaries:
        lines += ["", f"### `{s.grade_id}` ({_points(s.points)}): {s.passed} of {n} passed", ""]
        if s.misconceptions:
            lines += [f"- {_cell(m.text)}: **{m.count} of {n}**" for m in s.misconceptions]
        else:
            lines.append("No failures.")
    return "\n".join(lines) + "\n"


def write_class_report(out_dir: Path, results: list[SubmissionResult], checks: list[Check], title: str,
                       sandboxed: bool = True, seed: str = "") -> None:
    """Write ``class_report.md`` and ``class_report.csv`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / REPORT_FILES[0]).write_text(class_report_markdown(title, results, checks, sandboxed, seed), encoding="utf-8")
    with open(out_dir / REPORT_FILES[1], "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["check", "points", "submissions", "passed", "misconception", "count"])
        for s in summarise(results, checks):
            base = [s.grade_id, _fmt(s.points), s.submissions, s.passed]
            for m in s.misconceptions or [Misconception("", 0)]:
                writer.writerow([*base, csv_field(m.text), m.count])
