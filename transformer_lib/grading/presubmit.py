"""The pre-submit check: run a student's notebook the way the grader will, visible checks only.

``python -m transformer_lib.grading check exercises/NN_topic.ipynb`` goes through the grader's
steps with the visible checks only: it prepares the notebook as ``grade`` does
(:func:`~transformer_lib.grading.prepare.submission.load_submission`, the check cells restored, here from
the student version, so without the hidden tests; the kernel half of the checks in each check
cell), reads the code for the constructs the grader refuses
(:mod:`~transformer_lib.grading.prepare.rules`), runs it top to bottom in a fresh kernel in a worker
process with the grader's default limits (:func:`~transformer_lib.grading.run.runner.run_notebook`),
judges the records in this process (:mod:`~transformer_lib.grading.judges.verdicts`), and prints per check
"passed" or the message the grader's feedback would give. It then warns about what a student
needs to know before handing in, judged by what happened in the fresh run:

- a cell that raised (the grader runs on past it, but what it defines is missing), and for a
  ``NameError`` the cell further down that defines the name;
- a cell that ran without error, or a check that passed, in the saved notebook but not in the
  fresh run: the notebook depends on the order its cells were run in;
- a saved notebook whose execution counts do not increase top to bottom;
- check cells that were edited, deleted or duplicated (the grader restores them);
- a cell or the whole notebook over the time limit, the kernel dying.

The grader also compares the outcomes with the instructor run's on its hidden inputs; that is
not repeated here. A student copy (:mod:`~transformer_lib.grading.student`) judges by its stored values.
"""
from __future__ import annotations

import copy
import inspect
import re
import secrets
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from nbformat import NotebookNode

from .grade import bans, grade
from .judges.verdicts import cell_error, judge_calls, stop_reason
from .prepare.costs import defined_names, refusals
from .prepare.notebook import check_cells, grade_id, read, release
from .prepare.rules import Refusal
from .prepare.submission import for_kernel, load_submission, restore_checks
from .run.procs import kill_tagged
from .run.runner import RunResult, run_notebook
from .student import RELEASED, in_copy

__all__ = ["CheckOutcome", "PresubmitReport", "default_source", "prepare_visible", "presubmit", "format_report",
           "LIMITS"]

LIMITS = {name: inspect.signature(grade).parameters[name].default for name in ("cell_timeout", "timeout")}
REPO = Path(__file__).resolve().parents[2]
_ORIGIN = "_presubmit_origin"  # a cell's index in the saved notebook, while the checks are restored
WIDTH = 100  # characters per printed line
_NAME_ERROR = re.compile(r"name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")


@dataclass
class CheckOutcome:
    """One visible check in the fresh run: passed, or the message the grader's feedback would give."""

    grade_id: str
    points: float
    passed: bool
    message: str


@dataclass
class PresubmitReport:
    """What :func:`presubmit` found: one outcome per visible check, the warnings; ``stored``: judged by a
    student copy's stored expected values."""

    path: Path
    checks: list[CheckOutcome] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cell_timeout: float = 0.0
    timeout: float = 0.0
    stored: bool = False

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks) and not self.warnings


def default_source(path: Path) -> Path:
    """The instructor notebook of a student notebook: ``exercises/source/<same name>`` of the course the
    library belongs to, else (a student copy) the notebook as released, else ``source/<same name>``."""
    name = Path(path).name
    for candidate in (REPO / "exercises" / "source" / name, RELEASED / name, Path(path).parent / "source" / name):
        if candidate.is_file():
            return candidate
    kind, where = ("released", RELEASED) if in_copy() else ("instructor", REPO / "exercises" / "source")
    raise FileNotFoundError(f"no {kind} notebook {name} in {where}: is the notebook named as the course named it "
                            "(NN_topic.ipynb)? Or give it with --source")


def _snippet(cell: dict) -> str:
    lines = [ln.strip() for ln in str(cell.get("source", "")).splitlines() if ln.strip()]
    code = [ln for ln in lines if not ln.startswith("#")] or lines or [""]
    text = code[0]
    return text if len(text) <= 40 else text[:39] + "…"


def _saved_error(cell: dict) -> bool:
    return any(out.get("output_type") == "error" for out in cell.get("outputs", []) or [])


def _saved_passed_check(cell: dict) -> bool:
    """The saved outputs show a passing check: its ✓ line and no error."""
    outputs = cell.get("outputs", []) or []
    text = "".join(str(out.get("text", "")) for out in outputs if out.get("output_type") == "stream")
    return "✓" in text and not _saved_error(cell)


