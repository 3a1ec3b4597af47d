"""The browser suite can run here: Chromium, Playwright and a built book are present.

Where they are not, this is the one test left of the suite, and it is skipped with a
line that says how to enable the others (see `pytest_collection_modifyitems`).
"""
from __future__ import annotations


def test_browser_suite_is_enabled(book_html, browser):
    assert (book_html / "index.html").exists()
    assert browser.is_connected()
