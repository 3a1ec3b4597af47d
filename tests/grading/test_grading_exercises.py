"""The exercise checks: pass on the instructor notebooks, fail on the student notebooks, and
catch each known-wrong solution with exactly the checks meant to catch it (in-process, fast)."""
from __future__ import annotations

import functools
import os
import re

import numpy as np
import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")

from repo_paths import REPO  # noqa: E402
from submissions.helpers import as_handed_in, records_of, run_inprocess, substitute  # noqa: E402
from submissions.wrong import HIDDEN_ONLY, WRONG  # noqa: E402
from transformer_lib.grading.prepare.notebook import check_cells, grade_id, read  # noqa: E402

SOURCES = sorted((REPO / "exercises" / "source").glob("*.ipynb"))
# A known-wrong answer (8.3's loss as a float) makes torch warn; the warning is the student's to read.
pytestmark = pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True:UserWarning")
NAMES = [p.stem for p in SOURCES]


def _source(stem: str):
    return read(REPO / "exercises" / "source" / f"{stem}.ipynb")


def _points(nb) -> dict[str, float]:
    return {grade_id(c): c.metadata["nbgrader"]["points"] for _, c in check_cells(nb)}


def test_every_chapter_has_exercises():
    assert NAMES == [p.stem for p in sorted((REPO / "chapters").glob("*.ipynb"))]


@pytest.mark.parametrize("stem", NAMES)
def test_every_check_passes_on_the_instructor_version(stem):
    results = run_inprocess(_source(stem))
    assert results and set(results) == set(_points(_source(stem)))
    assert {g: e for g, e in results.items() if e} == {}


@pytest.mark.parametrize("stem", NAMES)
def test_every_check_fails_on_the_student_version(stem):
    results = run_inprocess(read(REPO / "exercises" / f"{stem}.ipynb"))
    assert set(results) == set(_points(_source(stem)))
    assert [g for g, e in results.items() if e is None] == []


CASES = [(stem, name) for stem in WRONG for name in WRONG[stem]]


def _numbers(value) -> list[float]:
    """The numbers of a small answer (a number, or a few of them); none of a larger one."""
    if isinstance(value, (list, tuple)) and len(value) <= 4:
        return [x for v in value for x in _numbers(v)]
    if isinstance(value, torch.Tensor) and value.numel() == 1 or isinstance(value, np.ndarray) and value.size == 1:
        return [float(value.reshape(-1)[0])]
    return [float(value)] if isinstance(value, int | float) and not isinstance(value, bool) else []


@functools.cache
def _answers(stem: str) -> dict[str, set[float]]:
    """``{check: the numbers its visible calls returned}`` in the instructor's run: what the tasks ask for."""
    return {gid: {x for call in calls for out in call.outs for v in out.values() for x in _numbers(v)
                  if x not in (0, 1, -1)}
            for gid, calls in records_of(as_handed_in(_source(stem))).items()}


