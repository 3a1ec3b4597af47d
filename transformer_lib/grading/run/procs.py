"""The processes of a grading run: the kernels' environment, and killing what a submission started.

Nothing here trusts a pid a kernel could have written. What to kill is found from the process
tree the grader itself started (:func:`kill_tree`), and from a random token the grader puts in
the environment of every worker and kernel (:func:`kill_tagged`), which also finds daemons that
left the tree (``setsid``, double fork). The worker adopts orphaned descendants
(:func:`adopt_orphans`), so a daemon that clears its environment stays in the tree.
"""
from __future__ import annotations

import ctypes
import os
import signal

import psutil

KERNEL_ENV = {"MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "PYDEVD_DISABLE_FILE_VALIDATION": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# What Python, torch and Jupyter need from the grader's environment; nothing else is passed on.
PASSED_ON = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
             "VIRTUAL_ENV", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "HF_HOME", "TORCH_HOME",
             "MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR",
             "JUPYTER_PATH", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR",
             "SYSTEMROOT")


def kernel_env(token: str) -> dict[str, str]:
    """The environment of a worker and its kernel: a minimal one and the token. Neither the record
    folder nor the seed of the hidden tests is in it: they reach the check cells alone (see
    :mod:`~transformer_lib.grading._watch`)."""
    from ..protocol import TOKEN_ENV  # here, so that the worker does not import numpy

    kept = {key: os.environ[key] for key in PASSED_ON if key in os.environ}
    return {**kept, **KERNEL_ENV, TOKEN_ENV: token}


def _kill(proc: psutil.Process) -> bool:
    """SIGKILL ``proc`` unless it is gone or a zombie; True if it was alive."""
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        proc.kill()  # psutil checks that the pid still names the same process
        return True
    except psutil.Error:
        return False


def kill_descendants(pid: int | None = None) -> None:
    """SIGKILL every descendant of ``pid`` (of this process if None), again until none is left
    alive, in case one forks meanwhile. ``pid`` must be a child of the caller, not yet waited for."""
    for _ in range(10):
        try:
            descendants = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return
        if not [proc for proc in descendants if _kill(proc)]:
            return


def kill_tree(pid: int) -> None:
    """SIGKILL the descendants of ``pid``, then its process group (``pid`` started its own)."""
    kill_descendants(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tagged(token: str, prefix: bool = False) -> int:
    """SIGKILL every process of this user whose environment carries ``token`` (or, with ``prefix``,
    a token starting with it); return how many."""
    from ..protocol import TOKEN_ENV

    killed = 0
    for proc in processes_of(os.getuid()):
        try:
            value = proc.environ().get(TOKEN_ENV, "")
        except psutil.Error:
            continue
        if value and (value == token or (prefix and value.startswith(token))):
            killed += _kill(proc)
    return killed


def processes_of(uid: int) -> list[psutil.Process]:
    """Every process whose real user id is ``uid``."""
    found = []
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None and uids.real == uid and proc.pid != os.getpid():
            found.append(proc)
    return found


def kill_user(uid: int) -> None:
    """SIGKILL every process of user ``uid`` (a sandboxed run's own), again until none is left."""
    for _ in range(20):
        if not [proc for proc in processes_of(uid) if _kill(proc)]:
            return


def adopt_orphans() -> None:
    """Make this process the one orphaned descendants are re-parented to (Linux), not init."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
