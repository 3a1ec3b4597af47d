"""Which objects a submission's code did not create: the modules, classes and functions of the libraries.

A graded notebook may set attributes of the objects its code creates (``self.w = …``,
``layer.capacity_factor = 2``), never those of a module, a library class or a library function
(``torch.Tensor.detach = …``, ``F.softmax = …``): the change would outlive the cell and act inside
the checks. Read without running anything, an expression is *foreign* when it may evaluate to such
an object:

- a name bound by an import, and an attribute chain from it that the imported modules resolve to a
  module, class or function (``torch.Tensor``; ``torch.float32``, a value, is not; a chain that does
  not resolve counts as foreign);
- ``type(…)``, and a call of a notebook function that returns something foreign;
- a name the notebook binds to something foreign (``T = torch.Tensor``, ``for T in [torch.Tensor]``,
  ``def f(T=torch.Tensor)``), and every parameter of a notebook function (or method of that name)
  that some call hands something foreign.

An item or attribute of a foreign expression is foreign; a call's result is not (it is new), except
as above. Names are tracked across the whole notebook, whatever their scope (a name once foreign
stays so).
"""
from __future__ import annotations

import ast
import sys
import types

from .reach import _own_dict

_CALLS_RETURNING_ARGUMENT = {"next", "enumerate", "zip", "map", "filter", "iter", "max", "min", "sorted", "list", "tuple", "dict",
                             "set", "reversed", "vars", "dir", "id", "super"}
_FOREIGN_KINDS = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _imports(tree: ast.AST) -> dict[str, str]:
    """The names a tree's imports bind, and the dotted name of what each is bound to."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
    return bound


def _resolve(dotted: str) -> object | None:
    """The object a dotted name of the loaded modules names (read from dictionaries only), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            obj = module
            for part in parts[cut:]:
                found = _own_dict(obj)
                if part not in found and isinstance(obj, type):
                    found = {k: v for klass in reversed(obj.__mro__) for k, v in _own_dict(klass).items()}
                if part not in found:
                    return None
                obj = found[part]
            return obj
    return None


def _chain(node: ast.AST) -> tuple[str, list[str]] | None:
    """``(root name, attribute names)`` of ``a.b.c`` (None if it does not start at a name)."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None


def _bound_names(target: ast.AST) -> set[str]:
    """The names an assignment target binds (not those of ``a.b = …`` or ``a[i] = …``)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*map(_bound_names, target.elts)) if target.elts else set()
    return _bound_names(target.value) if isinstance(target, ast.Starred) else set()


class Owners:
    """The notebook-wide facts: imported names, names bound to foreign things, functions returning them."""

    def __init__(self, trees: list[ast.AST]) -> None:
        self.imported: dict[str, str] = {}
        for tree in trees:
            self.imported.update(_imports(tree))
        self.foreign: set[str] = set()
        self.returning: set[str] = set()
        defs = [n for t in trees for n in ast.walk(t) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for _ in range(4):  # a few rounds reach the fixed point of any notebook a student writes
            before = (len(self.foreign), len(self.returning))
            for tree in trees:
                self._bindings(tree, defs)
            for d in defs:
                returned = [n.value for n in ast.walk(d) if isinstance(n, (ast.Return, ast.Yield)) and n.value]
                if any(self.mentions(v) for v in returned):
                    self.returning.add(d.name)
            if (len(self.foreign), len(self.returning)) == before:
                break

    def _bindings(self, tree: ast.AST, defs: list[ast.AST]) -> None:
        for node in ast.walk(tree):
            pairs = []
            if isinstance(node, ast.Assign):
                pairs = [(t, node.value) for t in node.targets]
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
                pairs = [(node.target, node.value)]
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                pairs = [(node.target, node.iter)]
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                pairs = [(i.optional_vars, i.context_expr) for i in node.items if i.optional_vars]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args.posonlyargs + node.args.args
                pairs = [(ast.Name(a.arg), d) for a, d in zip(args[len(args) - len(node.args.defaults):],
                                                               node.args.defaults)]
                pairs += [(ast.Name(a.arg), d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d]
            elif isinstance(node, ast.Call):
                self._handed(node, defs)
            for target, value in pairs:
                if self.mentions(value):
                    self.foreign |= _bound_names(target)

    def _handed(self, call: ast.Call, defs: list[ast.AST]) -> None:
        """The parameters of a notebook function (or method of that name) that ``call`` hands something
        foreign: by position (one further too, for a method: ``obj.m(a)`` and ``Class.m(obj, a)``), by name."""
        called = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
        shift = (0, 1) if isinstance(call.func, ast.Attribute) else (0,)
        for d in (d for d in defs if d.name == called):
            a = d.args
            positional = a.posonlyargs + a.args
            for i, arg in enumerate(call.args):
                if self.mentions(arg):
                    for k in (i + j for j in shift):
                        self.foreign |= {positional[k].arg} if k < len(positional) else (
                            {a.vararg.arg} if a.vararg else set())
            for kw in call.keywords:
                if self.mentions(kw.value):
                    names = {x.arg for x in positional + a.kwonlyargs} & {kw.arg}
                    self.foreign |= names or ({a.kwarg.arg} if a.kwarg else set())

    def is_foreign(self, node: ast.AST) -> bool:
        """True if ``node`` may evaluate to a module, class or function the notebook did not create."""
        while isinstance(node, (ast.Subscript, ast.Starred)):
            node = node.value
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id not in self.imported and func.id in ("type", "getattr"):
                return func.id == "type" or bool(node.args) and self.mentions(node.args[0])
            return (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) in self.returning
        chain = _chain(node)
        if chain is None:
            return isinstance(node, ast.Attribute) and self.is_foreign(node.value)
        root, attrs = chain
        if root in self.foreign:
            return True
        if root not in self.imported:
            return False
        obj = _resolve(".".join([self.imported[root], *attrs]))
        return obj is None or isinstance(obj, _FOREIGN_KINDS)

    def mentions(self, value: ast.AST) -> bool:
        """True if evaluating ``value`` may hand on something foreign: a foreign expression in it that is
        not called, nor only an argument of a call that makes something new."""
        if self.is_foreign(value) and not isinstance(value, ast.Call):
            return True
        if isinstance(value, ast.Call):
            if self.is_foreign(value):
                return True
            func = value.func
            if isinstance(func, ast.Lambda):
                return self.mentions(func.body)
            passes = isinstance(func, ast.Name) and func.id in _CALLS_RETURNING_ARGUMENT
            parts = ([*value.args, *(k.value for k in value.keywords)] if passes else [])
            parts += [func.value] if isinstance(func, ast.Attribute) and not self._rooted_import(func) else []
            return any(self.mentions(p) for p in parts)
        if isinstance(value, ast.Lambda):
            return self.mentions(value.body)
        return any(self.mentions(c) for c in ast.iter_child_nodes(value) if isinstance(c, ast.expr))

    def _rooted_import(self, node: ast.AST) -> bool:
        chain = _chain(node)
        return chain is not None and chain[0] in self.imported
