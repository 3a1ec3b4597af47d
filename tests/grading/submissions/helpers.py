"""Build submissions by editing notebooks, and run checks in-process for fast tests.

Only the course's own fixtures run in-process here; the autograder itself always runs
submissions in a separate kernel process.
"""
from __future__ import annotations

import contextlib
import copy
import csv
import io
import linecache
import os
import sys
import tempfile
import textwrap
from pathlib import Path

from transformer_lib.grading._harness import RECORD_ENV
from transformer_lib.grading.prepare.notebook import (BEGIN_SOLUTION, END_SOLUTION, grade_id, is_check,
                                              regions, strip_hidden)
from transformer_lib.grading.prepare.submission import for_kernel
from transformer_lib.grading.protocol import load_calls


def grade_command(source, subs, out, *args) -> list[str]:
    """The instructor's command line: grade the folder ``subs`` against ``source`` into ``out``."""
    return [sys.executable, "-m", "transformer_lib.grading", "grade", str(source), str(subs), "--out", str(out),
            *map(str, args)]


def grades(out) -> dict[str, dict[str, str]]:
    """``{submission: row}`` of the ``grades.csv`` a grading run wrote into ``out``."""
    with open(Path(out) / "grades.csv", newline="", encoding="utf-8") as fh:
        return {row["submission"]: row for row in csv.DictReader(fh)}


def substitute(nb, edits: dict[str, str]):
    """A copy of ``nb`` with solution regions replaced: key ``grade_id`` or ``grade_id#k`` (k-th region)."""
    nb = copy.deepcopy(nb)
    cells = {grade_id(c): c for c in nb.cells if grade_id(c)}
    for key, body in edits.items():
        gid, _, k = key.partition("#")
        cell = cells[gid]
        lines = cell.source.splitlines()
        begin, end = regions(cell.source, BEGIN_SOLUTION, END_SOLUTION, gid)[int(k or 0)]
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        new = [indent + line if line else line for line in textwrap.dedent(body).strip("\n").splitlines()]
        cell.source = "\n".join(lines[: begin + 1] + new + lines[end:])
    return nb


def as_handed_in(nb):
    """What a student hands in: the check cells as the student version shows them (no hidden tests)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if is_check(cell):
            cell.source = strip_hidden(cell.source)
    return nb


def run_inprocess(nb) -> dict[str, str | None]:
    """Execute the code cells in one namespace; ``{check grade_id: None if passed, else the error}``."""
    namespace: dict = {"__name__": "__main__"}
    results: dict[str, str | None] = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "skip-execution" in cell.metadata.get("tags", []):
            continue
        error = None
        name = f"<cell {i}>"   # its lines readable by linecache, as IPython makes a cell's
        linecache.cache[name] = (len(cell.source), None, cell.source.splitlines(keepends=True), name)
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(compile(cell.source, name, "exec"), namespace)
            except Exception as err:  # noqa: BLE001 - any error fails the cell, as in a kernel
                error = f"{type(err).__name__}: {err}"
        if is_check(cell):
            results[grade_id(cell)] = error
    return results


def records_of(nb) -> dict:
    """``{check grade_id: recorded calls}`` of ``nb``'s check cells, executed here in record mode (as a
    fake runner would report them; the grader itself runs notebooks in a separate kernel)."""
    folder, before = Path(tempfile.mkdtemp()), os.environ.get(RECORD_ENV)
    os.environ[RECORD_ENV] = str(folder)
    found = {}
    try:
        namespace: dict = {"__name__": "__main__"}
        for i, cell in enumerate(for_kernel(nb).cells):
            if cell.cell_type != "code":
                continue
            with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
                exec(compile(cell.source, f"<cell {i}>", "exec"), namespace)  # noqa: S102
            if is_check(cell):
                (folder / grade_id(cell)).mkdir()
                for f in folder.glob("*.npz"):
                    f.rename(folder / grade_id(cell) / f.name)
                found[grade_id(cell)] = load_calls(folder / grade_id(cell))
    finally:
        os.environ.pop(RECORD_ENV) if before is None else os.environ.__setitem__(RECORD_ENV, before)
    return found
