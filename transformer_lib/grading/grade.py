"""Grade submissions of one exercise notebook: prepare → run → judge → report.

1. **Prepare** (:mod:`~transformer_lib.grading.prepare.submission`,
   :mod:`~transformer_lib.grading.prepare.rules`):
   read each submission, restore the instructor's check cells, read the student's code for the
   constructs a graded notebook may not use, and give the check cells the kernel half of the
   checks. Choose the seed of this grading run's hidden inputs (random unless given).
2. **Run** (:mod:`~transformer_lib.grading.run.runner`): the instructor notebook first, alone and
   with generous limits, then each submission in its own worker process and kernel (sandboxed),
   ``jobs`` at a time. A kernel only records inputs and outcomes; it decides nothing.
3. **Judge** (:mod:`~transformer_lib.grading.judges.verdicts`): in this process, each submission's
   records against the instructor run's inputs and outcomes. The instructor run must pass its own judges.
4. **Report** (:mod:`~transformer_lib.grading.report.feedback`,
   :mod:`~transformer_lib.grading.report.classreport`).

One submission's failure, of any kind, becomes a note and a 0 for it alone. On SIGINT/SIGTERM (a
KeyboardInterrupt) the reports are still written, for what was graded so far, and
:class:`GradingInterrupted` is raised.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import re
import secrets
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from .judges.verdicts import Check, CheckResult, SubmissionResult, judge_calls, judge_run, stop_reason, zeros
from .prepare.costs import refusals
from .prepare.notebook import check_cells, grade_id, read, validate
from .prepare.submission import SubmissionError, for_kernel, load_submission, restore_checks
from .protocol import Call
from .report.classreport import REPORT_FILES, write_class_report
from .report.feedback import write_reports
from .run.procs import kill_tagged
from .run.runner import RunResult, allow_runs, run_notebook, stop_all
from .run.sandbox import MEMORY_BYTES, resolve as resolve_sandbox

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


def bans() -> dict[str, tuple[str, ...]]:
    """Per check name, the functions its exercise switches off (from the judges)."""
    from .judges import JUDGES

    return {name: spec.bans for name, spec in JUDGES.items()}


def _reference(instructor, checks: list[Check], package: str, seed: str, cell_timeout: float, timeout: float,
               prefix: str, sandboxed: bool = False, memory: int = MEMORY_BYTES) -> dict[str, list[Call]]:
    """The instructor run's records, after making sure that it passes every judge."""
    cell_limit, limit = max(4 * cell_timeout, REFERENCE_CELL_TIMEOUT), max(4 * timeout, REFERENCE_TIMEOUT)
    prepared = for_kernel(restore_checks(instructor, instructor)[0], package)
    run = run_notebook(prepared, cell_limit, limit, token_prefix=prefix, sandbox=sandboxed, memory=memory, seed=seed)
    if run.killed:
        raise GradingError(f"the instructor notebook timed out: it ran longer than {limit:g} s")
    status = {e["grade_id"]: e for e in run.cells if e["grade_id"]}
    for check in checks:
        event, calls = status.get(check.grade_id), run.records.get(check.grade_id, [])
        if event is None:
            why = run.worker_error or stop_reason(run, limit)
        elif event["timed_out"]:
            why = f"the instructor notebook timed out: the cell ran longer than {cell_limit:g} s"
        elif event["status"] != "ok":
            why = f"{event['ename']}: {event['evalue'][:300]}"
        else:
            why = judge_calls(calls, calls, compare=False)
        if why is not None:
            raise GradingError(f"check {check.grade_id!r} fails on the instructor notebook (seed {seed}): {why}")
    return run.records


