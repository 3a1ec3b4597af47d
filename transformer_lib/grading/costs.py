"""Which checks a refused construct costs (see :mod:`~transformer_lib.grading.rules` for what is refused).

A refused construct costs its exercise its points (one before the first exercise costs every
exercise), and so does, in any exercise, a cell that uses a name defined by a refused cell, or by
a cell that did so: a helper written in one exercise serves another. Only the names a cell defines
for the cells after it count (its top level, and what its functions declare ``global``), never a
function's own locals, and a name defined anew by accepted code is clean again.

An exercise of an instructor notebook starts at a markdown heading ``## N.M …`` and runs to the
next; a submission's cells are given to exercises by the grade ids and cell ids they share with
the instructor's cells, in notebook order.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .rules import Refusal, read_cell, split_magics


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
        return ast.parse(split_magics(source)[0])
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
    code, _, timed = split_magics(source)
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
