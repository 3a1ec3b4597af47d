"""The sandbox each submission's worker and kernel run in: bubblewrap, and resource limits.

With ``--sandbox bwrap`` (or ``auto`` where bubblewrap works) :func:`command` wraps the worker
in ``bwrap``: new PID, network, IPC and UTS namespaces (so no network, not even 127.0.0.1 of
the host, and no process of the host can be seen or signalled); a filesystem of its own in
which only the system folders, Python and its packages and the course library are visible,
read-only, plus the run's own folder (writable) and a private, size-limited ``/tmp`` in memory,
where the kernel's working folder, home and records are. The instructor notebook, the other
submissions, the rest of the repository and ``$HOME`` are not there at all, and neither are the
judges: the library is shown as a copy without the judges' folder (``grading/judges/``) and the
reports' modules (:func:`kernel_library`). When the grader runs as root, the worker drops to a
user id of its own, random per run, before it starts the kernel (:func:`drop_privileges`), so
that the process limit counts only this submission's processes.

:func:`apply_limits` (in the worker, in every mode) sets the limits the kernel inherits:
address space per process (``RLIMIT_AS``), size of a written file, no core files, and, in the
sandbox, the number of processes. The runner also watches the memory of the whole process
tree (:func:`tree_memory`), and the size of the run's folders on its disk (:func:`folder_bytes`).
"""
from __future__ import annotations

import atexit
import functools
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

MODES = ("auto", "bwrap", "none")
MEMORY_BYTES = 4 * 2**30  # per process (address space) and for the whole tree (resident)
MAX_PROCESSES = 256  # processes and threads of one sandboxed submission
FILE_BYTES = 64 * 2**20  # largest file a submission may write
DISK_BYTES = 128 * 2**20  # a run's folders on the grader's disk: over this, the run is stopped
JUDGES_ONLY = ("judges", "report", "grade.py", "bench.py")  # the judges, the verdicts and the reports
TMP_BYTES = 256 * 2**20  # the sandbox's /tmp (in memory)
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
UID_RANGE = (1_000_000, 2_000_000_000)  # unused user ids, one per sandboxed run when root
# Variables naming the grader's own folders: inside the sandbox, a home of the run's stands in for them.
HOST_FOLDERS = ("TMPDIR", "MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR",
                "JUPYTER_PATH", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR",
                "HF_HOME", "TORCH_HOME")


class SandboxError(RuntimeError):
    """``--sandbox bwrap`` was asked for, but bubblewrap does not work here."""


def python_roots() -> list[str]:
    """The folders Python needs to run the worker and kernel: the interpreter's installation, the
    virtual environment, the ``site-packages`` folders on ``sys.path``, and the ``transformer_lib``
    package (only that folder of the repository; not the current folder, not ``PYTHONPATH``)."""
    import transformer_lib

    package = Path(transformer_lib.__file__).resolve().parent
    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.prefix).absolute(),
             Path(sys.executable).resolve().parent, package}
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path.is_dir() and {"site-packages", "dist-packages"} & set(path.parts):
            roots.add(path)
    roots = {r for r in roots if r.is_dir() and not any(str(r) == s or str(r).startswith(s + "/") for s in SYSTEM)}
    return sorted(str(r) for r in roots if not any(p in roots for p in r.parents))


