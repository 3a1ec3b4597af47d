"""What the modules a graded notebook may import let its code reach: the attribute names the grader refuses.

The modules a graded notebook may import (:data:`~transformer_lib.grading.prepare.rules.ALLOWED_IMPORTS`) hold,
as attributes, modules and functions that reach the interpreter (``torch.sys``, ``numpy.os``, a
module's ``inspect`` or ``threading``, ``operator.attrgetter`` …). Listing their names by hand
misses some; so when the grader starts (in its own process, never in a student's kernel),
:func:`reach` imports the allowed modules (and the checks, for what they load) and reads every
public attribute of each loaded module of theirs, and of the classes and objects those modules
hold, **without calling anything** (their own ``__dict__``: no property, no lazy module attribute,
no import runs). A value is *forbidden* if it is

- a module outside the allowed set (one whose package is not allowed, or is refused, or an object
  posing as a module that is not the one imported under its name), or
- something that runs code or reaches the interpreter: ``exec``, ``eval``, ``compile``,
  ``__import__``, ``getattr`` and its kin (``operator.attrgetter``, ``functools.update_wrapper``),
  ``open``, ``globals``/``locals``/``vars``, and every function, class or object defined by the
  interpreter's own modules (:data:`INTERPRETER`: ``sys``, ``os``, ``importlib``, ``subprocess``,
  ``ctypes``, ``inspect``, ``threading``, ``gc``, ``types``, ``io``, ``shutil``, ``signal``,
  ``pickle``, ``marshal`` …), torch's operator and class registries, torch's switches for its
  function and dispatch modes, and the hooks that make every module call (or numpy error) run
  the notebook's code.

Every name under which a forbidden value is found is refused as an attribute, on anything. Only
modules and code-running values count: a harmless function of a forbidden module (``os.path.join``)
does not make ``join`` a refused name, and exceptions and ``inspect``'s plain data classes are
harmless. A name that is both forbidden somewhere and a course function elsewhere (``dist``: a
module's alias of ``torch.distributed``, and ``torch.dist``) stays usable when every module that
binds it to the forbidden value can be *closed*: reached under refused names only; such a module
may then not be imported. A package that imports its submodules when they are asked for as
attributes (numpy, torch) has the names of those the walk did not cover refused. The result is
computed once per process.
"""
from __future__ import annotations

import builtins
import functools
import importlib
import operator
import pkgutil
import re
import sys
import types
from collections import defaultdict
from dataclasses import dataclass

ALLOWED_IMPORTS = frozenset({"math", "cmath", "random", "itertools", "functools", "collections", "typing",
                             "dataclasses", "statistics", "fractions", "decimal", "numbers", "copy", "enum", "abc",
                             "heapq", "bisect", "time", "warnings", "torch", "numpy", "matplotlib", "einops"})
REFUSED_MODULES = ("torch.multiprocessing", "torch.distributed", "torch.utils.cpp_extension", "torch.overrides",
                   "torch.library", "torch.jit", "torch.fx", "torch.compiler", "torch.utils.data", "torch.hub",
                   "torch.package", "torch.profiler", "torch.autograd.profiler", "numpy.ctypeslib", "numpy.f2py",
                   "numpy.distutils", "numpy.testing", "matplotlib.testing", "torch.ops", "torch.classes", "torch.export",
                   "torch.onnx")
# Refused imports whose name is a common attribute (``Tensor.data``): walked like an allowed module
# when reached as an attribute, so that what they hold that runs code is refused by its own name.
WALKED_THOUGH_REFUSED = ("torch.utils.data",)
# Submodules that `import torch` etc. do not load, but a notebook may import (numpy's are loaded lazily).
SUBMODULES = ("matplotlib.pyplot", "matplotlib.patches", "matplotlib.animation", "numpy.random", "numpy.fft",
              "numpy.linalg", "numpy.polynomial")
INTERPRETER = ("sys", "os", "posix", "nt", "subprocess", "_posixsubprocess", "importlib", "_imp",
               "_frozen_importlib", "_frozen_importlib_external", "zipimport", "pkgutil", "runpy", "ctypes",
               "_ctypes", "inspect", "threading", "_thread", "gc", "types", "io", "_io", "shutil", "signal",
               "_signal", "pickle", "_pickle", "marshal", "copyreg", "code", "codeop", "pdb", "bdb", "traceback",
               "dis", "linecache", "atexit", "faulthandler", "multiprocessing", "concurrent", "socket", "_socket",
               "select", "selectors", "mmap", "resource", "fcntl", "site", "_sitebuiltins", "sysconfig",
               "tracemalloc", "weakref", "_weakref", "_weakrefset", "asyncio", "_asyncio", "contextvars",
               "_contextvars", "IPython", "ipykernel", "torch._ops", "torch._classes")
