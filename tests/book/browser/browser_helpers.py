"""Helpers for the browser tests: page discovery, offline page visits, link and image checks."""
from __future__ import annotations

import base64
import io
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

COLLECT_JS = (Path(__file__).with_name("collect_page.js")).read_text()
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
# A known defect of Jupyter Book 1.x / sphinx-thebe, not of the course: the thebe
# configuration script is emitted twice, so the second `const` declaration throws.
KNOWN_PAGE_ERRORS = ("THEBE_JS_URL",)


def toc_files(repo: Path) -> list[str]:
    """Every `file:` entry of the book's _toc.yml, in order (without suffix)."""
    toc = repo / "_toc.yml"
    if not toc.exists():
        return []
    return re.findall(r"^\s*-?\s*file:\s*([^\s#]+)", toc.read_text(), flags=re.M)


PAGE_FOLDERS = ("guides", "chapters", "exercises")


def book_pages(html: Path, repo: Path | None) -> list[str]:
    """Guide, chapter and exercises pages (`chapters/x.html`): from _toc.yml, else from the build."""
    if repo is not None:
        files = [f for f in toc_files(repo) if f.startswith(tuple(f"{d}/" for d in PAGE_FOLDERS))]
        if files:
            return [f"{Path(f).with_suffix('')}.html" for f in files]
    found = [p.relative_to(html).as_posix()
             for d in PAGE_FOLDERS for p in html.glob(f"{d}/*.html")]
    return sorted(found)


def root_page(html: Path, repo: Path | None) -> str:
    """The home page: the _toc.yml root, else intro.html if built, else index.html."""
    if repo is not None and (repo / "_toc.yml").exists():
        m = re.search(r"^root:\s*([^\s#]+)", (repo / "_toc.yml").read_text(), flags=re.M)
        if m:
            return f"{Path(m.group(1)).with_suffix('')}.html"
    return "intro.html" if (html / "intro.html").exists() else "index.html"


def slug(path: str) -> str:
    """File-name form of a page path: `chapters/01_x.html` -> `chapters-01_x`."""
    return path.removesuffix(".html").replace("/", "-")


def is_local(url: str) -> bool:
    """True for URLs the offline browser may load: localhost and inline data."""
    parts = urlsplit(url)
    return parts.scheme in {"data", "blob", "about"} or parts.hostname in LOCAL_HOSTS


@dataclass
class PageReport:
    """What one page visit saw; `data` is the dict returned by collect_page.js."""

    path: str
    data: dict
    aborted: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    screenshot: Path | None = None


class PageVisitor:
    """Opens book pages in Chromium with the network limited to localhost."""

    def __init__(self, browser, base_url: str, html: Path, screenshots: Path) -> None:
        self.browser, self.base_url, self.html, self.screenshots = browser, base_url, html, screenshots
        self._reports: dict[str, PageReport] = {}

    def new_page(self, dark: bool = False):
        """A page in a fresh offline context; returns (page, report) to fill while it loads."""
        context = self.browser.new_context(viewport={"width": 1280, "height": 900})
        mode = "dark" if dark else "light"
        context.add_init_script(
            f"localStorage.setItem('mode', '{mode}'); localStorage.setItem('theme', '{mode}');")
        report = PageReport(path="", data={})

        def route(r) -> None:
            if is_local(r.request.url):
                r.continue_()
            else:
                report.aborted.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        page = context.new_page()
        page.on("pageerror", lambda e: report.page_errors.append(str(e)))
        page.on("response", lambda r: r.status >= 400 and report.failed.append(f"{r.status} {r.url}"))
        return page, report

    def visit(self, path: str, dark: bool = False, screenshot: str | None = None) -> PageReport:
        """Load `path`, wait for rendering, collect its data, optionally take a screenshot."""
        page, report = self.new_page(dark)
        try:
            page.goto(self.base_url + path, wait_until="load")
            report.path, report.data = path, page.evaluate(COLLECT_JS)
            if screenshot:  # the first screen; the whole page (2 to 3 s a chapter) with BOOK_FULL_SCREENSHOTS=1
                report.screenshot = self.screenshots / screenshot
                page.screenshot(path=str(report.screenshot), full_page=os.environ.get("BOOK_FULL_SCREENSHOTS") == "1")
        finally:
            page.context.close()
        return report

    def report(self, path: str) -> PageReport:
        """The cached light-mode visit of `path` (one load per page per session)."""
        if path not in self._reports:
            if not (self.html / path).exists():
                raise AssertionError(f"{path}: page not in the built book {self.html}")
            self._reports[path] = self.visit(path, screenshot=f"{slug(path)}.png")
        return self._reports[path]

    def visited(self) -> list[PageReport]:
        return list(self._reports.values())


