"""Score one run of a submission: per-check points, the messages a student reads, and notes.

A check earns its points iff the kernel reported its cell ran without error *and* the results
it recorded match the instructor notebook's own results. A student reads the message of a
failure only if the checks raised it (its class name carries the run's token, see
:func:`~transformer_lib.grading._checktools.failure_name`); for anything else the cell raised,
the student's code included, the feedback names the exception type and no message, so that
no text the student's code makes up (the hidden tests, encoded) reaches it.
"""
from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from pathlib import Path

from ._checktools import failure_name
from .records import Records, compare
from .runner import RunResult

_BUILTIN_ERRORS = {name for name, value in vars(builtins).items()
                   if isinstance(value, type) and issubclass(value, BaseException)}
_ERROR_HINTS = {"NameError": " (is every name the check uses defined? Run your solution cells first)"}


@dataclass
class Check:
    """One check cell of the instructor notebook."""

    grade_id: str
    points: float
    hidden: list[str]


@dataclass
class CheckResult:
    grade_id: str
    score: float
    max_score: float
    message: str


@dataclass
class SubmissionResult:
    name: str
    path: Path
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(c.score for c in self.checks)

    @property
    def max_score(self) -> float:
        return sum(c.max_score for c in self.checks)


def zeros(checks: list[Check], message: str) -> list[CheckResult]:
    """Every check scored 0 with the same message."""
    return [CheckResult(c.grade_id, 0.0, c.points, message) for c in checks]


def cell_name(index: int, label: str | None) -> str:
    return f"cell {index}" + (f" ({label})" if label else "")


def error_message(event: dict, token: str) -> str:
    """What a student reads about a check cell that raised: the checks' own message, or the type."""
    if event["ename"] == failure_name(token):
        return f"AssertionError: {event['evalue']}".strip()
    kind = event["ename"] if event["ename"] in _BUILTIN_ERRORS else "an exception"
    return (f"your code raised {kind} while the check ran{_ERROR_HINTS.get(kind, '')}; run the check cell "
            "in your notebook to see the traceback")


def stop_reason(run: RunResult, timeout: float) -> str:
    """Why a check cell of ``run`` has no result, in words for the student (shared with ``check``)."""
    if run.out_of_memory:
        return "the notebook used more memory than allowed and was stopped"
    if run.killed:
        return f"the notebook ran longer than {timeout:g} s and was stopped"
    if run.dead_at is not None:
        return f"the kernel died while running {cell_name(run.dead_at, run.dead_label)}"
    if run.worker_error:
        return "the grader could not run the notebook"
    return "the check cell did not run"


def score(run: RunResult, checks: list[Check], reference: dict[str, Records],
          cell_timeout: float, timeout: float) -> tuple[list[CheckResult], list[str]]:
    """Score one run: per-check results and notes."""
    notes: list[str] = []
    events = {e["grade_id"]: e for e in run.cells if e["grade_id"]}
    for e in run.cells:
        name = cell_name(e["cell"], e["label"])
        if e["timed_out"]:
            notes.append(f"{name} ran longer than {cell_timeout:g} s and was interrupted")
        if e["truncated"]:
            notes.append(f"the output of {name} was cut to its first {len(e['output'])} characters")
    stop = stop_reason(run, timeout)
    if run.killed or run.out_of_memory or run.dead_at is not None:
        notes.append(f"{stop}; the checks after it were not run and score 0")
    if run.worker_error:
        notes.append(run.worker_error)
    results, mismatches = [], []
    for check in checks:
        event, got = events.get(check.grade_id), 0.0
        if event is None:
            message = f"not run: {stop}"
        elif event["timed_out"]:
            message = f"timed out: the cell ran longer than {cell_timeout:g} s and was interrupted"
        elif event["status"] != "ok":
            message = error_message(event, run.token)
        else:
            mismatch = compare(run.records.get(check.grade_id, {}), reference[check.grade_id])
            if mismatch:
                message = ("the check cell ran, but the results it recorded do not match the instructor's "
                           f"({mismatch}); 0 points")
                mismatches.append(f"{check.grade_id} ({mismatch})")
            else:
                got, message = check.points, "passed"
        results.append(CheckResult(check.grade_id, got, check.points, message))
    if mismatches:
        notes.append(f"the results recorded by {len(mismatches)} check(s) do not match the instructor's, "
                     f"so they score 0 (were the checks replaced?): {mismatches[0]}"
                     + (f" and {len(mismatches) - 1} more" if len(mismatches) > 1 else ""))
    return results, notes


def redact(text: str, hidden: list[str]) -> str:
    """Remove any line that quotes the hidden tests' source (a second line of defence, applied
    by :func:`~transformer_lib.grading.grade.grade` to every message and note it reports)."""
    keep = [line for line in text.splitlines() if not any(h in line for h in hidden if len(h) >= 8)]
    return "\n".join(keep)
