"""Grade submissions of one exercise notebook against its instructor version.

:func:`grade` prepares every submission (check cells restored, see
:mod:`~transformer_lib.grading.prepare`, each loading a fresh copy of the checks, see
:mod:`~transformer_lib.grading.fresh`). It runs the instructor notebook first, alone and with
generous time limits, to get the reference results; then each submission in its own worker
process and kernel (:mod:`~transformer_lib.grading.runner`), ``jobs`` at a time; and scores
them (:mod:`~transformer_lib.grading.scoring`). One submission's failure, of any kind, becomes
a note and a 0 for it alone. On SIGINT/SIGTERM (a KeyboardInterrupt) the reports are still
written, for what was graded so far, and :class:`GradingInterrupted` is raised.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import re
import secrets
import signal
import threading
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from ._checktools import failure_name
from .classreport import REPORT_FILES, write_class_report
from .fresh import use_fresh_checks
from .notebook import check_cells, dumps, grade_id, hidden_lines, read, validate
from .prepare import SubmissionError, load_submission, restore_checks
from .procs import kill_tagged
from .records import Records
from .report import write_reports
from .runner import RunResult, allow_runs, run_notebook, stop_all
from .sandbox import MEMORY_BYTES, resolve as resolve_sandbox
from .scoring import Check, CheckResult, SubmissionResult, redact, score, zeros

__all__ = ["grade", "collect", "GradingError", "GradingInterrupted", "Check", "CheckResult",
           "SubmissionResult"]

REFERENCE_CELL_TIMEOUT, REFERENCE_TIMEOUT = 120.0, 900.0  # the instructor run's limits, at least
RESERVED = {"grades.csv", *REPORT_FILES}  # names in the output folder that are not a submission's


class GradingError(RuntimeError):
    """The instructor notebook itself is broken (a check fails on the solutions, or it times out)."""


class GradingInterrupted(Exception):
    """SIGINT/SIGTERM: the reports were written, for the ``graded`` submissions that had run."""

    def __init__(self, results: list[SubmissionResult], graded: int) -> None:
        super().__init__("grading was interrupted; the reports are partial")
        self.results, self.graded = results, graded


_REFERENCE_CACHE: dict[str, dict[str, Records]] = {}


def collect(paths: list[Path | str]) -> list[Path]:
    """Files given directly, plus the ``*.ipynb`` files of folders (sorted, not recursive)."""
    found: list[Path] = []
    for p in map(Path, paths):
        found += sorted(f for f in p.glob("*.ipynb") if f.is_file()) if p.is_dir() else [p]
    return found


def unique_names(paths: list[Path]) -> list[str]:
    """Output folder names: safe characters, distinct even ignoring case, never ``grades.csv``."""
    names: list[str] = []
    taken = {name.lower() for name in RESERVED}
    for p in paths:
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", p.stem).strip(".")[:100] or "submission"
        name, n = stem, 1
        while name.lower() in taken:
            n += 1
            name = f"{stem}-{n}"
        taken.add(name.lower())
        names.append(name)
    return names


def _reference(instructor, checks: list[Check], loader: str, cell_timeout: float, timeout: float,
               prefix: str, sandboxed: bool = False, memory: int = MEMORY_BYTES) -> dict[str, Records]:
    """The instructor run's records (cached), after making sure every check passed on the solutions."""
    key = hashlib.sha256(dumps(instructor).encode()).hexdigest()
    if key in _REFERENCE_CACHE:
        return _REFERENCE_CACHE[key]
    cell_limit, limit = max(4 * cell_timeout, REFERENCE_CELL_TIMEOUT), max(4 * timeout, REFERENCE_TIMEOUT)
    prepared = use_fresh_checks(restore_checks(instructor, instructor)[0], loader)
    run = run_notebook(prepared, cell_limit, limit, token_prefix=prefix, sandbox=sandboxed, memory=memory)
    if run.killed:
        raise GradingError(f"the instructor notebook timed out: it ran longer than {limit:g} s")
    status = {e["grade_id"]: e for e in run.cells if e["grade_id"]}
    for check in checks:
        event = status.get(check.grade_id)
        if event is None or event["status"] != "ok" or not run.records.get(check.grade_id):
            if event is not None and event["timed_out"]:
                why = f"the instructor notebook timed out: the cell ran longer than {cell_limit:g} s"
            elif event is not None:
                ename = "AssertionError" if event["ename"] == failure_name(run.token) else event["ename"]
                why = f"{ename}: {event['evalue']}"
            else:
                why = run.worker_error or ("the kernel died" if run.dead_at is not None else "the cell did not run")
            raise GradingError(f"check {check.grade_id!r} fails on the instructor notebook: {why}")
    _REFERENCE_CACHE[key] = run.records
    return run.records