RUNNERS = ("exec", "eval", "compile", "__import__", "getattr", "setattr", "delattr", "hasattr", "globals", "locals",
           "vars", "open", "breakpoint", "input", "help", "exit", "quit", "__build_class__")
GLOBAL_HOOK = re.compile(r"register_module_\w*hook|seterrcall$")  # hooks on every module call, every numpy error
MODE_SWITCH = re.compile(r"Disable|Dispatch|Guard|Mode", re.I)  # torch._C's classes that switch the watch's modes


def _in(name: object, modules: tuple[str, ...]) -> bool:
    return isinstance(name, str) and any(name == m or name.startswith(m + ".") for m in modules)


def allowed_module_name(name: str) -> bool:
    """True for a module a graded notebook may use: its package allowed, not a refused one."""
    return name.split(".")[0] in ALLOWED_IMPORTS and not _in(name, REFUSED_MODULES)


def _public(name: str) -> bool:
    return not name.startswith("_")


def _own_dict(obj: object) -> dict:
    """``obj``'s own attribute dictionary, read without running any of its code (empty if none)."""
    try:
        found = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - an object without a dictionary of its own
        return {}
    return dict(found) if isinstance(found, (dict, types.MappingProxyType)) else {}


def _defined_in(value: object) -> str | None:
    """The module that defines a function or class (None if it does not say)."""
    if isinstance(value, types.BuiltinFunctionType) and isinstance(value.__self__, types.ModuleType):
        return _own_dict(value.__self__).get("__name__")
    if isinstance(value, types.MethodType):
        return _defined_in(value.__func__)
    if isinstance(value, functools.partial):
        return _defined_in(value.func)
    if isinstance(value, type):
        found = _own_dict(value).get("__module__")
        return found if isinstance(found, str) else type.__dict__["__module__"].__get__(value)
    found = getattr(value, "__module__", None) if isinstance(value, (types.FunctionType, types.BuiltinFunctionType,
                                                                     types.MethodDescriptorType)) else None
    return found if isinstance(found, str) else None


@dataclass
class Reach:
    """The result of the walk: the refused attribute names (with one place each was found and why),
    and the modules a notebook may import."""

    refused: dict[str, str]
    importable: frozenset[str]
    attributes: dict[str, frozenset[str]]  # per importable module, its attribute names


