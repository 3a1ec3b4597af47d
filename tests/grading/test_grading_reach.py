"""The attribute names the grader refuses are computed: checked here by a walk of this test's own.

From every module a graded notebook may import, this test follows attribute chains of up to three
names with plain ``getattr`` (as a student's code would, not reading dictionaries as the grader's
walk does), skipping only the names the grader's reading already refuses as attributes (a chain
through one is refused). Every object reached is judged by this test's own list of what is
forbidden: a module outside the allowed set, the interpreter's code-running built-ins, and the
functions and classes defined by the interpreter's modules. Any chain that reaches one must be
refused by the grader's reading of the line that writes it. The other side: names that harmless
values share with forbidden ones stay usable, and no instructor solution, chapter or known-honest
submission is refused (tests/grading/test_grading_rules.py reads the exercise notebooks).
"""
from __future__ import annotations

import builtins
import ctypes
import functools
import gc
import importlib
import inspect
import io
import marshal
import operator
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import types
import warnings

import pytest

from repo_paths import REPO
from transformer_lib.grading.prepare import rules
from transformer_lib.grading.prepare.notebook import read
from transformer_lib.grading.prepare.reach import WALKED_THOUGH_REFUSED, reach

DEPTH = 3
INTERPRETER_MODULES = (sys, os, subprocess, importlib, ctypes, inspect, threading, gc, io, shutil, signal, pickle,
                       marshal)
CODE_RUNNERS = (exec, eval, compile, __import__, getattr, setattr, delattr, globals, locals, vars, open, breakpoint,
                input, operator.attrgetter, operator.methodcaller, functools.update_wrapper)


def _forbidden_objects() -> dict[int, str]:
    """This test's own list: id -> what it is."""
    found = {id(f): f"builtin {getattr(f, '__name__', f)}" for f in CODE_RUNNERS}
    for module in INTERPRETER_MODULES:
        names = {module.__name__, getattr(module, "__name__", "")} | ({"posix", "nt"} if module is os else set())
        names |= {"_io"} if module is io else ({"_pickle"} if module is pickle else set())
        names |= {"_ctypes"} if module is ctypes else ({"_thread"} if module is threading else set())
        names |= {"_signal"} if module is signal else set()
        for name, value in vars(module).items():
            if name.startswith("_") or not callable(value):
                continue
            if isinstance(value, type) and (issubclass(value, BaseException) or module is inspect):
                continue  # exceptions, and inspect's plain data classes
            if getattr(value, "__module__", None) in names:
                found[id(value)] = f"{module.__name__}.{name}"
    for name in ("FunctionType", "CodeType", "ModuleType", "MethodType", "FrameType", "TracebackType", "CellType"):
        found[id(getattr(types, name))] = f"types.{name}"
    found[id(os.environ)] = "os.environ"
    import torch

    for name in ("DisableTorchFunction", "DisableTorchFunctionSubclass"):
        found[id(getattr(torch._C, name))] = f"torch._C.{name}"
    found[id(torch.ops)], found[id(torch.classes)] = "torch.ops", "torch.classes"
    return found


def _allowed_module(module: types.ModuleType) -> bool:
    """A module of the allowed packages, not refused (or refused for import only, and walked into as the
    grader does: torch.utils.data shares its name with Tensor.data), the one imported under its name."""
    name = getattr(module, "__name__", "")
    refused = [m for m in rules.REFUSED_MODULES if m not in WALKED_THOUGH_REFUSED]
    return (isinstance(name, str) and name.split(".")[0] in rules.ALLOWED_IMPORTS
            and not any(name == m or name.startswith(m + ".") for m in refused) and sys.modules.get(name) is module)


@functools.lru_cache(maxsize=None)
def _refuses_attribute(name: str) -> bool:
    return bool(rules.read_cell(f"y = x.{name}"))


