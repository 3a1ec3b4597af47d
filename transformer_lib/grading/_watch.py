"""The watch a graded kernel carries from its start, before the first cell of the notebook runs.

The worker runs :func:`install` in the kernel silently (no history, no output) before the first
cell. It adds an audit hook (:func:`sys.addaudithook`: it cannot be removed, and it sees every
thread) that notes, for the rest of the run, what code of the notebook does that no exercise
needs: reaching frames, code or the interpreter's hooks (``sys._getframe``, ``tb_frame``,
``__code__``, ``sys.setprofile``, ``gc.get_referrers``, another audit hook), running code from a
string (``exec``, ``compile``), files, processes, sockets and ``ctypes``. It also keeps what torch's,
NumPy's and Python's own namespaces and classes held at the start (``torch.Tensor.detach``,
``torch.softmax``, ``numpy.savez``, ``builtins.isinstance`` …) and the threads that were running.

Nothing of this is kept where the notebook can reach it: the state lives in the hook's closure.
A check asks before and after it calls the student's code, by reading ``__code__`` of a function
named :data:`QUERY`: that read raises an audit event in C, which no Python function the notebook
could replace stands in front of. The hook raises :class:`Tampered` (naming the first finding and
where it happened) if something was noted since the last question, a namespace is changed, a
thread of the notebook's is alive or a trace or profile function is set (``sys`` or ``threading``: it
would run, and could rewrite the locals of, the checks' own code). A call that a cell's time limit
interrupted asks the watch to forget one finding (:data:`FORGET`): the switching off of the check's
profile hook. A finding that can reach beyond the current check
(:data:`STICKY`: the watch's own state through ``gc``, memory through ``ctypes``, code made from
bytes, processes) stays: every check after it fails too. Code run from a string is the notebook's.

The hook also holds each check cell's secrets (the seed of its hidden inputs, its record folder and
the nonce of its record files' names), read from a file the grader wrote, deleted before the first
cell: a check cell's loader asks for them the same way (:data:`SECRETS`), and gets them once. The
check cells' own files (:func:`cell_file`) are not the notebook's code.
"""
from __future__ import annotations

QUERY, SECRETS = "_grading_watch_query", "_grading_watch_secrets"  # names of the functions that ask
# The name of the function whose ``__code__`` a check's call reads when an interrupt ended it (asked by
# ``_forget_dropped_hook`` in ``call`` of ``_calls.py``, called by no code of the notebook's): the watch forgets
# its last finding if that is a ``sys.setprofile`` since the last question, which CPython raises when it switches
# off a profile function that an exception escaped (the check's hook, where the interrupt landed).
FORGET, DROPPED = "_grading_watch_forget", "the notebook's code used sys.setprofile"
HASH_SEED = 0xC70F6907  # ipykernel's: a cell runs from the file ipykernel_<pid>/<murmur2(source)>.py
# Events noted when code of the notebook raises them (the frame that raised it is the notebook's).
EVENTS = {"sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.setprofile", "sys.settrace",
          "sys.addaudithook", "object.__getattr__", "object.__setattr__", "object.__delattr__", "gc.get_objects",
          "gc.get_referrers", "gc.get_referents", "exec", "compile", "code.__new__", "function.__new__", "open",
          "os.system", "os.kill", "os.killpg", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
          "os.putenv", "os.unsetenv", "os.remove", "os.rename", "os.mkdir", "os.chmod", "os.symlink", "os.link",
          "os.truncate", "subprocess.Popen", "shutil.copyfile", "shutil.rmtree", "pty.spawn", "sys._debugmallocstats",
          "cpython.run_command", "builtins.input", "marshal.loads", "pickle.find_class", "urllib.Request",
          "import"}
