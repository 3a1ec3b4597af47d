"""A Gradescope autograder for one exercise notebook (``python -m transformer_lib.grading gradescope``).

:func:`build` writes a zip file with Gradescope's two scripts at its top level:

- ``setup.sh`` (run once, when Gradescope builds the autograder's image): installs torch's CPU
  build at the course's pinned version into a virtual environment, then this course's library
  from the zip, its other dependencies held to the course's pinned versions
  (``constraints.txt``); nothing else;
- ``run_autograder`` (run for every submission, in a fresh container): grades the submitted
  notebook with this package's grader (:func:`~transformer_lib.grading.grade.grade`) and
  writes ``results/results.json``.

Gradescope unpacks the zip into ``/autograder/source`` and puts the submission into
``/autograder/submission``. The root ``/autograder`` can be changed with the environment
variable ``AUTOGRADER_ROOT`` (the tests use a temporary folder).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from transformer_lib.doctor import TORCH_INDEX

REPO = Path(__file__).resolve().parents[3]
PACKAGE = Path(__file__).resolve().parents[2]  # transformer_lib

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder's image: CPU torch at the course's
# pinned version, then the course's library with its dependencies held to the course's pins.
set -euo pipefail
cd "$(dirname "$0")"
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/python" -m pip install --quiet --no-cache-dir {torch} --index-url {index}
"$ROOT/venv/bin/python" -m pip install --quiet --no-cache-dir --constraint constraints.txt ./course
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: grade it, write results/results.json.
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHON="$ROOT/venv/bin/python"
[ -x "$PYTHON" ] || PYTHON=python3
cd "$ROOT/source"
exec "$PYTHON" -m transformer_lib.grading.report.gradescope --root "$ROOT" --source "$ROOT/source/{notebook}"
"""

PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "transformer_lib"
version = "{version}"
requires-python = "{python}"
dependencies = {dependencies}

[tool.setuptools.packages.find]
include = ["transformer_lib*"]
"""


def _project() -> dict:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]


def _constraints() -> str:
    """The course's runtime pins (``requirements/runtime.txt``; torch is installed from its own index)."""
    from transformer_lib.doctor import read_pins

    pins = read_pins(REPO / "requirements" / "runtime.txt")
    return "".join(f"{name}=={version}\n" for name, version in pins.items() if name != "torch")


def build(source: Path | str, out: Path | str) -> Path:
    """Write the autograder zip for the instructor notebook ``source`` to ``out``; return ``out``."""
    from ..prepare.notebook import read, validate

    source, out = Path(source), Path(out)
    validate(read(source))  # refuse a malformed instructor notebook now, not on Gradescope
    project = _project()
    torch = next(d for d in project["dependencies"] if d.startswith("torch=="))
    pyproject = PYPROJECT.format(version=project["version"], python=project["requires-python"],
                                 dependencies=json.dumps(project["dependencies"]))
    files = {"setup.sh": SETUP_SH.format(torch=torch, index=TORCH_INDEX),
             "run_autograder": RUN_AUTOGRADER.format(notebook=source.name),
             "constraints.txt": _constraints(), "course/pyproject.toml": pyproject}
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name in ("setup.sh", "run_autograder") else 0o644) << 16
            zf.writestr(info, text)
        zf.write(source, source.name)
        for path in sorted(PACKAGE.rglob("*.py")):
            zf.write(path, f"course/{path.relative_to(PACKAGE.parent)}")
    return out


def _submission(folder: Path, name: str) -> Path | None:
    """The submitted notebook: the one named like the exercise, else the only one."""
    found = sorted(p for p in folder.rglob("*.ipynb") if p.is_file() and ".ipynb_checkpoints" not in p.parts)
    named = [p for p in found if p.name == name]
    return named[0] if named else (found[0] if len(found) == 1 else None)


def run(root: Path, source: Path) -> int:
    """Grade the submission in ``root/submission``; write ``root/results/results.json``."""
    from ..grade import grade

    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    submission = _submission(root / "submission", source.name)
    if submission is None:
        report = {"score": 0, "output": f"No notebook to grade: upload {source.name} (one .ipynb file).",
                  "tests": []}
        (results / "results.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
        return 0
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        (result,) = grade(source, [submission], Path(tmp), jobs=1, progress=False)
        shutil.copy(Path(tmp) / result.name / "results.json", results / "results.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer_lib.grading.report.gradescope --root R --source S`` (what ``run_autograder`` runs)."""
    parser = argparse.ArgumentParser(prog="python -m transformer_lib.grading.report.gradescope")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--source", type=Path, required=True)
    args = parser.parse_args(argv)
    return run(args.root, args.source)


if __name__ == "__main__":
    sys.exit(main())
