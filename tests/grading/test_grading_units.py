"""Pieces of the autograder in isolation: restoring check cells, the kernel half of the checks,
writing and reading records safely, judging them in the grader, the report formats, and the checks'
messages, bans and bookkeeping. (The grading run itself: tests/grading/test_grading_run.py.)"""
from __future__ import annotations

import copy
import importlib
import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from repo_paths import REPO
from submissions.helpers import run_inprocess
from transformer_lib.grading import checks
from transformer_lib.grading.checks import ch02_attention
from transformer_lib.grading.judges.verdicts import CheckResult, SubmissionResult, judge_calls
from transformer_lib.grading.judges import common as judging
from transformer_lib.grading.prepare.notebook import IMPORT_CHECKS, check_cells, grade_id, read, release
from transformer_lib.grading.prepare.submission import (CELL_FUNCTION, SubmissionError, for_kernel, kernel_files,
                                             load_submission, loader, restore_checks)
from transformer_lib.grading.protocol import RECORD_ENV, SEED_ENV, Opaque, load_calls
from transformer_lib.grading.report.feedback import feedback_markdown, results_json

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

def _softmax(x, dim=-1):
    e = (x - x.amax(dim, keepdim=True)).exp()
    return e / e.sum(dim, keepdim=True)


def _recorded(tmp_path, monkeypatch, fn=_softmax, **kwargs):
    monkeypatch.setenv(RECORD_ENV, str(tmp_path))
    checks.check_stable_softmax(fn, **kwargs)
    return load_calls(tmp_path)


def test_checks_record_only_when_the_grader_asks_and_then_judge_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    with pytest.raises(AssertionError):
        checks.check_stable_softmax(lambda x, dim=-1: x)  # judged here while a student works
    (call,) = _recorded(tmp_path, monkeypatch, fn=lambda x, dim=-1: x)  # under grading: recorded, no verdict
    assert capsys.readouterr().out.count("✓") == 0
    assert call.check == "stable_softmax" and call.hidden == 0 and len(call.cases) == len(call.outs) == 1
    assert torch.equal(call.outs[0]["out"], call.cases[0]["x"]) and call.outs[0]["out"].dtype == torch.float32