def _order_warning(saved: NotebookNode) -> str | None:
    """A warning if the saved execution counts do not increase from top to bottom."""
    runs = [(i, c.get("execution_count")) for i, c in enumerate(saved.cells)
            if c.get("cell_type") == "code" and isinstance(c.get("execution_count"), int)]
    inversions = [(a, b) for a, b in zip(runs, runs[1:]) if b[1] < a[1]]
    if not inversions:
        return None
    (i, n), (j, m) = inversions[0]
    return (f"your saved notebook was not run top to bottom: cell {j + 1} ran as In\u00a0[{m}], before cell {i + 1} "
            f"above it (In\u00a0[{n}])"
            + (f", and {len(inversions) - 1} more such place(s)" if len(inversions) > 1 else "")
            + "; the grader runs every cell once, in order, in a fresh kernel (see the warnings below for what that "
            "changes)")


def prepare_visible(submission: NotebookNode, instructor: NotebookNode
                    ) -> tuple[NotebookNode, list[str], list[int | None], dict[str, list[Refusal]]]:
    """The notebook the grader would run, with the visible checks only; the repair notes; for each
    of its cells the index of the cell in the saved notebook it came from (None: inserted); and per
    check the constructs the grader refuses that cost it its points."""
    tagged = copy.deepcopy(submission)
    for i, cell in enumerate(tagged.cells):
        cell.setdefault("metadata", {})[_ORIGIN] = i
    nb, notes = restore_checks(tagged, release(instructor))
    origin = [cell.metadata.pop(_ORIGIN, None) for cell in nb.cells]
    saved_checks = {}
    for i, cell in enumerate(submission.cells):
        saved_checks.setdefault(grade_id(cell), i)
    origin = [saved_checks.get(grade_id(cell)) if where is None and grade_id(cell) else where
              for where, cell in zip(origin, nb.cells)]
    costs = refusals(nb, instructor, bans())
    for found in costs.values():  # name the cells as the saved notebook numbers them
        for r in found:
            r.cell = origin[r.cell] if origin[r.cell] is not None else r.cell
    return for_kernel(nb), notes, origin, costs


def _cell_warnings(run: RunResult, nb: NotebookNode, saved: NotebookNode, origin: list[int | None],
                   failed: set[str]) -> list[str]:
    """Warnings about the cells that raised in the fresh run, and the checks (grade ids ``failed``)
    that failed in it although they passed in the saved notebook."""
    checks = {e["cell"] for e in run.cells if e["grade_id"]}

    def name(index: int) -> str:
        label = f"check cell {grade_id(nb.cells[index])}" if index in checks else f'"{_snippet(nb.cells[index])}"'
        return f"cell {origin[index] + 1} ({label})" if origin[index] is not None else label

    def saved_cell(index: int) -> dict:
        return saved.cells[origin[index]] if origin[index] is not None else {}

    def saved_as(index: int) -> str:
        count = saved_cell(index).get("execution_count")
        return f" (In\u00a0[{count}])" if isinstance(count, int) else ""

    def ran_ok(index: int) -> bool:  # in the saved notebook
        return isinstance(saved_cell(index).get("execution_count"), int) and not _saved_error(saved_cell(index))

    warnings, raised = [], []
    for e in run.cells:
        i = e["cell"]
        if e["grade_id"] in failed and e["ename"] != "NameError" and _saved_passed_check(saved_cell(i)):
            warnings.append(f"{name(i)} passed in your saved notebook{saved_as(i)} but fails in a fresh run: "
                            "it depends on the order your cells ran in, or on cells since changed or deleted")
            continue
        if e["timed_out"] or e["status"] == "ok":
            continue
        raised.append(i)
        if i in checks and e["ename"] != "NameError":  # its line in the list of checks gives the error
            continue
        if e["ename"] == "NotImplementedError" and i not in checks:
            warnings.append(f"{name(i)} is not done yet: it raises NotImplementedError")
            continue
        first = (e["evalue"].splitlines() or [""])[0]
        text = f"{name(i)} raised {e['ename']}" + (f": {first}" if first else "")
        match = _NAME_ERROR.search(e["evalue"]) if e["ename"] == "NameError" else None
        if match:
            var = match.group(1)
            defines = [j for j, c in enumerate(nb.cells) if c.cell_type == "code" and var in defined_names(c.source)]
            below = [j for j in defines if j > i]
            if below and not [j for j in defines if j < i]:
                text += f"; '{var}' is defined only further down, in {name(below[0])}{saved_as(below[0])}"
                text += (": it worked in your session because you ran that cell first" if ran_ok(below[0]) else "")
                text += ". Move the definition above its first use"
            elif not defines:
                text += f"; no cell defines '{var}'"
                earlier = [j for j in raised if j < i]
                if ran_ok(i):
                    text += " any more: it came from a cell you changed or deleted after running it"
                elif earlier:
                    text += f" (did {name(earlier[-1])}, which raised, not get to define it?)"
        elif i not in checks:
            text += ("; the grader runs on past a cell that raises, but whatever the cell should define is missing "
                     "for the cells and checks after it")
        if ran_ok(i):
            text += (f". In your saved notebook this cell ran without error{saved_as(i)}: it depends on the order "
                     "your cells ran in, or on cells since changed or deleted")
        warnings.append(text)
    return warnings


