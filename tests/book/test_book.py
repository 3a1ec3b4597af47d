"""The book builds, executing every chapter, with Sphinx warnings treated as errors.

The build is `_build/html`, as `make book` makes it, built once per test session with every page
read from a fresh Sphinx environment (`tests/book_build.py`, shared with the browser suite); the
execution cache (`_build/.jupyter_cache`, set in `_config.yml`) is shared with `make book`, so a
notebook is re-executed only when it, the library or a pin changed (scripts/execute_book.py). A second, tiny book proves that a failing cell
fails the build.
"""
from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

import book_build
from repo_paths import REPO

@pytest.fixture(scope="module")
def built() -> Path:
    result = book_build.build()
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"book build failed:\n{log[-6000:]}"
    # Sphinx warnings read "path: WARNING: message" (a kernel's own log lines do not count).
    warnings = [ln for ln in log.splitlines() if "WARNING: " in ln]
    assert not warnings, "book build printed warnings:\n" + "\n".join(warnings[:20])
    return book_build.HTML


def test_book_has_every_page(built):
    assert (built / "index.html").exists()
    for nb in sorted((REPO / "chapters").glob("*.ipynb")):
        assert (built / "chapters" / f"{nb.stem}.html").exists(), f"no page for {nb.name}"
        assert (built / "exercises" / f"{nb.stem}.html").exists(), f"no exercises page for {nb.name}"


def test_chapters_were_executed(built):
    """Every chapter page shows the outputs of its check cells (printed '✓' lines)."""
    for nb in sorted((REPO / "chapters").glob("*.ipynb")):
        html = (built / "chapters" / f"{nb.stem}.html").read_text()
        assert "✓" in html, f"{nb.name}: no check output on the page: was the notebook executed?"
        assert "Traceback" not in html, f"{nb.name}: a traceback is shown on the page"


def test_no_chapter_page_shows_stderr(built):
    """A warning printed while a chapter runs (a torch UserWarning, say) reaches the page as a
    stderr block that quotes the line which caused it, hidden input or not: no chapter may show one."""
    shown = {}
    for nb in sorted((REPO / "chapters").glob("*.ipynb")):
        html = (built / "chapters" / f"{nb.stem}.html").read_text()
        blocks = re.findall(r'<div class="output stderr[^"]*">(.*?)</div>', html, re.S)
        if blocks:
            shown[nb.name] = [re.sub(r"<[^>]+>", "", b).strip()[:300] for b in blocks]
    assert not shown, f"stderr blocks on chapter pages: {shown}"


# A MyST role left as text: {name}` or {domain:name}` (a rendered role leaves neither brace).
_ROLE = re.compile(r"\{[A-Za-z][\w.:-]*\}`")


def unrendered_roles(page: str) -> list[str]:
    """The MyST roles that a built page prints literally, outside code: `{glue...`, `{cite}`…"""
    text = re.sub(r"<(pre|code|script|style)\b.*?</\1>", " ", page, flags=re.S | re.I)
    text = html.unescape(re.sub(r"<[^>]+>", "", text))
    found = [m.group(0) for m in _ROLE.finditer(text)]
    found += [text[i:i + 40] for i in (m.start() for m in re.finditer(r"\{glue", text))
              if not _ROLE.match(text, i)]
    return found


def test_the_role_detector_finds_an_unclosed_glue_role():
    page = ("<p>At <em>n</em> = 4096 it holds 128 MiB, {glue:text}`wall_ratio:.0f} times less.</p>"
            "<pre>glue('x', 1)  # {glue:text}`x` in a code block is fine</pre><p>{glue</p>")
    assert unrendered_roles(page) == ["{glue:text}`", "{glue"]
    assert unrendered_roles("<p>113 times less, as {cite} shows</p><code>{cite}`k`</code>") == []


def test_no_page_prints_a_role_literally(built):
    """Every {glue}, {cite}, {numref} … role of every page was rendered: none is left as text."""
    bad = {str(page.relative_to(built)): found for page in sorted(built.rglob("*.html"))
           if (found := unrendered_roles(page.read_text()))}
    assert not bad, f"pages print MyST roles literally: {bad}"


