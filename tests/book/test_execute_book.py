"""`scripts/execute_book.py`, the side-by-side execution that fills the book's execution cache.

jupyter-cache keys a notebook on its code only; the script drops the cache when the library (or a
pin) changed since the notebooks were executed, so a broken library cannot hide behind outputs it
computed before. On a tiny book in a scratch folder (its own `transformer_lib`, one chapter that
prints a library function's value, one that fails): a first run executes both, a second run none,
and after the library function's output changes the chapter is executed again and the cache holds
the new value. The run prints one line per notebook and a summary, and no kernel warns about
plain-text TCP.
"""
from __future__ import annotations

import os
import subprocess
import sys

import nbformat

from repo_paths import REPO

SCRIPT = REPO / "scripts" / "execute_book.py"
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def _tiny_book(root):
    (root / "transformer_lib").mkdir(parents=True)
    (root / "transformer_lib" / "__init__.py").write_text("")
    (root / "transformer_lib" / "tiny.py").write_text("def answer():\n    return 41\n")
    (root / "chapters").mkdir()
    (root / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n"
                                   "  - file: chapters/tiny\n  - file: chapters/broken\n")
    for name, source in (("tiny", "from transformer_lib.tiny import answer\nprint(answer())"),
                         ("broken", "1 / 0")):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)], metadata={"kernelspec": KERNELSPEC})
        nbformat.write(nb, root / "chapters" / f"{name}.ipynb")


def _run(root) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(root)})  # the kernels import root's library
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _cached_output(root) -> str:
    from jupyter_cache import get_cache

    cache = get_cache(root / "_build" / ".jupyter_cache")
    record = cache.get_cached_project_nb(str(root / "chapters" / "tiny.ipynb"))
    assert record is not None, "chapters/tiny.ipynb is not in the cache"
    return "".join(o.get("text", "") for o in cache.get_cache_bundle(record.pk).nb.cells[0].outputs).strip()


def test_a_library_change_executes_the_cached_chapter_again(tmp_path):
    _tiny_book(tmp_path)
    first = _run(tmp_path)
    assert "executing 2 of 2 notebooks" in first, first
    lines = first.splitlines()
    assert any(ln.split()[:1] == ["ok"] and ln.endswith("chapters/tiny.ipynb") for ln in lines), first
    assert any(ln.split()[:1] == ["FAILED"] and "chapters/broken.ipynb" in ln and "ZeroDivisionError" in ln
               for ln in lines), first
    assert "executed 1 of 2 notebooks" in lines[-1] and "1 failed" in lines[-1], first
    assert "(ZeroDivisionError: division by zero)" in first, "the error, without terminal colours"
    assert "without encryption" not in first and "WARNING" not in first, first
    assert len(lines) == 4, f"one line per notebook and the summary:\n{first}"
    assert _cached_output(tmp_path) == "41"

    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: chapters/tiny\n")
    again = _run(tmp_path)  # the library is unchanged: the cached chapter is not executed again
    assert again.strip() == "all 1 notebooks are in the execution cache, executed with this library", again

    (tmp_path / "transformer_lib" / "tiny.py").write_text("def answer():\n    return 42\n")
    changed = _run(tmp_path)
    assert "changed since the notebooks were executed" in changed and "executing 1 of 1 notebooks" in changed, changed
    assert _cached_output(tmp_path) == "42", "the cache still holds the output of the old library"