def _walk() -> list[tuple[str, str]]:
    """``(chain, what it reaches)`` for every forbidden object reached by a chain the grader does not refuse."""
    forbidden = _forbidden_objects()
    roots = sorted(reach().importable)
    seen: set[int] = set()
    frontier = [(importlib.import_module(name), name) for name in roots]
    escapes = []
    for _ in range(DEPTH):
        following = []
        for obj, chain in frontier:
            try:
                names = [n for n in dir(obj) if isinstance(n, str) and not n.startswith("_")]
            except Exception:  # noqa: BLE001 - an object whose dir() fails has nothing to follow
                continue
            for name in names:
                if _refuses_attribute(name):
                    continue
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        value = getattr(obj, name)
                except Exception:  # noqa: BLE001 - a property or lazy attribute that fails here
                    continue
                here = f"{chain}.{name}"  # every chain to a forbidden object counts, not only the first
                if isinstance(value, types.ModuleType) and not _allowed_module(value):
                    escapes.append((here, f"the module {getattr(value, '__name__', '?')}"))
                elif id(value) in forbidden:
                    escapes.append((here, forbidden[id(value)]))
                elif id(value) not in seen:
                    seen.add(id(value))
                    following.append((value, here))
        frontier = following
    return escapes


@pytest.fixture(scope="module")
def escapes():
    return _walk()


def test_the_walk_finds_the_known_escapes_and_the_grader_refuses_them():
    for line in ("torch.sys", "numpy.os", "torch.DisableTorchFunction", "torch.ctypes", "matplotlib.pyplot.inspect",
                 "matplotlib.backends.backend_agg.features"):  # loaded once a figure is drawn: Pillow's PIL.features
        assert rules.read_cell(f"import {line.split('.')[0]}\ny = {line}"), line
    assert "sys" in reach().refused and "DisableTorchFunction" in reach().refused


def test_no_chain_of_three_attributes_reaches_the_interpreter_unrefused(escapes):
    """Each chain found reaching a forbidden object, read as a line of code, is refused."""
    unrefused = []
    for chain, what in escapes:
        root = next(m for m in sorted(reach().importable, key=len, reverse=True) if chain.startswith(m + "."))
        if not rules.read_cell(f"import {root}\ny = {chain}"):
            unrefused.append(f"{chain} -> {what}")
    assert not unrefused, unrefused[:40]


def test_private_and_double_underscore_attributes_are_refused_whatever_they_hold():
    """The walks skip them: the grader refuses them all (but on self, and __init__/__name__)."""
    assert rules.read_cell("y = x._anything") and rules.read_cell("y = x.__dict__")
    assert rules.read_cell("y = x.__class__.__mro__") and rules.read_cell("y = type(x).__subclasses__()")


@pytest.mark.parametrize("code", [
    "y = ', '.join(['a', 'b'])",  # os.path.join exists: join is not refused for it
    "import torch\nd = torch.dist(a, b)",  # a module binds `dist` to torch.distributed: closed instead
    "import math\nd = math.dist([0, 0], [3, 4])",
    "import torch\np = torch.nn.Parameter(torch.zeros(2))",  # inspect.Parameter is harmless
    "import matplotlib.path\np = matplotlib.path.Path([(0, 0), (1, 1)])",  # pathlib.Path is not forbidden
    "import torch\ny = x.data.clone()",  # torch.utils.data is refused, Tensor.data is not
    "import torch\nw = torch.signal.windows.hann(4)",
    "import torch\nd = x.type(torch.float64).dim()",
])
def test_a_name_a_harmless_value_shares_stays_usable(code):
    assert rules.read_cell(code) == []


def _chapter_cells() -> list[tuple[str, int, str]]:
    cells = []
    for path in sorted((REPO / "chapters").glob("*.ipynb")):
        for i, cell in enumerate(read(path).cells):
            if cell.cell_type == "code":
                cells.append((path.stem, i, cell.source))
    return cells


def test_no_chapter_code_is_refused_by_the_computed_names_the_magics_or_the_assignment_rule():
    """Chapter code imports the course library and more (refused in a graded notebook, on purpose);
    nothing in it may fall under the rules computed here."""
    new_rules = ("reaches", rules.CHANGES_LIBRARY, rules.UNREADABLE, "%", "shell commands")
    hits = [(stem, i, code, why) for stem, i, source in _chapter_cells() for _, code, why in rules.read_cell(source)
            if any(why.startswith(r) or r in why[:12] for r in new_rules)]
    assert not hits, hits[:10]
