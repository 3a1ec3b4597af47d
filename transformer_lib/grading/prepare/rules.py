"""The grader's reading of a submission's code: the constructs a graded notebook may not use.

The kernel that runs a submission is the student's: code there can reach whatever Python can. So
that no check can be escaped from inside it, the grader reads every code cell the student wrote
(the check cells are the instructor's) **outside the kernel**, before running it. It reads what
IPython runs: the cell as IPython's own input transformer turns it into Python (``/f x`` is
``f(x)``, ``%time s`` runs ``s``). A cell that is still not Python cannot be read, and is refused
(it would not run either). The grader refuses:

- imports other than the numeric modules an exercise needs (:data:`ALLOWED_IMPORTS`, and those of
  their submodules that importing them loads, see :mod:`~transformer_lib.grading.prepare.reach`): no
  threads or processes, no frames or objects' insides, no importing by name, no IPython, no files;
  none of the course library (it is switched off in the checks) or of its grading package; no
  private module;
- names that run or look up code by a string, or reach the interpreter's state: ``exec``,
  ``eval``, ``compile``, ``__import__``, ``globals``, ``locals``, ``vars``, ``open``,
  ``breakpoint``, ``get_ipython``, ``getattr``/``setattr``/``delattr``/``hasattr`` with a name that
  is not a string literal;
- as an attribute of anything: every name under which an allowed module holds a module outside the
  allowed set or something that runs code or reaches the interpreter (**computed** by walking the
  allowed modules, :func:`~transformer_lib.grading.prepare.reach.reach`: ``sys``, ``os``, ``inspect``,
  ``attrgetter``, ``DisableTorchFunction`` …), the attributes of frames, code and closures
  (``f_back``, ``__closure__`` …), every double-underscore attribute but ``__init__`` and
  ``__name__``, every private one (a leading ``_``) except on ``self``, and the names that read or
  write files;
- setting or deleting an attribute of an object the notebook did not create: a module, a library
  class or function (:mod:`~transformer_lib.grading.prepare.owners`), as in ``torch.Tensor.detach = f``;
- the functions an exercise switches off (listed in its exercise box), named as attributes or
  imported;
- shell commands, and IPython magics other than ``%time``/``%timeit`` with a statement and no
  option (and ``%matplotlib inline``); format strings that read attributes
  (``"{0.__class__}".format(x)``).

Which checks a refused construct costs is :mod:`~transformer_lib.grading.prepare.costs`'s part. The
runtime watches of :mod:`~transformer_lib.grading._harness` stay, as a second layer.
"""
from __future__ import annotations

import ast
import re
import string
import sys
from dataclasses import dataclass

from .ipython import magic_call, python_of, timed_statement
from .owners import Owners
from .reach import ALLOWED_IMPORTS, REFUSED_MODULES, reach

REFUSED_NAMES = {"exec", "eval", "compile", "__import__", "globals", "locals", "vars", "open", "breakpoint",
                 "get_ipython", "__builtins__", "__loader__", "__spec__"}
ATTRIBUTE_FUNCTIONS = {"getattr", "setattr", "delattr", "hasattr"}
# What the walk of the allowed modules cannot see: the attributes of frames, tracebacks, generators and
# code, and a class's bases (mro); the names that read or write files; the library functions that
# compile or evaluate code (torch.compile, typing.get_type_hints) or start processes (DataLoader's
# workers); formatting by name.
REFUSED_ATTRIBUTES = {
    "f_back", "f_locals", "f_globals", "f_builtins", "f_code", "f_trace", "tb_frame", "tb_next", "gi_frame", "gi_code",
    "cr_frame", "cr_code", "ag_frame", "ag_code", "co_code", "co_consts", "save", "savez", "savez_compressed",
    "savetxt", "tofile", "memmap", "fromfile", "load", "loadtxt", "genfromtxt", "from_file", "open_memmap", "savefig",
    "DataSource", "compile", "get_type_hints", "DataLoader", "set_default_tensor_type", "format_map", "vformat", "mro",
}
ALLOWED_DUNDERS = {"__init__", "__name__"}
REFUSED_DEFINITIONS = {"__torch_function__", "__torch_dispatch__", "__getattribute__", "__getattr__", "__del__",
                       "__init_subclass__", "__set_name__", "__reduce__", "__reduce_ex__", "__class_getitem__",
                       "__subclasshook__", "__instancecheck__", "__subclasscheck__", "__prepare__"}
CHANGES_LIBRARY = ("setting or deleting an attribute of a module, or of a library's class or function, is not "
                   "allowed in a graded notebook (the change would reach the checks)")
