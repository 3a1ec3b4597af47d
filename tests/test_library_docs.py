"""The library reads like the book: every public symbol says what it computes, with shapes,
and which chapter explains it; no module outgrows one sitting."""
from __future__ import annotations

import importlib
import inspect
import re

import pytest

from repo_paths import REPO

MODULES = ["embedding", "attention", "multihead", "block", "positional", "moe",
           "model", "counting", "config", "viz", "data", "train"]
MAX_LINES = 300


def _public(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, o in vars(module).items() if not n.startswith("_")
                 and (inspect.isfunction(o) or inspect.isclass(o)) and o.__module__ == module.__name__]
    return [(n, getattr(module, n)) for n in names
            if inspect.isfunction(getattr(module, n)) or inspect.isclass(getattr(module, n))]


@pytest.mark.parametrize("name", MODULES)
def test_public_symbols_name_their_chapter(name):
    module = importlib.import_module(f"transformer_lib.{name}")
    assert module.__doc__, f"transformer_lib.{name} has no module docstring"
    symbols = _public(module)
    assert symbols, f"transformer_lib.{name} exports nothing"
    missing = [n for n, obj in symbols if not re.search(r"Chapters? \d", inspect.getdoc(obj) or "")]
    assert not missing, f"transformer_lib.{name}: docstrings without 'Chapter N': {missing}"


@pytest.mark.parametrize("name", MODULES)
def test_public_methods_are_documented(name):
    module = importlib.import_module(f"transformer_lib.{name}")
    undocumented = []
    for cls_name, cls in _public(module):
        if not inspect.isclass(cls):
            continue
        for attr, value in vars(cls).items():
            func = getattr(value, "__func__", value)
            if attr.startswith("_") or not inspect.isfunction(func):
                continue
            if not inspect.getdoc(func):
                undocumented.append(f"{cls_name}.{attr}")
    assert not undocumented, f"transformer_lib.{name}: undocumented methods {undocumented}"


def test_modules_stay_small():
    sizes = {p.relative_to(REPO).as_posix(): len(p.read_text().splitlines())
             for p in (REPO / "transformer_lib").rglob("*.py")}
    too_long = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by idea): {too_long}"
