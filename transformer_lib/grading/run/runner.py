"""Run one notebook in a separate worker process (and its own kernel), with time limits.

:func:`run_notebook` writes the notebook to a private folder, starts
:mod:`transformer_lib.grading.run.worker` in a new process group with a minimal environment that
carries a random token, and waits at most ``timeout`` seconds. If the time runs out, the
worker's process tree is killed and the cells reported so far are kept. Afterwards every
process carrying the token is killed too. Student code never runs in the calling process.

The events the worker wrote are read as hostile data (the kernel can write to that file too):
every field is type-checked, a cell's ``grade_id`` is taken from the notebook, not the file,
and malformed lines are ignored.

With ``sandbox=True`` the worker (and its kernel) runs in bubblewrap
(:mod:`~transformer_lib.grading.run.sandbox`): of the grader's folders only the run's own is there. The runner stops a run
whose processes hold more than ``memory`` bytes, or whose folders on its disk outgrow DISK_BYTES.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import nbformat

from .._watch import cell_file, write_secrets
from ..prepare.notebook import grade_id, is_check
from ..protocol import Call, collect
from . import slots
from .procs import kernel_env, kill_tagged, kill_tree, kill_user
from .sandbox import (DISK_BYTES, MEMORY_BYTES, command, folder_bytes, python_roots, sandbox_env, sandbox_uid,
                      tree_memory, user_memory)

OUTPUT_CAP = 10_000  # characters of output stored per cell
MAX_EVENTS_BYTES = 20_000_000
POLL_S = 0.5  # how often the memory of a run's processes is measured (about 6 ms each)


@dataclass
class RunResult:
    """What a run reported: one event per executed code cell, and the check calls each check cell
    recorded."""

    cells: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, Sequence[Call | None]] = field(default_factory=dict)  # grade_id -> calls (read lazily)
    dead_at: int | None = None  # index of the cell during which the kernel died
    dead_label: str | None = None  # that cell's grade_id, if it has one
    killed: bool = False  # the whole-notebook time limit was hit
    out_of_memory: bool = False  # the run's processes held more than the memory limit, and were stopped
    out_of_disk: bool = False  # the run's folders on the grader's disk grew over DISK_BYTES, and it was stopped
    finished: bool = False
    worker_error: str = ""
    seconds: float = 0.0
    token: str = ""  # the run's token, in the environment of its worker and kernel


_LIVE: set[subprocess.Popen] = set()
_LOCK = threading.Lock()
_STOPPING = threading.Event()


def allow_runs() -> None:
    """Undo :func:`stop_all` (called when a new grading run starts)."""
    _STOPPING.clear()


def stop_all() -> None:
    """Kill every running worker and its kernel, and start no new one."""
    _STOPPING.set()
    with _LOCK:
        for proc in list(_LIVE):
            kill_tree(proc.pid)


def _cell_event(raw: dict, nb: nbformat.NotebookNode, cap: int) -> dict[str, Any] | None:
    """A cell event with every field checked, or None if it names no code cell of ``nb``."""
    index = raw.get("cell")
    if type(index) is not int or not 0 <= index < len(nb.cells) or nb.cells[index].cell_type != "code":
        return None
    cell = nb.cells[index]

    def text(key: str, limit: int) -> str:
        return raw[key][:limit] if isinstance(raw.get(key), str) else ""

    return {"cell": index, "grade_id": grade_id(cell) if is_check(cell) else None, "label": grade_id(cell),
            "status": "ok" if raw.get("status") == "ok" else "error", "ename": text("ename", 200),
            "evalue": text("evalue", cap), "output": text("output", cap),
            "timed_out": raw.get("timed_out") is True, "truncated": raw.get("truncated") is True}


def _read_events(path: Path, nb: nbformat.NotebookNode, result: RunResult, cap: int) -> None:
    """Fill ``result`` from the events file, ignoring whatever is malformed. How the run ended
    (``done`` or ``dead``) is taken from the last line only: the worker writes it after its kernel
    has gone, so a line the kernel forged is never last."""
    try:  # a regular file only: never follow a link, never block on a FIFO the kernel made
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    with open(fd, encoding="utf-8", errors="replace") as fh:
        if not _regular(fd):
            return
        lines = fh.read(MAX_EVENTS_BYTES).splitlines()
    raw: object = None
    for line in lines:
        try:
            raw = json.loads(line)
        except ValueError:
            raw = None
            continue
        event = _cell_event(raw, nb, cap) if isinstance(raw, dict) and "cell" in raw else None
        if event is not None:
            result.cells.append(event)
    if isinstance(raw, dict) and raw.get("done") is True:
        result.finished = True
    elif isinstance(raw, dict) and raw.get("watch") is False:
        result.worker_error = "the grader could not start the kernel's watch; the notebook was not run"
    elif isinstance(raw, dict) and "dead" in raw:
        dead = raw["dead"]
        result.dead_at = dead if type(dead) is int and 0 <= dead < len(nb.cells) else -1
        result.dead_label = grade_id(nb.cells[result.dead_at]) if result.dead_at >= 0 else None


def _regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _watch(ended: Callable[[float], bool], used: Callable[[], int], stop: Callable[[], None], timeout: float,
           memory: int, result: RunResult, disk: Callable[[], int] = lambda: 0) -> None:
    """Wait until ``ended(seconds)`` says the run is over, checking every ``POLL_S`` seconds; at
    ``timeout``, when ``used()`` exceeds ``memory`` bytes or ``disk()`` exceeds ``DISK_BYTES``,
    ``stop()`` the run and wait for its end."""
    deadline = time.monotonic() + timeout
    while not ended(max(0.0, min(POLL_S, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            result.killed = True
        elif used() > memory:
            result.out_of_memory = True
        elif disk() > DISK_BYTES:
            result.out_of_disk = True
        else:
            continue
        stop()
        ended(30.0)
        return


def _chown_all(folder: Path, uid: int) -> None:
    for root, dirs, files in os.walk(folder):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, uid, uid, follow_symlinks=False)


def run_notebook(nb: nbformat.NotebookNode, cell_timeout: float = 30.0, timeout: float = 300.0,
                 output_cap: int = OUTPUT_CAP, token_prefix: str = "", sandbox: bool = False,
                 memory: int = MEMORY_BYTES, seed: str = "", expected: dict[str, int] | None = None,
                 keep: Path | None = None) -> RunResult:
    """Execute ``nb`` in a worker process; never raises because of what the notebook does.

    The run's token is ``token_prefix`` plus a random part (``result.token``); ``seed``: the grading
    run's, of the hidden tests (each check cell's derives from it). With ``sandbox`` the worker runs
    in bubblewrap, and the kernel's folders are on the sandbox's size-capped ``/tmp``. ``memory``
    limits each process's address space and all the run's processes together. Of each check cell's
    records only those it was to write are kept (:func:`~transformer_lib.grading.protocol.collect`).

    A run that ended before any cell of the notebook had finished, with no limit hit (its kernel
    or its watch did not start, or the kernel died in the first cell), is run once more: a kernel
    that fails to start on a busy machine is not the student's doing. The second run's result
    stands, whatever it is.
    """
    args = (nb, cell_timeout, timeout, output_cap, token_prefix, sandbox, memory, seed, expected, keep)
    result = _run_once(*args)
    if never_started(result) and not _STOPPING.is_set():
        why = result.worker_error or "the kernel died in the first cell"
        print(f"grading: a run ended before its first cell finished ({why[:200]}); running it again",
              file=sys.stderr)
        result = _run_once(*args)
    return result


def never_started(result: RunResult) -> bool:
    """True if the run ended before any cell finished, without hitting a limit."""
    limit = result.killed or result.out_of_memory or result.out_of_disk
    return not result.cells and not limit and (bool(result.worker_error) or result.dead_at is not None)


def _run_once(nb: nbformat.NotebookNode, cell_timeout: float, timeout: float, output_cap: int, token_prefix: str,
              sandbox: bool, memory: int, seed: str, expected: dict[str, int] | None,
              keep: Path | None) -> RunResult:
    """One attempt of :func:`run_notebook`."""
    start = time.perf_counter()
    result = RunResult(token=token_prefix + secrets.token_hex(8))
    slot = _warm_slot() if sandbox and slots.enabled() else None
    healthy = False
    base = str(slot.root) if slot else None
    private = Path(tempfile.mkdtemp(prefix="grading-", dir=base))
    public = Path(tempfile.mkdtemp(prefix="grading-kernel-", dir=base)) if not sandbox else None
    try:
        kernel_root = public or Path(f"/tmp/grading-kernel-{secrets.token_hex(8)}")  # in the sandbox: its tmpfs
        live, cwd = kernel_root / "records", kernel_root / "work"  # the worker makes them
        cells = {grade_id(c): c for c in nb.cells if is_check(c) and grade_id(c)}
        nonces = write_secrets(private / "secrets.json", list(cells), str(live), seed)
        nbformat.write(nb, str(private / "notebook.ipynb"))
        uid = sandbox_uid() if sandbox else None
        job = {"notebook": str(private / "notebook.ipynb"), "events": str(private / "events.jsonl"),
               "records": str(private / "records"), "live": str(live), "cwd": str(cwd),
               "kernel_root": str(kernel_root), "secrets": str(private / "secrets.json"), "roots": python_roots(),
               "checks": sorted(cell_file(c.source) for c in cells.values()),
               "cell_timeout": cell_timeout, "output_cap": output_cap, "memory": memory, "sandboxed": sandbox,
               "uid": uid}
        argv, env = [sys.executable, "-m", "transformer_lib.grading.run.worker"], kernel_env(result.token)
        if sandbox:
            argv, env = command(argv, [str(private)], str(private)), sandbox_env(env, kernel_root / "home")
            if uid is not None:
                _chown_all(private, uid)
        disk = lambda: sum(folder_bytes(f) for f in (private, public) if f is not None)  # noqa: E731
        if slot is not None:
            returncode, healthy = _run_in_slot(slot, {**job, "env": env}, timeout, memory, result, disk)
        else:
            returncode = _run_worker(argv, env, private, job, timeout, memory, result, disk)
        _read_events(private / "events.jsonl", nb, result, output_cap)
        ended = result.finished or result.dead_at is not None
        if not (result.killed or result.out_of_memory or result.out_of_disk or result.worker_error) \
                and (returncode != 0 or not ended):
            log = private / "worker.log"
            tail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
            result.worker_error = f"worker exited with status {returncode}: {tail.strip()}"
        result.records = collect(private / "records", nonces, expected, keep)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # the grader must survive anything a submission does
        result.worker_error = f"the notebook could not be run ({type(err).__name__}: {str(err)[:300]})"
    finally:
        shutil.rmtree(private, ignore_errors=True)
        if public is not None:
            shutil.rmtree(public, ignore_errors=True)
        if slot is not None:  # only now: the next run of this slot finds no folder of this one
            slots.release(slot, healthy)
    result.seconds = time.perf_counter() - start
    return result


def _warm_slot() -> slots.Slot | None:
    """A warm sandbox for this run, or None (a fresh one per run) if none could be started."""
    if _STOPPING.is_set():
        raise KeyboardInterrupt("grading was stopped")
    try:
        return slots.acquire()
    except (slots.SlotError, OSError) as err:
        print(f"grading without a warm sandbox: {err}"[:300], file=sys.stderr)
        return None


def _run_worker(argv: list[str], env: dict[str, str], private: Path, job: dict[str, Any], timeout: float,
                memory: int, result: RunResult, disk: Callable[[], int] = lambda: 0) -> int:
    """Start the worker (in a sandbox of its own if ``argv`` says so) and wait for it; its exit status."""
    with open(private / "worker.log", "wb") as log, _LOCK:
        if _STOPPING.is_set():
            raise KeyboardInterrupt("grading was stopped")
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log,
                                cwd=private, env=env, start_new_session=True)
        _LIVE.add(proc)

    def ended(seconds: float) -> bool:
        try:
            proc.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False

    try:
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except OSError:
            pass
        _watch(ended, lambda: tree_memory(proc.pid, memory), lambda: kill_tree(proc.pid), timeout, memory, result,
               disk)
        proc.wait()
    finally:
        with _LOCK:
            _LIVE.discard(proc)
        kill_tagged(result.token)
    return proc.returncode


def _run_in_slot(slot: slots.Slot, job: dict[str, Any], timeout: float, memory: int,
                 result: RunResult, disk: Callable[[], int] = lambda: 0) -> tuple[int, bool]:
    """Give the job to the slot's zygote and wait for the worker's exit status, stopping the run's
    processes (all of its user id) at ``timeout`` or at ``memory`` bytes. Returns the status and
    whether the slot can be used again."""
    uid, healthy, status = int(job["uid"]), False, -1
    with _LOCK:
        if _STOPPING.is_set():
            raise KeyboardInterrupt("grading was stopped")
        _LIVE.add(slot.proc)
    message: list[dict] = []

    def ended(seconds: float) -> bool:
        if not message:
            line = slot.read(seconds)
            message.extend([line] if line is not None else [])
        return bool(message)

    try:
        slot.send(job)
        _watch(ended, lambda: user_memory(uid, memory), lambda: kill_user(uid), timeout, memory, result, disk)
        status = message[0].get("exit") if message else None
        healthy = type(status) is int
    except slots.SlotError as err:
        result.worker_error = f"the notebook could not be run ({err})"[:500]
    finally:
        with _LOCK:
            _LIVE.discard(slot.proc)
        kill_user(uid)
    return (status if healthy else -1), healthy
