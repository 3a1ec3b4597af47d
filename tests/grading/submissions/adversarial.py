"""Adversarial submissions of the chapter 2 exercises, for the autograder's command-line tests.

``build(folder, pid_file)`` writes them and returns ``{name: (expected score, phrase expected in the
notes, or None for no notes)}``; ``time_limits`` and ``sigterm`` write those of the runs with
their own limits. The maximum score is ``FULL``, the points of the notebook's check cells.
"""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from transformer_lib.grading.prepare.notebook import check_cells, dumps, grade_id, read, release

from .helpers import as_handed_in, substitute
from .wrong import WRONG

REPO = Path(__file__).resolve().parents[3]
SOURCE = REPO / "exercises" / "source" / "02_building_up_attention.ipynb"
FULL = sum(cell.metadata["nbgrader"]["points"] for _, cell in check_cells(read(SOURCE)))
GRADE_IDS = [grade_id(c) for _, c in check_cells(read(SOURCE))]

# Submission A of the audit: the student's own answers are wrong, and a cell re-points every
# check at the real one, called with correct answers computed here (so the records would be right).
SMART_PATCH = '''
import math, torch
from transformer_lib.grading import checks as _c
_X = torch.tensor([[1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 0, 1]], dtype=torch.float64)
_WQ = torch.tensor([[1, 0], [0, 1], [1, 0], [0, 1]], dtype=torch.float64)
_WK = torch.tensor([[0, 1], [1, 0], [0, 1], [1, 1]], dtype=torch.float64)
_Q, _K = _X @ _WQ, _X @ _WK
_S = _Q @ _K.T
_A = torch.softmax(_S / math.sqrt(2), -1)

def _softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)

def _attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    a = _softmax(s)
    return a @ v, a

_real = {n: getattr(_c, n) for n in dir(_c) if n.startswith("check_")}
_good = {
    "check_hand_qkv": lambda *a, **k: _real["check_hand_qkv"](_Q, _K, _Q),
    "check_hand_scores": lambda *a, **k: _real["check_hand_scores"](_S, False),
    "check_hand_weights": lambda *a, **k: _real["check_hand_weights"](_A, _A @ _Q, 1.0),
    "check_stable_softmax": lambda fn, *a, **k: _real["check_stable_softmax"](_softmax, *a, **k),
    "check_attention": lambda fn, *a, **k: _real["check_attention"](_attention, *a, **k),
    "check_masked_attention": lambda fn, *a, **k: _real["check_masked_attention"](_attention, *a, **k),
    "check_score_std": lambda fn, *a, **k: _real["check_score_std"](lambda d: math.sqrt(d), *a, **k),
    "check_score_range": lambda fn, *a, **k: _real["check_score_range"](
        lambda d: (-2 * math.sqrt(d), 2 * math.sqrt(d)), *a, **k),
    "check_variance_divided_by_dk": lambda fn, *a, **k: _real["check_variance_divided_by_dk"](
        lambda d: 1 / d, *a, **k),
}
'''
PATCH_ATTRIBUTES = SMART_PATCH + '''
for _n, _f in _good.items():
    setattr(_c, _n, _f)
'''
PATCH_SYS_MODULES = SMART_PATCH + '''
import sys, types
import transformer_lib.grading as _package
_fake = types.ModuleType("transformer_lib.grading.checks")
_fake.__dict__.update({**vars(_c), **_good})
sys.modules["transformer_lib.grading.checks"] = _package.checks = _fake
'''

# Exfiltration of the hidden tests through the feedback: the check cell's source (_ih[-1]),
# plain, reversed, base64-encoded, or as the name of an exception class. (Hidden tests now hold no
# inputs, which are drawn at grade time; the messages must still carry no text of the kernel's.)
EXFILTRATE = {
    "stable_softmax": "raise AssertionError('\\n'.join(_ih[-1:]))",
    "variance_questions#0": "raise AssertionError(_ih[-1][::-1])",
    "variance_questions#1": "import base64\nraise AssertionError(base64.b64encode(_ih[-1].encode()).decode())",
    "variance_questions#2": "raise type(''.join(c if c.isalnum() else '_' for c in _ih[-1])[-120:], "
                            "(AssertionError,), {})('x')",
}

