"""Exercise notebooks in nbgrader's format: cell roles, markers, validation and release.

An instructor notebook (``exercises/source/NN_topic.ipynb``) marks its cells the way
nbgrader does, in ``cell.metadata["nbgrader"]`` (``schema_version`` 3):

- a *solution* cell (``solution: true``) holds code between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION``; the student version replaces each region with
  ``# YOUR CODE HERE`` + ``raise NotImplementedError()``;
- a *check* cell (``grade: true, locked: true`` with ``points``) imports the checks with
  ``from transformer_lib.grading import checks`` (the grader swaps that line for a fresh copy)
  and calls one of them; lines between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``
  are removed from the student version (an indented region leaves a ``pass``);
- a *locked* cell (``locked: true``) is read-only text or given code.

:func:`release` turns an instructor notebook into the student notebook; it first calls
:func:`validate`, which refuses malformed markers with a :class:`MarkerError` naming the cell.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
from nbformat import NotebookNode

SCHEMA_VERSION = 3
BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
MARKERS = (BEGIN_SOLUTION, END_SOLUTION, BEGIN_HIDDEN, END_HIDDEN)
_MARKER_LIKE = r"#{2,}\s*(BEGIN|END)\b"  # a line that looks like a marker (in code cells, in any case)
IMPORT_CHECKS = "from transformer_lib.grading import checks"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
MARKDOWN_STUB = "YOUR ANSWER HERE"
CHECK_TAG = "raises-exception"


class MarkerError(ValueError):
    """A malformed exercise notebook: bad markers, duplicate grade ids, missing points."""


def nbgrader(cell: NotebookNode) -> dict:
    """The cell's nbgrader metadata (an empty dict for an ordinary cell)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def grade_id(cell: NotebookNode) -> str | None:
    """The cell's ``grade_id``, or None."""
    gid = nbgrader(cell).get("grade_id")
    return gid if isinstance(gid, str) and gid else None


def is_check(cell: NotebookNode) -> bool:
    """True for an autograded check cell (a code cell with ``grade: true``)."""
    return cell.get("cell_type") == "code" and bool(nbgrader(cell).get("grade"))


def is_solution(cell: NotebookNode) -> bool:
    """True for a cell the student fills in (``solution: true``)."""
    return bool(nbgrader(cell).get("solution"))


def describe(cell: NotebookNode, index: int) -> str:
    """A human name for a cell: ``cell 7 (grade_id 'softmax_check')``."""
    gid = grade_id(cell)
    return f"cell {index}" + (f" (grade_id {gid!r})" if gid else "")


def check_cells(nb: NotebookNode) -> list[tuple[int, NotebookNode]]:
    """``(index, cell)`` of every check cell, in notebook order."""
    return [(i, c) for i, c in enumerate(nb.cells) if is_check(c)]


def _marker(line: str, marker: str) -> bool:
    return line.strip() == marker


def _refuse_unknown_markers(cell: NotebookNode, where: str) -> None:
    """A misspelt marker (``### BEGIN HIDDEN TEST``) would ship what it should hide: refuse it."""
    flags = re.IGNORECASE if cell.get("cell_type") == "code" else 0
    for i, line in enumerate(cell.get("source", "").splitlines()):
        if re.match(_MARKER_LIKE, line.strip(), flags) and line.strip() not in MARKERS:
            raise MarkerError(f"{where}: unknown marker {line.strip()!r} on line {i + 1} "
                              f"(the markers are {', '.join(map(repr, MARKERS))})")


def _refuse_other_imports(cell: NotebookNode, where: str) -> None:
    """The grader gives each check cell a fresh copy of the checks by swapping one exact line."""
    for i, line in enumerate(cell.get("source", "").splitlines()):
        if "transformer_lib.grading" in line and line.strip() != IMPORT_CHECKS:
            raise MarkerError(f"{where}: line {i + 1} imports from transformer_lib.grading; a check cell "
                              f"imports the checks only with the line {IMPORT_CHECKS!r}")


def regions(source: str, begin: str, end: str, where: str) -> list[tuple[int, int]]:
    """Line spans ``(begin_line, end_line)`` of the ``begin``…``end`` regions of a cell.

    Raises MarkerError (naming ``where``) for a nested, unclosed or unopened region.
    """
    spans, start = [], None
    for i, line in enumerate(source.splitlines()):
        if _marker(line, begin):
            if start is not None:
                raise MarkerError(f"{where}: nested {begin!r} on line {i + 1} "
                                  f"(the region opened on line {start + 1} is not closed)")
            start = i
        elif _marker(line, end):
            if start is None:
                raise MarkerError(f"{where}: {end!r} on line {i + 1} without a matching {begin!r}")
            spans.append((start, i))
            start = None
    if start is not None:
        raise MarkerError(f"{where}: {begin!r} on line {start + 1} is never closed by {end!r}")
    return spans


def _has_marker(source: str, *markers: str) -> bool:
    return any(_marker(line, m) for line in source.splitlines() for m in markers)


