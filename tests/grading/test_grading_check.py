"""The pre-submit check: a notebook that only works when run out of order is reported as such,
a correct one passes without warnings, and the time limits are the grader's."""
from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from repo_paths import REPO
from submissions.helpers import as_handed_in, records_of, substitute
from transformer_lib.grading import presubmit as check_module
from transformer_lib.grading.__main__ import main
from transformer_lib.grading.presubmit import LIMITS, format_report, presubmit
from transformer_lib.grading.prepare.notebook import check_cells, dumps, grade_id, hidden_lines, is_check, read, release
from transformer_lib.grading.run.runner import RunResult

STEM = "02_building_up_attention"
SOURCE = REPO / "exercises" / "source" / f"{STEM}.ipynb"


def _handed_in():
    return as_handed_in(read(SOURCE))  # the student version with every solution filled in


def out_of_order():
    """Solved, but saved after running out of order: ``stable_softmax`` is defined in the last cell,
    which ran before its check; a scratch cell raised and was left in."""
    nb = _handed_in()
    cells = nb.cells
    moved = cells.pop(next(i for i, c in enumerate(cells) if grade_id(c) == "stable_softmax"))
    cells.append(moved)
    scratch = nbformat.v4.new_code_cell("scratch = torch.ones(2, 3) @ torch.ones(2, 3)  # trying out shapes")
    scratch.outputs = [nbformat.v4.new_output("error", ename="RuntimeError", evalue="shapes", traceback=[])]
    cells.insert(2, scratch)
    count = 0
    for cell in cells:
        if cell.cell_type != "code" or cell is moved:
            continue
        if grade_id(cell) == "check_stable_softmax":  # the definition ran just before its check
            count += 1
            moved.execution_count = count
        count += 1
        cell.execution_count = count
        if is_check(cell):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✓ passed\n")]
    return nb


