"""Pieces of the autograder in isolation: restoring check cells, fresh copies of the checks,
loading and comparing records safely, the report formats, and the checks' messages, bans and
bookkeeping. (The grading run itself: tests/test_grading_run.py.)"""
from __future__ import annotations

import copy
import json
import math
import sys
import types
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from repo_paths import REPO
from submissions.helpers import run_inprocess
from transformer_lib.grading import _checktools, checks
from transformer_lib.grading.checks import ch01_embeddings, ch02_attention
from transformer_lib.grading._checktools import RECORD_ENV, record
from transformer_lib.grading.fresh import loader, use_fresh_checks
from transformer_lib.grading.grade import CheckResult, SubmissionResult
from transformer_lib.grading.notebook import IMPORT_CHECKS, check_cells, grade_id, read, release
from transformer_lib.grading.prepare import SubmissionError, load_submission, restore_checks
from transformer_lib.grading.records import compare, load_records
from transformer_lib.grading.report import feedback_markdown, results_json

SOURCE = REPO / "exercises" / "source" / "02_building_up_attention.ipynb"


def _ids(nb) -> list[str | None]:
    return [grade_id(c) for c in nb.cells]


# ------------------------------------------------------------------ restoring check cells

def test_restore_puts_back_hidden_tests_without_notes():
    instructor = read(SOURCE)
    prepared, notes = restore_checks(release(instructor), instructor)
    assert notes == []
    assert [c.source for c in prepared.cells if grade_id(c) == "check_attention"] == \
           [c.source for c in instructor.cells if grade_id(c) == "check_attention"]


def test_missing_check_is_reinserted_after_its_preceding_cell():
    instructor = read(SOURCE)
    student = release(instructor)
    student.cells = [c for c in student.cells if grade_id(c) != "check_hand_scores"]
    prepared, notes = restore_checks(student, instructor)
    ids = _ids(prepared)
    assert ids.index("check_hand_scores") == ids.index("hand_scores") + 1
    assert notes == ["check cell 'check_hand_scores' was missing; it was re-inserted"]


def test_missing_checks_go_to_the_end_without_an_anchor():
    instructor = read(SOURCE)
    student = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    prepared, notes = restore_checks(student, instructor)
    wanted = [grade_id(c) for c in instructor.cells if grade_id(c) and grade_id(c).startswith("check_")]
    assert _ids(prepared) == [None, *wanted] and len(notes) == len(wanted)


def test_duplicate_checks_are_dropped_and_edits_undone():
    instructor = read(SOURCE)
    student = release(instructor)
    pos = _ids(student).index("check_stable_softmax")
    dup = copy.deepcopy(student.cells[pos])
    student.cells[pos].source = "pass"
    student.cells.insert(pos + 3, dup)
    prepared, notes = restore_checks(student, instructor)
    assert _ids(prepared).count("check_stable_softmax") == 1
    assert any("was modified" in n for n in notes) and any("more than once" in n for n in notes)


@pytest.mark.parametrize("content,reason", [
    (b"\xff\xfe not utf-8", "not UTF-8"), (b"{not json", "not valid JSON"), (b"[1, 2]", "without notebook cells"),
    (b'{"cells": 3, "nbformat": 4, "nbformat_minor": 5, "metadata": {}}', "not a notebook")])
def test_unusable_files_are_refused_with_a_reason(tmp_path, content, reason):
    path = tmp_path / "sub.ipynb"
    path.write_bytes(content)
    with pytest.raises(SubmissionError, match=reason):
        load_submission(path)


# ------------------------------------------------------------------ records

def _save(folder: Path, name: str, **arrays) -> None:
    folder.mkdir(exist_ok=True)
    np.savez(folder / f"{name}.npz", **arrays)


def test_records_never_unpickle(tmp_path):
    _save(tmp_path, "00-evil", out=np.array([{"a": 1}], dtype=object))
    _save(tmp_path, "01-fine", out=np.arange(3.0))
    (tmp_path / "02-garbage.npz").write_bytes(b"PK not a zip")
    assert list(load_records(tmp_path)) == ["01-fine"]


def test_compare_uses_the_reference_tolerance(tmp_path):
    ref = {"00-x": {"out": np.array([1.0, 2.0]), "__tolerance__": np.array([1e-3, 0.0])}}
    near = {"00-x": {"out": np.array([1.0015, 2.0]), "__tolerance__": np.array([1.0, 1.0])}}
    far = {"00-x": {"out": np.array([1.01, 2.0]), "__tolerance__": np.array([1.0, 1.0])}}
    assert compare(near, ref) is None
    assert "values differ" in compare(far, ref)
    assert "missing" in compare({}, ref)
    assert "shape" in compare({"00-x": {"out": np.zeros(3)}}, ref)


def test_checks_record_only_when_the_grader_asks(tmp_path, monkeypatch):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    record("x", {"out": [1.0]})
    monkeypatch.setenv(RECORD_ENV, str(tmp_path))
    checks.check_score_std(lambda d: math.sqrt(d))
    loaded = load_records(tmp_path)
    assert list(loaded) == ["00-score_std"] and float(loaded["00-score_std"]["d_k=256"]) == 16.0


# ------------------------------------------------------------------ checks

def test_library_softmax_is_refused_however_it_is_reached_and_only_during_the_check():
    aliased = torch.softmax
    for fn in (lambda x, dim=-1: aliased(x, dim), lambda x, dim=-1: torch.nn.Softmax(dim)(x),
               lambda x, dim=-1: x.log_softmax(dim).exp()):
        with pytest.raises(AssertionError, match="from scratch"):
            checks.check_stable_softmax(fn)
    assert torch.softmax(torch.zeros(2), 0).sum() == 1