PREFIXES = ("ctypes.", "socket.", "_thread.", "mmap.", "resource.", "signal.", "fcntl.", "winreg.")
# Findings that can reach what later checks rely on (the watch's own state, other processes' memory, code
# run from data): every check after them fails. Any other finding fails the check it happened in (or before).
STICKY = {"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.addaudithook", "code.__new__", "function.__new__", "marshal.loads", "pickle.find_class", "os.system", "os.fork", "os.forkpty",
          "os.posix_spawn", "os.spawn", "os.exec", "subprocess.Popen", "pty.spawn", "cpython.run_command"}
# Events noted when code of the notebook is anywhere on the stack: what changes files (through any library);
# also every ``socket.*`` event and every ``open`` to write.
CHANGES = {"os.remove", "os.rename", "os.symlink", "os.link", "os.truncate", "shutil.copyfile", "shutil.rmtree",
           "shutil.move"}
PASSING = {"interactiveshell.py", "pathlib.py", "codecs.py", "_compression.py", "gzip.py", "bz2.py", "lzma.py"}
# What the checks rely on: the namespaces whose functions and classes must stay the ones the kernel started with.
NAMESPACES = ("builtins", "torch", "torch.nn.functional", "torch.linalg", "torch.special", "torch.autograd",
              "torch.overrides", "torch.utils._python_dispatch", "torch._C", "torch._C._VariableFunctions",
              "torch._C._nn", "numpy", "numpy.lib.npyio", "os", "os.path", "json", "zipfile", "hashlib", "sys",
              "threading", "contextlib", "linecache", "types", "functools")
CLASSES = (("torch", "Tensor"), ("torch.nn", "Module"), ("torch.nn", "Parameter"), ("torch", "Generator"),
           ("torch.overrides", "TorchFunctionMode"), ("torch.utils._python_dispatch", "TorchDispatchMode"))
VARYING = {"builtins.input", "builtins.raw_input", "builtins.getpass", "sys.displayhook", "sys.excepthook",
           "sys.breakpointhook"}  # set anew by the kernel for each cell
# The import of these by the notebook's own code is noted (the grader's reading refuses them too).
MODULES = {"ctypes", "_ctypes", "gc", "inspect", "importlib", "_thread", "threading", "subprocess", "multiprocessing",
           "socket", "pickle", "marshal", "code", "codeop", "pty", "signal", "mmap", "resource", "shutil",
           "tempfile", "concurrent", "asyncio", "sysconfig", "site", "builtins", "io", "os", "sys", "traceback",
           "linecache", "types", "weakref"}


class Tampered(RuntimeError):
    """The watch noted something (the message: what, and ``line|text`` where, if known)."""


def _memory(args: tuple) -> bool:
    """True if an ``open`` event opens a process's memory (``/proc/<pid>/mem`` and the like)."""
    import os
    import re

    path = args[0] if args and isinstance(args[0], (str, bytes)) else ""
    path = os.path.realpath(os.fsdecode(path)) if path else ""
    return bool(re.fullmatch(r"/proc/[^/]+(/task/[^/]+)?/(mem|pagemap|maps|smaps|environ)|/dev/k?mem", path))


def _writes(mode: object, flags: object) -> bool:
    """True if an ``open`` event's mode or flags write."""
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & 3)  # O_WRONLY or O_RDWR


def _callable(value: object) -> bool:
    return callable(value) or type(value).__name__ == "module"


def cell_file(source: str) -> str:
    """The name of the file ipykernel compiles a cell of ``source`` as (without its folder)."""
    from ipykernel.compiler import murmur2_x86

    return f"{murmur2_x86(source, HASH_SEED)}.py"


def write_secrets(path, cells: list[str], record: str, seed: str) -> dict[str, str]:  # noqa: ANN001
    """Write each check cell's secrets to ``path`` (mode 0600), for :func:`install`: its record
    folder ``record``, a nonce and a seed derived from the grading run's ``seed`` and its grade_id.
    Returns the nonces. (Called by the grader, outside the kernel.)"""
    import hashlib
    import json
    import os
    import secrets as random

    nonces = {gid: random.token_hex(8) for gid in cells}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({gid: {"record": record, "nonce": nonces[gid],
                         "seed": hashlib.sha256(f"{seed}/{gid}".encode()).hexdigest()[:32]} for gid in cells}, fh)
    return nonces


