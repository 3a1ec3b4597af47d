"""Warm sandboxes, one per job slot, each running a :mod:`~transformer_lib.grading.run.zygote`.

Used by :func:`transformer_lib.grading.run.runner.run_notebook` when grading is sandboxed and the
grader is root (so that each run gets its own user id). A slot is a folder (mode 0711: a run
can enter its own folders there, but not list the others) bound writable into a bubblewrap
sandbox, and the zygote process in it. :func:`acquire` takes an idle slot or starts one (about
3 s: the zygote imports torch); :func:`release` gives it back, or closes it if it misbehaved.
Slots live until :func:`close_all` (also called at exit).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .procs import kernel_env, kill_tree
from .sandbox import command, sandbox_env

READY_S = 120.0  # the longest a zygote may take to import everything
ENABLE_ENV = "TRANSFORMER_LIB_GRADING_ZYGOTE"  # "0": start a fresh sandbox and kernel for every run


def enabled() -> bool:
    """True if sandboxed runs should use slots: the grader is root and they are not switched off."""
    return os.geteuid() == 0 and os.environ.get(ENABLE_ENV, "1") != "0"


class SlotError(RuntimeError):
    """The slot's zygote did not start, died, or said something that is not a status line."""


class Slot:
    """One warm sandbox: ``root`` (the writable folder) and ``proc`` (bubblewrap, then the zygote)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="grading-slot-"))
        os.chmod(self.root, 0o711)
        (self.root / "home").mkdir(mode=0o700)
        self._buffer = b""
        argv = command([sys.executable, "-m", "transformer_lib.grading.run.zygote"], [str(self.root)], str(self.root))
        log = os.open(self.root / "zygote.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # runs cannot read it
        self._log = os.fdopen(log, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     cwd=self.root, env=_zygote_env(self.root / "home"),
                                     start_new_session=True)
        try:
            if self.read(READY_S) != {"ready": True}:
                raise SlotError("the grading sandbox did not start in time")
        except SlotError as err:
            tail = (self.root / "zygote.log").read_text(errors="replace")[-800:].strip()
            self.close()
            raise SlotError(f"{err}: {tail}") from None

    def send(self, job: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(job).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as err:
            raise SlotError(f"the grading sandbox has stopped ({err})") from None

    def read(self, timeout: float) -> dict[str, Any] | None:
        """The zygote's next line, or None if none came within ``timeout`` seconds."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise SlotError("the grading sandbox has stopped")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            raise SlotError(f"the grading sandbox wrote {line[:100]!r}") from None
        if not isinstance(message, dict):
            raise SlotError(f"the grading sandbox wrote {line[:100]!r}")
        return message

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        kill_tree(self.proc.pid)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)
        with _LOCK:
            _IDLE[:] = [slot for slot in _IDLE if slot is not self]


_IDLE: list[Slot] = []
_LOCK = threading.Lock()
_ALL: set[Slot] = set()


def _zygote_env(home: Path) -> dict[str, str]:
    """The zygote's environment: a kernel's, without a run's token, records and seed (each job brings
    its own), with the slot's home. OMP_NUM_THREADS is in it: OpenMP reads it once, when torch loads."""
    from ..protocol import TOKEN_ENV

    env = {k: v for k, v in kernel_env("").items() if k != TOKEN_ENV}
    return sandbox_env(env, home)


def acquire() -> Slot:
    """An idle slot, or a new one."""
    while True:
        with _LOCK:
            slot = _IDLE.pop() if _IDLE else None
        if slot is None:
            break
        if slot.alive():
            return slot
        release(slot, healthy=False)
    slot = Slot()
    with _LOCK:
        _ALL.add(slot)
    return slot


def release(slot: Slot, healthy: bool) -> None:
    """Give ``slot`` back for the next run, or close it if the last run left it in doubt."""
    if healthy and slot.alive():
        with _LOCK:
            _IDLE.append(slot)
    else:
        slot.close()
        with _LOCK:
            _ALL.discard(slot)


def close_all() -> None:
    """Stop every slot's sandbox."""
    with _LOCK:
        slots = list(_ALL)
        _ALL.clear()
    for slot in slots:
        slot.close()


atexit.register(close_all)
