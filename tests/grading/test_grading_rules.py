"""The grader's reading of a submission's source (transformer_lib.grading.prepare.rules): each construct that
escapes the checks is refused, naming the line; ordinary exercise code is not; a refusal costs its
exercise, and the exercises whose code uses what the refused cell defined, their points (costs)."""
from __future__ import annotations

import copy

import nbformat
import pytest

from repo_paths import REPO
from transformer_lib.grading.grade import bans
from submissions.helpers import as_handed_in
from transformer_lib.grading.prepare.notebook import grade_id, is_check, read, release
from transformer_lib.grading.prepare.submission import restore_checks
from transformer_lib.grading.prepare.costs import exercises, refusals
from transformer_lib.grading.prepare.rules import read_cell

SOURCES = sorted((REPO / "exercises" / "source").glob("*.ipynb"))

REFUSED = {  # one construct per technique a student used to beat the checks from inside the kernel
    "climb the stack": "import sys\nexpected = sys._getframe(1).f_locals['expected']",
    "the frame of a traceback": "try:\n    1 / 0\nexcept Exception as e:\n    f = e.__traceback__.tb_frame.f_back",
    "a generator's frame": "g = (i for i in [1])\nf = g.gi_frame",
    "a thread": "import threading",
    "a thread pool": "from concurrent.futures import ThreadPoolExecutor",
    "a thread, low level": "import _thread",
    "a process": "import multiprocessing",
    "a subprocess": "import subprocess",
    "a fork": "import os\nos.fork()",
    "a shell command": "!ls /",
    "a shell command into a name": "files = !ls",
    "a cell magic": "%%bash\nls",
    "switch the profile watch off": "import sys\nsys.setprofile(None)",
    "torch's switch for function modes": "import torch\nwith torch._C.DisableTorchFunction():\n    pass",
    "torch.ops": "import torch\ny = torch.ops.aten.layer_norm(x, [4])",
    "a wrapper's closure": "original = wrapped.__closure__[0].cell_contents",
    "a function's globals": "g = f.__globals__",
    "a function's code": "c = f.__code__",
    "the garbage collector": "import gc\nobjs = gc.get_objects()",
    "inspect": "import inspect",
    "ctypes": "import ctypes",
    "IPython's hooks": "get_ipython().ast_transformers.append(object())",
    "IPython itself": "from IPython import get_ipython",
    "exec": "exec('x = 1')",
    "eval": "y = eval('1 + 1')",
    "compile": "c = compile('1', 'f', 'eval')",
    "__import__": "m = __import__('os')",
    "importlib": "import importlib",
    "getattr with a computed name": "name = 'cal' + 'ls'\nc = getattr(expert, name)",
    "getattr of a private name": "c = getattr(expert, '_uncounted')",
    "a private attribute": "y = expert._uncounted(x)",
    "a double-underscore attribute": "k = type(x).__subclasses__()",
    "globals()": "g = globals()",
    "vars()": "v = vars(model)",
    "open": "text = open('/proc/1/cmdline').read()",
    "numpy's file reading": "import numpy as np\na = np.loadtxt('x')",
    "torch.load": "import torch\nm = torch.load('x')",
    "the course library": "from transformer_lib.positional import apply_rope",
    "the grading package": "from transformer_lib.grading import checks",
    "a format string that reads attributes": "s = '{0.__class__}'.format(x)",
    "format on a computed string": "s = template.format(x)",
    "a metaclass": "class A(metaclass=M):\n    pass",
    "__torch_function__": "class T:\n    def __torch_function__(self, *a):\n        pass",
    "torch.jit": "import torch\nf = torch.jit.script(g)",
    "a %time line with eval": "%time y = eval('1')",
    "a relative import": "from . import x",
    "import *": "from math import *",
    # what IPython runs is read, and what it cannot run is refused
    "an IPython-only line": "/print 1\nimport sys",
    "%timeit with options": "%timeit -n1 -r1 f(x)",
    "%time with an option": "%time f(x) --no-raise-error",
    "%%timeit with a setup statement": "%%timeit -n1 import sys\ny = f(x)",
    "a help magic": "x?",
    "%matplotlib with a backend": "%matplotlib qt",
    "a cell that is not Python": "def f(:\n    pass",
    "a refusal after blank lines (which IPython drops)": "\n  \nimport sys",
    # the refused attribute names are computed from the allowed modules
    "the interpreter as an attribute": 'import torch\ntorch.sys.modules["builtins"].exec("x = 1")',
    "builtins under another name": "import enum\nrun = enum.bltns.exec",
    "an interpreter module through an alias": "import torch as t\ny = t.os",
    "torch's public switch of its function modes": "import torch\nwith torch.DisableTorchFunction():\n    pass",
    "a setattr by name in functools": "import functools\nfunctools.update_wrapper(a, b, ('detach',))",
    "a module its package imports when asked": "import numpy as np\ny = np.testing",
    "a submodule not walked": "import torch.onnx",
    "a private module": "import torch._dynamo",
    "a refused module imported from its package": "from torch.utils import data",
    "a module closed for what it binds": "from matplotlib import backend_bases",
    # the libraries' objects are not the notebook's to change
    "a library class changed": "import torch\ntorch.Tensor.detach = f",
    "a library class changed through an alias": "import torch\nT = [torch.Tensor][0]\nT.detach = f",
    "a library class changed where it is handed": "import torch\ndef patch(cls):\n    cls.detach = f\npatch(torch.Tensor)",
    "a library function deleted": "import torch.nn.functional as F\ndel F.relu",
    "setattr on a library class": "import torch\nsetattr(torch.Tensor, 'detach', f)",
    "the class of an object": "type(x).detach = f",
    "a library class changed in a loop over it": "import torch\nfor i, T in enumerate([torch.Tensor]):\n    T.detach = f",
}

