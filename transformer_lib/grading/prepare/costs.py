"""Which checks a refused construct costs (see :mod:`~transformer_lib.grading.prepare.rules` for what is refused).

The exercises come from the instructor notebook alone: an exercise starts at a markdown heading
``## N.M …`` and runs to the next, and owns the check cells in between. In a submission, whose
check cells are exactly the instructor's (:func:`~transformer_lib.grading.prepare.submission.restore_checks`),
every other code cell is the student's, whatever its metadata, and belongs **by position** to the
exercise of the first check cell after it (after the last one: to the last exercise). No id a
student can copy into a cell's metadata moves a cell to another exercise.

A refused construct costs its exercise its points. One in the notebook's setup, before the first
exercise's heading and the first check cell (whichever comes first), costs every exercise, and so
does, from its exercise on, a refused change to a module or a library class (it outlives its
cell). (A heading moved up only makes setup code the first exercise's code, costed as such.) A cell that
uses a name defined by a refused cell, or by a cell that did so, costs its exercise too, and a
check cell that uses one costs its own check: a helper written in one exercise serves another.
Only the names a cell defines for the cells after it count (its top level, and what its functions
declare ``global``), never a function's own locals, and a name defined anew by accepted code is
clean again.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .ipython import magic_call, parse, timed_statement
from .owners import Owners
from .rules import CHANGES_LIBRARY, Refusal, read_cell


@dataclass
class Exercise:
    """One exercise of an instructor notebook: its number (``2.3``), its check cells' grade ids and
    the functions it switches off."""

    title: str
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
            found.append(Exercise(heading.group(1), [], ()))
        if not found:
            continue
        ex = found[-1]
        if is_check(cell):
            ex.checks.append(grade_id(cell))
            called = re.findall(r"\bchecks\.check_(\w+)", cell.source)
            ex.bans = tuple(sorted({b for name in called for b in bans_of.get(name, ())} | set(ex.bans)))
    return found


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


def _trees(source: str) -> list[ast.Module]:
    """The cell as IPython runs it, parsed, and the statements its ``%time`` lines run (none if the
    cell is not Python)."""
    tree = parse(source)
    if tree is None:
        return []
    found = [tree]
    for node in ast.walk(tree):
        magic = magic_call(node)
        if magic and magic[0] in ("run_line_magic", "run_cell_magic") and magic[1][:1] in (["time"], ["timeit"]):
            args = magic[1]
            inner = (timed_statement(args[0], args[1]) if magic[0] == "run_line_magic" and isinstance(args[1], str)
                     else args[2] if len(args) == 3 else None)
            found += _trees(inner) if isinstance(inner, str) else []
    return found


def defined_names(source: str) -> set[str]:
    """The names a cell defines for the cells after it: what its top level binds (assignments,
    ``def``, ``class``, imports, loop targets), and what its functions declare ``global``."""
    names: set[str] = set()
    for tree in _trees(source):
        bound, declared = _bound(tree.body)
        names |= bound | declared
    return names


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
    names: set[str] = set()
    for tree in _trees(source):
        reader = _GlobalUses()
        reader.visit(tree)
        names |= reader.used
    return names


def cell_exercises(submission, exs: list[Exercise]) -> tuple[list[int], set[int]]:  # noqa: ANN001
    """For each cell of ``submission``, the index of its exercise in ``exs`` (that of the first
    instructor check cell after it), and the indices of the instructor's check cells."""
    from .notebook import grade_id, is_check

    of_check = {gid: i for i, ex in enumerate(exs) for gid in ex.checks}
    checks = {i for i, c in enumerate(submission.cells) if is_check(c) and grade_id(c) in of_check}
    owner, upcoming = [0] * len(submission.cells), max(len(exs) - 1, 0)
    for index in reversed(range(len(submission.cells))):
        if index in checks:
            upcoming = of_check[grade_id(submission.cells[index])]
        owner[index] = upcoming
    return owner, checks


def refusals(submission, instructor, bans_of: dict[str, tuple[str, ...]]) -> dict[str, list[Refusal]]:  # noqa: ANN001
    """Per check grade id, the refused constructs that cost it its points (see the module's text):
    every code cell of ``submission`` that is not one of the instructor's check cells is read with
    its exercise's bans."""
    from .notebook import IMPORT_CHECKS, grade_id  # the given line: only check cells run it

    exs = exercises(instructor, bans_of)
    cost: dict[str, list[Refusal]] = {gid: [] for ex in exs for gid in ex.checks}
    if not exs:
        return cost
    owner, checks = cell_exercises(submission, exs)
    first = min([*checks, *(i for i, c in enumerate(submission.cells) if c.cell_type == "markdown"
                            and re.search(rf"^## {re.escape(exs[0].title)} ", c.source, re.M))], default=0)
    sources = {i: "\n".join("" if line.strip() == IMPORT_CHECKS else line for line in c.source.splitlines())
               for i, c in enumerate(submission.cells) if c.cell_type == "code" and i not in checks}
    owners = Owners([tree for source in sources.values() for tree in _trees(source)])
    tainted: dict[str, str] = {}  # name -> the refusal behind it
    for index, cell in enumerate(submission.cells):
        if index in checks:
            gid, used = grade_id(cell), sorted((used_names(cell.source) - defined_names(cell.source)) & set(tainted))
            if used and not cost[gid]:
                cost[gid].append(Refusal(index, 0, used[0], f"the check uses {used[0]}, defined by code the grader "
                                                             f"refuses ({tainted[used[0]]})"))
            continue
        if index not in sources:
            continue
        source, ex = sources[index], owner[index]
        found = [Refusal(index, line, code, reason) for line, code, reason in read_cell(source, exs[ex].bans, owners)]
        defines = defined_names(source)
        found += [Refusal(index, 0, name, f"uses {name}, defined by code the grader refuses ({tainted[name]})")
                  for name in sorted((used_names(source) - defines) & set(tainted))][:1]
        if not found:
            for name in defines:  # defined anew by code the grader accepts
                tainted.pop(name, None)
            continue
        tainted.update({name: f"cell {found[0].cell + 1}" for name in defines})
        lasting = any(r.reason == CHANGES_LIBRARY for r in found)
        for later in exs if index < first else exs[ex:] if lasting else exs[ex:ex + 1]:
            for gid in later.checks:
                cost[gid] += found
    return cost
