"""Warm sandboxes (``transformer_lib.grading.run.slots`` and ``zygote``): used when the grader is root.

A kernel forked from the warm process must behave like one started afresh, and two runs of
one slot, which follow each other in the same sandbox, must not see each other: no file, no
folder listing, no process left behind. Skipped where bubblewrap does not work or the grader is
not root (then every run gets a fresh sandbox, which the other grading tests cover).
"""
from __future__ import annotations

import json
import os
import secrets
import time

import nbformat
import psutil
import pytest

from submissions.sandbox_attacks import _name
from transformer_lib.grading.run import sandbox, slots
from transformer_lib.grading.protocol import TOKEN_ENV
from transformer_lib.grading.run.runner import run_notebook

pytestmark = pytest.mark.skipif(sandbox.probe() is not None or os.geteuid() != 0,
                                reason="warm sandboxes need bubblewrap and a grader running as root")

PORTRAIT = f"""
import json, os, random, sys
import numpy, torch
print(json.dumps({{"uid": os.getuid(), "cwd": os.getcwd(), "path": sys.path, "env": sorted(os.environ),
                  "token": os.environ.get({TOKEN_ENV!r}), "threads": torch.get_num_threads(),
                  "numpy": numpy.random.random_sample(3).tolist(), "torch": torch.rand(3).tolist(),
                  "random": random.random()}}))
"""


def _run(*cells: str, **kwargs):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return run_notebook(nb, sandbox=True, timeout=120, **kwargs)


def _portrait(result) -> dict:
    assert result.finished and not result.worker_error, result.worker_error
    assert result.cells[0]["status"] == "ok", result.cells[0]
    return json.loads(result.cells[0]["output"])


def test_a_warm_kernel_looks_like_one_started_afresh(monkeypatch):
    monkeypatch.setenv(slots.ENABLE_ENV, "0")
    fresh_result = _run(PORTRAIT)
    fresh = _portrait(fresh_result)
    monkeypatch.delenv(slots.ENABLE_ENV)
    first_result, second_result = _run(PORTRAIT), _run(PORTRAIT)
    first, second = _portrait(first_result), _portrait(second_result)
    for warm, result in ((first, first_result), (second, second_result)):
        assert warm["token"] == result.token and fresh["token"] == fresh_result.token
        assert warm["uid"] >= sandbox.UID_RANGE[0] and warm["cwd"].endswith("/work")
        assert warm["path"] == fresh["path"]  # no folder of the warm process's on sys.path
        assert warm["env"] == fresh["env"]
        assert warm["threads"] == fresh["threads"] == 1
    assert first["uid"] != second["uid"]  # a user id of its own per run
    for generator in ("numpy", "torch", "random"):  # unseeded draws differ from run to run, as in new processes
        assert first[generator] != second[generator] and first[generator] != fresh[generator], generator


def test_runs_of_one_slot_see_nothing_of_each_other():
    slots.close_all()
    marker = f"slot{secrets.token_hex(4)}"
    left = _run(
        "import os\nopen('/tmp/left_behind', 'w').write('x')\nopen('mine.txt', 'w').write('x')\nprint(os.getcwd())",
        # a daemon: double fork, a session of its own, an empty environment
        f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.environ.clear()\n"
        f"        {_name(marker)}\n        time.sleep(600)\n    os._exit(0)\nos.wait()")
    assert left.finished and not left.worker_error, left.worker_error
    cwd = left.cells[0]["output"].strip()
    probe = f"""
import glob, os
listed = False
for root in glob.glob('/tmp/grading-slot-*'):  # the slot's folder (the run's own is on the sandbox's /tmp)
    try:
        os.listdir(root)
        listed = True
    except PermissionError:
        pass
names = []
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            names.append(open(f'/proc/{{pid}}/comm').read().strip())
        except OSError:
            pass
print(os.path.exists('/tmp/left_behind'), os.path.exists({cwd!r}), listed, {marker!r} in names)
"""
    seen = _run(probe)
    assert len(slots._ALL) == 1  # the same sandbox ran both
    assert seen.cells[0]["output"].split() == ["False", "False", "False", "False"], seen.cells[0]
    deadline = time.monotonic() + 5
    while [p for p in psutil.process_iter(["name"]) if p.info["name"] == marker] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in psutil.process_iter(["name"]) if p.info["name"] == marker]


def test_a_dead_warm_process_is_replaced():
    assert _run("1").finished
    for slot in list(slots._IDLE):
        slot.proc.kill()
        slot.proc.wait()
    result = _run("print(6 * 7)")
    assert result.finished and result.cells[0]["output"] == "42\n", result.worker_error


def test_a_warm_sandbox_that_cannot_start_gives_way_to_a_fresh_one(monkeypatch, capsys):
    slots.close_all()

    def broken() -> None:
        raise slots.SlotError("the grading sandbox did not start in time")

    monkeypatch.setattr(slots, "Slot", broken)
    result = _run("print(6 * 7)")
    assert result.finished and result.cells[0]["output"] == "42\n", result.worker_error
    err = capsys.readouterr().err
    assert err.startswith("grading without a warm sandbox: the grading sandbox did not start in time")
