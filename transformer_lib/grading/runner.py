"""Run one notebook in a separate worker process (and its own kernel), with time limits.

:func:`run_notebook` writes the notebook to a private folder, starts
:mod:`transformer_lib.grading.worker` in a new process group, and waits at most ``timeout``
seconds. If the time runs out, the worker's and the kernel's process groups are killed and
the cells reported so far are kept. Student code never runs in the calling process.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from ._checktools import RECORD_ENV
from .records import Records, load_records

OUTPUT_CAP = 10_000  # characters of output stored per cell
KERNEL_ENV = {"MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "PYDEVD_DISABLE_FILE_VALIDATION": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@dataclass
class RunResult:
    """What a run reported: one event per executed code cell, and the checks' records."""

    cells: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, Records] = field(default_factory=dict)  # grade_id -> records
    dead_at: int | None = None  # index of the cell during which the kernel died
    dead_label: str | None = None  # that cell's grade_id, if it has one
    killed: bool = False  # the whole-notebook time limit was hit
    finished: bool = False
    worker_error: str = ""
    seconds: float = 0.0


_LIVE: set[subprocess.Popen] = set()
_LOCK = threading.Lock()
_STOPPING = threading.Event()


def allow_runs() -> None:
    """Undo :func:`stop_all` (called when a new grading run starts)."""
    _STOPPING.clear()


def stop_all() -> None:
    """Kill every running worker (their kernels exit with them) and start no new one."""
    _STOPPING.set()
    with _LOCK:
        for proc in list(_LIVE):
            _kill_group(proc.pid)


def _kill_group(pgid: int | None) -> None:
    if pgid:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _read_events(path: Path, result: RunResult) -> int | None:
    """Fill ``result`` from the events file; return the kernel pid if reported."""
    kernel_pid = None
    if not path.exists():
        return None
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        if "kernel_pid" in event and isinstance(event["kernel_pid"], int):
            kernel_pid = event["kernel_pid"]
        elif "cell" in event:
            result.cells.append(event)
        elif "dead" in event:
            result.dead_at = event["dead"] if isinstance(event["dead"], int) else -1
            result.dead_label = event.get("label") if isinstance(event.get("label"), str) else None
        elif event.get("done") is True:
            result.finished = True
    return kernel_pid


def run_notebook(nb: nbformat.NotebookNode, cell_timeout: float = 30.0, timeout: float = 300.0,
                 output_cap: int = OUTPUT_CAP) -> RunResult:
    """Execute ``nb`` in a worker process; never raises because of what the notebook does."""
    start = time.perf_counter()
    result = RunResult()
    private = Path(tempfile.mkdtemp(prefix="grading-"))
    public = Path(tempfile.mkdtemp(prefix="grading-kernel-"))
    try:
        live, cwd = public / "records", public / "work"
        live.mkdir()
        cwd.mkdir()
        nbformat.write(nb, str(private / "notebook.ipynb"))
        job = {"notebook": str(private / "notebook.ipynb"), "events": str(private / "events.jsonl"),
               "records": str(private / "records"), "live": str(live), "cwd": str(cwd),
               "cell_timeout": cell_timeout, "output_cap": output_cap}
        env = {**os.environ, **KERNEL_ENV, RECORD_ENV: str(live)}
        with open(private / "worker.log", "wb") as log, _LOCK:
            if _STOPPING.is_set():
                raise KeyboardInterrupt("grading was stopped")
            proc = subprocess.Popen([sys.executable, "-m", "transformer_lib.grading.worker"],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log,
                                    cwd=private, env=env, start_new_session=True)
            _LIVE.add(proc)
        try:
            proc.communicate(json.dumps(job).encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            result.killed = True
            _kill_group(proc.pid)
            proc.wait()
        finally:
            with _LOCK:
                _LIVE.discard(proc)
        kernel_pid = _read_events(private / "events.jsonl", result)
        if result.killed:
            _kill_group(kernel_pid)
        elif proc.returncode != 0 or not (result.finished or result.dead_at is not None):
            tail = (private / "worker.log").read_text(errors="replace")[-1500:]
            result.worker_error = f"worker exited with status {proc.returncode}: {tail.strip()}"
        for folder in sorted((private / "records").glob("*")):
            result.records[folder.name] = load_records(folder)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # the grader must survive anything a submission does
        result.worker_error = f"the notebook could not be run ({type(err).__name__}: {str(err)[:300]})"
    finally:
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(public, ignore_errors=True)
    result.seconds = time.perf_counter() - start
    return result