def _run_all(prepared: dict[int, object], runs: dict[int, RunResult], jobs: int, cell_timeout: float,
             timeout: float, prefix: str, progress: bool, sandboxed: bool = False,
             memory: int = MEMORY_BYTES) -> None:
    """Run the prepared submissions, ``jobs`` at a time, filling ``runs`` as they finish."""
    pool = cf.ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = {pool.submit(run_notebook, nb, cell_timeout, timeout, token_prefix=prefix, sandbox=sandboxed,
                               memory=memory): i
                   for i, nb in prepared.items()}
        with tqdm(total=len(futures), desc="grading", unit="nb", disable=not progress) as bar:
            for fut in cf.as_completed(futures):
                runs[futures[fut]] = fut.result()
                bar.update()
    except KeyboardInterrupt:  # leave no worker or kernel behind
        pool.shutdown(wait=False, cancel_futures=True)
        stop_all()
        raise
    finally:
        pool.shutdown(wait=True)


@contextlib.contextmanager
def _signals_deferred(got: list[int]) -> Iterator[None]:
    """While the reports are written, SIGINT/SIGTERM are only noted in ``got``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _score_all(results: list[SubmissionResult], prepared: dict, runs: dict[int, RunResult],
               checks: list[Check], reference: dict[str, Records] | None, cell_timeout: float,
               timeout: float) -> None:
    for i, res in enumerate(results):
        if i not in prepared:
            continue  # not a usable notebook: already scored 0 with a note
        if i not in runs or reference is None:
            res.checks = zeros(checks, "not graded: the grading run was interrupted")
            res.notes.append("not graded: the grading run was interrupted before this submission was graded "
                             "(partial report)")
            continue
        try:
            res.checks, notes = score(runs[i], checks, reference, cell_timeout, timeout)
            res.notes += notes
        except Exception as err:  # one submission's bad data never stops the others
            res.checks = zeros(checks, "not graded: the grader could not score this submission")
            res.notes.append(f"the grader could not score this submission ({type(err).__name__}: "
                             f"{str(err)[:200]}); 0 points")


def grade(instructor_path: Path | str, submissions: list[Path | str], out_dir: Path | str,
          jobs: int = 1, cell_timeout: float = 30.0, timeout: float = 300.0,
          progress: bool = True, sandbox: str = "auto", memory: int = MEMORY_BYTES) -> list[SubmissionResult]:
    """Grade ``submissions`` (files or folders) and write the reports into ``out_dir``;
    ``sandbox``: ``auto``, ``bwrap`` or ``none``; ``memory``: bytes per submission (see
    :mod:`~transformer_lib.grading.sandbox`)."""
    sandboxed = resolve_sandbox(sandbox)
    instructor = read(instructor_path)
    validate(instructor)
    checks = [Check(grade_id(c), float(c.metadata["nbgrader"]["points"]), hidden_lines(c.source))
              for _, c in check_cells(instructor)]
    paths = collect(list(submissions))
    results = [SubmissionResult(name, path) for name, path in zip(unique_names(paths), paths)]
    loader, prefix = f"_grading_checks_{secrets.token_hex(8)}", f"{secrets.token_hex(8)}-"
    prepared: dict[int, object] = {}
    for i, res in enumerate(results):
        try:
            nb, res.notes = restore_checks(load_submission(res.path), instructor)
            prepared[i] = use_fresh_checks(nb, loader)
        except Exception as err:  # never crash on a submission
            if not isinstance(err, SubmissionError):
                err = SubmissionError(f"unusable notebook ({type(err).__name__}: {str(err)[:200]})")
            res.notes.append(f"could not grade this file: {err}")
            res.checks = zeros(checks, f"not graded: {err}")
    allow_runs()
    runs: dict[int, RunResult] = {}
    reference, got = None, []
    try:
        reference = _reference(instructor, checks, loader, cell_timeout, timeout, prefix, sandboxed, memory)
        _run_all(prepared, runs, jobs, cell_timeout, timeout, prefix, progress, sandboxed, memory)
    except KeyboardInterrupt:
        got.append(signal.SIGINT)
    with _signals_deferred(got):
        kill_tagged(prefix, prefix=True)  # daemons that outlived their kernel, before any report
        _score_all(results, prepared, runs, checks, reference, cell_timeout, timeout)
        all_hidden = [h for c in checks for h in c.hidden]
        for res in results:  # nothing written for students may quote the hidden tests
            res.notes = [redact(n, all_hidden) for n in res.notes]
            for c in res.checks:
                c.message = redact(c.message, all_hidden)
        write_reports(Path(out_dir), results, checks)
        write_class_report(Path(out_dir), results, checks, Path(instructor_path).stem, all_hidden)
    if got:
        raise GradingInterrupted(results, len(runs) if reference is not None else 0)
    return results
