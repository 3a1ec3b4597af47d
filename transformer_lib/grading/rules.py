"""The grader's reading of a submission's code: the constructs a graded notebook may not use.

The kernel that runs a submission is the student's: code there can reach whatever Python can. So
that no check can be escaped from inside it, the grader parses every code cell the student wrote
(the check cells are the instructor's) **outside the kernel**, before running it, and refuses:

- imports other than the numeric ones an exercise needs (:data:`ALLOWED_IMPORTS`): no threads or
  processes (``threading``, ``_thread``, ``concurrent``, ``multiprocessing``, ``subprocess``,
  ``os``), no frames or objects' insides (``sys``, ``gc``, ``inspect``, ``traceback``,
  ``ctypes``), no importing by name (``importlib``), no IPython, no files; and none of the
  course library (it is switched off in the checks) or of its grading package;
- names that run or look up code by a string, or reach the interpreter's state: ``exec``,
  ``eval``, ``compile``, ``__import__``, ``globals``, ``locals``, ``vars``, ``open``,
  ``breakpoint``, ``get_ipython``, ``getattr``/``setattr``/``delattr``/``hasattr`` with a name that
  is not a string literal;
- attributes that lead to frames, code, closures and torch's internals (``f_back``, ``f_locals``,
  ``__closure__``, ``__code__``, ``__globals__``, ``_getframe``, ``setprofile``, ``settrace``,
  ``torch._C``, ``torch.ops``, ``jit``, …), every double-underscore attribute but ``__init__`` and
  ``__name__``, and every private one (a leading ``_``) except on ``self``;
- the functions an exercise switches off (listed in its exercise box), named as attributes or
  imported;
- shell commands and IPython magics other than ``%time``/``%timeit``/``%matplotlib``, and format
  strings that read attributes (``"{0.__class__}".format(x)``).

Which checks a refused construct costs is :mod:`~transformer_lib.grading.costs`'s part. The
runtime watches of :mod:`~transformer_lib.grading._harness` stay, as a second layer.
"""
from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass

ALLOWED_IMPORTS = {"math", "cmath", "random", "itertools", "functools", "collections", "typing", "dataclasses",
                   "statistics", "fractions", "decimal", "numbers", "copy", "enum", "abc", "heapq", "bisect",
                   "time", "warnings", "torch", "numpy", "matplotlib", "einops"}
REFUSED_MODULES = ("torch.multiprocessing", "torch.distributed", "torch.utils.cpp_extension", "torch.overrides",
                   "torch.library", "torch.jit", "torch.fx", "torch.compiler", "torch.utils.data", "torch.hub",
                   "torch.package", "torch.profiler", "torch.autograd.profiler", "numpy.ctypeslib", "numpy.f2py",
                   "numpy.distutils", "numpy.testing", "matplotlib.testing")
REFUSED_NAMES = {"exec", "eval", "compile", "__import__", "globals", "locals", "vars", "open", "breakpoint",
                 "get_ipython", "__builtins__", "__loader__", "__spec__"}
ATTRIBUTE_FUNCTIONS = {"getattr", "setattr", "delattr", "hasattr"}
REFUSED_ATTRIBUTES = {
    "f_back", "f_locals", "f_globals", "f_builtins", "f_code", "f_trace", "tb_frame", "tb_next", "gi_frame", "gi_code",
    "cr_frame", "cr_code", "ag_frame", "ag_code", "co_code", "co_consts", "setprofile", "settrace", "ops", "jit",
    "compile", "fx", "library", "overrides", "multiprocessing", "distributed", "ctypeslib", "f2py", "save", "savez",
    "savez_compressed", "savetxt", "tofile", "memmap", "fromfile", "load", "loadtxt", "genfromtxt", "from_file",
    "open_memmap", "savefig", "DataSource", "environ", "getenv", "putenv", "system", "popen", "fork", "kill",
    "set_default_tensor_type", "hub", "get_type_hints", "format_map", "vformat", "DataLoader",
}
ALLOWED_DUNDERS = {"__init__", "__name__"}
REFUSED_DEFINITIONS = {"__torch_function__", "__torch_dispatch__", "__getattribute__", "__getattr__", "__del__",
                       "__init_subclass__", "__set_name__", "__reduce__", "__reduce_ex__", "__class_getitem__",
                       "__subclasshook__", "__instancecheck__", "__subclasscheck__", "__prepare__"}
ALLOWED_MAGICS = {"time", "timeit", "matplotlib"}


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