def unexpected_errors(errors: list[str]) -> list[str]:
    return [e for e in errors if not any(k in e for k in KNOWN_PAGE_ERRORS)]


# `$$`, any TeX command (`\frac`, `\alpha_{ij}`, the book's macros `\R`, `\T`), `\[ \( \) \]`,
# or a `$…$` span: in visible prose (code and outputs excluded) none survives typesetting.
RAW_TEX = re.compile(r"\$\$|\\[A-Za-z]+|\\[\[\]()]|\$[^$\s][^$]{0,80}\$")


def raw_tex(text: str) -> list[str]:
    """Snippets of text that look like TeX MathJax did not typeset."""
    return [text[max(m.start() - 30, 0):m.end() + 30] for m in RAW_TEX.finditer(text)]


def is_trivial_alt(alt: str) -> bool:
    """True for missing alt text or alt text that is a file name or path."""
    alt = alt.strip()
    return (len(alt) < 4 or "/" in alt or "\\" in alt
            or bool(re.search(r"\.(png|jpe?g|svg|gif|webp)$", alt, re.I))
            or bool(re.fullmatch(r"[0-9a-f]{16,}", alt)))


def fetch(url: str) -> tuple[int, bytes]:
    """HTTP GET against the local server: (status, body)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def html_ids(body: bytes) -> set[str]:
    text = body.decode("utf-8", "replace")
    return set(re.findall(r"""\s(?:id|name)=["']([^"']+)["']""", text))


def broken_links(links: dict[str, set[str]]) -> list[str]:
    """For {link URL: pages linking to it}, the local links that 404 or miss their anchor."""
    problems, cache = [], {}
    for link, sources in sorted(links.items()):
        if not is_local(link) or not link.startswith("http"):
            continue
        target, anchor = urldefrag(link)
        if target not in cache:
            cache[target] = fetch(target)
        status, body = cache[target]
        where = ", ".join(sorted(sources))
        if status >= 400:
            problems.append(f"{link} -> HTTP {status} (linked from {where})")
        elif anchor and urlsplit(target).path.endswith(".html") and anchor not in html_ids(body):
            problems.append(f"{link}: no element with id '{anchor}' (linked from {where})")
    return problems


def image_bytes(src: str) -> bytes:
    """The bytes of an image URL on the local server or of a data: URL."""
    if src.startswith("data:"):
        return base64.b64decode(src.split(",", 1)[1])
    status, body = fetch(src)
    if status != 200:
        raise AssertionError(f"{src}: HTTP {status}")
    return body


def corner_alphas(png: bytes) -> list[int]:
    """Alpha of the four corner pixels (255 everywhere for an image without alpha)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        rgba = im.convert("RGBA")
        w, h = rgba.size
        return [rgba.getpixel((x, y))[3] for x, y in ((0, 0), (w - 1, 0), (0, h - 1), (w - 1, h - 1))]


def parse_rgb(css: str) -> tuple[int, int, int]:
    """`rgb(20, 24, 30)` -> (20, 24, 30)."""
    nums = [int(float(v)) for v in re.findall(r"[\d.]+", css)[:3]]
    return nums[0], nums[1], nums[2]


def ink_on_background(png: bytes, background: tuple[int, int, int]) -> tuple[int, float]:
    """(number of ink pixels, share of them with contrast >= 3 against `background`).

    Ink is what a figure draws straight onto its transparent background: opaque grey
    pixels (text, axes, ticks) within 3 px of a transparent one. Annotations on opaque
    heatmap cells are excluded: the cell, not the page, lies behind them.
    """
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        rgba = np.asarray(im.convert("RGBA"), dtype=float)
    rgb, alpha = rgba[..., :3], rgba[..., 3] / 255
    clear, r = alpha < 0.1, 3
    near_clear = np.zeros_like(clear)
    padded = np.pad(clear, r)
    h, w = clear.shape
    for dy in range(2 * r + 1):
        for dx in range(2 * r + 1):
            near_clear |= padded[dy:dy + h, dx:dx + w]
    ink = (rgb.max(-1) - rgb.min(-1) < 12) & (alpha > 0.9) & near_clear
    if not ink.any():
        return 0, 1.0
    return int(ink.sum()), float((contrast(rgb[ink], background) >= 3).mean())


def contrast(rgb_a, rgb_b):
    """WCAG contrast ratio (1 to 21) of colours with channels in [0, 255]."""
    import numpy as np

    from transformer_lib.viz import contrast_ratio

    return contrast_ratio(np.asarray(rgb_a, dtype=float) / 255, np.asarray(rgb_b, dtype=float) / 255)
