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
# `make test` runs the suite on two pytest-xdist workers. The unit of work a worker takes is a
# whole file, so that a file's module fixtures (a grading run, say) are made once, with two
# exceptions. The book's build and the browser suite that reads it are one unit, so that the book
# is built once. The grader's command-line tests, the sandbox's and the judging of the short-limits
# run are one, so that the worker that started that run (it mostly waits: tests/grading/conftest.py)
# works through the sandbox's tests meanwhile, in collected order, instead of waiting (80 s of the
# run's 130 in one run). The units are handed out in the order collected, which puts the longest ones
# first, so that none starts last. (xdist's own `--dist loadgroup` marks tests by rewriting an
# attribute pytest 9 no longer reads, so it would send the tests of one file to both workers.)
UNITS = {"book": ("tests/book/browser/", "tests/book/test_book.py"),
         "grader": ("tests/grading/test_grading_cli.py", "tests/grading/test_grading_sandbox.py",
                    "tests/grading/test_grading_time_limits.py")}
LONGEST_FIRST = ["book", "grader", "tests/grading/test_grading_notebooks.py", "tests/grading/test_grading_student.py"]


def _unit(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return next((name for name, paths in UNITS.items() if path.startswith(paths)), path)


def pytest_configure(config) -> None:
    """On an xdist worker, torch and what the worker starts use one thread: two workers on two cores,
    each with torch's default of a thread per core, make OpenMP threads spin against each other (a
    file of small tensor tests took 134 s beside one busy core with two threads, 37 s with one)."""
    if hasattr(config, "workerinput"):
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # keep the collected order below, not the most tests first
    return ByUnit(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the order units are handed out in
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_unit(item.nodeid), len(rank)))  # stable: files keep their order