class _Reader(ast.NodeVisitor):
    """Collect the refused constructs of one cell's code."""

    def __init__(self, lines: list[str], bans: tuple[str, ...], offset: int = 0) -> None:
        self.lines, self.bans, self.offset = lines, tuple(_compact(b) for b in bans), offset
        self.found: list[tuple[int, str, str]] = []

    def refuse(self, node: ast.AST, reason: str) -> None:
        line = getattr(node, "lineno", 1)
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.found.append((line + self.offset, text[:80], reason))

    def banned(self, name: str) -> str | None:
        compact = _compact(name)
        return next((b for b in self.bans if b and b in compact), None)

    def check_module(self, node: ast.AST, module: str) -> None:
        top = module.split(".")[0]
        if module.startswith("transformer_lib"):
            self.refuse(node, "the course library is switched off in graded exercises: write the code yourself")
        elif top not in ALLOWED_IMPORTS:
            self.refuse(node, f"the module {top!r} is not allowed in a graded notebook (threads, processes, files, "
                              "frames and the interpreter's insides are out of bounds)")
        elif any(module == m or module.startswith(m + ".") for m in REFUSED_MODULES):
            self.refuse(node, f"{module} is not allowed in a graded notebook")

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
        for alias in node.names:
            self.check_module(node, f"{module}.{alias.name}")
            if alias.name == "*":
                self.refuse(node, "import * is not allowed in a graded notebook: import the names you use")
            elif alias.name.startswith("_") or alias.name in REFUSED_ATTRIBUTES:
                self.refuse(node, f"importing {alias.name!r} is not allowed in a graded notebook")
            elif self.banned(alias.name):
                self.refuse(node, "this exercise asks you to write that function yourself")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in REFUSED_NAMES or (node.id.startswith("__") and node.id.endswith("__") and node.id != "__name__"):
            self.refuse(node, f"{node.id} is not allowed in a graded notebook")
        elif node.id in ATTRIBUTE_FUNCTIONS and not getattr(node, "_called_with_literal", False):
            self.refuse(node, f"{node.id} may only be called with a string literal as the attribute's name")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ATTRIBUTE_FUNCTIONS:
            name = node.args[1] if len(node.args) >= 2 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                func._called_with_literal = True  # type: ignore[attr-defined]
                self.attribute(node, name.value, node.args[0])
        if isinstance(func, ast.Attribute) and func.attr == "format":
            template = func.value
            if not (isinstance(template, ast.Constant) and isinstance(template.value, str)):
                self.refuse(node, "str.format is allowed on a string literal only (use an f-string)")
            elif any(field and re.search(r"[.\[]", field) for _, field, _, _ in _fields(template.value)):
                self.refuse(node, "a format string may not read attributes or items")
        self.generic_visit(node)

    def attribute(self, node: ast.AST, attr: str, value: ast.AST) -> None:
        on_self = isinstance(value, ast.Name) and value.id == "self"
        if attr.startswith("__") and attr.endswith("__"):
            if attr not in ALLOWED_DUNDERS:
                self.refuse(node, f"the attribute {attr} is not allowed in a graded notebook")
        elif attr.startswith("_") and not on_self:
            self.refuse(node, f"private attributes ({attr}) of objects you did not write are not allowed")
        elif attr in REFUSED_ATTRIBUTES and not on_self:
            self.refuse(node, f"the attribute {attr!r} is not allowed in a graded notebook")
        elif self.banned(attr) and not on_self:
            self.refuse(node, f"{_base(node) or attr}: this exercise asks you to write that function yourself")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.attribute(node, node.attr, node.value)
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


_MAGIC = re.compile(r"^\s*(%%?)(\w+)(.*)$")


def split_magics(source: str) -> tuple[str, list[tuple[int, str, str]], list[tuple[int, str]]]:
    """The cell as Python (magic lines blanked), the refused magic lines, and the code of the
    allowed ``%time``-style magics (line number, code) to read as well."""
    lines, refused, timed = source.splitlines(), [], []
    out = []
    for i, line in enumerate(lines, 1):
        stripped = line.strip()
        m = _MAGIC.match(line)
        if stripped.startswith("!") or re.match(r"^\s*\w+\s*=\s*[!%]", line):
            refused.append((i, stripped[:80], "shell commands and magics are not allowed in a graded notebook"))
            out.append("")
        elif m:
            if m.group(2) not in ALLOWED_MAGICS:
                refused.append((i, stripped[:80], f"the magic %{m.group(2)} is not allowed in a graded notebook"))
            elif m.group(1) == "%" and m.group(3).strip() and m.group(2) != "matplotlib":
                timed.append((i, m.group(3).strip()))
            out.append("")
        elif stripped.endswith("?") and not stripped.startswith("#"):
            out.append("")  # IPython's help syntax (name?)
        else:
            out.append(line)
    return "\n".join(out), refused, timed


def read_cell(source: str, bans: tuple[str, ...] = ()) -> list[tuple[int, str, str]]:
    """``(line, code, reason)`` of every refused construct in one cell's source."""
    code, found, timed = split_magics(source)
    lines = source.splitlines()
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return found  # it fails in the kernel too
    reader = _Reader(lines, bans)
    reader.visit(tree)
    found += reader.found
    for line, text in timed:
        try:
            inner = ast.parse(text)
        except SyntaxError:
            continue
        sub = _Reader([lines[line - 1]], bans, offset=line - 1)
        sub.visit(inner)
        found += sub.found
    return sorted(set(found))
