"""The book reads offline: every page renders from the files of the build alone.

Pages are opened with every request to a host other than localhost aborted (see
`PageVisitor.new_page`); MathJax, RequireJS and the ipywidgets manager are vendored
from the npm registry (versions and hashes pinned in package-lock.json) by
scripts/vendor_assets.py and served from `_static/vendor/`.
"""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

from browser_helpers import unexpected_errors

REPO = Path(__file__).resolve().parents[3]
# <link rel=…> values that make the browser fetch the address.
FETCHING_RELS = {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "shortcut",
                 "apple-touch-icon", "manifest", "preconnect", "dns-prefetch"}


def test_page_reads_offline(visitor, page_path):
    rep = visitor.report(page_path)
    assert not rep.aborted, f"{page_path}: the page asked other hosts for {sorted(set(rep.aborted))}"
    assert not rep.failed, f"{page_path}: requests failed on the local server: {rep.failed[:10]}"
    errors = unexpected_errors(rep.page_errors)
    assert not errors, f"{page_path}: JavaScript errors: {errors[:5]}"
    if page_path.startswith("chapters/"):
        assert rep.data["mjxCount"] > 0, f"{page_path}: MathJax did not typeset offline"


class _ExternalAssets(HTMLParser):
    """Collects addresses on other hosts that a page would load (not plain <a> links)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        urls = []
        if tag in {"script", "img", "iframe", "source", "video", "audio", "embed", "track"}:
            urls.append(a.get("src", ""))
        if tag == "link" and FETCHING_RELS & set(a.get("rel", "").lower().split()):
            urls.append(a.get("href", ""))
        if tag == "object":
            urls.append(a.get("data", ""))
        urls += re.findall(r"url\(\s*['\"]?(https?:)?//", a.get("style", ""))
        self.found += [f"<{tag}> {u}" for u in urls if re.match(r"(https?:)?//", u)]

    def handle_data(self, data: str) -> None:
        self.found += [f"CSS {m}" for m in re.findall(r"@import\s+url\(\s*['\"]?(?:https?:)?//[^)]*", data)]


def test_built_html_loads_nothing_from_other_hosts(book_html):
    """No built page or stylesheet points a script, style, font or image at another host."""
    problems = []
    for page in sorted(book_html.rglob("*.html")):
        parser = _ExternalAssets()
        parser.feed(page.read_text(errors="replace"))
        problems += [f"{page.relative_to(book_html)}: {f}" for f in parser.found]
    for css in sorted((book_html / "_static").rglob("*.css")):
        text = css.read_text(errors="replace")
        for m in re.findall(r"(?:url\(|@import\s+)\s*['\"]?((?:https?:)?//[^'\")\s]+)", text):
            problems.append(f"{css.relative_to(book_html)}: {m}")
    assert not problems, "external assets:\n" + "\n".join(problems[:30])


def test_vendored_assets_match_package_lock(book_html):
    """The build serves exactly the npm versions that package-lock.json pins."""
    notice = book_html / "_static" / "vendor" / "NOTICE.txt"
    assert notice.exists(), (f"{notice} missing: run `python scripts/vendor_assets.py`, "
                             f"then rebuild the book")
    lock = json.loads((REPO / "package-lock.json").read_text())["packages"]
    text = notice.read_text()
    for name in json.loads((REPO / "package.json").read_text())["dependencies"]:
        version = lock[f"node_modules/{name}"]["version"]
        assert f"{name}@{version}," in text, f"the build does not serve {name}@{version}"
    for asset in ("mathjax/tex-chtml.js", "requirejs/require.js", "html-manager/embed-amd.js"):
        assert (book_html / "_static" / "vendor" / asset).exists(), f"_static/vendor/{asset} missing"
