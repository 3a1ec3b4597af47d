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

import ast
import functools
import importlib
import inspect
import re

import nbformat
import pytest
from torch import nn

from repo_paths import REPO

MODULES = ["embedding", "attention", "multihead", "block", "stream", "positional", "moe", "bert",
           "patching", "attribution", "hooks",
           "model", "loading", "counting", "config", "viz", "data", "train", "tiled", "memory",
           "efficient", "vision", "corpus", "bpe", "tokenizer", "wordpiece", "scaling"]
MAX_LINES = 300

CHAPTER_END = re.compile(r"(?:Chapters? \d+(?:(?:, \d+)* and \d+|–\d+)?(?:, through\s+`[\w.]+`)?"
                         r"|Library: no chapter names it)\.\s*$")
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


def _code_lines(path) -> int:
    """Lines of a module that are not docstrings (module, class and function docstrings)."""
    source = path.read_text()
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return len(source.splitlines()) - len(doc_lines)


def test_modules_stay_small():
    """The cap counts code, not docstrings: a module is not squeezed to make room for prose."""
    sizes = {p.relative_to(REPO).as_posix(): _code_lines(p)
             for p in (REPO / "transformer_lib").rglob("*.py")}
    too_long = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines of code (split them by idea): {too_long}"


def test_code_lines_leave_out_docstrings_only(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Module\ndoc."""\nX = """not a\ndocstring"""\n\n\ndef f():\n    """One\n    two."""\n'
                      '    return 1\n\n\nclass C:\n    """C."""\n    y = 2\n')
    assert _code_lines(module) == 15 - 2 - 2 - 1


# ----------------------------------------------------------------------------- chapter tags
CHAPTER_TAG = re.compile(r"Chapters? (\d+(?:(?:, \d+)* and \d+|–\d+)?)(?:, through\s+`([\w.]+)`)?\.\s*$")
APPENDICES = {10: "appendix_beyond_words", 11: "appendix_tokens", 12: "appendix_scaling"}  # as in __init__


def _tag(doc: str) -> tuple[set[int], str | None]:
    """The chapters a docstring's closing tag names and the symbol it goes through, if any:
    "Chapters 3–4." -> ({3, 4}, None); "Chapter 11, through `Tokenizer`." -> ({11}, "Tokenizer")."""
    tag = CHAPTER_TAG.search(doc or "")
    if not tag:
        return set(), None
    text = tag.group(1)
    if "–" in text:
        first, last = map(int, text.split("–"))
        return set(range(first, last + 1)), tag.group(2)
    return {int(n) for n in re.findall(r"\d+", text)}, tag.group(2)


@functools.cache
def _chapter_source(n: int) -> str:
    """Every cell of chapter n's notebook (10, 11: the appendices), code and prose, as one text."""
    (path,) = (REPO / "chapters").glob(f"{APPENDICES[n]}.ipynb" if n in APPENDICES else f"{n:02d}_*.ipynb")
    return "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)


def _named_in(qualified: str, text: str, prop: bool = False) -> bool:
    """A function or class by its name; a method by ``Class.name`` or a call ``.name(`` (a
    property, ``prop``, by ``.name``); ``forward`` by its class's name (calling a module is
    calling its forward)."""
    cls, _, attr = qualified.rpartition(".")
    if not cls:
        return re.search(rf"\b{re.escape(attr)}\b", text) is not None
    if attr == "forward":
        return re.search(rf"\b{re.escape(cls)}\b", text) is not None
    call = r"\b" if prop else r"\("
    return re.search(rf"\.{re.escape(attr)}{call}|\b{re.escape(cls)}\.{re.escape(attr)}\b", text) is not None


@functools.cache
def _library() -> dict[str, tuple[object, object]]:
    """Every function and class of the library's modules by name -> (object, its module)."""
    found = {}
    for name in MODULES:
        module = importlib.import_module(f"transformer_lib.{name}")
        for n, o in vars(module).items():
            if (inspect.isfunction(o) or inspect.isclass(o)) and o.__module__ == module.__name__:
                found.setdefault(n, (o, module))
    return found


def _runs(through: str, qualified: str) -> bool:
    """``through``'s code names ``qualified``, directly or in a private helper of its module
    that it calls."""
    obj, module = _library()[through]
    source = inspect.getsource(obj)
    helpers = [inspect.getsource(o) for n, o in vars(module).items()
               if n.startswith("_") and inspect.isfunction(o) and re.search(rf"\b{n}\(", source)]
    return any(_named_in(qualified, text) for text in [source, *helpers])


def _false_tags() -> list[str]:
    false = []
    for name in MODULES:
        module = importlib.import_module(f"transformer_lib.{name}")
        for qualified, doc, _ in _documented(module):
            chapters, through = _tag(doc)
            owner, _, attr = qualified.rpartition(".")
            prop = bool(owner) and isinstance(vars(getattr(module, owner)).get(attr), property)
            if qualified == "main":   # a command line is named by its module or its make target
                pattern = rf"transformer_lib\.{name}\b|make {name}\b"
                named = {n for n in range(1, max(APPENDICES) + 1) if re.search(pattern, _chapter_source(n))}
            else:
                named = {n for n in range(1, max(APPENDICES) + 1) if _named_in(qualified, _chapter_source(n), prop)}
            if "Library: no chapter names it." in (doc or "") and named:
                false.append(f"{name}.{qualified}: 'no chapter' but named in {sorted(named)}")
            elif through is None and chapters - named:
                false.append(f"{name}.{qualified}: not named in chapters {sorted(chapters - named)}")
            elif through is not None and (through not in _library() or not _runs(through, qualified)
                                          or not all(_named_in(through, _chapter_source(n)) for n in chapters)):
                false.append(f"{name}.{qualified}: not run through `{through}` named in {sorted(chapters)}")
    return false


def test_chapter_tags_name_chapters_that_use_the_symbol():
    """A tag is a promise, checked for every public symbol against the notebooks: "Chapter N."
    says chapter N names the symbol; "Chapter N, through `f`." that chapter N names f and f's
    code calls the symbol; "Library: no chapter names it." that no chapter does."""
    false = _false_tags()
    assert not false, f"{len(false)} chapter tags that are not true: {false}"


def test_chapter_tag_rule_rejects_what_it_should():
    assert _tag("Text. Chapters 3–4.") == ({3, 4}, None) and _tag("Chapters 2, 5 and 7.") == ({2, 5, 7}, None)
    assert _tag("Chapter 11, through `Tokenizer`.") == ({11}, "Tokenizer")
    assert _named_in("GPT.generate", "model.generate(ids, 5)") and not _named_in("GPT.generate", "generated text")
    assert _named_in("apply_rope", "q = apply_rope(q)") and not _named_in("apply_rope", "apply_ropes")
    assert _named_in("GPT.forward", "model = GPT(config)") and not _named_in("GPT.forward", "a forward pass")
    assert _named_in("ModelConfig.d_head", "c.d_head * 2", prop=True) and not _named_in("ModelConfig.d_head", "c.d_head")
    assert _runs("TransformerBlock", "make_norm") and not _runs("TransformerBlock", "apply_rope")
    assert _runs("run_with_cache", "attached")           # through the private _run
