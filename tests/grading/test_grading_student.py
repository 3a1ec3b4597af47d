"""The student copy (``release --student DIR``): built once for this module, then searched for every
line of every solution and hidden-test region of the instructor notebooks and for the judges, and
used as a student would: a chapter's check cells run against the stored expected values, and the
``check`` command works in it, judging the visible checks only and saying so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from repo_paths import REPO
from submissions.helpers import as_handed_in, substitute
from submissions.wrong import WRONG
from transformer_lib.grading.prepare.notebook import (BEGIN_SOLUTION, END_SOLUTION, dumps, hidden_lines, is_check,
                                              is_solution, read, regions, release)
from transformer_lib.grading.student import REGISTER, differs, write_copy

SOURCES = sorted((REPO / "exercises" / "source").glob("*.ipynb"))
SHORT = 16  # characters: shorter lines (`return out`, `pass`) are not an answer
PUBLISHED = ("chapters", "guides", "transformer_lib")  # what the course publishes outside its exercises
CH9 = "09_parameter_and_flop_counting"


def _norm(line: str) -> str:
    return " ".join(line.split())


def _lines(path: Path) -> set[str]:
    """The whitespace-normalised lines of a text file (of a notebook: of its cells' sources)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return set()
    if path.suffix == ".ipynb":
        text = "\n".join(c.source for c in read(path).cells)
    return {_norm(line) for line in text.splitlines()}


def _secrets() -> dict[str, str]:
    """Every line of a solution or hidden-test region of an instructor notebook that is not trivially
    short and that the course does not publish anyway (its chapters, guides, library outside the
    checks, and the student notebooks as released): line -> notebook."""
    found: dict[str, str] = {}
    for src in SOURCES:
        for cell in read(src).cells:
            lines = cell.source.splitlines()
            if is_solution(cell):
                for b, e in regions(cell.source, BEGIN_SOLUTION, END_SOLUTION, src.name):
                    found.update({_norm(line): src.name for line in lines[b + 1:e]})
            if is_check(cell):
                found.update({_norm(line): src.name for line in hidden_lines(cell.source)})
    public: set[str] = set()
    for top in PUBLISHED:
        for path in (REPO / top).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".ipynb", ".md") and not {"checks", "judges"} & set(path.parts):
                public |= _lines(path)
    for src in SOURCES:
        public |= {_norm(line) for c in release(read(src)).cells for line in c.source.splitlines()}
    return {line: nb for line, nb in found.items() if len(line) >= SHORT and line not in public}


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("student") / "course"
    write_copy(dest, jobs=2)
    return dest


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_no_line_of_a_solution_or_hidden_test_is_in_the_copy(copy):
    secrets = _secrets()
    assert len(secrets) > 100 and len(set(secrets.values())) == len(SOURCES), "the search finds too little to mean much"
    assert any(line in secrets for src in SOURCES for line in _lines(src)), "the search does not see a notebook's lines"
    leaked = {f"{p.relative_to(copy)}: {line} (from {secrets[line]})" for p in _files(copy) for line in _lines(p)
              if line in secrets}
    assert not leaked, "\n".join(sorted(leaked))


def test_no_instructor_notebook_and_no_judge_is_in_the_copy(copy):
    assert not (copy / "exercises" / "source").exists() and not (copy / "tests").exists()
    assert sorted(p.name for p in (copy / "exercises").iterdir()) == [p.name for p in SOURCES]
    for src in SOURCES:
        assert (copy / "exercises" / src.name).read_text(encoding="utf-8") == dumps(release(read(src)))
    modules = sorted((REPO / "transformer_lib" / "grading" / "checks").glob("ch[0-9]*.py"))
    assert modules
    for module in modules:  # every chapter's checks: the kernel half, whole
        assert (copy / module.relative_to(REPO)).read_text(encoding="utf-8") == module.read_text(encoding="utf-8")
    judges = copy / "transformer_lib" / "grading" / "judges"  # no chapter's judges: the stored values' judges
    assert not list(judges.glob("ch[0-9]*.py")) and (judges / "__init__.py").read_text(encoding="utf-8") == REGISTER
    python = "\n".join(p.read_text(encoding="utf-8") for p in (copy / "transformer_lib").rglob("*.py"))
    assert "@judge(" not in python and "_reference_model" not in python