def _package() -> Path:
    import transformer_lib

    return Path(transformer_lib.__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def kernel_library() -> str:
    """A copy of the ``transformer_lib`` package as a graded kernel sees it (made once, removed at
    exit): the judges' folder and the reports' modules left out, with their compiled files."""
    folder = Path(tempfile.mkdtemp(prefix="grading-library-"))
    atexit.register(shutil.rmtree, folder, True)
    copy = folder / "transformer_lib"
    shutil.copytree(_package(), copy)  # with the compiled files: those of unchanged modules stay valid
    for name in JUDGES_ONLY:
        if name.endswith(".py"):
            (copy / "grading" / name).unlink(missing_ok=True)
        else:
            shutil.rmtree(copy / "grading" / name, ignore_errors=True)
        for compiled in (copy / "grading" / "__pycache__").glob(f"{name.removesuffix('.py')}.*.pyc"):
            compiled.unlink()
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return str(copy)


def folder_bytes(folder: Path, max_entries: int = 20_000) -> int:
    """The bytes of the files under ``folder`` (links not followed); more than ``max_entries``
    entries count as too many bytes."""
    total, seen, stack = 0, 0, [str(folder)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if seen > max_entries:
                        return 2**62
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
    return total


def sandbox_env(env: dict[str, str], home: Path) -> dict[str, str]:
    """``env`` for a process inside the sandbox: no folder of the grader's, ``home`` as its home."""
    kept = {key: value for key, value in env.items() if key not in HOST_FOLDERS}
    return {**kept, "HOME": str(home), "TMPDIR": "/tmp", "MPLCONFIGDIR": str(home / ".matplotlib")}


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def command(argv: list[str], writable: list[str], cwd: str = "/") -> list[str]:
    """``argv`` wrapped in bubblewrap, run in ``cwd``, with the ``writable`` folders bound
    read-write at their own paths."""
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "grading"]
    if os.geteuid() != 0:
        args.append("--unshare-user")  # unprivileged bubblewrap needs a user namespace
    args += _system_binds()
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
    roots = python_roots()
    parents = sorted({str(p) for r in roots for p in Path(r).parents if str(p) != "/"}, key=len)
    for parent in parents:  # folders bubblewrap makes are private to root unless told otherwise
        args += ["--perms", "0755", "--dir", parent]
    for root in roots:
        args += ["--ro-bind", root, root]
    args += ["--ro-bind", kernel_library(), str(_package())]  # over the library: its copy without the judges
    for folder in writable:
        args += ["--bind", folder, folder]
    return [*args, "--chdir", cwd, "--", *argv]


@functools.lru_cache(maxsize=None)
def probe() -> str | None:
    """None if the sandbox works on this machine, else why not (one line)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        done = subprocess.run(command([sys.executable, "-c", "import transformer_lib"], []),
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"bubblewrap could not be started ({type(err).__name__}: {err})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1][:200]
        return f"bubblewrap does not work here ({last})"
    return None


def resolve(mode: str) -> bool:
    """True to sandbox with ``mode`` (``auto``, ``bwrap`` or ``none``). ``bwrap`` needs a working
    bubblewrap, and so does ``auto`` whenever bubblewrap is installed: if it fails to start, both
    raise :class:`SandboxError` with the reason (grading never falls back silently; ``none`` is the
    explicit way to grade without it). ``auto`` without bubblewrap installed grades unsandboxed,
    with a warning (the class report says so too)."""
    if mode not in MODES:
        raise ValueError(f"sandbox: expected one of {MODES}, got {mode!r}")
    if mode == "none":
        return False
    why = probe()
    if why is None:
        return True
    if mode == "bwrap" or shutil.which("bwrap") is not None:
        raise SandboxError(f"--sandbox {mode}: {why}. Fix it (`python -m transformer_lib doctor`), or grade "
                           "without the sandbox with --sandbox none (student code then runs as this user)")
    print(f"WARNING: grading without a sandbox: {why}; student code runs as this user and can read what this "
          "user can (see the instructors' guide). Install bubblewrap, or pass --sandbox none to say so.",
          file=sys.stderr)
    return False


def sandbox_uid() -> int | None:
    """A random unused user id for one sandboxed run when the grader is root, else None."""
    if os.geteuid() != 0:
        return None
    low, high = UID_RANGE
    return low + int.from_bytes(os.urandom(4), "big") % (high - low)


def apply_limits(memory: int, sandboxed: bool) -> None:
    """Limits for this process and everything it starts (called by the worker, before the kernel)."""
    limits = [(resource.RLIMIT_AS, memory), (resource.RLIMIT_FSIZE, FILE_BYTES), (resource.RLIMIT_CORE, 0)]
    if sandboxed:  # outside a sandbox it would count every process of the grader's user
        limits.append((resource.RLIMIT_NPROC, MAX_PROCESSES))
    for kind, value in limits:
        try:
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError):
            pass


def drop_privileges(uid: int) -> None:
    """Become user and group ``uid`` (no supplementary groups) for good."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def tree_memory(pid: int, limit: int) -> int:
    """Memory, in bytes, of ``pid`` and all its descendants (0 if it is gone); see :func:`memory_of`."""
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return 0
    return memory_of(procs, limit)


def user_memory(uid: int, limit: int) -> int:
    """Memory, in bytes, of every process of user ``uid`` (a sandboxed run's own user id)."""
    from .procs import processes_of

    return memory_of(processes_of(uid), limit)


def memory_of(procs: list[psutil.Process], limit: int) -> int:
    """The resident memory of ``procs``, or, if that exceeds ``limit``, their proportional set size
    (pages shared after a fork counted once), which is slower to measure."""

    def total(measure) -> int:  # noqa: ANN001
        found = 0
        for proc in procs:
            try:
                found += measure(proc)
            except psutil.Error:
                pass
        return found

    rss = total(lambda p: p.memory_info().rss)
    return rss if rss <= limit else total(lambda p: p.memory_full_info().pss)
