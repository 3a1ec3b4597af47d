"""The Gradescope autograder package: built by the command line, unpacked into a temporary folder
laid out as Gradescope's ``/autograder`` (``AUTOGRADER_ROOT``), and run on a correct and a blank
chapter 1 submission. The library is imported from the package's own copy, so a file missing
from the zip fails the test; ``setup.sh`` is only read (it installs from the network)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from repo_paths import REPO
from submissions.helpers import as_handed_in
from transformer_lib.grading.prepare.notebook import dumps, read, release

SOURCE = REPO / "exercises" / "source" / "01_data_independent_weights.ipynb"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("gradescope") / "autograder.zip"
    command = [sys.executable, "-m", "transformer_lib.grading", "gradescope", str(SOURCE), "--out", str(out)]
    done = subprocess.run(command,
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


def _autograde(package, tmp_path, notebook) -> dict:
    """Lay out /autograder as Gradescope does, run run_autograder, return results.json."""
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    with zipfile.ZipFile(package) as zf:
        zf.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    if notebook is not None:
        (root / "submission" / SOURCE.name).write_text(dumps(notebook), encoding="utf-8")
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "PYTHONPATH": str(root / "source" / "course"),
           "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(root / "run_autograder")], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))


def test_the_package_holds_the_scripts_the_notebook_and_the_library(package):
    with zipfile.ZipFile(package) as zf:
        names = set(zf.namelist())
        setup = zf.read("setup.sh").decode()
        modes = {i.filename: i.external_attr >> 16 for i in zf.infolist()}
    assert {"setup.sh", "run_autograder", "constraints.txt", SOURCE.name, "course/pyproject.toml",
            "course/transformer_lib/grading/grade.py", "course/transformer_lib/grading/checks/__init__.py"} <= names
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111
    installs = [line for line in setup.splitlines() if "pip install" in line]
    assert len(installs) == 2 and "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in installs[0]
    assert installs[1].endswith("--constraint constraints.txt ./course")
    assert not [n for n in names if "__pycache__" in n or n.startswith(("exercises/", "tests/"))]


def test_a_correct_submission_scores_full_marks(package, tmp_path):
    results = _autograde(package, tmp_path, as_handed_in(read(SOURCE)))
    assert results["score"] == 5 and [t["status"] for t in results["tests"]] == ["passed"] * len(results["tests"])
    assert sum(t["max_score"] for t in results["tests"]) == 5


def test_a_blank_submission_scores_zero(package, tmp_path):
    results = _autograde(package, tmp_path, release(read(SOURCE)))
    assert results["score"] == 0 and results["tests"] and {t["status"] for t in results["tests"]} == {"failed"}


def test_no_notebook_scores_zero_with_a_message(package, tmp_path):
    results = _autograde(package, tmp_path, None)
    assert results["score"] == 0 and SOURCE.name in results["output"]