def _printed_answers(message: str, answers: set[float]) -> list[float]:
    """The answers that a message prints back as its expected value."""
    shown = [float(n.replace(",", "")) for line in re.findall(r"expected[^:\n]*:(.*)", message)
             for n in re.findall(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", line)]
    return sorted({a for a in answers for n in shown if abs(n - a) <= max(1e-3 * abs(a), 5e-5)})  # shown to 4 decimals


@pytest.mark.parametrize("stem,name", CASES, ids=[f"{s[:2]}-{n}" for s, n in CASES])
def test_wrong_submission_loses_exactly_its_points(stem, name):
    edits, caught_by, phrase = WRONG[stem][name]
    nb = _source(stem)
    results = run_inprocess(substitute(nb, edits))
    failed = {g for g, e in results.items() if e}
    points = _points(nb)
    assert failed == caught_by, f"{name}: failed {sorted(failed)}, expected {sorted(caught_by)}"
    lost = sum(points[g] for g in failed)
    assert lost == sum(points[g] for g in caught_by) > 0
    messages = "\n".join(results[g] for g in sorted(caught_by))
    assert phrase in messages, f"{name}: no {phrase!r} in the messages:\n{messages}"
    assert all(e.startswith("AssertionError") for g, e in results.items() if e), messages
    # The visible check, which runs first in its cell, fails: the student sees the mistake too.
    hidden = sorted(g for g in caught_by if results[g].startswith("AssertionError: a hidden test"))
    assert hidden == [] or name in HIDDEN_ONLY, f"{name}: only hidden tests catch it in {hidden}"
    # No message prints back a value the task asks for (the instructor run's answers).
    printed = {g: _printed_answers(results[g], _answers(stem).get(g, set())) for g in caught_by}
    assert not any(printed.values()), f"{name}: the answers {printed} are printed back:\n{messages}"


def test_a_hard_coded_answer_fails_the_visible_check_and_a_table_of_visible_answers_the_hidden_ones():
    """The visible check tries several d_k, as the exercise says, so one hard-coded answer fails it;
    only the hidden tests can tell a table of the visible answers."""
    stem = "02_building_up_attention"
    edits, _, _ = WRONG[stem]["score std hard-coded to the answer for d_k = 256"]
    visible = run_inprocess(as_handed_in(substitute(_source(stem), edits)))
    assert visible["check_score_std"].startswith("AssertionError: score_std(1) is not right")
    edits, _, _ = WRONG[stem]["score std hard-coded to the visible answer"]
    assert run_inprocess(as_handed_in(substitute(_source(stem), edits)))["check_score_std"] is None


@pytest.mark.parametrize("stem", NAMES)
def test_check_cells_state_their_points(stem):
    for _, cell in check_cells(_source(stem)):
        first = cell.source.splitlines()[0]
        m = re.match(r"# Check [0-9.a-z]+ \((\d+) points?\)", first)
        assert m, f"{grade_id(cell)}: first line should be '# Check N (P points)…', got {first!r}"
        assert float(m.group(1)) == cell.metadata["nbgrader"]["points"], grade_id(cell)


@pytest.mark.parametrize("stem", NAMES)
def test_only_check_cells_use_the_checks(stem):
    """Under grading and `check` only check cells load the checks (the import line is taken out of
    every other cell), so a cell that reads data from them fails there: it holds its data itself."""
    from transformer_lib.grading.prepare.notebook import IMPORT_CHECKS, is_check
    for cell in _source(stem).cells:
        if cell.cell_type == "code" and not is_check(cell):
            rest = "\n".join(line for line in cell.source.splitlines() if line.strip() != IMPORT_CHECKS)
            assert not re.search(r"\bchecks\b", rest), f"{grade_id(cell)}: {cell.source[:80]!r}"


@pytest.mark.parametrize("stem", NAMES)
def test_each_exercise_opens_with_a_box(stem):
    """A MyST admonition with the task, a difficulty and a time estimate under each exercise heading."""
    texts = [c.source for c in read(REPO / "exercises" / f"{stem}.ipynb").cells if c.cell_type == "markdown"]
    exercises = [t for t in texts if re.search(r"^## \d+\.\d+ ", t, re.M)]
    assert len(exercises) >= 3
    for text in exercises:
        assert re.search(r":::\{admonition\} Exercise \d+\.\d+\n:class: tip", text), text[:80]
        assert "**Task.**" in text and "**Difficulty:**" in text and "**Time:**" in text, text[:80]


@pytest.mark.parametrize("stem", NAMES)
def test_student_notebook_starts_with_how_to_run_and_self_check(stem):
    first = read(REPO / "exercises" / f"{stem}.ipynb").cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# Exercises: ")
    assert "How to run and self-check" in first.source and "✓" in first.source


@pytest.mark.parametrize("stem", NAMES)
def test_each_exercise_box_lists_what_is_off_limits(stem):
    """The functions a judge switches off (and the grader refuses in the source) are the ones the
    exercise's box names on its **Off limits:** line; the intro box states the grader's rules."""
    from transformer_lib.grading.grade import bans
    from transformer_lib.grading.prepare.costs import exercises

    student = read(REPO / "exercises" / f"{stem}.ipynb")
    assert "The grader reads your code before it runs it" in student.cells[0].source
    boxes = {re.search(r"^## (\d+\.\d+) ", c.source, re.M).group(1): c.source for c in student.cells
             if c.cell_type == "markdown" and re.search(r"^## \d+\.\d+ ", c.source, re.M)}
    for ex in exercises(_source(stem), bans()):
        line = re.search(r"^\*\*Off limits:\*\* (.*)$", boxes[ex.title], re.M)
        assert line and line.group(1).endswith("the course library."), (ex.title, boxes[ex.title][:200])
        assert sorted(re.findall(r"`([^`]+)`", line.group(1))) == sorted(ex.bans), (ex.title, line.group(1))
