"""Shared set-up for the course's tests.

The environment variables are set before any kernel starts, so notebooks run by nbval
inherit them: no model hub access. (MPLBACKEND is left alone: a kernel that
inherits Agg would show no inline figures.)
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

TESTS = Path(__file__).resolve().parent
BOOK_GROUP = {("book", "test_book.py"), ("book", "browser")}  # the browser suite reads the book test_book.py builds


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs the suite on two workers (`pytest -n 2 --dist loadgroup`). Every file is a
    group of its own, so that a module's fixtures (a graded class, a course made by nbgrader) are
    built once; the book's build and the browser suite that reads it are one group. Tests marked
    `timing` are left to a second, serial run, on an otherwise idle machine."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            relative = Path(str(item.path)).resolve().relative_to(TESTS)
            group = "book" if relative.parts[:2] in BOOK_GROUP else relative.as_posix()
            item.add_marker(pytest.mark.xdist_group(group))
