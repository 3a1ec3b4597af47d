"""One build of the book per test session, shared by `tests/book/test_book.py` and the browser suite.

It builds into `_build/html`, where `make book` puts the book: first the notebooks are executed
side by side into the execution cache (`scripts/execute_book.py`, as `make book` does), then
`jupyter-book build --all` renders every page from a fresh Sphinx environment, so that every
page is read again and every warning is printed, whatever an earlier build left behind. The
result (exit code and log) is kept for the tests that read it. A file lock keeps two test
processes from building at once.
"""
from __future__ import annotations

import fcntl
import functools
import subprocess
import sys
from pathlib import Path

from repo_paths import REPO

JB = Path(sys.executable).with_name("jupyter-book")
FLAGS = ["--warningiserror", "--nitpick", "--keep-going"]
HTML = REPO / "_build" / "html"


def build_command(source: Path, *extra: str) -> list[str]:
    """The command that builds the book at ``source`` as `make book` does (plus ``extra``)."""
    return [str(JB), "build", str(source), *FLAGS, *extra]


def build_into(source: Path, out: Path) -> subprocess.CompletedProcess:
    """Build another book (``source``, a small one a test makes) into ``out``, flags as `make book`."""
    return subprocess.run(build_command(source, "--path-output", str(out)), cwd=source, capture_output=True,
                          text=True, timeout=900)


def can_build() -> bool:
    return JB.exists() and (REPO / "_config.yml").exists()


@functools.cache
def build() -> subprocess.CompletedProcess:
    """Build `_build/html` once in this test session (every page, fresh environment)."""
    (REPO / "_build").mkdir(exist_ok=True)
    with open(REPO / "_build" / ".book-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([sys.executable, str(REPO / "scripts" / "execute_book.py")], cwd=REPO,
                       capture_output=True, timeout=900)  # a failure here is the build's to report
        return subprocess.run(build_command(REPO, "--all"), cwd=REPO, capture_output=True, text=True,
                              timeout=900)
