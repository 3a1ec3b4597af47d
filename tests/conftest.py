"""Shared set-up for the course's tests.

The environment variables are set before any kernel starts, so notebooks run by nbval
inherit them: no model hub access. (MPLBACKEND is left alone: a kernel that
inherits Agg would show no inline figures.)
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


# --------------------------------------------------------------------------- two workers
# `make test` runs the suite on two pytest-xdist workers with `--dist loadgroup`. Each file is
# one group (its module fixtures, such as a grading run, are then made once), except that the
# book's build and the browser suite that reads it are one group: one build per run. The groups
# are sent heaviest first, so that no long file starts last; the rest keep their order.
BOOK_GROUP = ("tests/book/browser/", "tests/book/test_book.py")
HEAVY_FIRST = ["book", "tests/grading/test_grading_cli.py", "tests/grading/test_grading_sandbox.py",
               "tests/grading/test_grading_notebooks.py", "tests/grading/test_grading_student.py"]


def _group(item) -> str:
    path = item.nodeid.split("::")[0]
    return "book" if path.startswith(BOOK_GROUP) else path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    if not getattr(config.option, "loadgroup", False):  # what xdist sets in each worker for --dist loadgroup
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(_group(item), len(rank)))  # stable: each file keeps its order
