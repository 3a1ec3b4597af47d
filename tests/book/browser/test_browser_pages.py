"""Each guide, chapter and exercises page, as a reader's browser renders it (offline, light mode).

Every page is loaded once per session (see `PageVisitor.report`); the tests below inspect
what that visit saw. A screenshot of each page's first screen goes to `_build/screenshots/` (of the
whole page with BOOK_FULL_SCREENSHOTS=1: 2 to 3 s more a chapter).
"""
from __future__ import annotations

import re
from pathlib import Path

from browser_helpers import broken_links, is_trivial_alt, raw_tex

REPO = Path(__file__).resolve().parents[3]


def test_math_is_typeset(visitor, page_path):
    data = visitor.report(page_path).data
    leftovers = raw_tex(data["prose"])
    assert not leftovers, f"{page_path}: TeX left untypeset in the text: {leftovers[:5]}"
    assert not data["mathErrors"], f"{page_path}: MathJax could not typeset {data['mathErrors'][:5]}"
    if page_path.startswith("chapters/"):
        assert data["mjxCount"] > 0, f"{page_path}: no typeset math (mjx-container) on a chapter page"


def test_no_error_output(visitor, page_path):
    errors = visitor.report(page_path).data["errorOutputs"]
    assert not errors, f"{page_path}: the page shows error output: {errors[:3]}"


def test_outputs_fit_the_page(visitor, page_path):
    """Printed output fits its box at 1280 px: no check line is cut off at the right edge."""
    clipped = visitor.report(page_path).data["clippedOutputs"]
    assert not clipped, f"{page_path}: output lines wider than the page: {clipped[:5]}"


def test_figures_load_and_are_described(visitor, page_path):
    """Images load; figures carry alt text or a caption (an animation, whose frames have
    no alt text, needs a caption; a widget's snapshot is described by its static counterpart)."""
    problems = []
    for img in visitor.report(page_path).data["images"]:
        name = img["attr"][:80]
        if not img["loaded"]:
            problems.append(f"{name}: not loaded")
        undescribed = img["inAnimation"] or is_trivial_alt(img["alt"])
        if img["inArticle"] and not img["inWidget"] and undescribed and not img["caption"]:
            problems.append(f"{name}: neither alt text nor a caption (alt={img['alt']!r}, "
                            f"animation={img['inAnimation']})")
    assert not problems, f"{page_path}: " + "; ".join(problems)


def test_widgets_have_a_static_counterpart(visitor, page_path):
    """A widget needs a kernel: the cell after it shows the same thing without one."""
    data = visitor.report(page_path).data
    problems = []
    for w in data["widgets"]:
        cell, nxt = w["cellClasses"], w["nextClasses"]
        if "tag_interactive" not in cell.split():
            problems.append(f"a widget sits in a cell not tagged `interactive` ({cell})")
        elif "tag_static-counterpart" not in nxt.split():
            problems.append(f"the cell after an `interactive` cell is not tagged "
                            f"`static-counterpart` ({nxt})")
        elif not (w["nextHasImage"] or w["nextHasAnimation"]):
            problems.append("the `static-counterpart` cell shows no figure or animation")
        if not w["rendered"]:
            problems.append("a widget was not rendered from its saved state")
    assert not problems, f"{page_path}: " + "; ".join(problems)


def test_page_screenshot(visitor, page_path):
    shot = visitor.report(page_path).screenshot
    assert shot is not None and shot.exists() and shot.stat().st_size > 10_000, shot


def test_chapter_structure(visitor, page_path, all_page_paths):
    """Learning goals open every chapter; previous / next links close every page."""
    data = visitor.report(page_path).data
    if page_path in all_page_paths:
        assert data["prevNextArea"], f"{page_path}: no previous / next navigation"
        assert data["prev"] and data["next"], f"{page_path}: previous or next link missing"
    if not page_path.startswith("chapters/"):
        return  # exercises pages have no learning goals box
    assert data["goals"], f"{page_path}: no learning-goals box (admonition class learning-goals)"
    assert data["goalsBeforeH2"], f"{page_path}: the learning goals must come before the first section"
    assert re.match(r"\d+\.\s", data["h1"].strip()), f"{page_path}: title {data['h1']!r} is not 'N. Title'"


def test_one_search_field(visitor, page_path):
    """The sidebar's search field is the only one (no second, page-wide search bar)."""
    count = visitor.report(page_path).data["searchFields"]
    assert count == 1, f"{page_path}: {count} visible search fields at 1280 px, expected 1"


def test_intro_has_the_course_map(visitor, root_path, all_page_paths):
    """Chapter -> library module -> exercises: every row names a module that exists."""
    data = visitor.report(root_path).data
    maps = [t for t in data["tables"] if any("Library module" in h for h in t["header"])
            and any("Exercises" in h for h in t["header"])]
    assert maps, f"{root_path}: no course map table with 'Library module' and 'Exercises' columns"
    table = maps[0]
    linked = {link.split("#")[0].split("?")[0] for link in table["links"]}
    course = [p for p in all_page_paths if p.startswith(("chapters/", "exercises/"))]
    missing = [p for p in course if visitor.base_url + p not in linked]
    assert not missing, f"{root_path}: the course map does not link to {missing}"
    column = next(i for i, h in enumerate(table["header"]) if "Library module" in h)
    assert len(table["rows"]) == sum(p.startswith("chapters/") for p in all_page_paths), \
        f"{root_path}: the course map needs one row per chapter, has {len(table['rows'])}"
    for row in table["rows"]:
        modules = re.findall(r"transformer_lib\.(\w+)", row[column])
        assert modules, f"{root_path}: course map row {row[0]!r} names no transformer_lib module"
        absent = [m for m in modules if not (REPO / "transformer_lib" / f"{m}.py").exists()]
        assert not absent, f"{root_path}: course map row {row[0]!r} names missing modules {absent}"


def test_internal_links_resolve(visitor, page_path):
    """Every link on the page reaches a page on the server, and its #anchor exists there."""
    links = {link: {page_path} for link in visitor.report(page_path).data["links"]}
    problems = broken_links(links)
    assert not problems, f"{page_path}: broken links:\n" + "\n".join(problems[:20])
