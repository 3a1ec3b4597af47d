"""Prepare a submission for its run: the first step of grading (prepare → run → judge → report).

:func:`load_submission` reads a submission without ever failing on it (a corrupt file gives
a :class:`SubmissionError` with a readable reason). :func:`restore_checks` then puts the
instructor's check cells back, by ``grade_id``: every check cell is replaced by the
instructor's version (so hidden tests are restored and edits undone), a missing check cell is
re-inserted after the cell that precedes it in the instructor notebook (or at the end), and
duplicated check cells are dropped. Each such event becomes a note for the report. Every other
cell is the student's, whatever its metadata says: a cell marked as a check with a grade_id the
instructor notebook does not have loses the mark, and is read and run as student code.

:func:`for_kernel` turns the check cells into what the kernel runs under grading: the body of a
function, so that nothing of the checks stays in the notebook's namespace (the line is also
removed from the other cells: only check cells load the checks), with the line
``from transformer_lib.grading import checks`` replaced by code that executes the **kernel half**
of the checks (each chapter's module in :mod:`transformer_lib.grading.checks`) from the files into new modules under a package name
random per grading run. Whatever the notebook did before does not reach the checks, and no judge,
reference or expected value is loaded into the kernel at all: the judges are modules of their own
(:mod:`transformer_lib.grading.judges`), which the kernel half never imports under grading.
"""
from __future__ import annotations

import copy
import inspect
import json
import re
import secrets
import warnings
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from .notebook import IMPORT_CHECKS, check_cells, grade_id, is_check, strip_hidden

FOLDER = Path(__file__).resolve().parents[1]  # the grading package

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
    """A clean copy of a submitted cell: its type, source, metadata and id, no outputs; never a check
    cell (the check cells are the instructor's alone: one the student marked is student code)."""
    make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell,
            "raw": nbformat.v4.new_raw_cell}[cell["cell_type"]]
    metadata = copy.deepcopy(dict(cell.get("metadata", {})))
    if not isinstance(metadata.get("tags", []), list):
        del metadata["tags"]
    if isinstance(metadata.get("nbgrader"), dict):
        metadata["nbgrader"] = {k: v for k, v in metadata["nbgrader"].items() if k not in ("grade", "points")}
    new = make(metadata=metadata)
    new.source = cell.get("source", "")
    new["id"] = cell.get("id")
    return new


def _fresh(cell: NotebookNode) -> NotebookNode:
    new = copy.deepcopy(cell)
    new.outputs, new.execution_count = [], None
    return new


# ---------------------------------------------------------------- the checks' kernel half

def kernel_files(names: set[str] | None = None) -> tuple[str, ...]:
    """The checks' files in the order they import each other: the protocol, the harness, each chapter's module
    (only those defining one of ``names``, if given and all are found), then the package."""
    chapters = sorted(p.stem for p in (FOLDER / "checks").glob("ch[0-9]*.py"))
    if names:
        defines = {stem: set(re.findall(r"^def (\w+)\(", (FOLDER / "checks" / f"{stem}.py").read_text(encoding="utf-8"),
                                        re.M)) for stem in chapters}
        needed = [stem for stem in chapters if defines[stem] & names]
        if names <= set().union(*(defines[stem] for stem in needed)):
            chapters = needed
    return ("protocol", "_harness", "_calls", *(f"checks.{stem}" for stem in chapters), "checks")


def _grading_kernel_checks(folder: str, name: str, files: tuple[str, ...], cell: str = ""):  # noqa: ANN202
    """Execute ``files`` (dotted names under ``folder``; a name with submodules is a package, read
    from its ``__init__.py``) as new modules under a new package ``name``; return the last. Then ask the kernel's watch for the secrets of check
    cell ``cell`` (its seed, record folder and nonce: :mod:`~transformer_lib.grading._watch`), which
    it hands out once; without a watch (checks run in-process) there are none.

    This function's source is copied into check cells, so it imports what it needs itself. The
    modules are in ``sys.modules`` only while they load (for their relative imports).
    """
    import sys
    import types

    package = types.ModuleType(name)
    package.__path__ = [folder]
    modules = {name: package}
    try:
        for dotted in files:
            module = types.ModuleType(f"{name}.{dotted}")
            path = f"{folder}/{dotted.replace('.', '/')}"
            if any(f.startswith(dotted + ".") for f in files):  # a package
                module.__path__, module.__package__, module.__file__ = [path], module.__name__, f"{path}/__init__.py"
            else:
                module.__package__, module.__file__ = module.__name__.rpartition(".")[0], f"{path}.py"
            modules[module.__name__] = module
            sys.modules.update(modules)
            with open(module.__file__, encoding="utf-8") as fh:
                lines = []
                for line in fh.read().splitlines():
                    if not (line.startswith("from .ch") and f"{dotted}.{line[6:].split()[0]}" not in files):
                        lines.append(line)  # gather only the chapters loaded
            exec(compile("\n".join(lines) + "\n", module.__file__, "exec"), module.__dict__)  # noqa: S102
    finally:
        for key in modules:
            sys.modules.pop(key, None)
    modules[f"{name}._calls"]._OWN.update(id(m.__dict__) for m in modules.values())
    box: list = []  # the secrets

    def _grading_watch_secrets(cell: str = cell, box: list = box) -> None:
        return None

    _grading_watch_secrets.__code__  # noqa: B018 - the read is the question (an audit event the watch answers)
    if box and box[0] is None:
        raise RuntimeError("the inputs of this check cell were asked for before it ran")
    modules[f"{name}._harness"].configure(box[0] if box else None)
    calls, found = modules[f"{name}._calls"], modules[f"{name}._calls"].ask_watch()  # noted in this exercise's cells
    calls._PENDING[:] = modules[f"{name}._harness"]._PENDING[:] = [found] if found is not None else []
    return module


def loader(name: str, indent: str = "", names: set[str] | None = None, cell: str = "") -> str:
    """The code that binds ``checks`` to a fresh kernel half of the checks (package ``name``; only
    the chapters that define ``names``, see :func:`kernel_files`), for check cell ``cell``."""
    call = (f"checks = _grading_kernel_checks({str(FOLDER)!r}, {name!r}, {kernel_files(names)!r}, "
            f"{cell!r})")
    code = f"{inspect.getsource(_grading_kernel_checks)}{call}\ndel _grading_kernel_checks"
    return "\n".join(indent + line if line else line for line in code.splitlines())


CELL_FUNCTION = "_grading_check_cell"


def for_kernel(nb: NotebookNode, name: str | None = None) -> NotebookNode:
    """A copy of ``nb`` whose check cells run as a function that loads its own kernel half of the
    checks (package ``name``; random if None) and leaves nothing behind in the namespace."""
    name = name or f"_grading_checks_{secrets.token_hex(8)}"
    nb = copy.deepcopy(nb)
    names = {n for cell in nb.cells if is_check(cell) for n in re.findall(r"\bchecks\.(\w+)", cell.source)}
    for cell in nb.cells:
        if cell.cell_type == "code" and not is_check(cell):  # the checks are loaded by the check cells alone
            cell.source = "\n".join(line for line in cell.source.splitlines() if line.strip() != IMPORT_CHECKS)
        if is_check(cell):
            body = [loader(name, "    ", names, grade_id(cell)) if line.strip() == IMPORT_CHECKS else "    " + line
                    for line in cell.source.splitlines()]
            cell.source = "\n".join([f"def {CELL_FUNCTION}():", *body, "    pass", f"{CELL_FUNCTION}()",
                                     f"del {CELL_FUNCTION}"])
    return nb
