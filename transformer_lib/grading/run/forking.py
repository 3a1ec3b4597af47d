"""A kernel forked from a warm process instead of started afresh (used by the worker in a warm sandbox).

:class:`KernelLauncher` forks a child before the worker reads the notebook; when jupyter_client
asks for a kernel (through the manager class :func:`forked_kernel_manager` makes), the child
becomes an IPython kernel, as ``python -m ipykernel_launcher -f FILE`` would, with torch and the
library already imported (:mod:`~transformer_lib.grading.run.zygote`). :class:`ForkedProcess` is the
part of ``subprocess.Popen`` jupyter_client uses, for that child.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

STARTED_IN = os.getcwd()  # the warm process's folder, which ipykernel_launcher would drop from sys.path
# No history database: nothing to keep, and no saving thread, which a fork in a cell stops and the
# next cell would have to start again, perhaps when a fork bomb has left no process to spare.
KERNEL_ARGUMENTS = ["--HistoryManager.enabled=False"]


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
