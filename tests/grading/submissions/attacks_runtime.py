"""Submissions that attack what happens while the notebook runs: the watch, the records, the hidden
inputs, the judges and the grader's own machine (the runtime side of the checks).

``CHAPTER_2`` are chapter-2 submissions for ``test_grading_runtime.py`` (one sandboxed grading run):
each name maps to ``(build, attacked, listed)``: ``build(instructor)`` returns the notebook as handed
in, ``attacked`` the checks it must score 0 on (every other check earns its points), ``listed`` whether
the class report must list it among the refused constructs. ``ATTACKS`` adds attacks on other
chapters to the runs of ``test_grading_notebooks.py`` (same format as ``submissions/attacks.py``).
Each attack is one of a class the grader must close, the example that was measured or a variant.
"""
from __future__ import annotations

import copy

import nbformat

from transformer_lib.grading.prepare.notebook import grade_id

from .helpers import as_handed_in, substitute

LATER = {"check_stable_softmax", "check_attention", "check_masked_attention", "check_score_std",
         "check_score_range", "check_variance_divided_by_dk", "check_permuted_mask"}  # 2.2 and after

# ---------------------------------------------------------------- work done after the watch

# The measured example: the function returns zeros and rebinds torch.Tensor.detach, which fills them
# with torch.softmax when the recorder detaches the result.
REBIND_DETACH = '''
state = {"out": torch.zeros_like(x), "x": x, "dim": dim}
original = torch.Tensor.detach

def detach(self, *args, **kwargs):
    if state.get("out") is self:
        self.copy_(torch.softmax(state["x"], state["dim"]))
    return original(self, *args, **kwargs)

torch.Tensor.detach = detach
return state["out"]
'''

# A variant: a subclass of torch.Tensor whose clone, the method a recorder copies a result with,
# computes the softmax only when it is read.
LAZY_SUBCLASS = '''
class Lazy(torch.Tensor):
    def clone(self, *args, **kwargs):
        return torch.softmax(x, dim)

return torch.zeros_like(x).as_subclass(Lazy)
'''

# ---------------------------------------------------------------- a banned result under another name

CROSS_ENTROPY = '''
import torch.nn.functional as F

moved = x.movedim(dim, -1)
n = moved.shape[-1]
rows = moved.reshape(-1, n)
targets = torch.arange(n).repeat(rows.shape[0])
p = torch.exp(-F.cross_entropy(rows.repeat_interleave(n, dim=0), targets, reduction="none"))
return p.reshape(moved.shape).movedim(-1, dim)
'''

# A variant: the logsumexp as the last entry of a cumulative one.
LOGCUMSUMEXP = '''
return torch.exp(x - x.logcumsumexp(dim).narrow(dim, x.shape[dim] - 1, 1))
'''

# ---------------------------------------------------------------- records written before the real ones

# Each call also writes a record of its own, named to sort ahead of the check's, holding the softmax
# torch computes (which the watch notes in the check's own record).
FORGED_RECORDS = '''
import json, os
import numpy as np

out = torch.softmax(x, dim)
folder = os.path.join(os.getcwd(), "..", "records")
meta = {"check": "stable_softmax", "hidden": 0, "cases": [{}], "outs": [{"out": {"$tensor": "a0", "dtype": "float32"}}]}
for name in ("000-stable_softmax.npz", "000-aaa.npz", "001-aaa.npz"):
    np.savez(os.path.join(folder, name), __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
             a0=out.float().numpy())
return torch.zeros_like(x)
'''

# ---------------------------------------------------------------- the hidden inputs read ahead

# The measured example: the grading seed read from the environment, the hidden inputs regenerated at
# top level (as the checks draw them) and answered from a table computed there, unwatched.
SEED_TABLE = '''
import hashlib

_seed = torch.os.environ.get("TRANSFORMER_LIB_GRADING_SEED", "0")
_g = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(f"{_seed}/stable_softmax/1".encode()).digest()[:8],
                                                  "big") >> 1)
_draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=_g))
_shape = (_draw(1, 3), _draw(2, 6), _draw(2, 6))
_x1 = (400 * torch.randn(*_shape, generator=_g, dtype=torch.float64)).float()
_d1 = _draw(-3, 2)
_x2 = -1e4 + torch.randn(_draw(2, 5), _draw(2, 5), generator=_g, dtype=torch.float64)
_d2 = _draw(0, 1)
_visible = torch.tensor([[1.0, 2.0, 3.0], [1000.0, 999.0, -5.0]])
TABLE = {(t.numpy().tobytes(), d): torch.softmax(t, d) for t, d in ((_x1, _d1), (_x2, _d2), (_visible, -1))}
'''
TABLE_LOOKUP = '''
return TABLE.get((x.numpy().tobytes(), dim), torch.zeros_like(x))
'''

# A variant: ask the kernel's watch for the secrets of a check cell that has not run yet, as its loader does.
ASK_THE_WATCH = '''
_box = []

def _grading_watch_secrets(cell="check_permuted_mask", box=_box):
    return None

_grading_watch_secrets.__code__
'''

# ---------------------------------------------------------------- the judge's own code

JUDGE_IMPORT = '''
from transformer_lib.grading.judges.ch02_attention import _stable_softmax  # the judge of 2.2
'''

# ---------------------------------------------------------------- harm to the grader

# 100 record files of about 20 kB, each a 20 MB array once read, named to sort ahead of the check's.
ZIP_BOMBS = '''
import os
import numpy as np

folder = os.path.join(os.getcwd(), "..", "records")
for i in range(100):
    np.savez_compressed(os.path.join(folder, f"{i:03d}-permuted_mask.npz"), a0=np.zeros(2_500_000))
return mask[perm][:, perm]
'''