def validate(nb: NotebookNode) -> None:
    """Refuse a malformed instructor notebook with a MarkerError naming the cell."""
    seen: dict[str, int] = {}
    for i, cell in enumerate(nb.cells):
        where, meta, src = describe(cell, i), nbgrader(cell), cell.get("source", "")
        _refuse_unknown_markers(cell, where)
        if meta:
            gid = grade_id(cell)
            if gid is None:
                raise MarkerError(f"{where}: nbgrader metadata without a grade_id")
            if gid in seen:
                raise MarkerError(f"{where}: duplicate grade_id {gid!r} (first used by cell {seen[gid]})")
            seen[gid] = i
            if meta.get("schema_version") != SCHEMA_VERSION:
                raise MarkerError(f"{where}: expected nbgrader schema_version {SCHEMA_VERSION}, "
                                  f"got {meta.get('schema_version')!r}")
        if is_solution(cell):
            regions(src, BEGIN_SOLUTION, END_SOLUTION, where)
        elif _has_marker(src, BEGIN_SOLUTION, END_SOLUTION):
            raise MarkerError(f"{where}: solution markers outside a solution cell "
                              "(set metadata.nbgrader.solution to true, or remove the markers)")
        if meta.get("grade"):
            points = meta.get("points")
            if isinstance(points, bool) or not isinstance(points, (int, float)) or points <= 0:
                raise MarkerError(f"{where}: a check cell needs positive points, got {points!r}")
        if is_check(cell):
            regions(src, BEGIN_HIDDEN, END_HIDDEN, where)
            _refuse_other_imports(cell, where)
        elif _has_marker(src, BEGIN_HIDDEN, END_HIDDEN):
            raise MarkerError(f"{where}: hidden-test markers outside a check cell (only a code cell with "
                              "grade: true can hide tests)")


def strip_solutions(source: str, cell_type: str = "code") -> str:
    """Replace every solution region by the stub, keeping the indentation of its BEGIN line."""
    lines = source.splitlines()
    spans = regions(source, BEGIN_SOLUTION, END_SOLUTION, "solution cell")
    stub = [MARKDOWN_STUB] if cell_type == "markdown" else list(CODE_STUB)
    if not spans:  # nbgrader: a solution cell without markers is replaced whole
        return "\n".join(stub)
    out, last = [], 0
    for begin, end in spans:
        out += lines[last:begin]
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        out += [indent + s for s in stub]
        last = end + 1
    out += lines[last:]
    return "\n".join(out).strip("\n")


def strip_hidden(source: str) -> str:
    """Remove the hidden-test regions (markers included) of a check cell. An indented region
    becomes ``pass``, so that the block it was in is never left empty."""
    lines = source.splitlines()
    out, last = [], 0
    for begin, end in regions(source, BEGIN_HIDDEN, END_HIDDEN, "check cell"):
        out += lines[last:begin]
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        out += [indent + "pass"] if indent else []
        last = end + 1
    return "\n".join(out + lines[last:]).rstrip()


def hidden_lines(source: str) -> list[str]:
    """The stripped, non-empty lines inside the hidden-test regions of a check cell."""
    lines = source.splitlines()
    spans = regions(source, BEGIN_HIDDEN, END_HIDDEN, "check cell")
    return [lines[i].strip() for b, e in spans for i in range(b + 1, e) if lines[i].strip()]


def release(nb: NotebookNode) -> NotebookNode:
    """The student version of a validated instructor notebook (a new notebook).

    Solutions become stubs, hidden tests disappear, outputs are cleared, check cells are
    locked (not editable, not deletable) and tagged ``raises-exception``.
    """
    validate(nb)
    student = copy.deepcopy(nb)
    for cell in student.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        if is_solution(cell):
            cell.source = strip_solutions(cell.source, cell.cell_type)
            cell.metadata["deletable"] = False
        if is_check(cell):
            cell.source = strip_hidden(cell.source)
            tags = list(cell.metadata.get("tags", []))
            cell.metadata["tags"] = tags + [CHECK_TAG] * (CHECK_TAG not in tags)
        if nbgrader(cell).get("locked") or is_check(cell):
            cell.metadata["editable"] = False
            cell.metadata["deletable"] = False
    return student


def read(path: Path | str) -> NotebookNode:
    """Read a notebook as nbformat 4."""
    return nbformat.read(str(path), as_version=4)


def dumps(nb: NotebookNode) -> str:
    """The notebook as the exact text nbformat writes (what is committed)."""
    return nbformat.writes(nb) + "\n"


def release_all(source_dir: Path | str, dest_dir: Path | str, check: bool = False) -> list[Path]:
    """Write (or, with ``check``, only compare) the student version of every source notebook.

    Returns the student notebooks that were written (or that differ, with ``check``).
    """
    source_dir, dest_dir = Path(source_dir), Path(dest_dir)
    changed = []
    for src in sorted(source_dir.glob("*.ipynb")):
        try:
            text = dumps(release(read(src)))
        except MarkerError as err:
            raise MarkerError(f"{src.name}: {err}") from None
        dest = dest_dir / src.name
        if not dest.exists() or dest.read_text(encoding="utf-8") != text:
            changed.append(dest)
            if not check:
                dest.write_text(text, encoding="utf-8")
    return changed
