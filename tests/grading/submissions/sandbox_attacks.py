"""Chapter 2 submissions that attack the machine the grader runs on, for the sandbox tests.

Each attack is prepended to the solution cell of exercise 2.2 of a correct submission and, if
it succeeds, raises there, so ``stable_softmax`` stays undefined and its check fails. The grader
refuses the code of most attacks (os, open, sockets, …), so 2.2 scores 0 either way, but it still
runs it and judges the check all the same: the message ends "(judged without regard to that:
passed)" where the attack was stopped, and names the NameError where it worked.
``memory_hog`` instead holds more memory than allowed, in several processes, before exercise
2.3: the grader stops it and it keeps the 6 points of the checks before.
"""
from __future__ import annotations

from pathlib import Path

from transformer_lib.grading.prepare.notebook import dumps, read

from .adversarial import SOURCE, _prepend_to
from .helpers import as_handed_in


def read_instructor(path: Path) -> str:
    """Read the instructor notebook: at the path given, and at every ``.ipynb`` path on a command line in /proc."""
    return f'''
import glob
_paths = [{str(path)!r}]
for _f in glob.glob("/proc/*/cmdline"):
    try:
        _paths += [a for a in open(_f, "rb").read().decode(errors="replace").split("\\0") if a.endswith(".ipynb")]
    except OSError:
        pass
for _p in _paths:
    try:
        if "BEGIN SOLUTION" in open(_p).read():
            raise RuntimeError("read the instructor notebook at " + _p)
    except OSError:
        pass
'''


def read_judges(folder: Path) -> str:
    """Read the judges of chapter 2 (their references are the answers) in the library's folder ``folder``."""
    return f'''
_read = []
for _p in [{str(folder / "ch02_attention.py")!r}, {str(folder / "common.py")!r}]:
    try:
        _text = open(_p).read()
        if "@judge(" in _text or "def judge(" in _text:
            _read.append(_p)
    except OSError:
        pass
if _read:
    raise RuntimeError("read the judges: " + ", ".join(_read))
'''


def read_other(path: Path) -> str:
    """Read another student's submission (and any notebook another run of the grader prepared)."""
    return f'''
import glob
for _p in [{str(path)!r}, *glob.glob("/tmp/grading-*/notebook.ipynb")]:
    try:
        open(_p).read()
    except OSError:
        continue
    raise RuntimeError("read another submission: " + _p)
'''


def connect(port: int) -> str:
    """Connect to a TCP server listening on the grader's 127.0.0.1."""
    return f'''
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
except OSError:
    pass
else:
    raise RuntimeError("connected to the grader's network")
'''


def write_outside(files: list[Path]) -> str:
    """Create files in the repository and in the grader's $HOME."""
    return f'''
_wrote = []
for _p in {[str(f) for f in files]!r}:
    try:
        open(_p, "w").write("written by a submission")
        _wrote.append(_p)
    except OSError:
        pass
if _wrote:
    raise RuntimeError("wrote " + ", ".join(_wrote))
'''


def signal_grader(pid: int) -> str:
    """SIGTERM to the grader's process and process group (its pid is given)."""
    return f'''
import os, signal
for _kill in (os.kill, os.killpg):
    try:
        _kill({pid}, signal.SIGTERM)
    except OSError:
        continue
    raise RuntimeError("signalled the grader")
'''


def _name(marker: str) -> str:
    """Code that names the current process ``marker`` (its ``comm``), so a test can look for it."""
    return f"import ctypes; ctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)"


def fork_bomb(marker: str) -> str:
    """Fork until the system says no; each child, named ``marker``, sleeps (processes without bound, not CPU)."""
    return f'''
import os, time
_n = 0
try:
    while _n < 20000:
        if os.fork() == 0:
            {_name(marker)}
            time.sleep(3600)
            os._exit(0)
        _n += 1
except OSError:
    pass
if _n >= 20000:
    raise RuntimeError("forked without bound")
'''


ALLOCATE_64_GB = '''
try:
    _big = torch.ones(16 * 2**30)  # 64 GB of float32, every page written
except (RuntimeError, MemoryError):
    pass
else:
    raise RuntimeError("allocated 64 GB")
'''

def memory_hog(marker: str) -> str:
    """Eight processes (named ``marker``) holding 400 MB each, written, so resident: 3.2 GB in
    all, each under the per-process limit of a 2 GB run, together over it."""
    return f'''
import os, time
for _ in range(8):
    if os.fork() == 0:
        {_name(marker)}
        _block = bytearray(400 * 2**20)
        time.sleep(600)
        os._exit(0)
time.sleep(600)
'''


def write(folder: Path, attacks: dict[str, str]) -> None:
    """Write one submission per attack into ``folder`` (``name.ipynb``)."""
    correct = as_handed_in(read(SOURCE))
    for name, code in attacks.items():
        cell = "attention" if name == "memory_hog" else "stable_softmax"
        (folder / f"{name}.ipynb").write_text(dumps(_prepend_to(correct, cell, code)), encoding="utf-8")