def test_stored_values_are_compared_with_the_judges_tolerance():
    assert differs(1.0000001, 1.0, 1e-6) is None and differs(1.001, 1.0, 1e-6) is not None
    assert differs(124439809, 124439808, 1e-6) is not None  # whole numbers exactly
    assert differs(124439808.0, 124439808, 0) is None
    assert differs(torch.zeros(2, 1), torch.zeros(2), 1e-6) == "the shape is (2, 1), not (2,)"
    assert differs(torch.tensor([True, True]), torch.tensor([True, False]), 0).startswith("1 of 2 numbers differ (at [(1,)])")
    assert differs(124356864, 124439808, 0) == "yours is 124356864"
    assert differs(None, None, 0) is None and differs([768, 768], None, 0) == "yours is [768, 768]"


_RUN = textwrap.dedent("""
    import contextlib, io, json, sys
    import nbformat, transformer_lib
    from transformer_lib.grading.prepare.notebook import grade_id, is_check
    nb, ns, found = nbformat.read(sys.argv[1], as_version=4), {"__name__": "__main__"}, {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            out, error = io.StringIO(), None
            with contextlib.redirect_stdout(out):
                try:
                    exec(compile(cell.source, f"<cell {i}>", "exec"), ns)
                except Exception as err:
                    error = f"{type(err).__name__}: {err}"
            if is_check(cell):
                found[grade_id(cell)] = error or out.getvalue().strip()
    print(json.dumps({"library": transformer_lib.__file__, "checks": found}))
""")


def _in_copy(copy: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy), "MPLBACKEND": "Agg"}  # the copy's library, not the course's
    return subprocess.run([sys.executable, *argv], cwd=copy, env=env, capture_output=True, text=True, timeout=600)


def _check_cells(copy: Path, nb, tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "nb.ipynb"
    path.write_text(dumps(nb), encoding="utf-8")
    done = _in_copy(copy, "-c", _RUN, str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert Path(result["library"]).is_relative_to(copy)
    return result["checks"]


def test_a_chapter_s_check_cells_judge_by_the_stored_values(copy, tmp_path):
    source = read(REPO / "exercises" / "source" / f"{CH9}.ipynb")
    solved = _check_cells(copy, as_handed_in(source), tmp_path)
    assert solved and all(v.startswith("✓") for v in solved.values()), solved
    assert "124,439,808" in solved["check_param_count"]  # the instructor's ✓ line, stored
    stub = _check_cells(copy, read(copy / "exercises" / f"{CH9}.ipynb"), tmp_path)
    assert stub.keys() == solved.keys() and all("NotImplementedError" in v for v in stub.values()), stub
    edits = WRONG[CH9]["params: biases forgotten"][0]
    wrong = _check_cells(copy, as_handed_in(substitute(source, edits)), tmp_path)
    assert [g for g, v in wrong.items() if not v.startswith("✓")] == ["check_param_count"], wrong
    assert "differs from the expected value" in wrong["check_param_count"]
    assert "124,439,808" not in wrong["check_param_count"] and "124439808" not in wrong["check_param_count"]
    assert wrong["check_param_count"] in (REPO / "guides" / "students.md").read_text(encoding="utf-8")  # as quoted


def test_check_works_in_the_copy_with_the_visible_checks_only(copy):
    name = "appendix_tokens.ipynb"
    path = copy / "exercises" / name
    path.write_text(dumps(as_handed_in(read(REPO / "exercises" / "source" / name))), encoding="utf-8")
    done = _in_copy(copy, "-m", "transformer_lib.grading", "check", f"exercises/{name}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "visible checks only" in done.stdout and "This is a student copy" in done.stdout
    assert "3 of 3 visible checks pass" in done.stdout
    path.write_text(dumps(release(read(REPO / "exercises" / "source" / name))), encoding="utf-8")
    other = _in_copy(copy, "-m", "transformer_lib.grading", "check", "exercises/99_not_an_exercise.ipynb")
    assert other.returncode == 2 and "no released notebook 99_not_an_exercise.ipynb" in other.stderr
