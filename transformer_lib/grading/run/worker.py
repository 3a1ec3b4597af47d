"""The grading worker: runs one prepared notebook in a fresh kernel, in its own process.

:mod:`transformer_lib.grading.run.runner` starts it as ``python -m transformer_lib.grading.run.worker``
in a new process group and writes the job (JSON) to its stdin. The worker never runs student
code itself: nbclient starts an IPython kernel (a further process) and sends it the cells. The
worker adopts the kernel's orphaned descendants (daemons) and kills them all at the end.
After each cell the worker appends one JSON line to the job's events file, so that what was
graded survives even if the whole process group is later killed:

- ``{"cell": i, "grade_id": …, "status": "ok" | "error", "ename", "evalue", "timed_out",
  "output", "truncated"}`` per executed code cell (status from the kernel's execute_reply);
- ``{"dead": i}`` if the kernel died while running cell ``i``; ``{"done": true}`` at the end.

Before anything else the worker sets the limits its kernel inherits and, in the sandbox when the
grader is root, becomes the run's own user (:mod:`~transformer_lib.grading.run.sandbox`).

Before the first cell it starts the kernel's watch (:mod:`~transformer_lib.grading._watch`),
silently: nothing of it enters the kernel's history. For a check cell, the ``.npz`` files the
checks wrote into the kernel's record folder during that cell are moved to
``records/<grade_id>/`` (at most ``MAX_RECORD_FILES`` of them, within ``MAX_CELL_BYTES``);
anything found there before the cell is removed.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from ..prepare.notebook import grade_id, is_check
from .forking import KERNEL_ARGUMENTS, KernelLauncher, forked_kernel_manager
from .procs import adopt_orphans, kill_descendants
from .sandbox import MEMORY_BYTES, apply_limits, drop_privileges

MAX_RECORD_FILE = 5_000_000  # bytes per .npz file moved out of the kernel's folder
MAX_RECORD_FILES = 64  # .npz files moved per check cell
MAX_CELL_BYTES = 64_000_000  # bytes moved per check cell


class WatchError(RuntimeError):
    """The kernel's watch could not be started: the run is not graded."""


class GradingClient(NotebookClient):
    """A NotebookClient that caps stored output per cell and reports each cell as it ends."""

    def __init__(self, nb: nbformat.NotebookNode, job: dict[str, Any], launcher: Any = None) -> None:
        extra = {}
        if launcher is not None:  # the kernel is forked by ``launcher`` (a forking.KernelLauncher)
            extra["kernel_manager_class"] = forked_kernel_manager(launcher)
        super().__init__(
            nb, kernel_name="python3", timeout=math.ceil(job["cell_timeout"]), interrupt_on_timeout=True,
            error_on_timeout={"ename": "CellTimeoutError", "traceback": [],
                              "evalue": f"cell exceeded {job['cell_timeout']} s and was interrupted"},
            allow_errors=True, store_widget_state=False, record_timing=False, iopub_timeout=4,
            shutdown_kernel="immediate", resources={"metadata": {"path": job["cwd"]}},
            on_cell_execute=self._before_cell,
            on_cell_executed=self._after_cell, extra_arguments=KERNEL_ARGUMENTS, **extra)
        self.job = job
        self.current = -1
        self._used: dict[int, int] = {}
        self._truncated: set[int] = set()
        self._timed_out: set[int] = set()

    async def async_start_new_kernel_client(self) -> Any:
        """Start the kernel's client, then the kernel's watch, silently, before any cell."""
        kc = await super().async_start_new_kernel_client()
        if self.job.get("secrets"):
            code = (f"import transformer_lib.grading._watch as _grading_watch\n"
                    f"_grading_watch.install({tuple(self.job['roots'])!r}, {tuple(self.job['checks'])!r}, "
                    f"{self.job['secrets']!r})\ndel _grading_watch")
            reply = await self.async_wait_for_reply(kc.execute(code, silent=True, store_history=False))
            if not reply or reply.get("content", {}).get("status") != "ok":
                raise WatchError("the kernel's watch could not be started")
        return kc

    # ------------------------------------------------------------ events
    def emit(self, event: dict[str, Any]) -> None:
        """Append one JSON line to the events file."""
        with open(self.job["events"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps(event) + "\n")

    def _before_cell(self, cell: Any, cell_index: int, **_: Any) -> None:
        self.current = cell_index
        if is_check(cell):
            _empty(Path(self.job["live"]))

    def _after_cell(self, cell: Any, cell_index: int, execute_reply: Any, **_: Any) -> None:
        content = (execute_reply or {}).get("content", {})
        gid = grade_id(cell) if is_check(cell) else None
        if gid:
            _move_records(Path(self.job["live"]), Path(self.job["records"]) / gid)
        self.emit({"cell": cell_index, "grade_id": gid, "label": grade_id(cell),
                   "status": content.get("status", "error"),
                   "ename": str(content.get("ename", ""))[:200],
                   "evalue": str(content.get("evalue", ""))[: self.job["output_cap"]],
                   "timed_out": cell_index in self._timed_out,
                   "output": _text(cell.get("outputs", []))[: self.job["output_cap"]],
                   "truncated": cell_index in self._truncated})

    # ------------------------------------------------------------ nbclient overrides
    async def _async_handle_timeout(self, timeout: int, cell: Any = None) -> Any:
        self._timed_out.add(self.current)
        return await super()._async_handle_timeout(timeout, cell)

    def output(self, outs: list, msg: dict, display_id: str | None, cell_index: int) -> Any:
        """Keep at most ``output_cap`` characters of output per cell; drop the rest unread."""
        content = msg.get("content", {})
        text = content.get("text") if isinstance(content.get("text"), str) else None
        size = len(text) if text is not None else sum(len(str(v)) for v in content.get("data", {}).values())
        used, cap = self._used.get(cell_index, 0), self.job["output_cap"]
        self._used[cell_index] = used + size
        if used + size > cap:
            self._truncated.add(cell_index)
            if text is None or used >= cap:
                return None
            msg = {**msg, "content": {**content, "text": text[: cap - used]}}
        return super().output(outs, msg, display_id, cell_index)


def _text(outputs: list) -> str:
    """The printed text of a cell: streams and plain-text results."""
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(str(out["data"].get("text/plain", "")) + "\n")
    return "".join(parts)


def _empty(folder: Path) -> None:
    for item in folder.iterdir():
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item, ignore_errors=True)
        else:
            item.unlink(missing_ok=True)