UNREADABLE = "the grader cannot read this cell as Python (IPython cannot run it either): fix it"


@dataclass
class Refusal:
    """One refused construct: where it is (cell index in the submission, line in the cell) and why."""

    cell: int
    line: int
    code: str
    reason: str

    def __str__(self) -> str:
        return f"cell {self.cell + 1}, line {self.line}: `{self.code}` — {self.reason}"


def _base(node: ast.AST) -> str:
    """The dotted name of ``a.b.c`` (empty if the chain does not start at a name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def _compact(name: str) -> str:
    return name.replace("_", "").lower()


def refused_attribute(name: str) -> str | None:
    """Why ``name`` is refused as an attribute of anything (not on ``self``), or None."""
    if name in REFUSED_ATTRIBUTES or name in REFUSED_NAMES:
        return f"the attribute {name!r} is not allowed in a graded notebook"
    why = reach().refused.get(name)
    return None if why is None else f"the attribute {name!r} reaches {why.split(' (found as')[0]}"


class _Reader(ast.NodeVisitor):
    """Collect the refused constructs of one cell's code."""

    def __init__(self, lines: list[str], bans: tuple[str, ...], owners: Owners) -> None:
        self.lines, self.given, self.bans, self.owners = lines, bans, tuple(_compact(b) for b in bans), owners
        self.found: list[tuple[int, str, str]] = []

    def refuse(self, node: ast.AST | int, reason: str) -> None:
        line = node if isinstance(node, int) else getattr(node, "lineno", 1)
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.found.append((line, text[:80], reason))

    def banned(self, name: str) -> str | None:
        compact = _compact(name)
        return next((b for b in self.bans if b and b in compact), None)

    def check_module(self, node: ast.AST, module: str, imported: bool = True) -> None:
        top = module.split(".")[0]
        if module.startswith("transformer_lib"):
            self.refuse(node, "the course library is switched off in graded exercises: write the code yourself")
        elif top not in ALLOWED_IMPORTS:
            self.refuse(node, f"the module {top!r} is not allowed in a graded notebook (threads, processes, files, "
                              "frames and the interpreter's insides are out of bounds)")
        elif any(module == m or module.startswith(m + ".") for m in REFUSED_MODULES) or any(
                p.startswith("_") for p in module.split(".")):
            self.refuse(node, f"{module} is not allowed in a graded notebook")
        elif imported and module not in reach().importable:
            self.refuse(node, f"{module} is not among the modules a graded notebook may import")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_module(node, alias.name)
            if self.banned(alias.name.rsplit(".", 1)[-1]):
                self.refuse(node, "this exercise asks you to write that function yourself")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.refuse(node, "relative imports are not allowed")
            return
        module = node.module or ""
        self.check_module(node, module)
        known = reach().attributes.get(module, frozenset())
        for alias in node.names:
            full = f"{module}.{alias.name}"
            if alias.name == "*":
                self.refuse(node, "import * is not allowed in a graded notebook: import the names you use")
            elif alias.name.startswith("_") or refused_attribute(alias.name):
                self.refuse(node, f"importing {alias.name!r} is not allowed in a graded notebook")
            elif full in sys.modules or full in reach().importable or module.startswith("transformer_lib"):
                self.check_module(node, full)
            elif alias.name not in known and module in reach().importable:
                self.refuse(node, f"{full} is not among the names a graded notebook may import")
            if self.banned(alias.name):
                self.refuse(node, "this exercise asks you to write that function yourself")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in REFUSED_NAMES or (node.id.startswith("__") and node.id.endswith("__") and node.id != "__name__"):
            self.refuse(node, f"{node.id} is not allowed in a graded notebook")
        elif node.id in ATTRIBUTE_FUNCTIONS and not getattr(node, "_called_with_literal", False):
            self.refuse(node, f"{node.id} may only be called with a string literal as the attribute's name")

    def visit_Call(self, node: ast.Call) -> None:
        magic = magic_call(node)
        if magic is not None:
            return self.magic(node, *magic)
        func = node.func
        if isinstance(func, ast.Name) and func.id in ATTRIBUTE_FUNCTIONS:
            name = node.args[1] if len(node.args) >= 2 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                func._called_with_literal = True  # type: ignore[attr-defined]
                self.attribute(node, name.value, node.args[0])
                if func.id in ("setattr", "delattr"):
                    self.store(node, node.args[0])
        if isinstance(func, ast.Attribute) and func.attr == "format":
            template = func.value
            if not (isinstance(template, ast.Constant) and isinstance(template.value, str)):
                self.refuse(node, "str.format is allowed on a string literal only (use an f-string)")
            elif any(field and re.search(r"[.\[]", field) for _, field, _, _ in _fields(template.value)):
                self.refuse(node, "a format string may not read attributes or items")
        self.generic_visit(node)
        return None

    def magic(self, node: ast.Call, method: str, args: list) -> None:
        """A line IPython turned into ``get_ipython().…``: only a plain ``%time``/``%timeit``, whose
        statement is read in its turn, and ``%matplotlib inline``, are allowed."""
        name, line = (args + [None, None])[:2]
        if method == "run_line_magic" and name in ("time", "timeit") and isinstance(line, str):
            statement = timed_statement(name, line)
            if statement is None:
                self.refuse(node, f"%{name} with options is not allowed in a graded notebook (write %{name} and "
                                  "the statement)")
            else:
                here = self.lines[node.lineno - 1].strip()[:80] if node.lineno <= len(self.lines) else ""
                self.found += [(node.lineno, here, why) for _, _, why in read_cell(statement, self.given, self.owners)]
        elif method == "run_cell_magic" and name in ("time", "timeit") and len(args) == 3 and args[1] == "" \
                and isinstance(args[2], str):
            self.found += [(line + node.lineno, code, why) for line, code, why in
                           read_cell(args[2], self.given, self.owners)]
        elif method == "run_line_magic" and name == "matplotlib" and isinstance(line, str) and line.strip() == "inline":
            return
        elif method in ("system", "getoutput"):
            self.refuse(node, "shell commands are not allowed in a graded notebook")
        else:
            shown = f"%{name}" if isinstance(name, str) and method == "run_line_magic" else (
                f"%%{name}" if isinstance(name, str) else "this IPython syntax")
            self.refuse(node, f"{shown[:40]} is not allowed in a graded notebook (only %time and %timeit with a "
                              "statement)")

    def attribute(self, node: ast.AST, attr: str, value: ast.AST) -> None:
        on_self = isinstance(value, ast.Name) and value.id == "self"
        if attr.startswith("__") and attr.endswith("__"):
            if attr not in ALLOWED_DUNDERS:
                self.refuse(node, f"the attribute {attr} is not allowed in a graded notebook")
        elif attr.startswith("_") and not on_self:
            self.refuse(node, f"private attributes ({attr}) of objects you did not write are not allowed")
        elif not on_self and refused_attribute(attr):
            self.refuse(node, refused_attribute(attr))
        elif self.banned(attr) and not on_self:
            self.refuse(node, f"{_base(node) or attr}: this exercise asks you to write that function yourself")

    def store(self, node: ast.AST, target: ast.AST) -> None:
        if self.owners.mentions(target):
            self.refuse(node, CHANGES_LIBRARY)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.attribute(node, node.attr, node.value)
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.store(node, node.value)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name in REFUSED_DEFINITIONS:
            self.refuse(node, f"defining {node.name} is not allowed in a graded notebook")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if any(k.arg == "metaclass" for k in node.keywords):
            self.refuse(node, "metaclasses are not allowed in a graded notebook")
        self.generic_visit(node)


