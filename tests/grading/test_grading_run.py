"""The grading run around the checks: events and records read as hostile data, output names, what
feedback may show, the kernels' environment and processes, and the orchestration of a run (the
instructor notebook first, interrupts, failures confined to one submission), with a fake runner
(returning the instructor's own records) where no kernel is needed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from repo_paths import REPO
from submissions.adversarial import FULL
from submissions.helpers import as_handed_in, records_of
from transformer_lib.grading import grade as grade_module
from transformer_lib.grading.protocol import RECORD_ENV, SEED_ENV, TOKEN_ENV
from transformer_lib.grading.judges.common import error_message
from transformer_lib.grading.grade import (CheckResult, GradingError, GradingInterrupted, SubmissionResult, grade,
                                           unique_names)
from transformer_lib.grading.judges.verdicts import Check, cell_error
from transformer_lib.grading.prepare.notebook import check_cells, dumps, grade_id, read
from transformer_lib.grading.run.procs import kernel_env, kill_tagged
from transformer_lib.grading.protocol import load_calls
from transformer_lib.grading.report.feedback import write_reports
from transformer_lib.grading.run.runner import RunResult, _read_events

SOURCE = REPO / "exercises" / "source" / "02_building_up_attention.ipynb"


def test_events_are_type_checked_and_only_the_last_line_says_how_the_run_ended(tmp_path):
    nb = read(SOURCE)
    first = check_cells(nb)[0][0]
    lines = ["[1]", "not json", {"cell": 0, "status": "ok"}, {"cell": 10**30}, {"cell": True},
             {"cell": first, "grade_id": "check_attention", "status": "ok", "ename": 7, "timed_out": "yes"},
             {"cell": first}, {"dead": 3}, {"done": True}]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines), encoding="utf-8")
    result = RunResult()
    _read_events(path, nb, result, 100)
    assert [(e["cell"], e["grade_id"], e["status"], e["ename"], e["timed_out"]) for e in result.cells] == \
           [(first, grade_id(nb.cells[first]), "ok", "", False), (first, grade_id(nb.cells[first]), "error", "", False)]
    assert result.finished and result.dead_at is None


def test_events_and_records_are_read_only_from_regular_files(tmp_path):
    """A kernel could replace them by a FIFO (the grader would block) or a link to the grader's files."""
    import threading

    nb = read(SOURCE)
    real = tmp_path / "real.jsonl"
    real.write_text(json.dumps({"cell": check_cells(nb)[0][0], "status": "ok"}) + "\n" + json.dumps({"done": True}))
    os.mkfifo(tmp_path / "fifo.jsonl")
    (tmp_path / "link.jsonl").symlink_to(real)
    (tmp_path / "records").mkdir()
    os.mkfifo(tmp_path / "records" / "00-x.npz")
    results = {}

    def read_all() -> None:
        for name in ("real", "fifo", "link"):
            run = RunResult()
            _read_events(tmp_path / f"{name}.jsonl", nb, run, 100)
            results[name] = (len(run.cells), run.finished)
        results["records"] = load_calls(tmp_path / "records")

    thread = threading.Thread(target=read_all, daemon=True)
    thread.start()
    thread.join(10)
    assert results == {"real": (1, True), "fifo": (0, False), "link": (0, False), "records": []}


def test_output_names_are_unique_and_never_grades_csv():
    files = ["grades.csv.ipynb", "GRADES.CSV.ipynb", "a b.ipynb", "a_b.ipynb", "a_b-2.ipynb", "A_B.ipynb",
             "..ipynb", "x/.hidden.ipynb", f"{'n' * 300}.ipynb"]
    names = unique_names([Path(f) for f in files])
    assert len({n.lower() for n in names}) == len(files) and "grades.csv" not in {n.lower() for n in names}
    assert all(0 < len(n) < 110 and not n.startswith(".") for n in names)


def test_feedback_never_shows_text_the_kernel_made_up():
    """What the kernel records about an error is a code and a name: the message is the grader's."""
    assert "ValueError" in error_message({"error": "raised", "detail": "ValueError"}, "f(x)")
    message = error_message({"error": "raised", "detail": "the hidden input was 42; expected: 7!"}, "f(x)")
    assert "42" in message and " " not in message.split("raised ")[1].split(" ")[0]  # one identifier at most
    assert error_message({"error": "made up", "detail": "x"}, "f(x)") == "f(x) returned nothing the check could judge"
    assert "NameError" in cell_error("NameError") and "Secret" not in cell_error("Secret_text_of_the_kernel")


def test_the_kernel_gets_a_minimal_environment(monkeypatch):
    """Neither the record folder nor the seed: they reach the check cells alone, through the watch."""
    monkeypatch.setenv("GRADER_ONLY_SECRET", "x")
    monkeypatch.setenv(SEED_ENV, "the grading seed")
    env = kernel_env("tok")
    assert "GRADER_ONLY_SECRET" not in env and env["PATH"] == os.environ["PATH"]
    assert (env[TOKEN_ENV], env["HF_HUB_OFFLINE"]) == ("tok", "1") and RECORD_ENV not in env and SEED_ENV not in env


def test_kill_tagged_kills_only_the_processes_with_the_token():
    procs = [subprocess.Popen(["sleep", "60"], env={**os.environ, TOKEN_ENV: token})
             for token in ("run1-a", "run2-a")]
    try:
        for proc in procs:  # wait until each runs sleep (with its own environment)
            while psutil.Process(proc.pid).cmdline()[:1] != ["sleep"]:
                time.sleep(0.01)
        assert kill_tagged("run1-", prefix=True) == 1
        assert procs[0].wait(timeout=5) == -9 and procs[1].poll() is None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ the grading run, with a fake runner

_RECORDS: dict = {}