def _move_records(live: Path, dest: Path) -> None:
    """Move the regular ``.npz`` files of ``live`` to ``dest``, within the quotas; drop everything else."""
    dest.mkdir(parents=True, exist_ok=True)
    moved, total = 0, 0
    with os.scandir(live) as entries:
        for item in entries:
            if moved >= MAX_RECORD_FILES:
                break
            if not item.name.endswith(".npz") or not item.is_file(follow_symlinks=False):
                continue
            size = item.stat(follow_symlinks=False).st_size
            if size <= MAX_RECORD_FILE and total + size <= MAX_CELL_BYTES:
                shutil.move(item.path, dest / item.name)
                moved, total = moved + 1, total + size
    _empty(live)


def _exit_with_parent() -> None:
    """End this worker (and so its kernel) if the grader that started it disappears."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def run(job: dict[str, Any], forked: bool = False) -> int:
    """Run ``job``; the exit status is 0 unless the worker itself failed. ``forked``: this process
    was forked by the :mod:`~transformer_lib.grading.run.zygote`, which passes the environment in the
    job, and the kernel is forked from this process instead of started afresh."""
    if forked:
        _as_forked_worker(job)
    _exit_with_parent()
    adopt_orphans()
    apply_limits(int(job.get("memory", MEMORY_BYTES)), bool(job.get("sandboxed")))
    if job.get("uid") is not None:
        drop_privileges(int(job["uid"]))
    for folder in ("live", "cwd"):  # in the sandbox: on its /tmp, in memory and size-capped
        Path(job[folder]).mkdir(parents=True, exist_ok=True)
    if job.get("kernel_root"):
        (Path(job["kernel_root"]) / "home").mkdir(parents=True, exist_ok=True)
    launcher = None
    if forked:  # the kernel's process is forked now, before the notebook is read
        launcher = KernelLauncher()
    nb = nbformat.read(job["notebook"], as_version=4)
    os.unlink(job["notebook"])  # it holds the hidden tests of every check: gone before the kernel starts
    client = GradingClient(nb, job, launcher)
    try:
        client.execute(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = {"done": True}
    except DeadKernelError:
        end = {"dead": client.current}
    except WatchError:
        end = {"watch": False}
    finally:
        kill_descendants()
    client.emit(end)
    return 0


def _as_forked_worker(job: dict[str, Any]) -> None:
    """Make a process forked by the zygote look like a worker started afresh: a session of its
    own, no descriptor of the zygote's, stderr into the run's log, the run's environment."""
    os.setsid()
    os.closerange(3, 1 << 16)
    log = os.open(Path(job["events"]).with_name("worker.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 2)
    os.close(log)
    folder = str(Path(job["events"]).parent)
    os.environ.clear()
    os.environ.update({**job["env"], "PWD": folder})  # PWD: as bubblewrap's --chdir sets it
    os.chdir(folder)


def main() -> int:
    """Read the job from stdin and run it."""
    return run(json.loads(sys.stdin.read()))


if __name__ == "__main__":
    sys.exit(main())