# 800 MB through ndarray.dump into the kernel's working folder (on the host's disk, it was).
DUMP_800_MB = '''
import numpy as np

try:
    np.zeros(100_000_000).dump("big.npy")
except (OSError, MemoryError):
    pass
else:
    raise RuntimeError("wrote 800 MB")
'''

# A variant: the worker's folder, which is on the host's disk, found through /proc (where a grader that is
# root runs the worker as a user of its own, /proc does not show it).
FILL_THE_WORKERS_FOLDER = '''
import os

try:
    _folder = os.readlink(f"/proc/{os.getppid()}/cwd")
    for _i in range(4):
        with open(os.path.join(_folder, f"fill{_i}"), "wb") as _fh:
            _fh.write(bytes(50 * 2**20))
except OSError:
    pass
'''

# Markup in the reports: an image tag with a script in a refused line, and a cell labelled with kilobytes of it.
HTML = "<img src=x onerror=alert(document.domain)>"
REFUSED_HTML = f'''
try:
    open("{HTML}")
except OSError:
    pass
'''


def _prepend(nb, gid: str, code: str):
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb.cells if grade_id(c) == gid)
    cell.source = code.strip("\n") + "\n" + cell.source
    return nb


def _labelled(nb):
    """A last cell, labelled with 6 kB of markup, whose output is cut (so that a note names it)."""
    nb = copy.deepcopy(nb)
    cell = nbformat.v4.new_code_cell('print("x" * 30000)')
    cell.metadata["nbgrader"] = {"grade_id": HTML * 150, "solution": True, "grade": False, "locked": False}
    nb.cells.append(cell)
    return nb


def _solved(edits: dict[str, str]):
    return lambda nb: as_handed_in(substitute(nb, edits))


def _before(gid: str, code: str, edits: dict[str, str] | None = None):
    return lambda nb: _prepend(as_handed_in(substitute(nb, edits or {})), gid, code)


def _harm(nb):
    """The zip bombs written by 2.5's function, 800 MB dumped, the worker's folder filled and markup
    refused at the top of its cell, and a last cell labelled with kilobytes of markup."""
    nb = _before("permuted_mask", DUMP_800_MB + FILL_THE_WORKERS_FOLDER + REFUSED_HTML, {"permuted_mask": ZIP_BOMBS})(nb)
    return _labelled(nb)


# name: (build, the checks it scores 0 on, what the class report says of it, each in a row with cell and line;
# where the grader's reading refuses a line the watch noted too, the report lists the line once)
CHAPTER_2 = {
    "rebind_detach": (_solved({"stable_softmax": REBIND_DETACH}), LATER, ["torch.Tensor.detach was replaced"]),
    "lazy_subclass_judge_import": (
        lambda nb: _before("variance_questions", JUDGE_IMPORT, {"stable_softmax": LAZY_SUBCLASS})(nb),
        {"check_stable_softmax", "check_score_std", "check_score_range", "check_variance_divided_by_dk"},
        ["runs code of its own while the check reads the result", "ch02_attention import _stable_softmax"]),
    "cross_entropy_softmax": (_solved({"stable_softmax": CROSS_ENTROPY}), {"check_stable_softmax"},
                              ["aten._log_softmax"]),
    "logcumsumexp_softmax": (_solved({"stable_softmax": LOGCUMSUMEXP}), {"check_stable_softmax"}, ["logcumsumexp"]),
    "forged_records": (_solved({"stable_softmax": FORGED_RECORDS}), {"check_stable_softmax"}, ["savez"]),
    "seed_table": (_before("stable_softmax", SEED_TABLE, {"stable_softmax": TABLE_LOOKUP}), {"check_stable_softmax"},
                   ["environ"]),
    "ask_the_watch": (_before("permuted_mask", ASK_THE_WATCH), {"check_permuted_mask"}, ["__code__"]),
    "harm": (_harm, {"check_permuted_mask"}, ["savez_compressed", "wrote a file (open big.npy)", "open(",
                                              "onerror=alert"]),
}

# ---------------------------------------------------------------- other chapters (test_grading_notebooks.py)

ATTACKS: dict[str, dict[str, tuple[dict[str, str], set[str]]]] = {
    "06_positional_information": {
        "the judge's reference imported": ({"alibi_slopes": """
            from transformer_lib.grading.judges.ch06_positional import _bloom
            return torch.tensor(_bloom(H), dtype=torch.float64)
            """}, {"check_alibi_slopes"}),
    },
    "08_mixture_of_experts": {
        "a derivative by finite differences": ({"balancing_grad": """
            T, E = logits.shape
            z0 = logits.double()
            f = torch.bincount(expert_index.reshape(-1), minlength=E).double() / expert_index.numel()

            def loss(z):
                return E * (f * torch.softmax(z, -1).mean(0)).sum()

            grad = torch.zeros_like(z0)
            steps = (1, 2, 3, 4)
            weights = (4 / 5, -1 / 5, 4 / 105, -1 / 280)  # the eighth-order central difference
            h = 1e-3
            for t in range(T):
                for e in range(E):
                    for s, w in zip(steps, weights):
                        up, down = z0.clone(), z0.clone()
                        up[t, e] += s * h
                        down[t, e] -= s * h
                        grad[t, e] += w * (loss(up) - loss(down)) / h
            return grad
            """}, {"check_balancing_grad"}),
    },
}
