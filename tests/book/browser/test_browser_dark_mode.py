"""Figures read in dark mode: drawn on transparent backgrounds with ink that contrasts with
both page colours, and shown on the page background (no light box, no dimming).

Every chapter and guide is opened in dark mode; its first screen is saved to `_build/screenshots/dark-*.png`.
"""
from __future__ import annotations

import io

from browser_helpers import COLLECT_JS, contrast, corner_alphas, image_bytes, \
    ink_on_background, parse_rgb, slug

# Every figure-like output of the article: images (static figures, widget snapshots,
# the current frame of an animation) and the boxes of widgets and animations. For each,
# the opaque backgrounds between it and the page, and its CSS filter.
FIGURE_BOXES = """() => {
  const opaque = (c) => c && c !== "transparent" && !/rgba\\(.*,\\s*0\\)$/.test(c);
  const body = getComputedStyle(document.body).backgroundColor;
  const article = document.querySelector("article") || document.body;
  const boxes = [...article.querySelectorAll(
      ".cell_output img, .cell_output .widget-subarea, .cell_output .text_html:has(.animation)")]
    .filter((el) => el.tagName !== "IMG" || (el.complete && el.naturalWidth > 0));
  return {
    body,
    boxes: boxes.map((el, i) => {
      el.dataset.darkCheck = String(i);
      const fills = [];
      for (let e = el; e && e !== document.body; e = e.parentElement) {
        const c = getComputedStyle(e).backgroundColor;
        if (opaque(c) && c !== body) fills.push(`${e.tagName.toLowerCase()}.${e.className}: ${c}`);
      }
      return { id: String(i), kind: el.tagName === "IMG" ? "image" : el.className.split(" ")[0],
               src: el.getAttribute("src") || "", filter: getComputedStyle(el).filter, fills };
    }),
  };
}"""
INSET = 6  # pixels from each corner of an image's box
# The page colours of the light and the dark theme (sphinx-book-theme's backgrounds).
LIGHT, DARK = (255, 255, 255), (18, 18, 18)


def test_dark_mode_shows_figures_on_the_page_background(visitor, page_path):
    if not page_path.startswith(("chapters/", "guides/")):
        return
    page, report = visitor.new_page(dark=True)
    problems = []
    try:
        page.goto(visitor.base_url + page_path, wait_until="load")
        data = page.evaluate(COLLECT_JS)
        assert data["theme"] == "dark", f"{page_path}: dark mode not applied (data-theme={data['theme']!r})"
        page.screenshot(path=str(visitor.screenshots / f"dark-{slug(page_path)}.png"))  # the first screen
        found = page.evaluate(FIGURE_BOXES)
        body = parse_rgb(found["body"])
        assert body == DARK and contrast(body, (0, 0, 0)) < 2, \
            f"{page_path}: dark page background is {body}, expected {DARK}"
        kinds = {b["kind"] for b in found["boxes"]}
        assert "image" in kinds or page_path.startswith("guides/"), f"{page_path}: no figure to check"
        for box in found["boxes"]:
            name = f"{box['kind']} {box['src'][:60]}"
            if box["fills"]:
                problems.append(f"{name}: painted behind it: {box['fills']}")
            if box["kind"] == "image":
                if box["filter"] != "none":
                    problems.append(f"{name}: CSS filter {box['filter']} (dims the figure)")
                problems += _corner_problems(page.locator(f'[data-dark-check="{box["id"]}"]'),
                                             name, body)
    finally:
        page.context.close()
    assert not problems, f"{page_path} in dark mode:\n" + "\n".join(problems)


def _corner_problems(locator, name: str, body: tuple[int, int, int]) -> list[str]:
    """Corners of the image as rendered that differ from the page colour."""
    from PIL import Image

    locator.scroll_into_view_if_needed()
    with Image.open(io.BytesIO(locator.screenshot())) as shot:
        rgb = shot.convert("RGB")
        w, h = rgb.size
        corners = [rgb.getpixel((x, y)) for x, y in
                   ((INSET, INSET), (w - 1 - INSET, INSET), (INSET, h - 1 - INSET),
                    (w - 1 - INSET, h - 1 - INSET))]
    far = [c for c in corners if max(abs(a - b) for a, b in zip(c, body)) > 24]
    return [f"{name}: corner colours {far} differ from the page background {body}"] if far else []


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


def test_figure_ink_reads_on_light_and_dark_pages(visitor, page_path):
    """Text, axes and ticks drawn on the transparent background contrast (>= 3:1, the
    WCAG level for graphics) with the light and the dark page: black ink would vanish
    in dark mode, white ink in light mode."""
    if not page_path.startswith("chapters/"):
        return
    data = visitor.report(page_path).data
    assert parse_rgb(data["background"]) == LIGHT, f"light page background is {data['background']}"
    problems = []
    for img in data["images"]:
        if not img["inCellOutput"] or not img["loaded"]:
            continue
        png = image_bytes(img["src"])
        for mode, bg in (("light", LIGHT), ("dark", DARK)):
            n, share = ink_on_background(png, bg)
            if share < 0.95:
                problems.append(f"{img['attr'][:60]}: only {share:.0%} of {n} ink pixels "
                                f"contrast >= 3:1 with the {mode} page {bg}")
    assert not problems, f"{page_path}: figures hard to read:\n" + "\n".join(problems)
