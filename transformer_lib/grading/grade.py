"""Grade submissions of one exercise notebook against its instructor version.

:func:`grade` prepares every submission (check cells restored, see
:mod:`~transformer_lib.grading.prepare`), runs each in its own worker process and kernel
(:mod:`~transformer_lib.grading.runner`), in parallel over ``jobs`` threads, and scores it:
a check earns its points iff the kernel reported its cell ran without error *and* the results
it recorded match the instructor notebook's own results (run once per call through the same
runner). The reports are written by :mod:`~transformer_lib.grading.report`.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from .notebook import check_cells, dumps, grade_id, hidden_lines, read, validate
from .prepare import SubmissionError, load_submission, restore_checks
from .records import Records, compare
from .runner import RunResult, allow_runs, run_notebook, stop_all


class GradingError(RuntimeError):
    """The instructor notebook itself is broken (a check fails on the solutions)."""


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


_REFERENCE_CACHE: dict[str, dict[str, Records]] = {}


def collect(paths: list[Path | str]) -> list[Path]:
    """Files given directly, plus the ``*.ipynb`` files of folders (sorted, not recursive)."""
    found: list[Path] = []
    for p in map(Path, paths):
        found += sorted(f for f in p.glob("*.ipynb") if f.is_file()) if p.is_dir() else [p]
    return found


def _unique_names(paths: list[Path]) -> list[str]:
    names, seen = [], {}
    for p in paths:
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", p.stem).lstrip(".") or "submission"
        seen[stem] = seen.get(stem, 0) + 1
        names.append(stem if seen[stem] == 1 else f"{stem}-{seen[stem]}")
    return names


def _reference(run: RunResult, checks: list[Check]) -> dict[str, Records]:
    """The instructor run's records, after making sure every check passed on the solutions."""
    status = {e["grade_id"]: e for e in run.cells if e.get("grade_id")}
    for check in checks:
        event = status.get(check.grade_id)
        if event is None or event["status"] != "ok" or not run.records.get(check.grade_id):
            why = (f"{event['ename']}: {event['evalue']}" if event else
                   run.worker_error or "the cell did not run")
            raise GradingError(f"check {check.grade_id!r} fails on the instructor notebook: {why}")
    return run.records


def _cell_name(index: int, label: str | None) -> str:
    return f"cell {index}" + (f" ({label})" if label else "")


def _stop_reason(run: RunResult, timeout: float) -> str:
    if run.killed:
        return f"the notebook ran longer than {timeout:g} s and was stopped"
    if run.dead_at is not None:
        return f"the kernel died while running {_cell_name(run.dead_at, run.dead_label)}"
    if run.worker_error:
        return "the grader could not run the notebook"
    return "the check cell did not run"


def score(run: RunResult, checks: list[Check], reference: dict[str, Records],
          cell_timeout: float, timeout: float) -> tuple[list[CheckResult], list[str]]:
    """Score one run: per-check results and notes."""
    notes: list[str] = []
    events = {e["grade_id"]: e for e in run.cells if e.get("grade_id")}
    for e in run.cells:
        name = _cell_name(e["cell"], e.get("label"))
        if e.get("timed_out"):
            notes.append(f"{name} ran longer than {cell_timeout:g} s and was interrupted")
        if e.get("truncated"):
            notes.append(f"the output of {name} was cut to its first {len(e.get('output', ''))} characters")
    stop = _stop_reason(run, timeout)
    if run.killed or run.dead_at is not None:
        notes.append(f"{stop}; the checks after it were not run and score 0")
    if run.worker_error:
        notes.append(run.worker_error)
    results, mismatches = [], []
    for check in checks:
        event, got = events.get(check.grade_id), 0.0
        if event is None:
            message = f"not run: {stop}"
        elif event.get("timed_out"):
            message = f"timed out: the cell ran longer than {cell_timeout:g} s and was interrupted"
        elif event["status"] != "ok":
            message = f"{event['ename']}: {event['evalue']}".strip()
        else:
            mismatch = compare(run.records.get(check.grade_id, {}), reference[check.grade_id])
            if mismatch:
                message = ("the check cell ran, but the results it recorded do not match the instructor's "
                           f"({mismatch}); 0 points")
                mismatches.append(f"{check.grade_id} ({mismatch})")
            else:
                got, message = check.points, "passed"
        results.append(CheckResult(check.grade_id, got, check.points, _redact(message, check.hidden)))
    if mismatches:
        notes.append(f"the results recorded by {len(mismatches)} check(s) do not match the instructor's, "
                     f"so they score 0 (were the checks replaced?): {mismatches[0]}"
                     + (f" and {len(mismatches) - 1} more" if len(mismatches) > 1 else ""))
    return results, notes