ALLOWED = {
    "numeric code": "import math\nimport torch\nimport torch.nn.functional as F\nimport numpy as np\n"
                    "y = F.relu(torch.tensor([1.0]))\nz = np.sqrt(2.0) * math.pi",
    "a class with self's private state": "class M(torch.nn.Module):\n    def __init__(self):\n"
                                         "        super().__init__()\n        self._cache = {}\n",
    "getattr with a literal": "w = getattr(layer, 'weight')",
    "a plot": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()",
    "a format literal": "s = '{:.3f}'.format(1.0)",
    "a timing magic": "%timeit f(x)",
    "a function's name": "n = f.__name__",
    "%matplotlib inline": "%matplotlib inline",
    "a plain %time": "%time y = f(x)",
    "a plain %%timeit": "%%timeit\ny = f(x)",
    "IPython's call syntax on a harmless function": "/print 1",
    "attributes of the objects the code made": "import torch\nlayer = torch.nn.Linear(2, 2)\n"
                                                "layer.weight = torch.nn.Parameter(torch.zeros(2, 2))\n"
                                                "x = torch.zeros(2)\nx.grad = None",
    "a library value handed to a constructor": "import torch\ncfg = make(dtype=torch.float32)\ncfg.scale = 2",
    "numpy's random, loaded when asked": "import numpy as np\nr = np.random.default_rng(0)",
    "a library function handed to a helper that changes the notebook's object": (
        "import torch\ndef init(module, fn):\n    module.weight = fn(module.weight)\n"
        "init(layer, torch.nn.init.normal_)"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_each_escape_is_refused_naming_its_line(name):
    found = read_cell(REFUSED[name])
    assert found, f"{name}: not refused"
    lines = REFUSED[name].splitlines()
    for line, code, reason in found:
        assert 1 <= line <= len(lines) and code == lines[line - 1].strip()[:80] and reason


@pytest.mark.parametrize("name", ALLOWED)
def test_ordinary_code_is_not_refused(name):
    assert read_cell(ALLOWED[name]) == []


def test_an_exercise_s_own_bans_are_refused_however_named():
    for code in ("y = F.layer_norm(x, (4,))", "from torch.nn.functional import layer_norm", "n = nn.LayerNorm(4)",
                 "y = x.layer_norm((4,))"):
        assert read_cell(code, ("layer_norm",)), code
    assert read_cell("def layer_norm(x):\n    return x", ("layer_norm",)) == []  # the student's own function


@pytest.mark.parametrize("path", SOURCES, ids=[p.stem[:12] for p in SOURCES])
def test_the_instructor_and_student_notebooks_use_nothing_the_grader_refuses(path):
    instructor = read(path)
    for nb in (restore_checks(instructor, instructor)[0], restore_checks(release(instructor), instructor)[0]):
        assert {g: [str(r) for r in v] for g, v in refusals(nb, instructor, bans()).items() if v} == {}


def test_every_exercise_has_checks_and_the_bans_of_its_judges():
    instructor = read(REPO / "exercises" / "source" / "03_the_transformer_block.ipynb")
    found = exercises(instructor, bans())
    assert [ex.title for ex in found] == ["3.1", "3.2", "3.3"] and all(ex.checks for ex in found)
    assert "layer_norm" in found[0].bans


def _with_cell_after(nb, gid: str, source: str):
    nb = copy.deepcopy(nb)
    index = next(i for i, c in enumerate(nb.cells) if grade_id(c) == gid)
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source))
    return nb


def test_a_refusal_costs_its_exercise_and_where_its_names_are_used():
    instructor = read(REPO / "exercises" / "source" / "02_building_up_attention.ipynb")
    exs = exercises(instructor, bans())
    by_title = {ex.title: ex.checks for ex in exs}
    solved = restore_checks(instructor, instructor)[0]
    # a refused helper in 2.2's part of the notebook: it costs 2.2 only
    nb = _with_cell_after(solved, "stable_softmax", "import sys\ndef helper():\n    return sys.maxsize")
    costs = {g for g, v in refusals(nb, instructor, bans()).items() if v}
    assert costs == set(by_title["2.2"])
    # ... until 2.4's code uses it: then 2.4 loses its points too
    nb = _with_cell_after(nb, "variance_questions", "limit = helper()")
    costs = {g: v for g, v in refusals(nb, instructor, bans()).items() if v}
    assert set(costs) == set(by_title["2.2"]) | set(by_title["2.4"])
    assert "uses helper" in str(costs[by_title["2.4"][0]][0])
    # a refusal before the first exercise costs every exercise
    nb = copy.deepcopy(solved)
    nb.cells.insert(1, nbformat.v4.new_code_cell("import threading"))
    assert all(refusals(nb, instructor, bans()).values())


