"""The sandbox, end to end: chapter 2 submissions that attack the grader's machine.

One run with ``--sandbox bwrap`` (as root: once with warm sandboxes, once with a fresh one per
submission) grades a correct and a blank submission and one submission per
attack (see ``submissions/sandbox_attacks.py``): reading the instructor notebook, reading
another submission, reading the judges in the library's folder, a TCP connection to a server this test opens on 127.0.0.1, writing into
the repository and $HOME, SIGTERM to the grader, a fork bomb, a 64 GB allocation, and several
processes that together hold more memory than allowed. The grader's reading of the source refuses
the code of most of them (exercise 2.2 scores 0), but it still runs: the sandbox must stop it, and
the run-time watch notes it as well. A run with ``--sandbox none``
grades the attacks that are harmless without a sandbox, and they succeed there: the attacks are
real. Without a working bubblewrap these tests are skipped, unless GRADING_SANDBOX_REQUIRED=1 (as
in CI).
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time

import psutil
import pytest

from repo_paths import REPO
from submissions import sandbox_attacks as attacks
from submissions.adversarial import FULL, SOURCE
from submissions.helpers import as_handed_in, grade_command, grades
from transformer_lib.grading.run import sandbox, slots
from transformer_lib.grading.prepare.notebook import dumps, read, release

WHY = sandbox.probe()
if WHY is not None and os.environ.get("GRADING_SANDBOX_REQUIRED") == "1":
    raise RuntimeError(f"GRADING_SANDBOX_REQUIRED=1 but {WHY}")
needs_bwrap = pytest.mark.skipif(WHY is not None, reason=f"no sandbox here: {WHY}")
LIMITS = ("--cell-timeout", "120", "--timeout", "600", "--quiet")
MARKER = f"sbx{secrets.token_hex(4)}"  # the name the fork bomb's and the memory hog's children take


def _command(subs, out, *args: str) -> list[str]:
    return grade_command(SOURCE, subs, out, "--jobs", "2", *LIMITS, *args)


@pytest.fixture(scope="module")
def server():
    """A TCP server on the grader's 127.0.0.1 (connections queue in the backlog; none is accepted)."""
    sock = socket.create_server(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture(scope="module")
def outside_files():
    """Files a submission must not be able to create: in the repository and in $HOME."""
    name = f".sandbox-probe-{secrets.token_hex(4)}"
    files = [REPO / name, os.path.expanduser(f"~/{name}")]
    yield [str(f) for f in files]
    for f in files:
        if os.path.exists(f):
            os.unlink(f)


def _harmless_attacks(subs, server, outside_files) -> dict[str, str]:
    other = subs.parent / f"{subs.name}_other" / "a_student.ipynb"  # another student's hand-in, not graded here
    other.parent.mkdir()
    other.write_text(dumps(as_handed_in(read(SOURCE))), encoding="utf-8")
    return {"read_instructor": attacks.read_instructor(SOURCE), "read_other": attacks.read_other(other),
            "read_judges": attacks.read_judges(REPO / "transformer_lib" / "grading" / "judges"),
            "connect": attacks.connect(server), "write_outside": attacks.write_outside(outside_files),
            "allocate_64_gb": attacks.ALLOCATE_64_GB}


def _correct_and_blank(subs) -> None:
    source = read(SOURCE)
    (subs / "correct.ipynb").write_text(dumps(as_handed_in(source)), encoding="utf-8")
    (subs / "blank.ipynb").write_text(dumps(release(source)), encoding="utf-8")


def _correct(subs) -> None:
    (subs / "correct.ipynb").write_text(dumps(as_handed_in(read(SOURCE))), encoding="utf-8")


@pytest.fixture(scope="module", params=["warm", "fresh"])
def sandboxed(request, tmp_path_factory, server, outside_files):
    """As root, sandboxed runs use warm sandboxes (``slots``); "fresh" switches them off, as a grader
    that is not root runs (elsewhere both are the same run)."""
    if request.param == "fresh" and os.geteuid() != 0:
        pytest.skip("not root: every sandboxed run is fresh, as in the other parameter")
    subs, out = tmp_path_factory.mktemp("sandboxed"), tmp_path_factory.mktemp("sandboxed_out")
    _correct_and_blank(subs)
    # The grader's pid is known before it starts: the shell waits for a line, then execs it.
    proc = subprocess.Popen(["sh", "-c", 'read _ && exec "$@"', "sh",
                             *_command(subs, out, "--sandbox", "bwrap", "--memory", "2")],
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, slots.ENABLE_ENV: "1" if request.param == "warm" else "0"})
    attacks.write(subs, {**_harmless_attacks(subs, server, outside_files),
                         "signal_grader": attacks.signal_grader(proc.pid), "fork_bomb": attacks.fork_bomb(MARKER),
                         "memory_hog": attacks.memory_hog(MARKER)})
    stdout, stderr = proc.communicate("go\n", timeout=900)
    return proc.returncode, stdout, stderr, out