def presubmit(path: Path | str, source: Path | str | None = None, cell_timeout: float = LIMITS["cell_timeout"],
              timeout: float = LIMITS["timeout"]) -> PresubmitReport:
    """Run the student notebook at ``path`` as the grader will, with the visible checks only."""
    path = Path(path)
    instructor = read(source or default_source(path))
    saved = load_submission(path)
    nb, notes, origin, costs = prepare_visible(saved, instructor)
    prefix = f"{secrets.token_hex(8)}-"
    try:
        run = run_notebook(nb, cell_timeout, timeout, token_prefix=prefix)
    finally:
        kill_tagged(prefix, prefix=True)
    report = PresubmitReport(path, seconds=run.seconds, cell_timeout=cell_timeout, timeout=timeout, stored=in_copy())
    events = {e["grade_id"]: e for e in run.cells if e["grade_id"]}
    stop = stop_reason(run, timeout)
    if run.dead_at is not None and not run.killed:  # name the cell as the saved notebook numbers it
        where = origin[run.dead_at] if 0 <= run.dead_at < len(origin) else None
        stop = "the kernel died" + (f" while running cell {where + 1}" if where is not None else "")
    for _, cell in check_cells(instructor):
        gid, points = grade_id(cell), float(cell.metadata["nbgrader"]["points"])
        event, calls = events.get(gid), run.records.get(gid, [])
        if costs.get(gid):
            found = costs[gid]
            outcome = CheckOutcome(gid, points, False, f"0 points: the grader refuses {found[0]}"
                                   + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""))
        elif event is None:
            outcome = CheckOutcome(gid, points, False, f"not run: {stop}")
        elif event["timed_out"]:
            outcome = CheckOutcome(gid, points, False, f"timed out: the cell ran longer than {cell_timeout:g} s and "
                                                       "was interrupted")
        elif not calls and event["status"] != "ok":  # the student's own error: on their machine, say which
            message = cell_error(event["ename"])
            outcome = CheckOutcome(gid, points, False,
                                   f"{message}\n{event['ename']}: {(event['evalue'].splitlines() or [''])[0]}")
        else:
            failure = judge_calls(calls, calls, compare=False)
            outcome = CheckOutcome(gid, points, failure is None, failure or "passed")
        report.checks.append(outcome)
    order = _order_warning(saved)
    report.warnings += [order] if order else []
    report.warnings += notes
    report.warnings += _cell_warnings(run, nb, saved, origin, {c.grade_id for c in report.checks if not c.passed})
    for e in run.cells:
        if e["timed_out"]:
            where = origin[e["cell"]]
            label = f"cell {where + 1} " if where is not None else ""
            report.warnings.append(f"{label}(\"{_snippet(nb.cells[e['cell']])}\") "
                                   f"ran longer than the grader's {cell_timeout:g} s per cell and was interrupted")
    if run.killed or run.dead_at is not None or run.worker_error:
        report.warnings.append(f"{stop}; the checks after it were not run and would score 0"
                               + (f" ({run.worker_error[:300]})" if run.worker_error else ""))
    elif run.seconds > timeout / 2:
        report.warnings.append(f"the notebook took {run.seconds:.0f} s, more than half of the grader's limit of "
                               f"{timeout:g} s: on a busier machine it may be stopped")
    return report


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False) or [first]


def format_report(report: PresubmitReport) -> str:
    """The text the ``check`` command prints (lines of at most ``WIDTH`` characters, where words allow)."""
    lines = _wrap(f"Checking {report.path} as the grader will: in a fresh kernel, every cell once from top to "
                  f"bottom, at most {report.cell_timeout:g} s per cell and {report.timeout:g} s in all; visible "
                  "checks only (the grader adds hidden tests).", "", "")
    lines += _wrap("This is a student copy: the visible checks are judged against the expected values of their "
                   "examples, stored when it was made; the grader's judges, which also name the likely misconception, "
                   "run when your notebook is graded.", "", "") * report.stored + [""]
    for c in report.checks:
        mark = "✓" if c.passed else "✗"
        pts = f"{c.points:g} point{'s' if c.points != 1 else ''}"
        body = c.message.splitlines() or [""]
        lines += _wrap(f"{c.grade_id} ({pts}): {body[0]}", f"{mark} ", "    ")
        lines += [f"    {ln}" for ln in body[1:]]
    passed = [c for c in report.checks if c.passed]
    lines += [""] + _wrap(f"{len(passed)} of {len(report.checks)} visible checks pass "
                          f"({sum(c.points for c in passed):g} of {sum(c.points for c in report.checks):g} points, "
                          f"if the hidden tests agree); the notebook ran in {report.seconds:.1f} s.", "", "")
    if report.warnings:
        lines += ["", f"{len(report.warnings)} warning(s):"]
        for w in report.warnings:
            lines += _wrap(w, "! ", "  ")
    else:
        lines += ["", "No warnings: the notebook runs from top to bottom as it is."]
    return "\n".join(lines)
