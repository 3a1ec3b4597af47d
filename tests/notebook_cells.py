"""Running a chapter's code cells outside Jupyter, for tests that re-run or break them.

Cells are found by a phrase of their source, never by index; IPython magics are dropped and
printed output is swallowed. Used by test_check_cells_fail.py (each check cell must fail when the
code it guards is broken) and by the claims tests that re-run a chapter's cells on other seeds.
"""
from __future__ import annotations

import contextlib
import io

import nbformat

from repo_paths import REPO


def code_cells(stem: str) -> list:
    """The code cells of chapters/<stem>.ipynb, in order."""
    nb = nbformat.read(REPO / "chapters" / f"{stem}.ipynb", as_version=4)
    return [c for c in nb.cells if c.cell_type == "code"]


def source(cell) -> str:
    """A cell's source without its IPython magics (lines starting with %)."""
    return "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))


def find(cells: list, phrase: str) -> int:
    """Index of the one cell whose source contains ``phrase``."""
    found = [i for i, c in enumerate(cells) if phrase in c.source]
    assert len(found) == 1, f"{phrase!r} is in {len(found)} cells"
    return found[0]


def run(code: str, namespace: dict, name: str = "<cell>") -> None:
    """Execute ``code`` in ``namespace``, its printed output swallowed."""
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, name, "exec"), namespace)


def edited(cells: list, phrase: str, edits: list[tuple[str, str]]) -> str:
    """The source of the cell holding ``phrase``, each ``old`` (present exactly once) replaced."""
    code = source(cells[find(cells, phrase)])
    for old, new in edits:
        assert code.count(old) == 1, f"{old!r} is not once in the cell {phrase!r}"
        code = code.replace(old, new)
    return code
