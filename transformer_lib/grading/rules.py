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

A refused construct costs its exercise its points (one before the first exercise costs every
exercise), and so does, in any exercise, a cell that uses a name defined by a refused cell, or by
a cell that did so (a helper written in one exercise serves another). The runtime watches of
:mod:`~transformer_lib.grading._harness` stay, as a second layer.
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


def _split_magics(source: str) -> tuple[str, list[tuple[int, str, str]], list[tuple[int, str]]]:
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
    code, found, timed = _split_magics(source)
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


@dataclass
class Exercise:
    """One exercise of an instructor notebook: its heading's cell index, the grade ids of its cells,
    the check cells' grade ids and the functions it switches off."""

    title: str
    ids: set[str]
    checks: list[str]
    bans: tuple[str, ...]


def exercises(instructor, bans_of: dict[str, tuple[str, ...]]) -> list[Exercise]:  # noqa: ANN001
    """The exercises of an instructor notebook: each starts at a markdown heading ``## N.M …`` and
    runs to the next; ``bans_of`` gives, per check name, the functions its judge switches off."""
    from .notebook import grade_id, is_check

    found: list[Exercise] = []
    for cell in instructor.cells:
        heading = re.search(r"^## (\d+\.\d+) ", cell.source, re.M) if cell.cell_type == "markdown" else None
        if heading:
            found.append(Exercise(heading.group(1), set(), [], ()))
        if not found:
            continue
        ex = found[-1]
        ex.ids |= {key for key in (grade_id(cell), cell.get("id")) if key}
        if is_check(cell):
            ex.checks.append(grade_id(cell))
            called = re.findall(r"\bchecks\.check_(\w+)", cell.source)
            ex.bans = tuple(sorted({b for name in called for b in bans_of.get(name, ())} | set(ex.bans)))
    return found


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _bound(body: list[ast.AST]) -> tuple[set[str], set[str]]:
    """The names a block of statements binds in its own scope (not in nested functions, classes,
    lambdas or comprehensions), and the names it declares ``global``."""
    bound, declared = set(), set()
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            declared |= {n for sub in ast.walk(node) if isinstance(sub, ast.Global) for n in sub.names}
            continue
        if isinstance(node, (ast.Lambda, *_COMPREHENSIONS)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Global):
            declared |= set(node.names)
        stack += list(ast.iter_child_nodes(node))
    return bound, declared


def _tree(source: str) -> ast.Module | None:
    try:
        return ast.parse(_split_magics(source)[0])
    except SyntaxError:
        return None


def defined_names(source: str) -> set[str]:
    """The names a cell defines for the cells after it: what its top level binds (assignments,
    ``def``, ``class``, imports, loop targets), and what its functions declare ``global``."""
    tree = _tree(source)
    if tree is None:
        return set()
    bound, declared = _bound(tree.body)
    return bound | declared


class _GlobalUses(ast.NodeVisitor):
    """The names a cell reads from the notebook's namespace: loads that no enclosing function,
    lambda or comprehension binds itself."""

    def __init__(self) -> None:
        self.local: list[set[str]] = []
        self.used: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and not any(node.id in scope for scope in self.local):
            self.used.add(node.id)

    def _scope(self, names: set[str], body: list[ast.AST]) -> None:
        self.local.append(names)
        for item in body:
            self.visit(item)
        self.local.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for item in node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(item)
        args = {a.arg for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs}
        args |= {a.arg for a in (node.args.vararg, node.args.kwarg) if a}
        bound, declared = _bound(node.body)
        self._scope((args | bound) - declared, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for item in node.args.defaults:
            self.visit(item)
        self._scope({a.arg for a in node.args.args + node.args.kwonlyargs}, [node.body])

    def _comprehension(self, node: ast.AST) -> None:
        targets = {n.id for gen in node.generators for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
        self.visit(node.generators[0].iter)
        parts = [g.iter for g in node.generators[1:]] + [c for g in node.generators for c in g.ifs]
        parts += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        self._scope(targets, parts)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


def used_names(source: str) -> set[str]:
    """Names a cell reads from the notebook's namespace (in its code and in its ``%time`` lines)."""
    code, _, timed = _split_magics(source)
    names: set[str] = set()
    for text in [code, *(t for _, t in timed)]:
        try:
            reader = _GlobalUses()
            reader.visit(ast.parse(text))
            names |= reader.used
        except SyntaxError:
            continue
    return names


def refusals(submission, instructor, bans_of: dict[str, tuple[str, ...]]) -> dict[str, list[Refusal]]:  # noqa: ANN001
    """Per check grade id, the refused constructs that cost it its points (see the module's text):
    every code cell of ``submission`` that is not a check cell is read with its exercise's bans."""
    from .notebook import IMPORT_CHECKS, grade_id, is_check  # the given line: only check cells run it

    exs = exercises(instructor, bans_of)
    owner = {key: i for i, ex in enumerate(exs) for key in ex.ids}
    cost: dict[str, list[Refusal]] = {gid: [] for ex in exs for gid in ex.checks}
    current, started, tainted = 0, False, {}  # tainted: name -> the refusal behind it
    for index, cell in enumerate(submission.cells):
        keys = [k for k in (grade_id(cell), cell.get("id")) if k in owner]
        if keys:
            current, started = max([current] + [owner[k] for k in keys]), True
        if cell.cell_type != "code" or is_check(cell) or not exs:
            continue
        source = "\n".join("" if line.strip() == IMPORT_CHECKS else line for line in cell.source.splitlines())
        found = [Refusal(index, line, code, reason) for line, code, reason in read_cell(source, exs[current].bans)]
        defines = defined_names(source)
        found += [Refusal(index, 0, name, f"uses {name}, defined by code the grader refuses ({tainted[name]})")
                  for name in sorted((used_names(source) - defines) & set(tainted))][:1]
        if not found:
            for name in defines:  # defined anew by code the grader accepts
                tainted.pop(name, None)
            continue
        tainted.update({name: f"cell {found[0].cell + 1}" for name in defines})
        for ex in (exs[current:current + 1] if started else exs):
            for gid in ex.checks:
                cost[gid] += found
    return cost
