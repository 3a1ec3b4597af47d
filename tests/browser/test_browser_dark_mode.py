"""Figures read in dark mode: drawn on transparent backgrounds, shown without a light box."""
from __future__ import annotations

import pytest

from browser_helpers import COLLECT_JS, corner_alphas, image_bytes, parse_rgb, slug

# For each figure in the chapter: its rendered box's colour just inside the corners
# (past the rounded border) and the colour of what lies behind it on the page.
FIGURE_BOXES = """() => {
  const opaque = (c) => c && c !== "transparent" && !/rgba\\(.*,\\s*0\\)$/.test(c);
  const behind = (el) => {
    for (let e = el.parentElement; e; e = e.parentElement) {
      const c = getComputedStyle(e).backgroundColor;
      if (opaque(c)) return c;
    }
    return getComputedStyle(document.documentElement).backgroundColor;
  };
  return [...document.querySelectorAll("article .cell_output img")]
    .filter((img) => img.naturalWidth > 0 && !img.closest(".animation"))
    .map((img) => ({ src: img.getAttribute("src"), background: behind(img) }));
}"""
INSET = 6  # pixels from each corner of the figure's box


def first_chapter(paths: list[str]) -> str:
    chapters = [p for p in paths if p.startswith("chapters/")]
    if not chapters:
        pytest.skip("no chapter in the book yet")
    return chapters[0]


def test_dark_mode_figures_show_the_page_background(visitor, all_page_paths):
    chapter = first_chapter(all_page_paths)
    page, report = visitor.new_page(dark=True)
    try:
        page.goto(visitor.base_url + chapter, wait_until="load")
        data = page.evaluate(COLLECT_JS)
        assert data["theme"] == "dark", f"{chapter}: dark mode not applied (data-theme={data['theme']!r})"
        page.screenshot(path=str(visitor.screenshots / f"dark-{slug(chapter)}.png"), full_page=True)
        boxes = page.evaluate(FIGURE_BOXES)
        assert boxes, f"{chapter}: no figure to check"
        problems = []
        for box in boxes[:6]:
            img = page.locator(f'article .cell_output img[src="{box["src"]}"]').first
            problems += _box_problems(img, box)
    finally:
        page.context.close()
    assert not problems, f"{chapter} in dark mode:\n" + "\n".join(problems)


def _box_problems(locator, box: dict) -> list[str]:
    """Corners of the figure's rendered box that differ from the page colour behind it."""
    import io

    from PIL import Image

    locator.scroll_into_view_if_needed()
    with Image.open(io.BytesIO(locator.screenshot())) as shot:
        rgb = shot.convert("RGB")
        w, h = rgb.size
        corners = [rgb.getpixel((x, y)) for x, y in
                   ((INSET, INSET), (w - 1 - INSET, INSET), (INSET, h - 1 - INSET),
                    (w - 1 - INSET, h - 1 - INSET))]
    bg = parse_rgb(box["background"])
    far = [c for c in corners if max(abs(a - b) for a, b in zip(c, bg)) > 24]
    return [f"{box['src']}: corner colours {far} differ from the page background {bg}"] if far else []


def test_chapter_figures_are_transparent(visitor, page_path):
    """Every figure of a chapter is a PNG whose corners are fully transparent."""
    if not page_path.startswith("chapters/"):
        return
    problems = []
    for img in visitor.report(page_path).data["images"]:
        if not img["inCellOutput"] or not img["loaded"]:
            continue
        alphas = corner_alphas(image_bytes(img["src"]))
        if any(alphas):
            problems.append(f"{img['attr'][:80]}: corner alpha {alphas} (expected 0: "
                            f"draw it after transformer_lib.viz.use_book_style())")
    assert not problems, f"{page_path}: opaque figure backgrounds:\n" + "\n".join(problems)