def forge_events(check_cell: int) -> str:
    """A cell that writes forged lines into the worker's events file: malformed, mistyped, and an
    event without a status for the check cell at index ``check_cell``, written before that check
    runs (so the real event, written later, decides)."""
    return f'''
import json, os
_events = os.path.join(os.readlink(f"/proc/{{os.getppid()}}/cwd"), "events.jsonl")
with open(_events, "a") as fh:
    for line in ["[1, 2]", "not json", json.dumps({{"cell": "x", "status": 5}}),
                 json.dumps({{"cell": 10**30, "timed_out": True}}), json.dumps({{"dead": "soon"}}),
                 json.dumps({{"cell": 1, "status": ["ok"], "ename": 7, "timed_out": "yes"}}),
                 json.dumps({{"cell": {check_cell}, "grade_id": "check_attention"}})]:
        fh.write(line + "\\n")
'''


def daemons(pid_file: Path) -> str:
    """A cell that leaves processes behind, and writes their pids to ``pid_file``: a setsid
    daemon, one with an empty environment (no grading token), and a double-forked one that also
    clears its environment. The cell ends only once all three have written their pids (else,
    on a busy machine, the worker could kill the last one before it wrote, and the test would
    count two)."""
    return f'''
import subprocess, sys
_pids = [subprocess.Popen(["setsid", "sleep", "300"]).pid,
         subprocess.Popen(["setsid", "sleep", "301"], env={{}}).pid]
_code = "import os, sys, time\\nif os.fork(): os._exit(0)\\nos.setsid()\\n" \\
        "open(sys.argv[1], 'a').write(f'{{os.getpid()}}\\\\n')\\ntime.sleep(302)"
subprocess.Popen([sys.executable, "-c", _code, {str(pid_file)!r}], env={{}}, start_new_session=True)
with open({str(pid_file)!r}, "a") as fh:
    fh.write("".join(f"{{pid}}\\n" for pid in _pids))
import time
_until = time.monotonic() + 60  # on a busy machine the double-forked daemon may take a while to start
while len(open({str(pid_file)!r}).read().split()) < 3 and time.monotonic() < _until:
    time.sleep(0.05)
'''


SIGTERM_GRADER = '''
import os, signal
with open(f"/proc/{os.getppid()}/stat") as fh:  # the kernel's parent is the worker; its parent the grader
    os.kill(int(fh.read().rsplit(")", 1)[1].split()[1]), signal.SIGTERM)
'''


WRONG_BUT_DEFINED = {
    "hand_qkv": "Q = K = V = torch.zeros(3, 2)", "hand_scores": "S = torch.zeros(3, 3)\nS_symmetric = True",
    "hand_weights": "A = Z = torch.zeros(3, 3)\nA_row_sum = 0.0", "stable_softmax": "return x",
    "attention": "return V, Q", "variance_questions#0": "return 0.0",
    "variance_questions#1": "return (0.0, 0.0)", "variance_questions#2": "return 0.0",
}


def _index(nb, gid: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if grade_id(c) == gid)


def _insert_after(nb, gid: str, source: str):
    nb = copy.deepcopy(nb)
    nb.cells.insert(_index(nb, gid) + 1, nbformat.v4.new_code_cell(source))
    return nb


def _prepend_to(nb, gid: str, source: str):
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb.cells if grade_id(c) == gid)
    cell.source = source + "\n" + cell.source
    return nb


