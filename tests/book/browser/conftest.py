"""Fixtures for the browser tests: the built book served on localhost, and Chromium.

The book in `_build/html` is built here (reusing the execution cache, `tests/book_build.py`)
when it is missing or older than its sources. Every page is opened with the network limited to
localhost, so a page that needs anything from the internet shows up as an aborted request.

Environment: `BOOK_HTML_DIR` tests another built book instead of `_build/html`
(it is then never rebuilt); `BOOK_CHROMIUM` names another Chromium binary.
"""
from __future__ import annotations

import functools
import http.server
import os
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import book_build
from browser_helpers import PageVisitor, book_pages, root_page

REPO = Path(__file__).resolve().parents[3]
CHROMIUM = Path(os.environ.get("BOOK_CHROMIUM", "/usr/bin/chromium"))
CUSTOM_HTML = os.environ.get("BOOK_HTML_DIR")
HTML = Path(CUSTOM_HTML) if CUSTOM_HTML else REPO / "_build" / "html"
SCREENSHOTS = HTML.parent / "screenshots"
HINT = ("browser tests skipped: install Debian's chromium (apt-get install chromium) "
        "and build the book (make book)")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
DOCS = ["_config.yml", "_toc.yml", "*.md", "references.bib", "chapters/*.ipynb", "exercises/*.ipynb", "guides/*.md",
        "guides/samples/*"]
# Static files count too: a book older than its CSS is stale.
ASSETS = ["_assets/*.css", "_assets/*.js", "_assets/vendor/NOTICE.txt"]


def _pages() -> list[str]:
    return book_pages(HTML, None if CUSTOM_HTML else REPO)


def _root() -> str:
    return root_page(HTML, None if CUSTOM_HTML else REPO)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `page_path` with the home page and every chapter and exercises page."""
    if "page_path" in metafunc.fixturenames:
        pages = [_root(), *_pages()] if _pages() else [_root(), "chapters/(none).html"]
        metafunc.parametrize("page_path", pages, scope="session")


@pytest.fixture(scope="session")
def root_path() -> str:
    """The book's home page (`intro.html`; `index.html` only redirects to it)."""
    return _root()


@pytest.fixture(scope="session")
def all_page_paths() -> list[str]:
    """Guide, chapter and exercises pages, in table-of-contents order."""
    return _pages()


def _disabled_reason() -> str | None:
    """Why the browser tests cannot run on this machine, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return HINT
    if not CHROMIUM.exists():
        return HINT
    if not (HTML / "index.html").exists() and (CUSTOM_HTML or not book_build.can_build()):
        return HINT
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without Chromium or a book, keep one test that skips with the hint (one line).

    With BOOK_BROWSER_REQUIRED=1 (set by .ci/run) a missing browser is an error instead:
    CI must never pass with the browser suite silently skipped.
    """
    reason = _disabled_reason()
    if reason is None:
        return
    if os.environ.get("BOOK_BROWSER_REQUIRED") == "1":
        raise pytest.UsageError(
            f"BOOK_BROWSER_REQUIRED=1, but the browser suite cannot run here ({reason})")
    here = Path(__file__).parent
    dropped = [i for i in items if here in Path(str(i.path)).parents
               and i.name != "test_browser_suite_is_enabled"]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]


def _newest(patterns: list[str]) -> float:
    return max((p.stat().st_mtime for pattern in patterns for p in REPO.glob(pattern)), default=0.0)


def _built_at() -> float:
    marker = HTML / "searchindex.js"  # rewritten by every Sphinx build
    return marker.stat().st_mtime if (HTML / "index.html").exists() and marker.exists() else -1.0


def _is_fresh() -> bool:
    return _built_at() >= _newest(DOCS + ASSETS)


def _build_book() -> None:
    """Build `_build/html` like `make book` (once per test session, shared with tests/book/test_book.py)."""
    if not book_build.can_build():
        return
    for attempt in (1, 2):  # once, a CI build left no index.html; the log says why next time
        if attempt == 2:
            book_build.build.cache_clear()
        done = book_build.build()
        if (HTML / "index.html").exists():
            return
        warnings.warn(f"book build {attempt} left no {HTML / 'index.html'} (exit {done.returncode}):\n"
                      + (done.stdout + done.stderr)[-3000:])


@pytest.fixture(scope="session")
def book_html() -> Path:
    """The folder of the built book; skips every browser test if it cannot be had."""
    if _disabled_reason():
        pytest.skip(HINT)
    if not CUSTOM_HTML and not _is_fresh():
        _build_book()  # warnings and failures are reported by tests/book/test_book.py
    if not (HTML / "index.html").exists():
        if os.environ.get("BOOK_BROWSER_REQUIRED") == "1":  # CI must not pass with the suite skipped
            pytest.fail(f"BOOK_BROWSER_REQUIRED=1, but there is no built book at {HTML}", pytrace=False)
        pytest.skip(HINT)
    return HTML


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="session")
def server(book_html: Path) -> Iterator[str]:
    """Base URL (`http://127.0.0.1:PORT/`) of a threaded server for the built book."""
    handler = functools.partial(_QuietHandler, directory=str(book_html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def browser(book_html: Path):
    """Headless Debian Chromium driven by Playwright (never a downloaded browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def visitor(browser, server: str, book_html: Path) -> PageVisitor:
    """Opens each page once (offline, light mode), caches what the tests inspect."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return PageVisitor(browser, server, book_html, SCREENSHOTS)
