"""nbgrader (0.9.6) grades every exercise notebook as it is: the format claim, checked.

One nbgrader course holds every instructor notebook as one assignment. ``generate_assignment``
must accept them unchanged and write the same code cells as our ``release`` (the committed
student notebooks); one ``autograde`` run then grades two students: ``solved`` hands in the
instructor notebooks without their hidden tests (nbgrader restores them), ``blank`` the committed
student notebooks. Each graded notebook scores full marks for the first and zero for the second.

``autograde`` executes every notebook it grades, one after another (two minutes for all of them),
so it grades the notebooks of ``AUTOGRADED``: the first chapter's, chapter 7's (the behaviour checks)
and the last appendix's. What it would do with the others, our own grader does for every notebook
through the command line (tests/grading/test_grading_notebooks.py) with the same checks and hidden tests.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import REPO
from submissions.helpers import as_handed_in
from transformer_lib.grading.prepare.notebook import check_cells, dumps, read

pytest.importorskip("nbgrader")

SOURCES = sorted((REPO / "exercises" / "source").glob("*.ipynb"))
STEMS = [p.stem for p in SOURCES]
AUTOGRADED = [STEMS[0], "07_causal_masking", STEMS[-1]]
ASSIGNMENT = "exercises"


def _nbgrader(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # alembic
    return subprocess.run([sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={root}"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("nbgrader_course")
    source = root / "source" / ASSIGNMENT
    source.mkdir(parents=True)
    for path in SOURCES:
        shutil.copy(path, source)
    generated = _nbgrader(root, "generate_assignment", ASSIGNMENT, "--force")
    assert generated.returncode == 0, generated.stderr[-3000:]
    for student in ("solved", "blank"):
        folder = root / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        for path in (p for p in SOURCES if p.stem in AUTOGRADED):
            nb = as_handed_in(read(path)) if student == "solved" else read(REPO / "exercises" / path.name)
            (folder / path.name).write_text(dumps(nb), encoding="utf-8")
    graded = _nbgrader(root, "autograde", ASSIGNMENT, "--force")
    assert graded.returncode == 0, graded.stderr[-3000:]
    from nbgrader.api import Gradebook

    scores = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        for student in ("solved", "blank"):
            for stem in AUTOGRADED:
                nb = gradebook.find_submission_notebook(stem, ASSIGNMENT, student)
                scores[student, stem] = (nb.score, nb.max_score)
    return root, scores


@pytest.mark.parametrize("stem", STEMS)
def test_generate_assignment_writes_our_student_notebook(course, stem):
    root, _ = course
    theirs = read(root / "release" / ASSIGNMENT / f"{stem}.ipynb")
    ours = read(REPO / "exercises" / f"{stem}.ipynb")
    code = [[c.source.strip() for c in nb.cells if c.cell_type == "code"] for nb in (theirs, ours)]
    assert code[0] == code[1]


@pytest.mark.parametrize("stem", AUTOGRADED)
def test_autograde_gives_full_marks_when_solved_and_zero_when_blank(course, stem):
    _, scores = course
    points = sum(c.metadata["nbgrader"]["points"] for _, c in check_cells(read(REPO / "exercises" / "source" /
                                                                                f"{stem}.ipynb")))
    assert scores["solved", stem] == (points, points)
    assert scores["blank", stem] == (0, points)
