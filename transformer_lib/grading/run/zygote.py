"""A warm process that forks each submission's worker and kernel, inside one bubblewrap sandbox.

Starting a kernel costs about 3 s of CPU, two thirds of it ``import torch``. When the grader is
root and grading is sandboxed, :mod:`~transformer_lib.grading.run.runner` therefore keeps one
sandbox per job slot (:func:`~transformer_lib.grading.run.sandbox.command`, with the slot's folder
as its only writable one) running ``python -m transformer_lib.grading.run.zygote``. This process
imports torch, the library and Jupyter once, prints ``{"ready": true}``, then reads one job (the
worker's job, plus its environment) per line on stdin. For each job it forks a worker
(:func:`transformer_lib.grading.run.worker.run`), which becomes the run's own user id, random per
run, before it reads the notebook, and forks the kernel from itself at that point
(:mod:`~transformer_lib.grading.run.forking`), so that the
kernel starts with everything imported and nothing of the notebook in memory. When the worker
has ended, every process of that user id is killed, ``/tmp`` is emptied, and ``{"exit": status}``
is printed.

What separates two runs of one slot: they run one after the other, under different user ids
(neither can signal, trace or read the files of the other or of this root process), and the
runner deletes each run's folders before the next starts. Runs of different slots are in
different sandboxes.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from pathlib import Path

from .forking import STARTED_IN

PRELOADED = ("torch", "numpy", "transformer_lib", "IPython", "ipykernel.kernelapp", "ipykernel.ipkernel",
             "nbclient", "nbformat", "jupyter_client", "psutil")


def preload() -> None:
    """Import what every worker and kernel needs. Nothing is run: no thread pool is started."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    from . import worker  # noqa: F401
    from .._calls import _Aten

    with _Aten((), []):  # a dispatch mode's first use imports some 800 modules of torch's: once, here
        importlib.import_module("torch").zeros(1).add(1)


def empty_tmp() -> None:
    """Remove what the last run left in the sandbox's /tmp (not the slot's folder, if it is there)."""
    for item in Path("/tmp").iterdir():
        if STARTED_IN == str(item) or STARTED_IN.startswith(f"{item}/"):
            continue
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item, ignore_errors=True)
        else:
            try:
                item.unlink()
            except OSError:
                pass


def _reap(pid: int) -> int:
    """Wait for the worker ``pid``, reaping any other child that ends meanwhile; its exit status."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return -1
        if done == pid:
            return os.waitstatus_to_exitcode(status)


def serve(jobs, out) -> None:  # noqa: ANN001
    """Fork a worker for each job line read from ``jobs``; write its exit status to ``out``."""
    from .procs import kill_user
    from .worker import run

    for line in jobs:
        job = json.loads(line)
        uid = int(job["uid"])
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                status = run(job, forked=True)
            except BaseException:  # noqa: B036 (the child must end here, whatever happened)
                traceback.print_exc()
            finally:
                os._exit(status)
        status = _reap(pid)
        kill_user(uid)
        empty_tmp()
        out.write(json.dumps({"exit": status}) + "\n")
        out.flush()


def main() -> int:
    if os.geteuid() != 0:
        print("the zygote needs root, to give each run its own user id", file=sys.stderr)
        return 2
    preload()
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    jobs = os.fdopen(os.dup(0), "r", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # stdin and stdout now /dev/null: a forked worker closes every other
    os.dup2(devnull, 1)  # descriptor, so it keeps neither the job pipe nor the status pipe
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    serve(jobs, out)
    return 0


if __name__ == "__main__":  # run as the package's module, which the worker imports too
    from transformer_lib.grading.run import zygote

    sys.exit(zygote.main())
