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
CHAPTERS = sorted((REPO / "chapters").glob("*.ipynb"))  # the nine chapters and the appendix


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


REQ_FILES = ("runtime", "book", "test")  # each may lean on the ones before it


def _pins(name: str) -> dict[str, str]:
    """{canonical name: version} of requirements/NAME.txt; every line must be an exact pin."""
    from packaging.utils import canonicalize_name

    pins = {}
    for ln in (REPO / "requirements" / f"{name}.txt").read_text().splitlines():
        ln = ln.strip()
        if not ln or ln.startswith("#"):
            continue
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+", ln), f"requirements/{name}.txt: not an exact pin: {ln}"
        pkg, version = ln.split("==")
        pins[canonicalize_name(pkg)] = version
    return pins


def test_requirements_are_pinned_and_split_by_purpose():
    top = [ln.strip() for ln in (REPO / "requirements.txt").read_text().splitlines()
           if ln.strip() and not ln.startswith("#")]
    assert top == [f"-r requirements/{name}.txt" for name in REQ_FILES], top
    files = {name: _pins(name) for name in REQ_FILES}
    for name, pins in files.items():
        assert "torch" not in pins, \
            f"requirements/{name}.txt: torch is installed first, on its own (requirements/torch.txt)"
    seen: dict[str, str] = {}
    for name, pins in files.items():
        twice = sorted(set(pins) & set(seen))
        assert not twice, f"requirements/{name}.txt repeats {twice}, pinned in {[seen[p] for p in twice]}"
        seen.update(dict.fromkeys(pins, name))


def _requires(dist_name: str, extras: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    out = []
    for line in metadata.distribution(dist_name).requires or []:
        req = Requirement(line)
        envs = [{"extra": e} for e in extras] or [{"extra": ""}]
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            out.append((canonicalize_name(req.name), tuple(req.extras)))
    return out


@pytest.mark.parametrize("index", range(len(REQ_FILES)))
def test_each_requirements_file_is_closed_under_its_dependencies(index):
    """Whatever a package in requirements/X.txt depends on (installed metadata, markers evaluated)
    is pinned in X.txt or an earlier file: runtime.txt alone installs a working runtime, and
    runtime + book a working book build. torch is the one package installed on its own, with
    --no-deps: its own dependencies must be pinned in runtime.txt. And no package pinned here depends
    on torch: `make install` installs torch and requirements.txt side by side, so pip, resolving
    requirements.txt, would fetch a torch of its own (the CUDA build) for such a package."""
    allowed = {"torch"}.union(*(_pins(name) for name in REQ_FILES[: index + 1]))
    own = _pins(REQ_FILES[index]) | ({"torch": ""} if index == 0 else {})
    missing, on_torch = {}, set()
    stack = [(pkg, ()) for pkg in own]
    done = set()
    while stack:
        pkg, extras = stack.pop()
        if (pkg, extras) in done:
            continue
        done.add((pkg, extras))
        for dep, dep_extras in _requires(pkg, extras):
            if dep == "torch":
                on_torch.add(pkg)
            if dep not in allowed:
                missing.setdefault(dep, pkg)
            else:
                stack.append((dep, dep_extras))
    assert not missing, (f"requirements/{REQ_FILES[index]}.txt: dependencies pinned in no file it may use "
                         f"(dependency <- needed by): {missing}")
    assert not on_torch, f"requirements/{REQ_FILES[index]}.txt: {sorted(on_torch)} depend on torch (see the Makefile)"


def test_glue_does_not_compile_grammars_on_import():
    """`glue` imports nbformat, which imports jsonschema; since 4.25 jsonschema's format checker
    imports rfc3987-syntax, which compiles 38 lark grammars (2.4 s in every chapter's kernel).
    The pinned jsonschema predates it; this keeps a dependency update from bringing it back."""
    import subprocess
    import sys

    code = "import sys; from myst_nb.ext.glue import glue; print(sorted({'lark', 'rfc3987_syntax'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"importing glue loads {done.stdout.strip()}"


def test_make_test_s_timing_pass_collects_every_timing_test():
    """`make test`'s second pass runs `-m timing` on one folder only: every test marked `timing` must
    be in it, or no pass would run it (the first deselects it)."""
    recipe, lines = [], (REPO / "Makefile").read_text(encoding="utf-8").splitlines()
    start = lines.index("test: install")
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    assert recipe[0] == '$(BIN)/python -m pytest -n 2 -m "not timing"', recipe
    words = recipe[1].split()
    assert words[:5] == ["$(BIN)/python", "-m", "pytest", "-m", "timing"] and len(words) > 5, recipe
    folders = [REPO / w for w in words[5:]]
    marked = [p for p in (REPO / "tests").rglob("*.py")
              if p != Path(__file__) and re.search(r"pytest\.mark\.timing\b", p.read_text(encoding="utf-8"))]
    assert marked, "no test is marked timing: the search finds nothing"
    outside = [str(p.relative_to(REPO)) for p in marked if not any(p.is_relative_to(f) for f in folders)]
    assert not outside, f"marked timing but outside the second pass's {words[5:]}: {outside}"
