"""Running a chapter's code cells outside Jupyter, for tests that re-run or break them.

Cells are found by a phrase of their source, never by index; IPython magics are dropped and
printed output is swallowed. Used by tests/chapters/ (each check cell must fail when the code it
guards is broken: `check_fails_when_broken`) and by the claims tests (tests/claims/) that re-run a
chapter's cells on other seeds.
"""
from __future__ import annotations

import __future__
import contextlib
import functools
import importlib
import inspect
import io
import os
import re
import textwrap
import traceback

import nbformat
import pytest

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


# ---------------------------------------------------------------------------------- break cases
def is_figure(cell) -> bool:
    """A cell that only draws or displays: hidden input, a figure or a table, no check."""
    tags = set(cell.metadata.get("tags", []))
    return (bool(tags & {"hide-input", "remove-input"}) and "assert" not in cell.source
            and ("plt.show()" in cell.source or "display(" in cell.source))


@functools.cache
def chapter(stem: str, last: str, skip: tuple[str, ...] = ()) -> tuple[list, dict]:
    """Run the chapter's code cells up to the one holding ``last`` once (figure cells and the cells
    holding a phrase of ``skip`` left out, plots to Agg); return its cells and namespace."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib.pyplot as plt
    cells, namespace = code_cells(stem), {"__name__": "__main__"}
    skipped = {find(cells, phrase) for phrase in skip}
    for i, cell in enumerate(cells[: find(cells, last) + 1]):
        if i not in skipped and not is_figure(cell):
            run(source(cell), namespace)
        plt.close("all")
    return cells, namespace


def break_library(target: str, edits: list[tuple[str, str]], namespace: dict, monkeypatch) -> None:
    """Recompile `module:function` or `module:Class.method` of the library with ``edits`` applied
    and put it in place of the original (in the module or class, and wherever the chapter's
    namespace holds the original) until the case ends."""
    module_name, qualname = target.split(":")
    module = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    owner = functools.reduce(getattr, path, module)
    original = inspect.getattr_static(owner, name)
    function = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original
    code = textwrap.dedent(inspect.getsource(function))
    for old, new in edits:
        assert code.count(old) == 1, f"{old!r} is not once in {target}"
        code = code.replace(old, new)
    scope = dict(vars(module))
    if owner is not module:   # a method: zero-argument super() needs its class named
        scope["__class__"] = owner
        code = code.replace("super()", "super(__class__, self)")
    flags = __future__.annotations.compiler_flag
    exec(compile(code, f"<broken {target}>", "exec", flags=flags, dont_inherit=True), scope)
    monkeypatch.setattr(owner, name, scope[name])
    for key, value in list(namespace.items()):
        if value is original:
            namespace[key] = scope[name]


def check_fails_when_broken(case: tuple, last: str, skip: tuple[str, ...], monkeypatch) -> None:
    """Run one break case of a chapter and assert that its check cell raises AssertionError on the
    line holding the case's phrase.

    A case is ``(chapter, steps, phrase of the failing line[, library patches])``. The chapter's
    cells up to ``last`` have run once (`chapter`); the case runs its steps in a copy of that
    namespace. A step is ``(cell phrase, [(line, broken line), ...])``: that cell with those lines
    replaced, or, for a phrase ``"lib:module:function"`` (or ``"lib:module:Class.method"``), that
    function of the library recompiled with the lines replaced, in place of the original for the
    case (`break_library`). The last step is the check cell. A library patch ``(module, name,
    make_broken)`` replaces ``module.name`` by ``make_broken(original)`` for the case. So a check
    can be shown to catch a bug inside transformer_lib (the rotation of RoPE dropped inside the
    attention layer, say), not only in the chapter's own cells. A training check is broken with a
    learning rate a million times too small (and fewer steps, which only save time)."""
    stem, steps, failing, *patches = case
    cells, namespace = chapter(stem, last, skip)
    namespace = dict(namespace)
    for module_name, attr, make_broken in (patches[0] if patches else []):
        module = importlib.import_module(module_name)
        original = getattr(module, attr)
        broken = make_broken(original)
        monkeypatch.setattr(module, attr, broken)
        namespace.update({key: broken for key, value in namespace.items() if value is original})
    *before, (check, edits) = steps
    for phrase, cell_edits in before:
        if phrase.startswith("lib:"):
            break_library(phrase[4:], cell_edits, namespace, monkeypatch)
        else:
            run(edited(cells, phrase, cell_edits), namespace)
    code = edited(cells, check, edits)
    with pytest.raises(AssertionError) as info:
        run(code, namespace, "<check>")
    line = [tb for tb in traceback.extract_tb(info.tb) if tb.filename == "<check>"][-1].lineno
    assert failing in code.splitlines()[line - 1], code.splitlines()[line - 1]


def uncovered_check_cells(stem: str, broken: dict) -> list[str]:
    """The first lines of the chapter's code cells that check something (an ``assert``, or a call of
    ``close``, chapter 1's name for ``torch.testing.assert_close``) and are the check cell of
    no case of ``broken``."""
    cells = code_cells(stem)
    covered = [find(cells, case[1][-1][0]) for case in broken.values() if case[0] == stem]
    checks = [i for i, c in enumerate(cells) if "assert" in c.source or re.search(r"(?<![\w.])close\(", c.source)]
    return [cells[i].source.splitlines()[0] for i in checks if i not in covered]
