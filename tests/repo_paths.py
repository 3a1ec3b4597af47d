"""Paths shared by the tests: the repository root and its tracked files."""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tracked_files(pattern: str) -> list[Path]:
    """Files under version control matching a git pathspec (every match if not a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", pattern], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
        return [REPO / p for p in out]
    except (OSError, subprocess.CalledProcessError):
        skip = {".venv", "_build", "node_modules"}
        return sorted(p for p in REPO.rglob(pattern) if not skip & set(p.parts))
