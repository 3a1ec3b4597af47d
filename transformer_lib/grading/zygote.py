"""A warm process that forks each submission's worker and kernel, inside one bubblewrap sandbox.

Starting a kernel costs about 3 s of CPU, two thirds of it ``import torch``. When the grader is
root and grading is sandboxed, :mod:`~transformer_lib.grading.runner` therefore keeps one
sandbox per job slot (:func:`~transformer_lib.grading.sandbox.command`, with the slot's folder
as its only writable one) running ``python -m transformer_lib.grading.zygote``. This process
imports torch, the library and Jupyter once, prints ``{"ready": true}``, then reads one job (the
worker's job, plus its environment) per line on stdin. For each job it forks a worker
(:func:`transformer_lib.grading.worker.run`), which becomes the run's own user id, random per
run, before it reads the notebook, and forks the kernel from itself at that point, so that the
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
import signal
import sys
import time
import traceback
from pathlib import Path

STARTED_IN = os.getcwd()
PRELOADED = ("torch", "numpy", "transformer_lib", "IPython", "ipykernel.kernelapp", "ipykernel.ipkernel",
             "nbclient", "nbformat", "jupyter_client", "psutil")


def preload() -> None:
    """Import what every worker and kernel needs. Nothing is run: no thread pool is started."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    from . import worker  # noqa: F401


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


# ---------------------------------------------------------------- the kernel, forked by the worker
class ForkedProcess:
    """The part of ``subprocess.Popen`` jupyter_client uses, for a child this process forked."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
            else:
                if done:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        while self.poll() is None:
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class KernelLauncher:
    """A child forked now, before the worker reads the notebook, that becomes the kernel when
    :meth:`start` sends it the connection file, environment and folder jupyter_client chose for
    the kernel (or exits if it never does)."""

    def __init__(self) -> None:
        read_end, self._write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self._write_end)
            with os.fdopen(read_end, "rb") as fh:
                request = fh.read()
            if request:
                _become_kernel(**json.loads(request))
            os._exit(0)
        os.close(read_end)

    def start(self, connection_file: str, env: dict[str, str], cwd: str) -> int:
        env = {**env, "JPY_PARENT_PID": str(os.getpid())}  # as jupyter_client's launcher sets it
        request = json.dumps({"connection_file": connection_file, "env": env, "cwd": cwd}).encode()
        with os.fdopen(self._write_end, "wb") as fh:
            fh.write(request)
        return self.pid


def _become_kernel(connection_file: str, cwd: str, env: dict[str, str]) -> None:
    """Run an IPython kernel in this process, as ``python -m ipykernel_launcher -f FILE`` would."""
    status = 1
    try:
        os.setsid()  # its own process group: an interrupt (SIGINT to the group) reaches only the kernel
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        if sys.path and sys.path[0] == STARTED_IN:  # as ipykernel_launcher drops the folder `-m` put first
            del sys.path[0]
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["ipykernel_launcher", "-f", connection_file]
        sys.modules["numpy"].random.seed()  # a fresh process draws its own seeds (Python's
        sys.modules["torch"].seed()  # random module re-seeds itself after a fork)
        from ipykernel.kernelapp import IPKernelApp

        from .worker import KERNEL_ARGUMENTS

        IPKernelApp.launch_instance(argv=["-f", connection_file, *KERNEL_ARGUMENTS])
        status = 0
    finally:
        os._exit(status)


def forked_kernel_manager(launcher: KernelLauncher) -> type:
    """A jupyter_client kernel manager class whose kernel is ``launcher``'s child."""
    from jupyter_client.manager import AsyncKernelManager

    class ForkedKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:  # noqa: ANN003
            provisioner = self.provisioner
            pid = launcher.start(self.connection_file, dict(kw["env"]), str(kw.get("cwd") or os.getcwd()))
            provisioner.process, provisioner.pid, provisioner.pgid = ForkedProcess(pid), pid, pid
            provisioner.cwd = kw.get("cwd")
            self._reconcile_connection_info(provisioner.connection_info)

    return ForkedKernelManager


if __name__ == "__main__":  # run as the package's module, which the worker imports too
    from transformer_lib.grading import zygote

    sys.exit(zygote.main())
