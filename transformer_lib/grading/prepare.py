"""Turn a submitted notebook into the notebook the grader runs.

:func:`load_submission` reads a submission without ever failing on it (a corrupt file gives
a :class:`SubmissionError` with a readable reason). :func:`restore_checks` then puts the
instructor's check cells back, by ``grade_id``: every check cell is replaced by the
instructor's version (so hidden tests are restored and edits undone), a missing check cell is
re-inserted after the cell that precedes it in the instructor notebook (or at the end), and
duplicated check cells are dropped. Each such event becomes a note for the report.
"""
from __future__ import annotations

import copy
import json
import re
import warnings
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from .notebook import check_cells, grade_id, is_check, strip_hidden

MAX_SUBMISSION_BYTES = 20_000_000


class SubmissionError(Exception):
    """A submission that cannot be graded at all (not a notebook, too large, …)."""


def load_submission(path: Path) -> NotebookNode:
    """Read a submitted notebook; raise SubmissionError (never anything else) if unusable."""
    try:
        size = path.stat().st_size
        if size > MAX_SUBMISSION_BYTES:
            raise SubmissionError(f"file is {size} bytes, more than the {MAX_SUBMISSION_BYTES} allowed")
        text = path.read_bytes().decode("utf-8")
        raw = json.loads(text)
        if not isinstance(raw, dict) or not ({"cells", "worksheets"} & set(raw)):
            raise SubmissionError("not a notebook (JSON, but without notebook cells)")
        if raw.get("nbformat", 4) == 4 and "cells" in raw:  # read leniently: outputs and extra fields are never used
            nb = nbformat.from_dict({"cells": raw["cells"], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                nb = nbformat.reads(text, as_version=4)
        cells = nb.get("cells")
        if not isinstance(cells, list):
            raise SubmissionError("not a notebook (no list of cells)")
        for i, cell in enumerate(cells):
            if not isinstance(cell, dict) or cell.get("cell_type") not in {"code", "markdown", "raw"}:
                raise SubmissionError(f"cell {i} is not a notebook cell")
            if isinstance(cell.get("source"), list):
                cell["source"] = "".join(str(s) for s in cell["source"])
            if not isinstance(cell.get("source", ""), str):
                raise SubmissionError(f"cell {i} has no text source")
            if not isinstance(cell.get("metadata"), dict):
                cell["metadata"] = {}
        return nb
    except SubmissionError:
        raise
    except UnicodeDecodeError:
        raise SubmissionError("not a notebook (the file is not UTF-8 text)") from None
    except (json.JSONDecodeError, RecursionError, nbformat.reader.NotJSONError):
        raise SubmissionError("not a notebook (the file is not valid JSON)") from None
    except Exception as err:  # nbformat raises many kinds of errors on malformed files
        raise SubmissionError(f"not a notebook ({type(err).__name__}: {str(err)[:200]})") from None


def _anchor_keys(cell: NotebookNode) -> list[str]:
    keys = [f"gid:{grade_id(cell)}"] if grade_id(cell) else []
    return keys + ([f"id:{cell['id']}"] if cell.get("id") else [])


def _insert_position(instructor: NotebookNode, index: int, cells: list[NotebookNode]) -> int:
    """Where to re-insert instructor cell ``index`` into ``cells``: after its nearest preceding
    instructor cell that is present (by grade_id or cell id), else at the end."""
    present = {}
    for pos, cell in enumerate(cells):
        for key in _anchor_keys(cell):
            present.setdefault(key, pos)
    for prev in reversed(instructor.cells[:index]):
        for key in _anchor_keys(prev):
            if key in present:
                return present[key] + 1
    return len(cells)


def restore_checks(submission: NotebookNode, instructor: NotebookNode) -> tuple[NotebookNode, list[str]]:
    """The submission with the instructor's check cells restored, and the notes it produced."""
    notes: list[str] = []
    wanted = {grade_id(c): (i, c) for i, c in check_cells(instructor)}
    cells: list[NotebookNode] = []
    seen: set[str] = set()
    for pos, cell in enumerate(submission.cells):
        gid = grade_id(cell)
        if gid not in wanted:
            cells.append(_normalised(cell))
            continue
        if gid in seen:
            notes.append(f"check cell {gid!r} appeared more than once; the copy at cell {pos} was dropped")
            continue
        seen.add(gid)
        original = wanted[gid][1]
        if cell.get("source", "").strip() != strip_hidden(original.source).strip() or not is_check(cell):
            notes.append(f"check cell {gid!r} was modified; the original was restored")
        cells.append(_fresh(original))
    for gid, (index, original) in wanted.items():
        if gid not in seen:
            cells.insert(_insert_position(instructor, index, cells), _fresh(original))
            notes.append(f"check cell {gid!r} was missing; it was re-inserted")
    _unique_ids(cells)
    prepared = nbformat.v4.new_notebook(metadata=copy.deepcopy(instructor.metadata))
    prepared.cells = cells
    return prepared, notes


def _unique_ids(cells: list[NotebookNode]) -> None:
    """Give every cell a unique, valid id (submissions may duplicate or mangle them)."""
    seen: set[str] = set()
    for i, cell in enumerate(cells):
        cid = cell.get("id")
        if not (isinstance(cid, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", cid)) or cid in seen:
            cell["id"] = cid = f"graded-cell-{i}"
        seen.add(cid)


def _normalised(cell: dict) -> NotebookNode:
    """A clean copy of a submitted cell: its type, source, metadata and id, no outputs."""
    make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell,
            "raw": nbformat.v4.new_raw_cell}[cell["cell_type"]]
    metadata = copy.deepcopy(dict(cell.get("metadata", {})))
    if not isinstance(metadata.get("tags", []), list):
        del metadata["tags"]
    new = make(metadata=metadata)
    new.source = cell.get("source", "")
    new["id"] = cell.get("id")
    return new


def _fresh(cell: NotebookNode) -> NotebookNode:
    new = copy.deepcopy(cell)
    new.outputs, new.execution_count = [], None
    return new
