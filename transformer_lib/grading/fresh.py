"""A fresh copy of the checks for every check cell the grader runs.

In each check cell of a prepared notebook, :func:`use_fresh_checks` replaces the line
``from transformer_lib.grading import checks`` by code that executes the ``checks`` package and its helper
module from their files into new module objects, under a package name random per grading run,
instead of importing them. Whatever the notebook did before (re-pointing ``checks.check_*``,
replacing ``sys.modules`` entries, patching the helpers' attributes) therefore does not reach
the check cell. Only the chapters whose checks the notebook calls are loaded. (It is a
deterrent, like everything inside the kernel: the grader's real
defence is comparing the recorded results outside it.)
"""
from __future__ import annotations

import copy
import inspect
import re
import secrets
from pathlib import Path

from nbformat import NotebookNode

from .notebook import IMPORT_CHECKS, is_check

FOLDER = Path(__file__).resolve().parent


def files(names: set[str] | None = None) -> tuple[str, ...]:
    """The checks' files in the order they import each other: the shared helpers, each
    chapter's module (only those defining one of ``names``, if given and all are found), then
    the package that gathers them."""
    chapters = sorted(p.stem for p in (FOLDER / "checks").glob("ch[0-9]*.py"))
    if names:
        defines = {stem: set(re.findall(r"^def (\w+)\(", (FOLDER / "checks" / f"{stem}.py").read_text(encoding="utf-8"),
                                        re.M)) for stem in chapters}
        needed = [stem for stem in chapters if defines[stem] & names]
        if names <= set().union(*(defines[stem] for stem in needed), {"CheckFailed"}):
            chapters = needed
    return ("_checktools", *(f"checks.{stem}" for stem in chapters), "checks")


def _grading_fresh_checks(folder: str, name: str, files: tuple[str, ...]):  # noqa: ANN202
    """Execute ``files`` (dotted names under ``folder``; a name with submodules is a package,
    read from its ``__init__.py``) as new modules under a new package ``name``; return the last.

    This function's source is copied into check cells, so it imports what it needs itself. The
    modules are in ``sys.modules`` only while they load (for their relative imports).
    """
    import sys
    import types

    package = types.ModuleType(name)
    package.__path__ = [folder]
    modules = {name: package}
    try:
        for dotted in files:
            module = types.ModuleType(f"{name}.{dotted}")
            path = f"{folder}/{dotted.replace('.', '/')}"
            if any(f.startswith(dotted + ".") for f in files):  # a package
                module.__path__, module.__package__, module.__file__ = [path], module.__name__, f"{path}/__init__.py"
            else:
                module.__package__, module.__file__ = module.__name__.rpartition(".")[0], f"{path}.py"
            modules[module.__name__] = module
            sys.modules.update(modules)
            with open(module.__file__, encoding="utf-8") as fh:
                lines = [line for line in fh.read().splitlines()  # gather only the chapters loaded
                         if not (line.startswith("from .ch") and f"{dotted}.{line[6:].split()[0]}" not in files)]
            exec(compile("\n".join(lines) + "\n", module.__file__, "exec"), module.__dict__)  # noqa: S102
    finally:
        for key in modules:
            sys.modules.pop(key, None)
    return module


def loader(name: str, indent: str = "", names: set[str] | None = None) -> str:
    """The code that binds ``checks`` to a fresh copy of the checks (package ``name``; only the
    chapters that define ``names``, see :func:`files`)."""
    call = f"checks = _grading_fresh_checks({str(FOLDER)!r}, {name!r}, {files(names)!r})"
    code = f"{inspect.getsource(_grading_fresh_checks)}{call}\ndel _grading_fresh_checks"
    return "\n".join(indent + line if line else line for line in code.splitlines())


def use_fresh_checks(nb: NotebookNode, name: str | None = None) -> NotebookNode:
    """A copy of ``nb`` whose check cells load a fresh copy of the checks (``name``: random if None)."""
    name = name or f"_grading_checks_{secrets.token_hex(8)}"
    nb = copy.deepcopy(nb)
    names = {n for cell in nb.cells if is_check(cell) for n in re.findall(r"\bchecks\.(\w+)", cell.source)}
    for cell in nb.cells:
        if is_check(cell):
            lines = cell.source.splitlines()
            cell.source = "\n".join(loader(name, line[: len(line) - len(line.lstrip())], names)
                                    if line.strip() == IMPORT_CHECKS else line for line in lines)
    return nb