def _redact(text: str, hidden: list[str]) -> str:
    """Remove any line that quotes the hidden tests' source."""
    keep = [line for line in text.splitlines() if not any(h in line for h in hidden if len(h) >= 8)]
    return "\n".join(keep)


def grade(instructor_path: Path | str, submissions: list[Path | str], out_dir: Path | str,
          jobs: int = 1, cell_timeout: float = 30.0, timeout: float = 300.0,
          progress: bool = True) -> list[SubmissionResult]:
    """Grade ``submissions`` (files or folders) and write the reports into ``out_dir``."""
    from .report import write_reports

    instructor = read(instructor_path)
    validate(instructor)
    checks = [Check(grade_id(c), float(c.metadata["nbgrader"]["points"]), hidden_lines(c.source))
              for _, c in check_cells(instructor)]
    all_hidden = [h for c in checks for h in c.hidden]
    paths = collect(list(submissions))
    results = [SubmissionResult(name, path) for name, path in zip(_unique_names(paths), paths)]
    jobs_to_run: dict[int, object] = {}
    for i, res in enumerate(results):
        try:
            prepared, notes = restore_checks(load_submission(res.path), instructor)
            jobs_to_run[i], res.notes = prepared, notes
        except Exception as err:  # never crash on a submission
            if not isinstance(err, SubmissionError):
                err = SubmissionError(f"unusable notebook ({type(err).__name__}: {str(err)[:200]})")
            res.notes.append(f"could not grade this file: {err}")
            res.checks = [CheckResult(c.grade_id, 0.0, c.points, f"not graded: {err}") for c in checks]
    key = hashlib.sha256(dumps(instructor).encode()).hexdigest()
    allow_runs()
    pool = cf.ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        ref_future = None if key in _REFERENCE_CACHE else pool.submit(
            run_notebook, restore_checks(instructor, instructor)[0], cell_timeout, timeout)
        futures = {pool.submit(run_notebook, nb, cell_timeout, timeout): i for i, nb in jobs_to_run.items()}
        runs = {}
        with tqdm(total=len(futures), desc="grading", unit="nb", disable=not progress) as bar:
            for fut in cf.as_completed(futures):
                runs[futures[fut]] = fut.result()
                bar.update()
        if ref_future is not None:
            _REFERENCE_CACHE[key] = _reference(ref_future.result(), checks)
    except KeyboardInterrupt:  # Ctrl-C: leave no worker or kernel behind
        pool.shutdown(wait=False, cancel_futures=True)
        stop_all()
        raise
    finally:
        pool.shutdown(wait=True)
    reference = _REFERENCE_CACHE[key]
    for i, run in runs.items():
        res = results[i]
        res.checks, notes = score(run, checks, reference, cell_timeout, timeout)
        res.notes += notes
    for res in results:  # nothing written for students may quote the hidden tests
        res.notes = [_redact(n, all_hidden) for n in res.notes]
        for c in res.checks:
            c.message = _redact(c.message, all_hidden)
    write_reports(Path(out_dir), results, checks)
    return results