def test_the_protocol_both_sides_share_imports_neither_torch_nor_a_side():
    """protocol.py holds the error types, the environment names and the record format: a process
    that imports it has loaded no torch, no kernel half and no judge."""
    code = ("import sys, transformer_lib.grading.protocol; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('transformer_lib.grading.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.stdout.split() == ["['transformer_lib.grading.protocol']"], done.stderr[-2000:]


def test_records_keep_dtypes_and_shapes_and_never_unpickle(tmp_path, monkeypatch):
    (call,) = _recorded(tmp_path, monkeypatch, hidden=1)
    assert [c["x"].dtype for c in call.cases] == [torch.float32, torch.float64] and call.hidden == 1
    assert all(torch.allclose(o["out"].double(), torch.softmax(c["x"].double(), c["dim"]), atol=1e-6)
               for c, o in zip(call.cases, call.outs))
    np.savez(tmp_path / "900-evil.npz", __meta__=np.array([{"a": 1}], dtype=object))
    (tmp_path / "901-garbage.npz").write_bytes(b"PK not a zip")
    np.savez(tmp_path / "902-bad-ref.npz", __meta__=np.frombuffer(json.dumps(
        {"check": "x", "hidden": 0, "cases": [{"$tensor": "a9", "dtype": "float64"}], "outs": [{}]}).encode(), np.uint8))
    os.symlink(tmp_path / "000-stable_softmax.npz", tmp_path / "903-link.npz")
    assert [c.check for c in load_calls(tmp_path)] == ["stable_softmax"]


def test_what_the_student_returns_is_recorded_as_data_never_as_live_objects(tmp_path, monkeypatch):
    class Sneaky(torch.Tensor):
        pass
    monkeypatch.setenv(RECORD_ENV, str(tmp_path))
    checks.check_score_range(lambda d: (lambda: 1, torch.zeros(1).as_subclass(Sneaky)))
    (call,) = load_calls(tmp_path)
    low, high = call.outs[0]["value"]
    assert low == Opaque("an object") and high == Opaque("an object")  # a subclass of a tensor is not read either


def test_the_judge_uses_the_instructor_s_inputs_not_the_submission_s(tmp_path, monkeypatch):
    """A kernel that records other inputs (here: ones it knows the answers to) is judged on the
    instructor's: its outcomes fail."""
    monkeypatch.setenv(SEED_ENV, "7")
    reference = _recorded(tmp_path / "ref", monkeypatch, hidden=1) if (tmp_path / "ref").mkdir() is None else None
    monkeypatch.setenv(SEED_ENV, "8")
    theirs = _recorded(tmp_path / "sub", monkeypatch, hidden=1) if (tmp_path / "sub").mkdir() is None else None
    assert judge_calls(theirs, theirs, compare=False) is None  # right on the inputs it chose
    failure = judge_calls(theirs, reference)
    assert failure.startswith("a hidden test (other inputs) fails") and not any(ch.isdigit() for ch in failure)
    assert judge_calls(reference, reference) is None


def test_hidden_inputs_change_with_the_grading_run_s_seed(tmp_path, monkeypatch):
    seen = []
    for seed in ("1", "2", "1"):
        monkeypatch.setenv(SEED_ENV, seed)
        folder = tmp_path / f"{seed}-{len(seen)}"
        folder.mkdir()
        seen.append(_recorded(folder, monkeypatch, hidden=1)[0].cases[0]["x"])
    assert torch.equal(seen[0], seen[2]) and seen[0].shape != seen[1].shape or not torch.equal(seen[0], seen[1])


def test_a_hidden_test_s_message_shows_neither_inputs_nor_values():
    message = "score_std(64): that is the variance Var(qᵀk) = d_k\n  expected: 8.0\n  got:      64.0"
    shown = judging.render(message, hidden=True)
    assert shown == "a hidden test (other inputs) fails: score_std(#): that is the variance Var(qᵀk) = d_k"
    assert judging.render(message, hidden=False) == message


def test_a_hidden_test_s_message_names_the_kind_of_input_and_never_sends_to_the_passing_cell():
    raised = judging.error_message({"error": "raised", "detail": "RuntimeError"}, "attention(Q, K, V)")
    shown = judging.render(raised, hidden=True, kind="batched, n ≠ m")
    assert shown.startswith("a hidden test (other inputs: batched, n ≠ m) fails: your code raised RuntimeError")
    assert "run the check cell" not in shown and "on such an input in your notebook" in shown
    named = judging.error_message({"error": "shape", "detail": "keepdim"}, "stable_softmax(x, dim)")
    assert "the row sums need keepdim=True to broadcast" in named


def test_a_shape_mistake_in_the_student_s_code_is_named_while_the_student_works():
    from transformer_lib.grading import checks

    def softmax(x, dim=-1):
        e = (x - x.amax(dim, keepdim=True)).exp()
        return e / e.sum(dim)   # the sums lose their dimension

    with pytest.raises(AssertionError, match="keepdim=True to broadcast") as info:
        checks.check_stable_softmax(softmax)
    assert isinstance(info.value.__cause__, RuntimeError)   # torch's own error stays in the traceback


# ------------------------------------------------------------------ checks

def test_library_softmax_is_refused_however_it_is_reached_and_only_during_the_check():
    """(The grader also refuses these names in the source: tests/grading/test_grading_rules.py.)"""
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
    with pytest.raises(AssertionError, match=r"score_range\(1\) is not right") as info:
        checks.check_score_range(lambda d: (-16.0, 16.0))   # d_k = 256's answer, typed
    with pytest.raises(AssertionError, match=r"±1 standard deviation") as one:
        checks.check_score_range(lambda d: (-math.sqrt(d), math.sqrt(d)), d_ks=[256])
    assert "expected" not in str(info.value) + str(one.value) and "32" not in str(one.value)  # the answer is not shown


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


# ------------------------------------------------------------------ the kernel half of the checks

def _kernel_checks(name: str, names: set[str] | None = None):
    namespace: dict = {}
    exec(loader(name, names=names), namespace)  # noqa: S102 - what a check cell runs
    return namespace["checks"]


def test_the_kernel_half_holds_no_judge_and_ignores_earlier_patches(monkeypatch):
    monkeypatch.setattr(checks, "check_score_std", lambda fn, *a, **k: None)
    monkeypatch.setitem(sys.modules, "transformer_lib.grading.checks", types.ModuleType("fake"))
    loaded = _kernel_checks("_grading_test_kernel")
    assert loaded is not checks and "_grading_test_kernel" not in sys.modules
    namespaces = {f.__globals__["__name__"]: f.__globals__ for n, f in vars(loaded).items() if n.startswith("check_")}
    assert len(namespaces) == len(list((REPO / "transformer_lib" / "grading" / "checks").glob("ch*.py")))
    for name, namespace in namespaces.items():  # nothing of the judging half: no judge, no comparison, no reference
        assert not {"judge", "fail", "close", "JUDGES", "verdict", "as_array"} & set(namespace), name
        assert not [n for n in namespace if n.startswith("_reference") or n.startswith("_judge")], name
        public = [n for n, v in namespace.items() if not n.startswith("_") and callable(v)
                  and getattr(v, "__module__", "") == name]
        assert all(n.startswith("check_") or n in ("sublayers", "tiny_gpt") for n in public), (name, public)


@pytest.mark.parametrize("path", sorted((REPO / "transformer_lib" / "grading" / "checks").glob("ch*.py")),
                         ids=lambda p: p.stem)
def test_each_chapter_has_a_kernel_half_without_judges_and_a_judge_for_every_check(path):
    kernel = path.read_text(encoding="utf-8")
    assert "judg" not in "".join(ln for ln in kernel.splitlines() if ln.startswith(("from ", "import ")))
    assert "@judge(" not in kernel and "_checktools" not in kernel
    importlib.import_module(f"transformer_lib.grading.judges.{path.stem}")  # the chapter's judges, beside it
    names = re.findall(r"^def check_(\w+)\(", kernel, re.M)
    assert names
    for name in names:
        assert name in judging.JUDGES, f"{path.stem}: check_{name} has no judge named {name!r}"


def test_a_check_cell_runs_as_a_function_and_leaves_nothing_behind(tmp_path, monkeypatch):
    prepared = for_kernel(read(SOURCE))
    for _, cell in check_cells(prepared):
        assert IMPORT_CHECKS not in cell.source and cell.source.startswith(f"def {CELL_FUNCTION}():")
    monkeypatch.setenv(RECORD_ENV, str(tmp_path))
    namespace: dict = {"__name__": "__main__"}
    for cell in prepared.cells:
        if cell.cell_type == "code":
            exec(compile(cell.source, "<cell>", "exec"), namespace)  # noqa: S102
    assert "checks" not in namespace and CELL_FUNCTION not in namespace
    assert len(load_calls(tmp_path)) == sum(c.source.count("checks.check_") for _, c in check_cells(read(SOURCE)))


def test_a_check_cell_loads_only_the_chapters_whose_checks_the_notebook_calls():
    assert kernel_files({"check_stable_softmax", "check_attention"}) == ("protocol", "_harness", "_calls",
                                                                         "checks.ch02_attention", "checks")
    assert len(kernel_files({"check_stable_softmax", "check_no_such_thing"})) == len(kernel_files())
    loaded = _kernel_checks("_grading_test_kernel_ch02", names={"check_stable_softmax"})
    assert loaded.check_stable_softmax.__module__.endswith("checks.ch02_attention")
    assert not [n for n in dir(checks) if n.startswith("check_") and n not in dir(ch02_attention)
                and hasattr(loaded, n)]


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


def test_a_banned_call_in_another_thread_is_noticed():
    import threading

    def threaded(x, dim=-1):
        out = []
        thread = threading.Thread(target=lambda: out.append(torch.softmax(x, dim)))
        thread.start()
        thread.join()
        return out[0]
    with pytest.raises(AssertionError, match="another thread"):
        checks.check_stable_softmax(threaded)
    assert threading.getprofile() is None if hasattr(threading, "getprofile") else True


def test_a_lookup_table_of_one_run_s_hidden_answers_earns_nothing_in_the_next(tmp_path, monkeypatch):
    """Even every hidden input and answer of one grading run (more than its feedback could ever give
    away) is of no use in the next: the inputs are drawn anew from each run's seed."""
    monkeypatch.setenv(RECORD_ENV, str(tmp_path))

    def calls(seed: str, fn) -> list:
        monkeypatch.setenv(SEED_ENV, seed)
        for f in tmp_path.glob("*.npz"):
            f.unlink()
        checks.check_score_std(fn, hidden=1)
        return load_calls(tmp_path)

    table = {case["d_k"]: math.sqrt(case["d_k"]) for case in calls("run-1", math.sqrt)[0].cases}
    lookup = lambda d: table.get(d, 0.0)  # noqa: E731
    assert judge_calls(calls("run-1", lookup), calls("run-1", math.sqrt)) is None
    next_run = calls("run-2", math.sqrt)
    assert judge_calls(calls("run-2", lookup), next_run).startswith("a hidden test (other inputs) fails")