def test_only_names_a_refused_cell_defines_for_later_cells_carry_its_cost():
    """A function's own locals are not the notebook's names: a later exercise that uses a local of
    the same name, or defines the name again first, keeps its points."""
    instructor = read(REPO / "exercises" / "source" / "02_building_up_attention.ipynb")
    by_title = {ex.title: ex.checks for ex in exercises(instructor, bans())}
    solved = restore_checks(instructor, instructor)[0]
    nb = _with_cell_after(solved, "stable_softmax", "import sys\ndef helper(x):\n    scale = 2\n    return x * scale")
    nb = _with_cell_after(nb, "variance_questions", "def f(d):\n    scale = d ** 0.5\n    return [scale for _ in [1]]\n"
                                                     "g = lambda helper: helper + 1\nhelper = abs\ny = helper(-1)")
    nb = _with_cell_after(nb, "check_variance_divided_by_dk", "z = helper(-2)")  # the new helper
    costs = {g for g, v in refusals(nb, instructor, bans()).items() if v}
    assert costs == set(by_title["2.2"])


def test_exercises_come_from_positions_not_from_ids_the_student_copies():
    """A setup cell carrying the id (or grade_id) of 2.5's solution cell moves nothing: the refused
    code in 2.2's cell costs 2.2, not 2.5."""
    instructor = read(REPO / "exercises" / "source" / "02_building_up_attention.ipynb")
    by_title = {ex.title: ex.checks for ex in exercises(instructor, bans())}
    solved = _with_cell_after(restore_checks(instructor, instructor)[0], "stable_softmax", "import sys")
    later = next(c for c in solved.cells if grade_id(c) == "permuted_mask")
    for copy_key in ("id", "grade_id"):
        nb = copy.deepcopy(solved)
        if copy_key == "id":
            nb.cells[1]["id"] = later["id"]
        else:
            nb.cells[1].metadata["nbgrader"] = {"grade_id": "permuted_mask", "solution": True, "schema_version": 3}
        costs = {g for g, v in refusals(nb, instructor, bans()).items() if v}
        assert costs == set(by_title["2.2"]), (copy_key, costs)


def test_a_check_cell_of_the_student_s_own_is_student_code():
    """A cell marked ``grade: true`` with a grade_id the instructor notebook does not have loses the mark
    when the checks are restored, and is read as the code of the exercise whose check follows it."""
    instructor = read(REPO / "exercises" / "source" / "02_building_up_attention.ipynb")
    by_title = {ex.title: ex.checks for ex in exercises(instructor, bans())}
    nb = _with_cell_after(as_handed_in(instructor), "stable_softmax", "import sys\nlimit = sys.maxsize")
    fake = next(c for c in nb.cells if c.source.startswith("import sys"))
    fake.metadata["nbgrader"] = {"grade": True, "grade_id": "my_own_check", "points": 5, "locked": True,
                                 "schema_version": 3}
    prepared, _ = restore_checks(nb, instructor)
    assert [grade_id(c) for c in prepared.cells if is_check(c)] == [grade_id(c) for c in instructor.cells if is_check(c)]
    costs = {g for g, v in refusals(prepared, instructor, bans()).items() if v}
    assert costs == set(by_title["2.2"])


def test_a_check_cell_that_uses_a_refused_name_costs_its_check():
    """The solution of 2.2 defined in 2.1's part of the notebook by refused code: 2.1 pays for the code,
    and 2.2's check, which calls it, pays too."""
    instructor = read(REPO / "exercises" / "source" / "02_building_up_attention.ipynb")
    by_title = {ex.title: ex.checks for ex in exercises(instructor, bans())}
    nb = restore_checks(instructor, instructor)[0]
    nb.cells = [c for c in nb.cells if grade_id(c) != "stable_softmax"]
    nb = _with_cell_after(nb, "hand_qkv", "import sys\ndef stable_softmax(x, dim=-1):\n    return x")
    costs = {g for g, v in refusals(nb, instructor, bans()).items() if v}
    assert costs == set(by_title["2.1"]) | set(by_title["2.2"])


def test_a_change_to_a_library_class_costs_every_exercise_from_its_own():
    instructor = read(REPO / "exercises" / "source" / "02_building_up_attention.ipynb")
    by_title = {ex.title: ex.checks for ex in exercises(instructor, bans())}
    nb = _with_cell_after(restore_checks(instructor, instructor)[0], "attention", "torch.Tensor.detach = abs")
    costs = {g for g, v in refusals(nb, instructor, bans()).items() if v}
    assert costs == {g for t in ("2.3", "2.4", "2.5") for g in by_title[t]}
