"""Judge a run: the third step of grading (prepare → run → judge → report), in the grader's process.

Nothing the kernel decided is trusted. A check earns its points iff

- its cell recorded one call per call of the instructor's run, of the same check, each with one
  outcome per case (a cell that ran "without error" but recorded nothing earns nothing);
- the check's judge (:mod:`transformer_lib.grading.judges`) accepts every outcome on the
  **instructor's** inputs (the inputs of the submission's own records are not used), and on the
  judge's ``compare`` outputs the outcome equals the instructor's;
- its cell ran to its end without an error;
- the grader's reading of the source refused nothing that costs it its points
  (:mod:`~transformer_lib.grading.prepare.rules`), and the watch in the kernel noted nothing (a banned
  function, code run while the result was read, a namespace of torch's changed, …: the outcome
  says so, with the line of the notebook's code it happened on, which :func:`caught` finds).

The message of a failure on a hidden test names the misconception only
(:func:`~transformer_lib.grading.judges.common.render`). Notes say what happened to the run (time limits, the kernel dying,
check cells restored).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..prepare.rules import Refusal
from ..protocol import BUILTIN_ERRORS, Call, CheckFailed
from ..report.escaping import cap
from ..run.runner import RunResult
from . import render, verdict


@dataclass
class Check:
    """One check cell of the instructor notebook."""

    grade_id: str
    points: float


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
    costs: dict[str, list[Refusal]] = field(default_factory=dict)  # grade_id -> refused constructs
    cells: list[str] = field(default_factory=list, repr=False)  # the code cells' sources, to place the watch's notes

    @property
    def refused(self) -> list[Refusal]:
        """Every refused construct of the submission, once, in notebook order."""
        found = {(r.cell, r.line, r.code): r for rs in self.costs.values() for r in rs}
        return [found[k] for k in sorted(found)]

    @property
    def total(self) -> float:
        return sum(c.score for c in self.checks)

    @property
    def max_score(self) -> float:
        return sum(c.max_score for c in self.checks)


def describe(refusal: Refusal) -> str:
    """A refused construct in words, its code (the student's text) capped."""
    where = f"cell {refusal.cell + 1}" if refusal.cell >= 0 else "a cell"
    return f"{where}, line {refusal.line}: `{cap(refusal.code, 120)}` — {cap(refusal.reason, 200)}"


def zeros(checks: list[Check], message: str) -> list[CheckResult]:
    """Every check scored 0 with the same message."""
    return [CheckResult(c.grade_id, 0.0, c.points, message) for c in checks]


def cell_name(index: int, label: str | None) -> str:
    return f"cell {index}" + (f" ({cap(label, 40)})" if label else "")


def stop_reason(run: RunResult, timeout: float) -> str:
    """Why a check cell of ``run`` has no result, in words for the student (shared with ``check``)."""
    if run.out_of_memory:
        return "the notebook used more memory than allowed and was stopped"
    if run.out_of_disk:
        return "the notebook wrote more to the grader's disk than allowed and was stopped"
    if run.killed:
        return f"the notebook ran longer than {timeout:g} s and was stopped"
    if run.dead_at is not None:
        return f"the kernel died while running {cell_name(run.dead_at, run.dead_label)}"
    if run.worker_error:
        return "the grader could not run the notebook"
    return "the check cell did not run"


def cell_error(ename: str) -> str:
    """What a student reads about a check cell that raised before its checks recorded anything:
    the exception's type if it is a built-in one (never a message the kernel made up)."""
    kind = ename if ename in BUILTIN_ERRORS else "an exception"
    hint = " (is every name the check uses defined? Run your solution cells first)" if kind == "NameError" else ""
    return (f"the check cell raised {kind} before the check could record a result{hint}; run the check cell in "
            "your notebook to see the traceback")


RUNTIME = {"banned", "library", "lookup", "thread", "unwatched", "capture", "tampered"}  # what the watch notes
_RUNTIME_REASONS = {"banned": "calls {detail}, which this exercise switches off", "library": "calls the course library "
                    "({detail})", "lookup": "looks rows up ({detail})", "thread": "runs code in another thread",
                    "unwatched": "switches the check's watch off",
                    "capture": "runs code of its own while the check reads the result", "tampered": "{detail}"}


def caught(calls: Sequence[Call | None], cells: list[str]) -> list[Refusal]:
    """What the watch in the kernel noted in these calls, each as a refused construct at the cell
    (of ``cells``, the submission's sources) and line where it happened, once per place."""
    found: dict[tuple[int, int], Refusal] = {}
    for call in calls:
        for out in (call.outs if call is not None else []):
            code = out.get("error")
            if code not in RUNTIME:
                continue
            where = out.get("where") if isinstance(out.get("where"), list) else []
            line = where[0] if where and type(where[0]) is int else 0
            text = where[1].strip()[:200] if len(where) > 1 and isinstance(where[1], str) else ""
            cell = next((i for i, source in enumerate(cells) if text and 0 < line <= len(source.splitlines())
                         and source.splitlines()[line - 1].strip() == text), -1)
            detail = out.get("detail") if isinstance(out.get("detail"), str) else ""
            reason = "noted at run time: " + _RUNTIME_REASONS[code].format(detail=detail[:200])
            found.setdefault((cell, line), Refusal(cell, line, text or "(code the grader could not place)", reason))
    return list(found.values())


def judge_calls(got: Sequence[Call | None], expected: list[Call], compare: bool = True) -> str | None:
    """None if the recorded calls ``got`` pass every judge on the inputs of ``expected`` (the
    instructor's calls; with ``compare``, also equal to its outcomes where the judge says), else the
    message a student reads."""
    if not expected:
        return "the check recorded nothing to judge"
    for i, ref in enumerate(expected):
        call = got[i] if i < len(got) else None
        if call is None or call.check != ref.check or len(call.outs) != len(ref.outs):
            return "the check cell finished without recording a result for every test, so there is nothing to judge"
        for case, out, ref_out in zip(ref.cases, call.outs, ref.outs):
            try:
                verdict(ref.check, case, out, ref_out if compare else None)
            except CheckFailed as err:
                return render(str(err), bool(ref.hidden), case.get("inputs"))
    return None


def judge_run(run: RunResult, checks: list[Check], reference: dict[str, list[Call]], cell_timeout: float,
              timeout: float, costs: dict[str, list[Refusal]] | None = None,
              cells: list[str] | None = None) -> tuple[list[CheckResult], list[str]]:
    """Per-check results and notes of one run; what the watch noted is added to ``costs``."""
    notes: list[str] = []
    events = {e["grade_id"]: e for e in run.cells if e["grade_id"]}
    for e in run.cells:
        name = cell_name(e["cell"], e["label"])
        if e["timed_out"]:
            notes.append(f"{name} ran longer than {cell_timeout:g} s and was interrupted")
        if e["truncated"]:
            notes.append(f"the output of {name} was cut to its first {len(e['output'])} characters")
    stop = stop_reason(run, timeout)
    if run.killed or run.out_of_memory or run.out_of_disk or run.dead_at is not None:
        notes.append(f"{stop}; the checks after it were not run and score 0")
    if run.worker_error:
        notes.append(run.worker_error)
    results = []
    for check in checks:
        event = events.get(check.grade_id)
        if event is None:
            failure = f"not run: {stop}"
        elif event["timed_out"]:
            failure = f"timed out: the cell ran longer than {cell_timeout:g} s and was interrupted"
        else:
            calls = run.records.get(check.grade_id, [])
            failure = judge_calls(calls, reference[check.grade_id])
            if event["status"] != "ok":  # a cell that did not finish: its records may not all be its own
                failure = cell_error(event["ename"])
            if costs is not None:  # what the watch noted, where the grader's reading refused nothing
                known = {(r.cell, r.line) for r in costs.get(check.grade_id, [])}
                costs[check.grade_id] = costs.get(check.grade_id, []) + [
                    r for r in caught(calls, cells or []) if (r.cell, r.line) not in known]
        refused = (costs or {}).get(check.grade_id, [])
        if refused:  # judged all the same, so that the student (and the instructor) see what it did
            message = (f"0 points: the grader refuses {describe(refused[0])}"
                       + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else "")
                       + f"\n(judged without regard to that: {failure or 'passed'})")
            results.append(CheckResult(check.grade_id, 0.0, check.points, message))
        else:
            results.append(CheckResult(check.grade_id, check.points if failure is None else 0.0, check.points,
                                       failure or "passed"))
    return results, notes
