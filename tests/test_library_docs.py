"""The library reads like the book: every public symbol says what it computes, with shapes,
and which chapter explains it; no module outgrows one sitting.

Rules, checked on each object's *own* docstring (``obj.__doc__``, never one inherited from
``nn.Module``):

- every public function and class, and every public method a public class defines, ends
  with a chapter sentence: ``Chapter 2.``, ``Chapters 7 and 9.``, ``Chapters 2, 5 and 7.``
  or ``Chapters 3–4.``;
- every public function and every method of a public class (``forward`` included) whose
  signature mentions ``Tensor`` states a shape: a parenthesised shape such as ``(b, n, d)``,
  ``(…)`` or ``(n,)``, or an arrow ``->``;
- a class that subclasses ``nn.Module`` documents its own ``forward``.

Methods that override an ``nn.Module`` hook other than ``forward`` (``extra_repr``) keep
torch's contract and are exempt.
"""
from __future__ import annotations

import importlib
import inspect
import re

import pytest
from torch import nn

from repo_paths import REPO

MODULES = ["embedding", "attention", "multihead", "block", "stream", "positional", "moe", "bert",
           "patching", "attribution",
           "model", "loading", "counting", "config", "viz", "data", "train", "tiled", "memory",
           "efficient", "vision", "corpus", "bpe", "tokenizer", "wordpiece", "scaling"]
MAX_LINES = 300

CHAPTER_END = re.compile(r"Chapters? \d+(?:(?:, \d+)* and \d+|–\d+)?\.\s*$")
SHAPE = re.compile(r"->|\((?:…|\.\.\.|[^()]*,[^()]*)\)")


def _public(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, o in vars(module).items() if not n.startswith("_")
                 and (inspect.isfunction(o) or inspect.isclass(o)) and o.__module__ == module.__name__]
    return [(n, getattr(module, n)) for n in names
            if inspect.isfunction(getattr(module, n)) or inspect.isclass(getattr(module, n))]


def _own_methods(cls):
    """(name, function) for the public methods and properties `cls` itself defines."""
    for attr, value in vars(cls).items():
        func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        if not inspect.isfunction(func):
            continue
        if attr == "forward" or not (attr.startswith("_") or hasattr(nn.Module, attr)):
            yield attr, func


def _mentions_tensor(func) -> bool:
    try:
        annotations = inspect.get_annotations(func)
    except TypeError:
        return False
    return any("Tensor" in str(a) for a in annotations.values())


def _documented(module):
    """(qualified name, own docstring, needs a shape) for every symbol the rules cover."""
    for name, obj in _public(module):
        yield name, obj.__doc__, inspect.isfunction(obj) and _mentions_tensor(obj)
        if inspect.isclass(obj):
            for attr, func in _own_methods(obj):
                yield f"{name}.{attr}", func.__doc__, _mentions_tensor(func)


@pytest.mark.parametrize("name", MODULES)
def test_docstrings_end_with_their_chapter(name):
    module = importlib.import_module(f"transformer_lib.{name}")
    assert module.__doc__, f"transformer_lib.{name} has no module docstring"
    assert _public(module), f"transformer_lib.{name} exports nothing"
    bad = [q for q, doc, _ in _documented(module) if not CHAPTER_END.search(doc or "")]
    assert not bad, f"transformer_lib.{name}: docstrings that do not end with 'Chapter N.': {bad}"


@pytest.mark.parametrize("name", MODULES)
def test_tensor_functions_state_shapes(name):
    module = importlib.import_module(f"transformer_lib.{name}")
    bad = [q for q, doc, needs in _documented(module) if needs and not SHAPE.search(doc or "")]
    assert not bad, f"transformer_lib.{name}: tensor functions without a shape in the docstring: {bad}"


@pytest.mark.parametrize("name", MODULES)
def test_modules_document_their_own_forward(name):
    module = importlib.import_module(f"transformer_lib.{name}")
    bad = [n for n, obj in _public(module) if inspect.isclass(obj) and issubclass(obj, nn.Module)
           and not ("forward" in vars(obj) and obj.forward.__doc__)]
    assert not bad, f"transformer_lib.{name}: nn.Modules without their own forward docstring: {bad}"


def test_rules_reject_what_they_should():
    assert CHAPTER_END.search("Text. Chapter 2.") and CHAPTER_END.search("Chapters 7 and 9.")
    assert CHAPTER_END.search("Chapters 3–4.") and CHAPTER_END.search("Chapters 2, 5 and 7.")
    assert not CHAPTER_END.search("Chapter 2 (used throughout Chapter 7).")
    assert not CHAPTER_END.search("See Chapter 2. More text after it.")
    assert SHAPE.search("``(b, n, d)``") and SHAPE.search("(n,)") and SHAPE.search("x -> y")
    assert not SHAPE.search("Apply the layer (see the book).")
    from transformer_lib.block import LayerNorm  # getdoc falls back to nn.Module's docstring:

    assert LayerNorm.extra_repr.__doc__ is None and inspect.getdoc(LayerNorm.extra_repr)


CHECKS_MAX_LINES = 450  # a chapter's checks: each check's kernel half and judge side by side, one module a chapter


def test_modules_stay_small():
    sizes = {p.relative_to(REPO).as_posix(): len(p.read_text().splitlines())
             for p in (REPO / "transformer_lib").rglob("*.py")}
    too_long = {p: n for p, n in sizes.items()
                if n > (CHECKS_MAX_LINES if p.startswith("transformer_lib/grading/checks/ch") else MAX_LINES)}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by idea): {too_long}"