def build(folder: Path, pid_file: Path) -> dict[str, tuple[float, str | None]]:
    """Write the submissions into ``folder``; return the expected score and note per output name.
    The daemons submission writes the pids of the processes it leaves behind to ``pid_file``."""
    source = read(SOURCE)
    correct = as_handed_in(source)
    wrong = as_handed_in(substitute(source, WRONG_BUT_DEFINED))
    subs: dict[str, tuple[object, float, str | None]] = {
        "correct": (correct, FULL, None),
        "blank": (release(source), 0, None),
        "kernel_dies": (_prepend_to(correct, "attention", "import os\nos._exit(1)"), 6, "kernel died"),
        "print_million_lines": (_prepend_to(correct, "stable_softmax",
                                            'print("\\n".join(str(i) for i in range(10**6)))'), FULL, "was cut"),
        "warnings": (_prepend_to(correct, "attention",
                                 "import warnings\nwarnings.warn('a harmless warning')"), FULL, None),
        "hard_coded": (as_handed_in(substitute(source, WRONG["02_building_up_attention"][
            "score std hard-coded to the visible answer"][0])), FULL - 1, None),
        "exfiltrate_hidden_tests": (as_handed_in(substitute(source, EXFILTRATE)), FULL - 5, None),
        "monkeypatch_checks": (_insert_after(wrong, "setup", PATCH_ATTRIBUTES), 0, None),
        "monkeypatch_sys_modules": (_insert_after(wrong, "setup", PATCH_SYS_MODULES), 0, None),
        # Both need os, open or subprocess, which the grader refuses: before the first exercise, that costs
        # every exercise. They still run, and the run must survive them (the messages say "passed").
        "forged_events": (_insert_after(correct, "setup", forge_events(1 + _index(correct, "check_attention"))),
                          0, None),
        "daemons": (_insert_after(correct, "setup", daemons(pid_file)), 0, None),
    }
    naive = as_handed_in(substitute(source, WRONG["02_building_up_attention"]["naive softmax that overflows"][0]))
    for cell in naive.cells:
        if grade_id(cell) == "check_stable_softmax":
            cell.source = "pass"
    subs["check_edited_to_pass"] = (naive, FULL - 2, "was modified")
    after = as_handed_in(substitute(source, WRONG["02_building_up_attention"][
        "attention mask applied after the softmax"][0]))
    after.cells = [c for c in after.cells if grade_id(c) != "check_masked_attention"]
    subs["check_deleted"] = (after, FULL - 1, "was missing")
    expected = {}
    for name, (nb, score, note) in subs.items():
        (folder / f"{name}.ipynb").write_text(dumps(nb), encoding="utf-8")
        expected[name] = (score, note)
    (folder / "not_json.ipynb").write_bytes(b"\x00this is not a notebook {")
    expected["not_json"] = (0, "not valid JSON")
    # Files whose output folders would collide (with each other, or with grades.csv).
    for file, name in [("json_not_notebook", "json_not_notebook"), ("grades.csv", "grades.csv-2"),
                       ("a b", "a_b"), ("a_b-2", "a_b-2"), ("a_b", "a_b-3")]:  # in sorted file order
        (folder / f"{file}.ipynb").write_text('{"hello": [1, 2, 3]}', encoding="utf-8")
        expected[name] = (0, "not a notebook")
    return expected


def time_limits(folder: Path, victim: int) -> dict[str, tuple[float, str]]:
    """Submissions for a run with short limits: an interruptible infinite loop, and a loop that
    swallows KeyboardInterrupt (only the notebook time limit stops it) after writing a forged
    ``kernel_pid`` event naming ``victim``, an unrelated process the grader must not kill."""
    source = read(SOURCE)
    loop = as_handed_in(substitute(source, {"stable_softmax": "import time\nwhile True:\n    time.sleep(0.01)"}))
    forge = ('import json, os\ntry:  # in the sandbox the worker\'s /proc entry is not readable\n'
             '    with open(os.path.join(os.readlink(f"/proc/{os.getppid()}/cwd"), "events.jsonl"), "a") as fh:\n'
             f'        fh.write(json.dumps({{"kernel_pid": {victim}}}) + "\\n")\nexcept OSError:\n    pass\n')
    hang = _prepend_to(as_handed_in(source), "stable_softmax", forge + "import time\nwhile True:\n    try:\n"
                       "        time.sleep(0.1)\n    except KeyboardInterrupt:\n        pass")
    (folder / "loop_forever.ipynb").write_text(dumps(loop), encoding="utf-8")
    (folder / "ignores_interrupts.ipynb").write_text(dumps(hang), encoding="utf-8")
    return {"loop_forever": (FULL - 2, "interrupted"), "ignores_interrupts": (4, "was stopped")}


def sigterm(folder: Path) -> None:
    """A correct submission, then one that sends SIGTERM to the grader (graded one at a time)."""
    source = read(SOURCE)
    (folder / "a_correct.ipynb").write_text(dumps(as_handed_in(source)), encoding="utf-8")
    (folder / "b_sigterm.ipynb").write_text(dumps(_insert_after(release(source), "setup", SIGTERM_GRADER)),
                                            encoding="utf-8")