def _run_all(prepared: dict[int, object], runs: dict[int, RunResult], jobs: int, cell_timeout: float,
             timeout: float, prefix: str, progress: bool, sandboxed: bool = False,
             memory: int = MEMORY_BYTES, seed: str = "", reference: dict[str, list[Call]] | None = None,
             keep: Path | None = None) -> None:
    """Run the prepared submissions, ``jobs`` at a time, filling ``runs`` as they finish; each keeps
    as many record files per check cell as the instructor's run (``reference``) wrote, in ``keep``."""
    pool = cf.ThreadPoolExecutor(max_workers=max(1, jobs))
    expected = {gid: len(calls) for gid, calls in (reference or {}).items()}
    try:
        futures = {pool.submit(run_notebook, nb, cell_timeout, timeout, token_prefix=prefix, sandbox=sandboxed,
                               memory=memory, seed=seed, expected=expected,
                               keep=keep / str(i) if keep is not None else None): i
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


def _judge_all(results: list[SubmissionResult], prepared: dict, runs: dict[int, RunResult],
               checks: list[Check], reference: dict[str, list[Call]] | None, cell_timeout: float,
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
            res.checks, notes = judge_run(runs[i], checks, reference, cell_timeout, timeout, res.costs, res.cells)
            res.notes += notes
        except Exception as err:  # one submission's bad data never stops the others
            res.checks = zeros(checks, "not graded: the grader could not judge this submission")
            res.notes.append(f"the grader could not judge this submission ({type(err).__name__}: "
                             f"{str(err)[:200]}); 0 points")


def grade(instructor_path: Path | str, submissions: list[Path | str], out_dir: Path | str,
          jobs: int = 1, cell_timeout: float = 30.0, timeout: float = 300.0,
          progress: bool = True, sandbox: str = "auto", memory: int = MEMORY_BYTES,
          seed: str | None = None) -> list[SubmissionResult]:
    """Grade ``submissions`` (files or folders) and write the reports into ``out_dir``;
    ``sandbox``: ``auto``, ``bwrap`` or ``none``; ``memory``: bytes per submission (see
    :mod:`~transformer_lib.grading.run.sandbox`); ``seed``: of the hidden inputs (random if None)."""
    sandboxed = resolve_sandbox(sandbox)
    instructor = read(instructor_path)
    validate(instructor)
    checks = [Check(grade_id(c), float(c.metadata["nbgrader"]["points"])) for _, c in check_cells(instructor)]
    paths = collect(list(submissions))
    results = [SubmissionResult(name, path) for name, path in zip(unique_names(paths), paths)]
    package, prefix = f"_grading_checks_{secrets.token_hex(8)}", f"{secrets.token_hex(8)}-"
    seed = secrets.token_hex(8) if seed is None else str(seed)
    banned = bans()
    prepared: dict[int, object] = {}
    for i, res in enumerate(results):  # 1. prepare
        try:
            nb, res.notes = restore_checks(load_submission(res.path), instructor)
            res.costs = refusals(nb, instructor, banned)
            res.cells = [c.source if c.cell_type == "code" else "" for c in nb.cells]
            prepared[i] = for_kernel(nb, package)
        except Exception as err:  # never crash on a submission
            if not isinstance(err, SubmissionError):
                err = SubmissionError(f"unusable notebook ({type(err).__name__}: {str(err)[:200]})")
            res.notes.append(f"could not grade this file: {err}")
            res.checks = zeros(checks, f"not graded: {err}")
    allow_runs()
    runs: dict[int, RunResult] = {}
    reference, got = None, []
    keep = Path(tempfile.mkdtemp(prefix="grading-records-"))  # the submissions' records, until judged
    try:
        try:  # 2. run
            reference = _reference(instructor, checks, package, seed, cell_timeout, timeout, prefix, sandboxed, memory)
            _run_all(prepared, runs, jobs, cell_timeout, timeout, prefix, progress, sandboxed, memory, seed,
                     reference, keep)
        except KeyboardInterrupt:
            got.append(signal.SIGINT)
        with _signals_deferred(got):
            kill_tagged(prefix, prefix=True)  # daemons that outlived their kernel, before any report
            _judge_all(results, prepared, runs, checks, reference, cell_timeout, timeout)  # 3. judge
            write_reports(Path(out_dir), results, checks)  # 4. report
            write_class_report(Path(out_dir), results, checks, Path(instructor_path).stem,
                               sandboxed=sandboxed, seed=seed)
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    if got:
        raise GradingInterrupted(results, len(runs) if reference is not None else 0)
    return results
