"""The grading tests' one shared fixture: the short-limits grading run, started early and judged late.

The run waits most of its two minutes (a cell that loops until it is interrupted, a kernel that
ignores the interrupt until the submission's limit), so it is started in the background by the
first test that asks for it (``graded`` in test_grading_cli.py) and judged by
test_grading_time_limits.py, after the sandbox's tests: the worker that runs them (one unit,
tests/conftest.py) works meanwhile instead of waiting.
"""
from __future__ import annotations

import subprocess

import pytest

from repo_paths import REPO
from submissions.adversarial import SOURCE, time_limits
from submissions.helpers import grade_command


@pytest.fixture(scope="session")
def limits(tmp_path_factory):
    """The short-limits run, in the background; an unrelated process it must not kill. Yields what each
    submission should score, the grader's process, its output folder, the folder of its stdout and
    stderr (files: a pipe nobody reads could fill), and the unrelated process."""
    victim = subprocess.Popen(["sleep", "900"], start_new_session=True)
    subs, out = tmp_path_factory.mktemp("limits"), tmp_path_factory.mktemp("limits_out")
    logs = tmp_path_factory.mktemp("limits_logs")
    expected = time_limits(subs, victim.pid)
    # Both limits are wall-clock times, and a busy machine stretches everything. The setup cell
    # (torch's import) must stay under --cell-timeout: under load, with the main run beside this
    # one, it once took more than 10 s, and a trivial cell after it too. And loop_forever must end
    # within --timeout although its loop uses up --cell-timeout: the rest gets 100 s (with 55 s, a
    # CI run beside the main suite once lost a later check of loop_forever to the limit). The run is
    # sandboxed where bubblewrap works (as in CI): as root, its kernels are forked from a warm
    # process that has imported torch already, so the setup cell is quick even under load.
    command = grade_command(SOURCE, subs, out, "--jobs", "2", "--cell-timeout", "20", "--timeout", "120", "--quiet")
    with open(logs / "stdout", "w") as stdout, open(logs / "stderr", "w") as stderr:
        proc = subprocess.Popen(command, cwd=REPO, stdout=stdout, stderr=stderr, text=True)
    yield expected, proc, out, logs, victim
    for p in (proc, victim):
        p.kill()
        p.wait()