def _command(path, *args) -> list[str]:
    return [sys.executable, "-m", "transformer_lib.grading", "check", str(path), *map(str, args)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The check command on three notebooks, run side by side: out of order, correct, too slow."""
    folder = tmp_path_factory.mktemp("check")
    slow = _handed_in()
    slow.cells.insert(2, nbformat.v4.new_code_cell("import time\ntime.sleep(600)"))
    notebooks = {"out_of_order": (out_of_order(), ()), "correct": (_handed_in(), ()),
                 "slow": (slow, ("--timeout", "20"))}  # 5 s: under load the kernel once took longer to start
    procs = {}
    for name, (nb, args) in notebooks.items():
        path = folder / f"{STEM}.ipynb" if name == "correct" else folder / f"{name}.ipynb"
        path.write_text(dumps(nb), encoding="utf-8")
        procs[name] = subprocess.Popen(_command(path, "--source", SOURCE, *args), cwd=REPO, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        out[name] = (proc.returncode, " ".join(stdout.split()), stderr)  # the lines are wrapped: compare words
    return out


def test_a_notebook_that_only_works_out_of_order_is_reported(runs):
    code, out, err = runs["out_of_order"]
    assert code == 1, err[-2000:]
    assert "✗ check_stable_softmax (2 points): the check cell raised NameError before the check could record a result" in out
    assert "NameError: name 'stable_softmax' is not defined" in out
    assert "✓ check_attention (2 points): passed" in out and "9 of 10 visible checks pass (11 of 13 points" in out
    assert "your saved notebook was not run top to bottom: cell 25 ran as In [9], before cell 24" in out
    assert ("cell 12 (check cell check_stable_softmax) raised NameError: name 'stable_softmax' is not defined; "
            "'stable_softmax' is defined only further down, in cell 25") in out
    assert "In your saved notebook this cell ran without error (In [10])" in out


def test_a_cell_that_raised_before_the_checks_is_reported(runs):
    _, out, _ = runs["out_of_order"]
    assert 'cell 3 ("scratch = torch.ones(2, 3) @ torch.ones…") raised RuntimeError: mat1 and mat2' in out
    assert "whatever the cell should define is missing" in out


def test_a_correct_notebook_passes_without_warnings(runs):
    code, out, err = runs["correct"]
    assert code == 0, out + err[-2000:]
    assert "10 of 10 visible checks pass (13 of 13 points" in out and "No warnings" in out
    assert "at most 30 s per cell and 300 s in all" in out


def test_a_notebook_over_the_time_limit_is_reported(runs):
    code, out, _ = runs["slow"]
    assert code == 1
    assert "✗ check_hand_qkv (1 point): not run: the notebook ran longer than 20 s and was stopped" in out
    assert "! the notebook ran longer than 20 s and was stopped; the checks after it were not run" in out


def test_lines_are_wrapped(tmp_path):
    report = check_module.PresubmitReport(tmp_path / "nb.ipynb", seconds=1.0, cell_timeout=30, timeout=300,
                                          warnings=["word " * 60])
    report.checks.append(check_module.CheckOutcome("check_x", 1.0, False, "AssertionError: x " * 40 + "\n  got: 1"))
    lines = format_report(report).splitlines()
    assert max(map(len, lines)) <= check_module.WIDTH and "      got: 1" in lines
    assert lines[-1].startswith("  word") and lines[-2].startswith("  word") and lines[-4].startswith("! word")


def test_the_limits_are_the_graders(capsys):
    assert LIMITS == {"cell_timeout": 30.0, "timeout": 300.0}
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert "as the grader's default" in capsys.readouterr().out


def _event(cell: int, gid: str | None, ename: str = "", evalue: str = "", timed_out: bool = False) -> dict:
    return {"cell": cell, "grade_id": gid, "label": gid, "status": "error" if ename else "ok", "ename": ename,
            "evalue": evalue, "output": "", "timed_out": timed_out, "truncated": False}


def test_time_limits_unfinished_cells_and_edited_checks_are_reported(tmp_path, monkeypatch):
    """With a fake run: cell 4 is interrupted, cell 6 is not done, its check misses S, the kernel dies at cell 8."""
    nb = _handed_in()
    cells = {grade_id(c): c for c in nb.cells}
    cells["check_hand_qkv"].source += "\nprint('edited')"
    cells["hand_scores"].source = "# YOUR CODE HERE\nraise NotImplementedError()"
    path = tmp_path / "nb.ipynb"
    path.write_text(dumps(nb), encoding="utf-8")

    def fake_run(prepared, cell_timeout, timeout, **kwargs):
        run = RunResult(token="t", dead_at=7, records={"check_hand_qkv": records_of(read(SOURCE))["check_hand_qkv"]})
        run.cells = [_event(3, None, "KeyboardInterrupt", timed_out=True), _event(4, "check_hand_qkv"),
                     _event(5, None, "NotImplementedError"),
                     _event(6, "check_hand_scores", "NameError", "name 'S' is not defined")]
        return run

    monkeypatch.setattr(check_module, "run_notebook", fake_run)
    report = presubmit(path, SOURCE, cell_timeout=7)
    text = " ".join(format_report(report).split())
    assert ('cell 4 ("Q = torch.tensor([[2.0, 1.0], [1.0, 1.0…") ran longer than the grader\'s 7 s per cell '
            "and was interrupted") in text, text
    assert "check cell 'check_hand_qkv' was modified; the original was restored" in text
    assert '! cell 6 ("raise NotImplementedError()") is not done yet: it raises NotImplementedError' in text
    assert ("cell 7 (check cell check_hand_scores) raised NameError: name 'S' is not defined; no cell defines 'S' "
            '(did cell 6 ("raise NotImplementedError()"), which raised, not get to define it?)') in text
    assert "✓ check_hand_qkv (1 point): passed" in text and "✗ check_hand_weights (2 points): not run: the kernel " \
        "died while running cell 8" in text
    assert "! the kernel died while running cell 8; the checks after it were not run" in text and not report.ok


def test_a_check_that_passed_when_saved_but_fails_fresh_is_reported(tmp_path, monkeypatch):
    nb = _handed_in()
    index = next(i for i, c in enumerate(nb.cells) if grade_id(c) == "check_stable_softmax")
    nb.cells[index].execution_count = 3
    nb.cells[index].outputs = [nbformat.v4.new_output("stream", name="stdout", text="✓ stable_softmax matches\n")]
    path = tmp_path / "nb.ipynb"
    path.write_text(dumps(nb), encoding="utf-8")
    wrong = records_of(substitute(read(SOURCE), {"stable_softmax": "return x.exp() / x.exp().sum(0)"}))
    monkeypatch.setattr(check_module, "run_notebook", lambda *a, **k: RunResult(
        token="t", finished=True, cells=[_event(index, "check_stable_softmax")],
        records={"check_stable_softmax": wrong["check_stable_softmax"][:1]}))
    text = " ".join(format_report(presubmit(path, SOURCE)).split())
    assert "✗ check_stable_softmax (2 points): stable_softmax(x) contains" in text or \
        "✗ check_stable_softmax (2 points): the output does not sum to 1 along dim=-1" in text, text
    assert (f"cell {index + 1} (check cell check_stable_softmax) passed in your saved notebook (In [3]) but fails "
            "in a fresh run") in text


def test_the_grader_preparation_with_the_visible_checks_only():
    source = read(SOURCE)
    nb, notes, origin, costs = check_module.prepare_visible(as_handed_in(source), source)
    visible = {grade_id(c): c.source for _, c in check_cells(release(source))}
    hidden = [h for _, c in check_cells(source) for h in hidden_lines(c.source) if "hidden=" in h]
    assert notes == [] and origin == list(range(len(source.cells))) and hidden and not any(costs.values())
    for _, cell in check_cells(nb):
        calls = [line.strip() for line in cell.source.splitlines() if "checks.check_" in line]
        assert calls == [line for line in visible[grade_id(cell)].splitlines() if "checks.check_" in line] != []
        assert not [h for h in hidden if h in cell.source]
    assert all("_grading_kernel_checks(" in c.source for c in nb.cells if is_check(c))
    assert not any("_presubmit_origin" in c.metadata for c in nb.cells)
