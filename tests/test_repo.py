"""Repository hygiene: notebooks are committed as sources, the table of contents lists only
what exists, the notation macros agree between Jupyter and the book, dependencies are pinned."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from repo_paths import REPO, tracked_files

NOTEBOOKS = tracked_files("*.ipynb")
CHAPTERS = sorted((REPO / "chapters").glob("[0-9][0-9]_*.ipynb"))


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _source(cell: dict) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def test_there_are_notebooks():
    assert CHAPTERS, "no chapter notebooks found in chapters/"
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_notebook_committed_without_outputs(path):
    dirty = [i for i, c in enumerate(_cells(path))
             if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, (f"{path.relative_to(REPO)}: cells {dirty} carry outputs or execution counts; "
                       "clear them before committing (the book shows fresh outputs)")


def _toc_files() -> list[str]:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries):
        for e in entries:
            if "file" in e:
                files.append(e["file"])
            walk(e.get("sections", []))
            walk(e.get("chapters", []))
    for part in toc.get("parts", []):
        walk(part["chapters"])
    return files


def test_toc_lists_only_existing_files():
    for f in _toc_files():
        matches = [p for p in REPO.glob(f + ".*") if p.suffix in {".md", ".ipynb"}]
        assert matches, f"_toc.yml lists {f!r} but no such .md/.ipynb file exists"


def test_every_chapter_and_its_exercises_are_in_the_toc():
    listed = set(_toc_files())
    for ch in CHAPTERS:
        assert f"chapters/{ch.stem}" in listed, f"{ch.name} is missing from _toc.yml"
        assert f"exercises/{ch.stem}" in listed, f"exercises for {ch.name} are missing from _toc.yml"
        assert (REPO / "exercises" / ch.name).exists(), f"no student exercises for {ch.name}"
        assert (REPO / "exercises" / "source" / ch.name).exists(), f"no instructor exercises for {ch.name}"


def _config_macros() -> dict[str, str]:
    cfg = yaml.safe_load((REPO / "_config.yml").read_text())
    return cfg["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_notation_macros_match_the_book(path):
    first = _cells(path)[0]
    assert first["cell_type"] == "markdown" and "remove-cell" in first["metadata"].get("tags", []), \
        f"{path.name}: the first cell must be the (remove-cell) markdown cell defining the notation macros"
    defined = dict(re.findall(r"\\newcommand\{\\(\w+)\}\{(.*?)\}(?=\\newcommand|\$)", _source(first)))
    assert defined == _config_macros(), (f"{path.name}: notation macros differ from _config.yml\n"
                                         f"notebook: {defined}\nbook:     {_config_macros()}")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_has_goals_checks_and_exercise_link(path):
    cells = _cells(path)
    text = "\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    code = "\n".join(_source(c) for c in cells if c["cell_type"] == "code")
    assert "learning-goals" in text, f"{path.name}: no learning-goals box"
    assert f"../exercises/{path.name}" in text, f"{path.name}: no link to its exercises"
    assert re.search(r"\bassert\b|assert_close", code), f"{path.name}: no assertion"
    assert "glue(" in code, f"{path.name}: numbers in prose must be glued"


def test_requirements_are_pinned():
    lines = [ln.strip() for ln in (REPO / "requirements.txt").read_text().splitlines()]
    reqs = [ln for ln in lines if ln and not ln.startswith("#")]
    loose = [r for r in reqs if not re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[A-Za-z0-9_.+\-]+", r)]
    assert not loose, f"unpinned requirements: {loose}"
    assert not any(r.lower().startswith("torch==") for r in reqs), \
        "torch is installed first, on its own (pip install torch==2.13.0), not from requirements.txt"