class _Walk:
    def __init__(self) -> None:
        self.runners = {id(getattr(builtins, n)) for n in RUNNERS if hasattr(builtins, n)}
        self.runners |= {id(f) for f in (operator.attrgetter, operator.methodcaller, functools.update_wrapper,
                                          functools.wraps)}
        harmless = (types.GenericAlias, types.UnionType, types.NoneType, types.EllipsisType, types.NotImplementedType,
                    types.SimpleNamespace, types.MappingProxyType, types.DynamicClassAttribute)
        self.runners |= {id(v) for v in vars(types).values()  # the interpreter's own types: functions, code, frames
                         if isinstance(v, type) and v not in harmless}
        self.harmless = {id(v) for v in harmless}
        self.modules = {id(m): n for n, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)
                        and (allowed_module_name(n) or _in(n, WALKED_THOUGH_REFUSED))}

    def forbidden(self, value: object) -> str | None:
        """Why ``value`` is forbidden, or None."""
        if isinstance(value, types.ModuleType):
            return None if id(value) in self.modules else f"the module {_own_dict(value).get('__name__', '?')}"
        if id(value) in self.harmless:
            return None
        if id(value) in self.runners:
            return f"{getattr(value, '__qualname__', value)!s}, which runs code or looks names up"
        if isinstance(value, type) and issubclass(value, BaseException):
            return None
        if isinstance(value, types.FunctionType) and GLOBAL_HOOK.match(value.__name__):
            return f"{value.__qualname__}, which makes library calls run the notebook's code"
        if callable(value) and not isinstance(value, (types.GenericAlias, types.UnionType)):
            where = _defined_in(value)
            if where is None:
                where = type(value).__module__
            if isinstance(value, type) and where == "inspect":
                return None  # inspect's data classes (Parameter, Signature) run nothing
            if _in(where, INTERPRETER):
                return f"a function or class of {where}"
            name = type.__dict__["__name__"].__get__(value) if isinstance(value, type) else ""
            if where == "torch._C" and MODE_SWITCH.search(name):
                return f"torch._C.{name}, a switch of torch's function and dispatch modes"
            return None
        kind = type(value).__module__
        if _in(kind, INTERPRETER) and kind != "types":
            return f"an object of {kind}"
        return None

    def run(self) -> Reach:
        walked: dict[int, str] = {i: n for i, n in self.modules.items() if all(map(_public, n.split(".")))}
        bindings: dict[str, list[tuple[str, str | None, int]]] = defaultdict(list)  # name -> (where, why, value)
        bound_as: dict[str, set[str]] = defaultdict(set)  # module -> the names it is found under
        seen: set[int] = set()
        useful: set[int] = set()
        queue = [sys.modules[n] for n in walked.values()]
        while queue:
            holder = queue.pop()
            where = self.modules.get(id(holder)) or _own_dict(holder).get("__qualname__") or type(holder).__qualname__
            for key, value in list(_own_dict(holder).items()):
                if not (isinstance(key, str) and _public(key)):
                    continue
                why = self.forbidden(value)
                bindings[key].append((where, why, id(value)))
                if why is None and (isinstance(value, types.ModuleType) or (callable(value) and allowed_module_name(
                        _defined_in(value) or ""))):
                    useful.add(id(value))
                if isinstance(value, types.ModuleType) and why is None:
                    bound_as[self.modules[id(value)]].add(key)
                if why is not None or id(value) in seen or not isinstance(holder, types.ModuleType):
                    continue
                seen.add(id(value))
                if isinstance(value, types.ModuleType):
                    if id(value) not in walked:
                        walked[id(value)] = self.modules[id(value)]
                        queue.append(value)
                elif allowed_module_name((_defined_in(value) if isinstance(value, type) else None)
                                         or type(value).__module__ or ""):
                    queue.append(value)  # a class or an object of the allowed modules: its own attributes
        for name in sorted(walked.values()):  # a package that imports submodules when they are asked for
            lazy = _own_dict(sys.modules[name]).get("__getattr__")
            imports = set(lazy.__code__.co_names) if isinstance(lazy, types.FunctionType) else set()
            if imports and isinstance(_own_dict(sys.modules[name]).get("__path__"), list):
                for child in pkgutil.iter_modules(_own_dict(sys.modules[name])["__path__"]):
                    full = f"{name}.{child.name}"
                    if _public(child.name) and full not in walked.values() and (
                            "import_module" in imports or full in imports):
                        bindings[child.name].append((name, f"the module {full}, which this walk does not cover "
                                                           "(its package imports it when asked)", 0))
        ids = {n: i for i, n in walked.items()}
        return self.settle(bindings, bound_as, ids, useful)

    @staticmethod
    def settle(bindings: dict[str, list[tuple[str, str | None, int]]], bound_as: dict[str, set[str]],
               walked: dict[str, int], useful: set[int]) -> Reach:
        """The refused names. A name that a harmless value shares is kept usable if every module that binds
        it to a forbidden value can be closed: a module without submodules, not one of those a notebook
        imports first, whose names are all refused, or name nothing but that module (then they are refused
        too); it may not be imported. ``useful``: the functions, classes and modules of the allowed modules."""
        refused = {k: f"{why} (found as {where}.{k})" for k, found in bindings.items()
                   for where, why, _ in found[::-1] if why is not None}
        closed: set[str] = set()
        for k in list(refused):
            bad = {w for w, why, _ in bindings[k] if why is not None}
            roots = ALLOWED_IMPORTS | set(SUBMODULES)
            if not all(m in walked and m not in roots and not any(n.startswith(m + ".") for n in walked) for m in bad) \
                    or not any(why is None and value in useful for _, why, value in bindings[k]):
                continue
            names = {m: (bound_as[m] | {m.rsplit(".", 1)[-1]}) - set(refused) for m in bad}
            if k in set().union(*names.values()) or not all(
                    all(why is not None or value == walked[m] for _, why, value in bindings.get(n, ()))
                    for m in bad for n in names[m]):
                continue
            for m in bad:
                refused.update({n: f"the module {m}, closed: it binds {k} to something forbidden" for n in names[m]})
            closed |= bad
            del refused[k]
        importable = frozenset(n for n in walked if all(map(_public, n.split("."))) and allowed_module_name(n)
                               and not _in(n, tuple(closed)))
        attributes = {n: frozenset(k for k in _own_dict(sys.modules[n]) if isinstance(k, str)) for n in importable}
        return Reach(refused, importable, attributes)


@functools.lru_cache(maxsize=1)
def reach() -> Reach:
    """Import the allowed modules and walk them (once per process); see the module's text."""
    for name in sorted(ALLOWED_IMPORTS) + list(SUBMODULES):
        try:
            importlib.import_module(name)
        except ImportError:  # an allowed module that is not installed: nothing of it to reach
            continue
    importlib.import_module("transformer_lib.grading.checks")  # what a kernel has loaded once its checks ran
    _draw_a_figure()
    return _Walk().run()


def _draw_a_figure() -> None:
    """Render a figure to PNG in memory, as a notebook that plots does: what drawing loads (Agg's backend,
    with ``matplotlib.backends.backend_agg.features``, Pillow's ``PIL.features``) is then walked too."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(1, 1))
    figure.add_subplot().plot([0, 1], [1, 0])
    FigureCanvasAgg(figure).print_png(io.BytesIO())
