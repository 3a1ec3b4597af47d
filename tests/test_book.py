"""The book builds, executing every chapter, with Sphinx warnings treated as errors.

The build goes into a temporary folder; the execution cache (`_build/.jupyter_cache`, set in
`_config.yml`) is shared with `make book`, so a notebook is re-executed only when it changed.
A second, tiny book proves that a failing cell fails the build.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import REPO

JB = str(Path(sys.executable).with_name("jupyter-book"))
FLAGS = ["--warningiserror", "--nitpick", "--keep-going"]


def _build(source: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([JB, "build", str(source), "--path-output", str(out), *FLAGS],
                          cwd=source, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book")
    result = _build(REPO, out)
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"book build failed:\n{log[-6000:]}"
    # Sphinx warnings read "path: WARNING: message" (a kernel's own log lines do not count).
    warnings = [ln for ln in log.splitlines() if "WARNING: " in ln]
    assert not warnings, "book build printed warnings:\n" + "\n".join(warnings[:20])
    return out / "_build" / "html"


def test_book_has_every_page(built):
    assert (built / "index.html").exists()
    for nb in sorted((REPO / "chapters").glob("*.ipynb")):
        assert (built / "chapters" / f"{nb.stem}.html").exists(), f"no page for {nb.name}"
        assert (built / "exercises" / f"{nb.stem}.html").exists(), f"no exercises page for {nb.name}"


def test_chapters_were_executed(built):
    """Every chapter page shows the outputs of its check cells (printed '✓' lines)."""
    for nb in sorted((REPO / "chapters").glob("*.ipynb")):
        html = (built / "chapters" / f"{nb.stem}.html").read_text()
        assert "✓" in html, f"{nb.name}: no check output on the page: was the notebook executed?"
        assert "Traceback" not in html, f"{nb.name}: a traceback is shown on the page"


def test_exercise_pages_are_not_executed(built):
    for nb in sorted((REPO / "exercises").glob("*.ipynb")):
        html = (built / "exercises" / f"{nb.stem}.html").read_text()
        assert "NotImplementedError" in html, f"{nb.name}: the student stubs are missing"
        assert "Traceback" not in html, f"{nb.name}: exercise pages must not be executed"


def test_a_failing_cell_fails_the_build(tmp_path):
    """The executing build is the gate: a cell that raises must stop it (no cache can hide it)."""
    book = tmp_path / "broken"
    book.mkdir()
    shutil.copy(REPO / "_config.yml", book)
    shutil.copy(REPO / "references.bib", book)
    (book / "intro.md").write_text("# Intro\n")
    (book / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: bad\n")
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# Bad"},
                    {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": "raise ZeroDivisionError('deliberate failure')"}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (book / "bad.ipynb").write_text(json.dumps(nb))
    result = _build(book, tmp_path / "out")
    assert result.returncode != 0, "a notebook cell raised but the build succeeded"
    assert "ZeroDivisionError" in result.stdout + result.stderr
