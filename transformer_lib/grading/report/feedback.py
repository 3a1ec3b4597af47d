"""Write the grading reports: ``grades.csv``, and per submission a Gradescope-style
``results.json`` and a Markdown ``feedback.md``.

Layout of the output folder::

    grades.csv                   one row per submission: name, one column per grade_id, total, max, notes
    <name>/results.json          score, output, tests[] (name, score, max_score, status, output, visibility)
    <name>/feedback.md           the score, the notes and each check's message for the student

Messages are the judges' (see :mod:`~transformer_lib.grading.judges.verdicts`); for an error of the
student's code only its type is given, and a hidden test's message shows neither its inputs nor
its expected value. If a submission's files cannot be written, it scores 0 with a note in
``grades.csv``, and the other submissions are not affected.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from ..judges.verdicts import Check, SubmissionResult, zeros
from .escaping import cap, csv_field, markdown

MAX_MESSAGE = 2000
MAX_NOTE = 600


def _fmt(x: float) -> str:
    return f"{x:g}"


def results_json(result: SubmissionResult) -> dict:
    """The Gradescope autograder ``results.json`` of one submission."""
    tests = [{"name": c.grade_id, "score": c.score, "max_score": c.max_score,
              "status": "passed" if c.score == c.max_score else "failed",
              "output": cap(c.message, MAX_MESSAGE, lines=True), "visibility": "visible"} for c in result.checks]
    summary = f"Score {_fmt(result.total)} / {_fmt(result.max_score)}."
    if result.notes:
        summary += "\nNotes:\n" + "\n".join(f"- {cap(n, MAX_NOTE)}" for n in result.notes)
    return {"score": result.total, "output": summary, "output_format": "text", "test_output_format": "text",
            "tests": tests}


def feedback_markdown(result: SubmissionResult) -> str:
    """The feedback a student reads: score, notes, then each check's outcome and message."""
    lines = [f"# Feedback: {result.name}", "",
             f"**Score: {_fmt(result.total)} / {_fmt(result.max_score)}**", ""]
    if result.notes:
        lines += ["## Notes", ""] + [f"- {markdown(n, MAX_NOTE)}" for n in result.notes] + [""]
    lines += ["## Checks", ""]
    for c in result.checks:
        mark = "✓" if c.score == c.max_score else "✗"
        lines += [f"### {mark} `{c.grade_id}`: {_fmt(c.score)} / {_fmt(c.max_score)}", ""]
        if c.message != "passed":
            lines += ["```text", cap(c.message, MAX_MESSAGE, lines=True).replace("```", "'''"), "```", ""]
    return "\n".join(lines)


def write_reports(out_dir: Path, results: list[SubmissionResult], checks: list[Check]) -> None:
    """Write the per-submission files, then grades.csv, into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in results:
        try:
            folder = out_dir / r.name
            folder.mkdir(exist_ok=True)
            (folder / "results.json").write_text(json.dumps(results_json(r), indent=1, ensure_ascii=False),
                                                 encoding="utf-8")
            (folder / "feedback.md").write_text(feedback_markdown(r), encoding="utf-8")
        except Exception as err:  # one submission's report never stops the others
            r.checks = zeros(checks, "not graded: the report could not be written")
            r.notes.append(f"its report could not be written ({type(err).__name__}: {str(err)[:200]}); 0 points")
    with open(out_dir / "grades.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["submission", *[c.grade_id for c in checks], "total", "max", "notes"])
        for r in results:
            scores = {c.grade_id: _fmt(c.score) for c in r.checks}
            writer.writerow([r.name, *[scores.get(c.grade_id, "0") for c in checks],
                             _fmt(r.total), _fmt(sum(c.points for c in checks)),
                             csv_field(" | ".join(cap(n, MAX_NOTE) for n in r.notes))])