def install(roots: tuple[str, ...], checks: tuple[str, ...], secrets_file: str) -> None:
    """Start the watch; ``roots``: the folders of trusted code (Python, its packages, the course
    library); ``checks``: the files of the check cells (:func:`cell_file`); code anywhere else
    (the notebook's cells) is the notebook's. ``secrets_file``: JSON ``{grade_id: secrets}``,
    read and deleted."""
    import importlib
    import json
    import linecache
    import os
    import sys
    import tempfile
    import threading

    getframe, audit_busy, function = sys._getframe, threading.local(), type(install)
    roots, checks = tuple(roots), frozenset(checks)
    with open(secrets_file, encoding="utf-8") as fh:
        secrets = json.load(fh)
    os.unlink(secrets_file)
    found: list[tuple[str, int, str, bool]] = []  # what, line, text, sticky (reaches beyond the current check)
    seen = [0]  # the findings a question has reported: one that is not sticky is reported once
    spaces = []
    for name in NAMESPACES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        kept = {k: v for k, v in vars(module).items()
                if (type(v) is type(len) if name == "sys" else _callable(v)) and f"{name}.{k}" not in VARYING}
        spaces.append((name, vars(module), kept, False))
    for module, cls in CLASSES:
        owner = getattr(importlib.import_module(module), cls)
        spaces.append((f"{module}.{cls}", owner.__dict__, dict(owner.__dict__), True))
    threads = set(sys._current_frames())
    caches = (os.path.join(os.path.expanduser("~"), ""), "/dev/",  # libraries' caches (matplotlib's fonts, torch's)
              os.path.join(tempfile.gettempdir(), "torchinductor_"))

    def notebook(filename: str) -> bool:
        return not filename.startswith(("<frozen ", *roots)) and os.path.basename(filename) not in checks

    def where(frame) -> tuple[int, str]:  # noqa: ANN001
        while frame is not None and not notebook(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is None:
            return 0, ""
        return frame.f_lineno, linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()[:200]

    def defined_at(code) -> tuple[int, str]:  # noqa: ANN001
        """The line number and text where the notebook's ``code`` starts (0, "" if it is not the notebook's)."""
        if code is None or not notebook(code.co_filename):
            return 0, ""
        return code.co_firstlineno, linecache.getline(code.co_filename, code.co_firstlineno).strip()[:200]

    def changed() -> tuple[str, int, str] | None:
        for name, current, kept, exact in spaces:
            for key, value in kept.items():
                if current.get(key, None) is not value:
                    new = current.get(key)
                    code = new.__code__ if type(new) is function else None
                    if code is not None and f"{os.sep}transformer_lib{os.sep}grading{os.sep}" in code.co_filename:
                        continue  # a check's own switch (ch05 notes calls of torch's multi-head layer)
                    if code is not None and not notebook(code.co_filename) and new.__dict__.get("__wrapped__") is value:
                        kept[key] = new  # torch wrapping its own function (torch._dynamo wraps manual_seed)
                        continue
                    return (f"{name}.{key} was replaced", *defined_at(code))
            if exact and len(current) != len(kept):
                extra = sorted(set(current) - set(kept))
                return f"{name}.{extra[0] if extra else '?'} was added", 0, ""
        return None

    def alarm() -> None:
        fresh, seen[0] = found[seen[0]:], len(found)
        hit = next((f[:3] for f in found if f[3]), None) or (fresh[0][:3] if fresh else None) or changed()
        for setter, tracer in (("sys.settrace", sys.gettrace()), ("sys.setprofile", sys.getprofile()),
                               ("threading.settrace", threading.gettrace()),
                               ("threading.setprofile", threading.getprofile())):
            if hit is None and tracer is not None:
                hit = (f"a {setter.rpartition('set')[2]} function is set ({setter})",
                       *defined_at(tracer.__code__ if type(tracer) is function else None))
        if hit is None:
            for ident, frame in sys._current_frames().items():  # a thread that runs code of the notebook's
                line, text = where(frame) if ident not in threads and ident != threading.get_ident() else (0, "")
                if line:
                    hit = ("a thread started by the notebook is running", line, text)
                    break
        if hit is not None:
            what, line, text = hit
            raise Tampered(f"{what}|{line}|{text}")

    def calls(frame, name: str) -> bool:  # noqa: ANN001
        """True if ``frame`` runs the function ``name`` of the checks' ``_calls.py`` (not the notebook's code)."""
        code = frame.f_code
        return not notebook(code.co_filename) and os.path.basename(code.co_filename) == "_calls.py" \
            and code.co_name == name

    def answer(asker: object, frame) -> None:  # noqa: ANN001
        defaults = asker.__defaults__ or ()
        if asker.__name__ == QUERY and len(defaults) == 1 and type(defaults[0]) is list:
            alarm()
            defaults[0].append(True)
        elif asker.__name__ == FORGET and len(defaults) == 1 and type(defaults[0]) is list:
            caller = frame.f_back  # call(), which the interrupt ended; and what called it: a check, never the notebook
            outer = caller.f_back if caller is not None else None
            if not (calls(frame, "_forget_dropped_hook") and caller is not None and calls(caller, "call")
                    and outer is not None and not notebook(outer.f_code.co_filename)):
                found.append(("the notebook's code asked the watch to forget", *where(frame), False))
                return
            if len(found) > seen[0] and found[-1][0] == DROPPED:
                found.pop()  # the last finding, CPython's: nothing of the notebook's ran after it
            defaults[0].append(True)
        elif asker.__name__ == SECRETS and len(defaults) == 2 and type(defaults[1]) is list:
            if notebook(frame.f_code.co_filename):  # only a check cell's loader may ask
                found.append(("the notebook's code asked for a check cell's inputs", *where(frame), False))
                return
            defaults[1].append(secrets.pop(str(defaults[0]), None))

    def hook(event: str, args: tuple) -> None:
        if getattr(audit_busy, "on", False):
            return
        if event == "object.__getattr__" and len(args) == 2 and args[1] == "__code__" \
                and type(args[0]) is function and args[0].__name__ in (QUERY, SECRETS, FORGET):
            audit_busy.on = True
            try:
                answer(args[0], getframe(1))
            finally:
                audit_busy.on = False
            return
        writes = event in CHANGES or event.startswith("socket.") or event == "open" and len(args) > 2 \
            and _writes(args[1], args[2]) and not str(args[0]).startswith(caches)
        if event not in EVENTS and not writes and not event.startswith(PREFIXES):
            return
        if event == "import" and (not args or str(args[0]).partition(".")[0] not in MODULES):
            return
        audit_busy.on = True
        try:
            frame = getframe(1)
            while frame.f_back is not None and os.path.basename(frame.f_code.co_filename) in PASSING:
                frame = frame.f_back  # IPython's open, pathlib's: the caller opened the file
            if writes and not notebook(frame.f_code.co_filename):
                line, text = where(frame)
                if line:  # a library writes a file or connects for the notebook's code (ndarray.dump, socket, …)
                    what = "connected" if event.startswith("socket.") else "wrote a file"
                    found.append((f"the notebook's code {what} ({event} {str(args[0])[:80]})", line, text, False))
            elif notebook(frame.f_code.co_filename):
                detail = f" ({args[1]})" if event.startswith("object.") and len(args) > 1 else ""
                detail = f" ({args[0]})" if event == "import" and args else detail
                sticky = event in STICKY or event.startswith(("ctypes.", "mmap.")) or event == "open" and _memory(args)
                found.append((f"the notebook's code used {event}{detail}"[:200], frame.f_lineno,
                              linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()[:200], sticky))
        finally:
            audit_busy.on = False

    sys.addaudithook(hook)