@pytest.fixture(scope="module")
def unsandboxed(tmp_path_factory, server, outside_files):
    subs, out = tmp_path_factory.mktemp("unsandboxed"), tmp_path_factory.mktemp("unsandboxed_out")
    _correct(subs)
    attacks.write(subs, _harmless_attacks(subs, server, outside_files))
    created_before = [os.path.exists(f) for f in outside_files]
    result = subprocess.run(_command(subs, out, "--sandbox", "none"), cwd=REPO, capture_output=True, text=True,
                            timeout=900)
    written = [os.path.exists(f) for f in outside_files]
    for f in outside_files:
        if os.path.exists(f):
            os.unlink(f)
    return result, out, created_before, written


def _softmax_message(out, name: str) -> str:
    tests = json.loads((out / name / "results.json").read_text(encoding="utf-8"))["tests"]
    return next(t["output"] for t in tests if t["name"] == "check_stable_softmax")


@needs_bwrap
@pytest.mark.parametrize("name", ["correct", "allocate_64_gb"])
def test_what_the_grader_allows_earns_its_points(sandboxed, name):
    returncode, _, stderr, out = sandboxed
    assert returncode == 0, stderr[-3000:]
    row = grades(out)[name]
    assert (row["total"], row["notes"]) == (str(FULL), ""), row


@needs_bwrap
@pytest.mark.parametrize("name", ["read_instructor", "read_other", "read_judges", "connect", "write_outside",
                                  "signal_grader", "fork_bomb"])
def test_each_attack_fails_in_the_sandbox(sandboxed, name):
    """Refused (2.2 scores 0) but run: stopped by the sandbox. Judged all the same, 2.2's check fails only
    because the kernel's watch noted the attack (a fork: from there on no check trusts the kernel, so the
    fork bomb keeps only the 4 points of 2.1)."""
    returncode, _, stderr, out = sandboxed
    assert returncode == 0, stderr[-3000:]
    row = grades(out)[name]
    total = 4 if name == "fork_bomb" else FULL - 2
    assert (row["total"], row["check_stable_softmax"], row["notes"]) == (str(total), "0", ""), row
    message = _softmax_message(out, name)
    assert "the grader refuses" in message and "(judged without regard to that: stable_softmax(x, dim): the " \
        "grader's watch noted code of this notebook" in message, message


@needs_bwrap
def test_the_grader_survives_and_nothing_was_written_outside(sandboxed, outside_files):
    returncode, stdout, stderr, out = sandboxed
    assert returncode == 0 and "reports written" in stdout, stderr[-3000:]
    assert grades(out)["blank"]["total"] == "0"
    assert not [f for f in outside_files if os.path.exists(f)]


@needs_bwrap
def test_memory_over_the_limit_stops_the_submission_with_a_note(sandboxed):
    row = grades(sandboxed[3])["memory_hog"]
    assert row["total"] == "6" and "used more memory than allowed and was stopped" in row["notes"], row
    assert row["check_stable_softmax"] == "2" and row["check_attention"] == "0"


@needs_bwrap
def test_no_sandboxed_process_outlives_the_run(sandboxed):
    """The fork bomb's and the memory hog's children (named MARKER) are all gone."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == MARKER]
        if not left:
            break
        time.sleep(0.1)
    assert not left


@pytest.mark.parametrize("name", ["read_instructor", "read_other", "read_judges", "connect", "write_outside"])
def test_without_the_sandbox_the_same_attacks_succeed(unsandboxed, name):
    """The attack raises where it succeeds, so stable_softmax is never defined."""
    result, out, _, _ = unsandboxed
    assert result.returncode == 0, result.stderr[-3000:]
    row = grades(out)[name]
    assert row["total"] == str(FULL - 2) and row["check_stable_softmax"] == "0", (row["notes"], row)
    assert "(judged without regard to that: the check cell raised NameError" in _softmax_message(out, name)


def test_without_the_sandbox_the_memory_limit_still_holds(unsandboxed):
    result, out, before, written = unsandboxed
    rows = grades(out)
    assert (rows["allocate_64_gb"]["total"], rows["correct"]["total"]) == (str(FULL), str(FULL)), rows
    assert before == [False, False] and written == [True, True]


def test_auto_warns_without_bubblewrap_and_stops_when_it_is_installed_but_fails(monkeypatch, capsys):
    probe = sandbox.probe
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    probe.cache_clear()
    try:
        assert sandbox.resolve("auto") is False
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("WARNING: grading without a sandbox: bubblewrap (bwrap) is "
                                                       "not installed")
        with pytest.raises(sandbox.SandboxError, match="--sandbox bwrap: bubblewrap"):
            sandbox.resolve("bwrap")
        assert sandbox.resolve("none") is False and capsys.readouterr().err == ""
        # installed, but it cannot start (an editable install outside the bound folders, say): never a fallback
        monkeypatch.setattr(sandbox.shutil, "which", lambda name: "/usr/bin/bwrap")
        monkeypatch.setattr(sandbox, "probe", lambda: "bubblewrap does not work here (setting up uid map: denied)")
        with pytest.raises(sandbox.SandboxError, match=r"--sandbox auto: bubblewrap does not work here .* --sandbox none"):
            sandbox.resolve("auto")
    finally:
        probe.cache_clear()


def test_the_sandbox_shows_python_and_the_library_but_not_the_repository():
    roots = sandbox.python_roots()
    assert str(REPO / "transformer_lib") in roots and str(REPO) not in roots
    assert not [r for r in roots if (REPO / "exercises").is_relative_to(r)]
