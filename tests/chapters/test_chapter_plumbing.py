"""No plumbing on the page: no code cell that a reader sees calls `glue(` (or a helper named
`glue…`, such as `glue_vec`). Numbers reach the prose through myst-nb's glue, but the calls
belong in cells whose input is removed or hidden (`remove-input`, `remove-cell`, `hide-input`,
`hide-cell`), as STYLE.md asks.

Every chapter is listed.
"""
from __future__ import annotations

import ast

import nbformat
import pytest

from repo_paths import REPO

HIDDEN = {"remove-input", "remove-cell", "hide-input", "hide-cell"}
CHAPTERS = sorted(p.stem for p in (REPO / "chapters").glob("*.ipynb"))


def _glue_calls(source: str) -> list[str]:
    """Names of the glue functions a cell calls (IPython magics and shell lines are skipped)."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    names = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name.startswith("glue"):
                names.append(name)
    return names


def visible_glue_calls(stem: str) -> list[str]:
    """'cell N: glue, glue_vec' for every visible code cell of a chapter that calls glue."""
    nb = nbformat.read(REPO / "chapters" / f"{stem}.ipynb", as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or HIDDEN & set(cell.metadata.get("tags", [])):
            continue
        calls = _glue_calls(cell.source)
        if calls:
            found.append(f"cell {i}: {', '.join(sorted(set(calls)))}")
    return found


def test_the_detector_finds_glue_calls_and_only_calls():
    assert _glue_calls("%matplotlib inline\nglue('x', 1, display=False)") == ["glue"]
    assert _glue_calls("glue_vec('v', v)\nmyst_nb.glue('y', 2)") == ["glue_vec", "glue"]
    assert _glue_calls("from myst_nb import glue\n# glue('x', 1)\ns = 'glue(x)'") == []


@pytest.mark.parametrize("stem", CHAPTERS)
def test_no_visible_cell_calls_glue(stem):
    found = visible_glue_calls(stem)
    assert not found, f"{stem}: glue calls in visible code cells (move them to a remove-input cell): {found}"