def test_a_stub_gives_a_clear_message():
    def stub(x, dim=-1):
        raise NotImplementedError()
    with pytest.raises(AssertionError, match="not implemented yet"):
        checks.check_stable_softmax(stub)


def test_variance_answers_are_computed_not_typed():
    checks.check_score_range(lambda d: (-2 * math.sqrt(d), 2 * math.sqrt(d)), d_ks=[256, 3])
    with pytest.raises(AssertionError, match=r"expected: \[-32.,  32.\]"):
        checks.check_score_range(lambda d: (-16.0, 16.0))


# ------------------------------------------------------------------ reports

def test_report_formats():
    res = SubmissionResult("alice", Path("alice.ipynb"),
                           [CheckResult("a", 2, 2, "passed"), CheckResult("b", 0, 1, "AssertionError: wrong axis")],
                           ["a note"])
    data = results_json(res)
    assert data["score"] == 2 and [t["status"] for t in data["tests"]] == ["passed", "failed"]
    assert data["tests"][1]["output"] == "AssertionError: wrong axis" and "a note" in data["output"]
    json.dumps(data)
    md = feedback_markdown(res)
    assert "**Score: 2 / 3**" in md and "wrong axis" in md and "- a note" in md


def test_lenient_reading_of_a_hand_edited_notebook(tmp_path):
    """Missing outputs, metadata or ids, list sources and bad ids are not a reason to refuse a notebook."""
    cells = [{"cell_type": "code", "source": ["x = 1\n", "y = 2"]},
             {"cell_type": "markdown", "source": "# Hi", "id": "bad id!"},
             {"cell_type": "code", "source": "", "metadata": [], "outputs": "garbage", "id": "bad id!"}]
    path = tmp_path / "sub.ipynb"
    path.write_text(json.dumps({"cells": cells, "nbformat": 4, "nbformat_minor": 4}), encoding="utf-8")
    nb = load_submission(path)
    assert nb.cells[0].source == "x = 1\ny = 2"
    prepared, _ = restore_checks(nb, read(SOURCE))
    nbformat.validate(prepared)
    assert len({c.id for c in prepared.cells}) == len(prepared.cells)


# ------------------------------------------------------------------ fresh copies of the checks

def test_a_fresh_copy_of_the_checks_ignores_earlier_patches(monkeypatch):
    monkeypatch.setattr(checks, "check_score_std", lambda fn, *a, **k: None)
    monkeypatch.setattr(_checktools, "close", lambda *a, **k: True)
    monkeypatch.setitem(sys.modules, "transformer_lib.grading.checks", types.ModuleType("fake"))
    namespace: dict = {}
    exec(loader("_grading_test_fresh"), namespace)  # noqa: S102 - what a check cell runs
    assert namespace["checks"] is not checks and "_grading_test_fresh" not in sys.modules
    with pytest.raises(AssertionError, match=r"score_std\(256\) is not right"):
        namespace["checks"].check_score_std(lambda d: 0.0)


def test_check_cells_load_fresh_checks_and_still_pass_on_the_solutions():
    instructor = read(SOURCE)
    prepared = use_fresh_checks(instructor)
    for _, cell in check_cells(prepared):
        assert IMPORT_CHECKS not in cell.source and "_grading_fresh_checks(" in cell.source
    assert [c.source for c in prepared.cells if not grade_id(c) or not grade_id(c).startswith("check_")] == \
           [c.source for c in instructor.cells if not grade_id(c) or not grade_id(c).startswith("check_")]
    assert set(run_inprocess(prepared).values()) == {None}


def test_a_check_cell_loads_only_the_chapters_whose_checks_the_notebook_calls():
    from transformer_lib.grading.fresh import files

    assert files({"check_stable_softmax", "check_attention"}) == ("_checktools", "checks.ch02_attention", "checks")
    assert len(files({"check_stable_softmax", "check_no_such_thing"})) == len(files())  # unknown: all of them
    namespace: dict = {}
    exec(loader("_grading_test_fresh_ch02", names={"check_stable_softmax"}), namespace)  # noqa: S102
    loaded = namespace["checks"]
    assert loaded.check_stable_softmax.__module__.endswith("checks.ch02_attention")
    assert hasattr(loaded, "CheckFailed")
    assert not [n for n in dir(checks) if n.startswith("check_") and n not in dir(ch02_attention)
                and hasattr(loaded, n)]


def test_no_module_level_helper_computes_an_answer():
    for module, name in [(ch02_attention, "_hand"), (ch01_embeddings, "_nw_reference"),
                         (ch02_attention, "_weights"), (ch02_attention, "_score_variance")]:
        assert not hasattr(module, name), f"{module.__name__}.{name}"


def test_hand_checks_name_the_wrong_entries_not_the_expected_values():
    right = torch.tensor([[5.0, 3.0, 6.0], [4.0, 2.0, 4.0], [7.0, 3.0, 6.0]])
    for wrong, shown in [(right.T, "S[0, 1] = 4"), (right + torch.eye(3), "S[0, 0] = 6")]:
        with pytest.raises(AssertionError) as info:
            checks.check_hand_scores(wrong)
        assert shown in str(info.value) and "expected" not in str(info.value)
    with pytest.raises(AssertionError) as info:
        checks.check_hand_qkv(torch.zeros(2, 3), torch.zeros(3, 2), torch.zeros(3, 2))
    assert "transposed" in str(info.value) and "expected:" not in str(info.value)


def test_switching_off_the_library_watch_is_noticed():
    def sneaky(x, dim=-1):
        sys.setprofile(None)
        from transformer_lib.attention import softmax
        return softmax(x, dim)
    with pytest.raises(AssertionError, match="sys.setprofile"):
        checks.check_stable_softmax(sneaky)
    assert sys.getprofile() is None