def _instructor_records() -> dict:
    if not _RECORDS:
        _RECORDS.update(records_of(read(SOURCE)))
    return _RECORDS


def _passing_run(nb, *args, **kwargs) -> RunResult:
    """What a run of ``nb`` reports if every check passes: the instructor's own records."""
    run = RunResult(token="fake")
    for i, cell in check_cells(nb):
        gid = grade_id(cell)
        run.cells.append({"cell": i, "grade_id": gid, "label": gid, "status": "ok", "ename": "", "evalue": "",
                          "output": "", "timed_out": False, "truncated": False})
        run.records[gid] = _instructor_records()[gid]
    return run


@pytest.fixture
def two_submissions(tmp_path):
    text = dumps(as_handed_in(read(SOURCE)))
    paths = [tmp_path / "a.ipynb", tmp_path / "b.ipynb"]
    for path in paths:
        path.write_text(text, encoding="utf-8")
    return paths


def test_the_instructor_notebook_runs_first_alone_with_its_own_limits(two_submissions, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(grade_module, "run_notebook",
                        lambda nb, cell, limit, **kw: calls.append((cell, limit)) or _passing_run(nb))
    results = grade(SOURCE, two_submissions, tmp_path / "out", jobs=2, cell_timeout=5, timeout=10, progress=False)
    assert calls == [(120.0, 900.0), (5, 10), (5, 10)] and [r.total for r in results] == [FULL, FULL]


def test_an_interrupt_writes_partial_reports(two_submissions, tmp_path, monkeypatch):
    calls: list = []

    def run(nb, *args, **kwargs):
        calls.append(nb)
        if len(calls) == 3:  # the instructor notebook, a, then b is interrupted
            raise KeyboardInterrupt
        return _passing_run(nb)

    monkeypatch.setattr(grade_module, "run_notebook", run)
    with pytest.raises(GradingInterrupted) as info:
        grade(SOURCE, two_submissions, tmp_path / "out", jobs=1, progress=False)
    a, b = info.value.results
    assert (a.total, a.notes, b.total, info.value.graded) == (FULL, [], 0, 1)
    assert "interrupted" in b.notes[0] and "interrupted" in (tmp_path / "out" / "grades.csv").read_text()


def test_a_failure_while_judging_one_submission_gives_it_a_note_and_0(two_submissions, tmp_path, monkeypatch):
    real, calls = grade_module.judge_run, []

    def judge_run(run, *args):
        calls.append(run)
        if len(calls) == 1:
            raise KeyError("boom")
        return real(run, *args)

    monkeypatch.setattr(grade_module, "run_notebook", _passing_run)
    monkeypatch.setattr(grade_module, "judge_run", judge_run)
    a, b = grade(SOURCE, two_submissions, tmp_path / "out", progress=False)
    assert (a.total, b.total) == (0, FULL) and "could not judge this submission (KeyError" in a.notes[0]


def test_a_report_that_cannot_be_written_gives_a_note_and_0(tmp_path):
    (tmp_path / "alice").write_text("a file where the folder should go")
    results = [SubmissionResult(n, Path(f"{n}.ipynb"), [CheckResult("a", 1, 1, "passed")]) for n in ("alice", "bob")]
    write_reports(tmp_path, results, [Check("a", 1.0)])
    rows = (tmp_path / "grades.csv").read_text().splitlines()
    assert rows[1].startswith("alice,0,0,1,") and "could not be written" in rows[1] and rows[2] == "bob,1,1,1,"


def test_an_instructor_notebook_that_times_out_is_reported_as_such(tmp_path, monkeypatch):
    nb = read(SOURCE)
    nb.cells.insert(2, nbformat.v4.new_code_cell("import time\ntime.sleep(300)"))
    (tmp_path / "slow.ipynb").write_text(dumps(nb), encoding="utf-8")
    monkeypatch.setattr(grade_module, "REFERENCE_TIMEOUT", 4.0)
    with pytest.raises(GradingError, match="the instructor notebook timed out"):
        grade(tmp_path / "slow.ipynb", [], tmp_path / "out", cell_timeout=100, timeout=1, progress=False)


@pytest.mark.parametrize("failures", [1, 2])
def test_a_run_whose_kernel_did_not_start_is_run_once_more(monkeypatch, failures):
    """A worker that fails before the first cell (as when a kernel cannot start on a busy machine) is
    started again once: the second run's result stands, and a third is never started."""
    from transformer_lib.grading.run import runner

    real, started = runner._run_worker, []

    def flaky(argv, *args, **kwargs):
        started.append(argv)
        if len(started) <= failures:
            argv = [sys.executable, "-c", "import sys; sys.stderr.write('no kernel today'); sys.exit(3)"]
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(runner, "_run_worker", flaky)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 6 * 7\nprint(x)")])
    result = runner.run_notebook(nb, cell_timeout=60, timeout=120)
    assert len(started) == 2
    if failures == 1:
        assert result.finished and not result.worker_error and result.cells[0]["output"].strip() == "42", result
    else:
        assert not result.cells and "worker exited with status 3: no kernel today" in result.worker_error, result


def test_a_run_that_finished_a_cell_or_hit_a_limit_is_not_run_again():
    from transformer_lib.grading.run.runner import never_started

    cell = {"cell": 0, "status": "error"}
    assert never_started(RunResult(worker_error="worker exited with status 1")) and never_started(RunResult(dead_at=0))
    assert not never_started(RunResult(cells=[cell], dead_at=1)) and not never_started(RunResult(finished=True))
    assert not never_started(RunResult(killed=True, dead_at=0))
    assert not never_started(RunResult(out_of_memory=True, worker_error="x"))
    assert not never_started(RunResult(out_of_disk=True, dead_at=0))