def unparsed_tables(page: str) -> list[str]:
    """Markdown tables that a page prints as a paragraph: a header row of pipes, then its rule."""
    return [m.group(0)[:60] for m in re.finditer(r"<p>\|[^\n<]*\|\s*\n\|\s*[-—:]", page)]


def test_the_table_detector_finds_a_table_left_as_text():
    assert unparsed_tables("<p>| model | count |\n|—|—|\n| GPT-2 | 124M |</p>")
    assert not unparsed_tables("<table><tr><th>model</th></tr></table><p>a | b</p>")


def test_no_page_prints_a_markdown_table_as_text(built):
    """Tables that cells display as Markdown are parsed (nb_render_markdown_format: myst)."""
    bad = {str(page.relative_to(built)): found for page in sorted(built.rglob("*.html"))
           if (found := unparsed_tables(page.read_text()))}
    assert not bad, f"pages print markdown tables as text: {bad}"


def test_exercise_pages_are_not_executed(built):
    for nb in sorted((REPO / "exercises").glob("*.ipynb")):
        html = (built / "exercises" / f"{nb.stem}.html").read_text()
        assert "NotImplementedError" in html, f"{nb.name}: the student stubs are missing"
        assert "Traceback" not in html, f"{nb.name}: exercise pages must not be executed"


def test_a_failing_cell_fails_the_build(tmp_path):
    """The executing build is the gate: a cell that raises must stop it (no cache can hide it)."""
    book = tmp_path / "broken"
    book.mkdir()
    shutil.copy(REPO / "_config.yml", book)
    shutil.copy(REPO / "references.bib", book)
    shutil.copytree(REPO / "_ext", book / "_ext")
    (book / "intro.md").write_text("# Intro\n")
    (book / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: bad\n")
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# Bad"},
                    {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": "raise ZeroDivisionError('deliberate failure')"}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (book / "bad.ipynb").write_text(json.dumps(nb))
    result = book_build.build_into(book, tmp_path / "out")
    assert result.returncode != 0, "a notebook cell raised but the build succeeded"
    assert "ZeroDivisionError" in result.stdout + result.stderr


def _external_links(html_dir: Path) -> dict[str, str]:
    """{external URL: first page linking it} over every page's href and src attributes."""
    import re

    links: dict[str, str] = {}
    for page in sorted(html_dir.rglob("*.html")):
        for url in re.findall(r'(?:href|src)="(https?://[^"]+)"', page.read_text()):
            links.setdefault(url, str(page.relative_to(html_dir)))
    return links


def _cited_urls() -> set[str]:
    """The URLs references.bib gives: url fields, DOIs and arXiv identifiers."""
    import re

    bib = (REPO / "references.bib").read_text()
    urls = set(re.findall(r"^\s*url\s*=\s*\{([^}]+)\}", bib, re.M | re.I))
    urls |= {f"https://doi.org/{d}" for d in re.findall(r"^\s*doi\s*=\s*\{([^}]+)\}", bib, re.M | re.I)}
    for arxiv in re.findall(r"^\s*eprint\s*=\s*\{([^}]+)\}", bib, re.M | re.I):
        urls |= {f"https://arxiv.org/abs/{arxiv}", f"https://arxiv.org/pdf/{arxiv}"}
    return urls


def repository_links(url: str) -> tuple[str, ...]:
    """Prefixes of the links a book may have for repository `url`: the repository itself and
    its notebooks opened in Colab and on Binder (GitHub; GitLab has the repository link only)."""
    org_repo = url.rstrip("/").split("/", 3)[3]
    return (url, f"https://colab.research.google.com/github/{org_repo}/",
            f"https://mybinder.org/v2/gh/{org_repo}/")


def test_external_links_are_ones_the_course_means(built):
    """Every external link on a page is a cited work's, or the course repository's when one is
    set (repository.url in _config.yml); with none set, no page links a repository, Binder or Colab."""
    import yaml

    url = (yaml.safe_load((REPO / "_config.yml").read_text())["repository"].get("url") or "").rstrip("/")
    cited = _cited_urls()
    unexpected = {}
    for link, page in _external_links(built).items():
        if link in cited:
            continue
        if url and link.startswith(repository_links(url)):
            continue
        unexpected[link] = page
    assert not unexpected, f"external links the course does not mean to have (link: page): {unexpected}"
