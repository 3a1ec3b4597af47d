"""What IPython runs for a notebook cell, for the grader's reading (:mod:`~transformer_lib.grading.prepare.rules`).

A cell is not Python as written: IPython first turns its own syntax into Python with its input
transformer (``%time s`` becomes ``get_ipython().run_line_magic('time', 's')``, ``!ls`` a call of
``get_ipython().system``, ``/f x`` the call ``f(x)``, ``x?`` a help magic). The grader reads the
result, the code IPython actually runs, made by IPython's own transformer (the kernel's version).
``%time`` and ``%timeit`` then run a statement of their line: :func:`timed_statement` gives the one
IPython would run, so that it is read in its turn.
"""
from __future__ import annotations

import ast
import functools


def magic_call(node: ast.AST) -> tuple[str, list] | None:
    """``(method, arguments)`` of IPython's ``get_ipython().method(…)`` (what a magic or ``!`` becomes)."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name) and node.func.value.func.id == "get_ipython"):
        return node.func.attr, [a.value if isinstance(a, ast.Constant) else None for a in node.args]
    return None


def timed_statement(name: str, line: str) -> str | None:
    """The statement IPython's ``%time``/``%timeit`` runs for ``line``; None if ``line`` has options."""
    if name == "timeit":
        return None if line.lstrip().startswith("-") else line.lstrip()
    from IPython.core import magic_arguments
    from IPython.core.magics.execution import ExecutionMagics

    try:
        args, extra = magic_arguments.parse_argstring(ExecutionMagics.time, line, partial=True)
    except BaseException:  # noqa: BLE001 - argparse exits on what it cannot parse: IPython runs nothing
        return None
    return None if any(vars(args).values()) else " ".join(extra)


@functools.lru_cache(maxsize=1)
def _transformer():  # noqa: ANN202
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager()


def python_of(source: str) -> str | None:
    """The Python that IPython runs for a cell (None if IPython's transformer fails on it)."""
    try:
        return _transformer().transform_cell(source)
    except Exception:  # noqa: BLE001 - whatever the transformer cannot handle, IPython cannot run
        return None


def parse(source: str) -> ast.Module | None:
    """The cell as IPython runs it, parsed; None if it is not Python."""
    code = python_of(source)
    try:
        return None if code is None else ast.parse(code)
    except (SyntaxError, ValueError):
        return None