def _fields(template: str) -> list[tuple]:
    try:
        return list(string.Formatter().parse(template))
    except ValueError:
        return [("", "?.", "", None)]


def read_cell(source: str, bans: tuple[str, ...] = (), owners: Owners | None = None) -> list[tuple[int, str, str]]:
    """``(line, code, reason)`` of every refused construct in one cell's source; ``owners``: the
    notebook's facts about what its code did not create (of this cell alone if None)."""
    raw = source.splitlines()
    found = [(i, line.strip()[:80], "get_ipython is not allowed in a graded notebook")
             for i, line in enumerate(raw, 1) if "get_ipython" in line]
    code = python_of(source)
    lead = next((i for i, line in enumerate(raw) if line.strip()), 0)  # the blank lines IPython drops first
    same = code is not None and len(code.splitlines()) + lead == len(raw)  # the lines stay where they were
    try:
        tree = ast.parse(code if code is not None else "\0")
    except (SyntaxError, ValueError) as err:
        line = (getattr(err, "lineno", None) or 1) + lead if same else 1
        return sorted(set(found + [(line, raw[line - 1].strip()[:80] if 0 < line <= len(raw) else "", UNREADABLE)]))
    if same:
        ast.increment_lineno(tree, lead)
    reader = _Reader(raw, bans, owners or Owners([tree]))
    reader.visit(tree)
    return sorted(set(found + reader.found))
