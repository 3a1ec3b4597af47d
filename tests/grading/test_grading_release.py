"""Releasing student notebooks: the committed versions are what `release` writes, they hold
no solution, and malformed instructor notebooks are refused with a message naming the cell."""
from __future__ import annotations

import copy
import subprocess
import sys

import nbformat
import pytest

from repo_paths import REPO
from transformer_lib.grading.prepare.notebook import (BEGIN_HIDDEN, BEGIN_SOLUTION, END_HIDDEN, END_SOLUTION,
                                              CODE_STUB, MarkerError, dumps, grade_id, hidden_lines,
                                              is_check, is_solution, read, regions, release, release_all)

SOURCES = sorted((REPO / "exercises" / "source").glob("*.ipynb"))
IDS = [p.stem for p in SOURCES]


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_committed_student_version_is_what_release_writes(source):
    committed = (REPO / "exercises" / source.name).read_text(encoding="utf-8")
    assert committed == dumps(release(read(source))), (
        f"exercises/{source.name} is out of date: run `python -m transformer_lib.grading release`")


def test_release_check_mode_reports_nothing_out_of_date():
    out = subprocess.run([sys.executable, "-m", "transformer_lib.grading", "release", "--check"],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_release_writes_the_student_versions(tmp_path):
    written = release_all(REPO / "exercises" / "source", tmp_path)
    assert sorted(p.name for p in written) == [p.name for p in SOURCES]
    assert release_all(REPO / "exercises" / "source", tmp_path, check=True) == []


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_no_solution_or_hidden_line_reaches_the_student(source):
    nb = read(source)
    student_lines = {line.strip() for c in read(REPO / "exercises" / source.name).cells
                     for line in c.source.splitlines()}
    secret = set()
    for cell in nb.cells:
        lines = cell.source.splitlines()
        if is_solution(cell):
            for b, e in regions(cell.source, BEGIN_SOLUTION, END_SOLUTION, "x"):
                secret |= {l.strip() for l in lines[b + 1:e] if l.strip()}
        if is_check(cell):
            secret |= {l for l in hidden_lines(cell.source) if not l.startswith("import ")}
    assert secret, "no solutions found"
    leaked = sorted(secret & student_lines)
    assert not leaked, f"{source.name}: solution or hidden-test lines in the student version: {leaked}"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_student_cells_are_stubbed_locked_and_clean(source):
    student = read(REPO / "exercises" / source.name)
    text = "\n".join(c.source for c in student.cells)
    assert BEGIN_SOLUTION not in text and BEGIN_HIDDEN not in text and END_HIDDEN not in text
    for cell in student.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
        if is_solution(cell):
            assert "\n".join(CODE_STUB) in "\n".join(l.strip() for l in cell.source.splitlines())
        if is_check(cell):
            assert cell.metadata["editable"] is False and cell.metadata["deletable"] is False
            assert "raises-exception" in cell.metadata["tags"]
    for cell in read(source).cells:  # the instructor version is nbgrader's format
        meta = cell.metadata.get("nbgrader")
        if meta:
            assert meta["schema_version"] == 3 and grade_id(cell)
            assert {"solution", "grade", "locked"} <= set(meta)


# ------------------------------------------------------------------ malformed notebooks

def _nb(*cells):
    return nbformat.v4.new_notebook(cells=list(cells))


def _cell(source, gid=None, solution=False, grade=False, points=None, kind="code"):
    make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
    cell = make(source)
    if gid:
        meta = {"schema_version": 3, "grade_id": gid, "solution": solution, "grade": grade,
                "locked": grade}
        if points is not None:
            meta["points"] = points
        cell.metadata["nbgrader"] = meta
    return cell


GOOD_SOL = f"def f(x):\n    {BEGIN_SOLUTION}\n    return x\n    {END_SOLUTION}"
GOOD_CHECK = f"assert f(1) == 1\n{BEGIN_HIDDEN}\nassert f(2) == 2\n{END_HIDDEN}"

MALFORMED = {
    "unclosed solution": (_nb(_cell("x = 1"), _cell(f"{BEGIN_SOLUTION}\nx = 1", "sol", solution=True)),
                          ["cell 1", "'sol'", "never closed"]),
    "nested solution": (_nb(_cell(f"{BEGIN_SOLUTION}\n{BEGIN_SOLUTION}\nx=1\n{END_SOLUTION}\n{END_SOLUTION}",
                                  "sol", solution=True)), ["cell 0", "'sol'", "nested"]),
    "end without begin": (_nb(_cell(f"x = 1\n{END_SOLUTION}", "sol", solution=True)),
                          ["cell 0", "without a matching"]),
    "solution markers outside a solution cell": (_nb(_cell(GOOD_SOL, "sol", solution=True),
                                                     _cell(GOOD_SOL)), ["cell 1", "outside a solution cell"]),
    "hidden tests outside a check cell": (_nb(_cell(GOOD_SOL, "sol", solution=True),
                                              _cell(GOOD_CHECK, "chk", solution=True)),
                                          ["cell 1", "'chk'", "outside a check cell"]),
    "unclosed hidden tests": (_nb(_cell(GOOD_SOL, "sol", solution=True),
                                  _cell(f"assert f(1)\n{BEGIN_HIDDEN}\nassert f(2)", "chk", grade=True, points=1)),
                              ["cell 1", "'chk'", "never closed"]),
    "duplicate grade_id": (_nb(_cell(GOOD_SOL, "same", solution=True),
                               _cell(GOOD_CHECK, "same", grade=True, points=1)),
                           ["cell 1", "duplicate grade_id 'same'", "cell 0"]),
    "check cell without points": (_nb(_cell(GOOD_SOL, "sol", solution=True),
                                      _cell(GOOD_CHECK, "chk", grade=True)), ["cell 1", "'chk'", "points"]),
    "check cell with zero points": (_nb(_cell(GOOD_CHECK, "chk", grade=True, points=0)), ["cell 0", "points"]),
    "misspelt hidden-tests marker": (_nb(_cell(GOOD_SOL, "sol", solution=True),
                                         _cell("assert f(1)\n### BEGIN HIDDEN TEST\nassert f(2)\n### END HIDDEN TEST",
                                               "chk", grade=True, points=1)),
                                     ["cell 1", "'chk'", "unknown marker '### BEGIN HIDDEN TEST' on line 2"]),
    "lower-case marker in code": (_nb(_cell("x = 1\n### begin solution", "sol", solution=True)),
                                  ["cell 0", "unknown marker '### begin solution'"]),
    "marker in an ordinary cell": (_nb(_cell("x = 1"), _cell("### END HIDDEN TESTZ")), ["cell 1", "unknown marker"]),
    "hidden tests in a markdown grade cell": (_nb(_cell(GOOD_CHECK, "md", grade=True, points=1, kind="markdown")),
                                              ["cell 0", "'md'", "outside a check cell"]),
    "check cell importing the checks another way": (
        _nb(_cell("import transformer_lib.grading.checks as checks\nchecks.check_score_std(f)", "chk",
                  grade=True, points=1)), ["cell 0", "'chk'", "line 1", "only with the line"]),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_notebook_is_refused_naming_the_cell(case):
    nb, fragments = MALFORMED[case]
    with pytest.raises(MarkerError) as info:
        release(nb)
    for fragment in fragments:
        assert fragment in str(info.value), f"{case}: {fragment!r} not in {info.value}"


def test_release_cli_refuses_a_malformed_notebook(tmp_path):
    (tmp_path / "src").mkdir()
    nbformat.write(MALFORMED["check cell without points"][0], str(tmp_path / "src" / "99_bad.ipynb"))
    out = subprocess.run([sys.executable, "-m", "transformer_lib.grading", "release", "--source",
                          str(tmp_path / "src"), "--dest", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 2 and "99_bad.ipynb: cell 1 (grade_id 'chk')" in out.stderr
    assert not (tmp_path / "99_bad.ipynb").exists()


def test_a_well_formed_notebook_releases_with_stub_and_without_hidden_tests():
    nb = _nb(_cell(GOOD_SOL, "sol", solution=True), _cell(GOOD_CHECK, "chk", grade=True, points=2))
    student = release(copy.deepcopy(nb))
    assert student.cells[0].source == "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    assert student.cells[1].source == "assert f(1) == 1"
    assert nb.cells[0].source == GOOD_SOL  # the instructor notebook is left alone


def test_an_indented_hidden_region_leaves_pass_so_the_block_is_not_empty():
    check = f"assert f(1) == 1\nif True:\n    {BEGIN_HIDDEN}\n    assert f(2) == 2\n    {END_HIDDEN}\nprint('done')"
    nb = _nb(_cell(GOOD_SOL, "sol", solution=True), _cell(check, "chk", grade=True, points=1))
    student = release(nb).cells[1].source
    assert student == "assert f(1) == 1\nif True:\n    pass\nprint('done')"
    compile(student, "check cell", "exec")


def test_marker_like_headings_in_markdown_are_allowed():
    text = _cell("### End-to-end example\n### Beginning with attention", "text", kind="markdown")
    text.metadata["nbgrader"]["locked"] = True
    release(_nb(text, _cell(GOOD_SOL, "sol", solution=True)))
