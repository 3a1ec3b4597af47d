"""Adversarial submissions of the chapter 2 exercises, for the autograder's command-line tests.

``build(folder)`` writes them and returns ``{name: (expected score, phrase expected in the notes,
or None for no notes)}``. The maximum score is 12.
"""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from transformer_lib.grading.notebook import dumps, grade_id, read, release

from .helpers import as_handed_in, substitute
from .wrong import WRONG

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "exercises" / "source" / "02_building_up_attention.ipynb"

PATCH_CHECKS = '''
import os, numpy as np
from transformer_lib.grading import checks

def _fake(*args, **kwargs):
    folder = os.environ.get("TRANSFORMER_LIB_GRADING_RECORD_DIR")
    if folder:
        np.savez(os.path.join(folder, "00-fake.npz"), out=np.zeros(3))
    print("✓ looks fine")

for _name in dir(checks):
    if _name.startswith("check_"):
        setattr(checks, _name, _fake)
_fake()
'''

WRONG_BUT_DEFINED = {
    "hand_qkv": "Q = K = V = torch.zeros(3, 2)", "hand_scores": "S = torch.zeros(3, 3)",
    "hand_weights": "A = Z = torch.zeros(3, 3)", "stable_softmax": "return x",
    "attention": "return V, Q", "variance_questions#0": "return 0.0",
    "variance_questions#1": "return (0.0, 0.0)", "variance_questions#2": "return 0.0",
}


def _insert_after(nb, gid: str, source: str):
    nb = copy.deepcopy(nb)
    pos = next(i for i, c in enumerate(nb.cells) if grade_id(c) == gid)
    nb.cells.insert(pos + 1, nbformat.v4.new_code_cell(source))
    return nb


def _prepend_to(nb, gid: str, source: str):
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb.cells if grade_id(c) == gid)
    cell.source = source + "\n" + cell.source
    return nb


def build(folder: Path) -> dict[str, tuple[float, str | None]]:
    """Write the submissions into ``folder``; return the expected score and note per name."""
    source = read(SOURCE)
    correct = as_handed_in(source)
    subs: dict[str, tuple[object, float, str | None]] = {
        "correct": (correct, 12, None),
        "blank": (release(source), 0, None),
        "loop_forever": (as_handed_in(substitute(source, {"stable_softmax": "while True:\n    pass"})),
                         10, "interrupted"),
        "kernel_dies": (_prepend_to(correct, "attention", "import os\nos._exit(1)"), 6, "kernel died"),
        "print_million_lines": (_prepend_to(correct, "stable_softmax",
                                            'print("\\n".join(str(i) for i in range(10**6)))'), 12, "was cut"),
        "warnings": (_prepend_to(correct, "attention",
                                 "import sys, warnings\nwarnings.warn('a harmless warning')\n"
                                 "print('to stderr', file=sys.stderr)"), 12, None),
        "hard_coded": (as_handed_in(substitute(source, WRONG["02_building_up_attention"][
            "score std hard-coded to the visible answer"][0])), 11, None),
        "exfiltrate_hidden_tests": (as_handed_in(substitute(source, {"variance_questions#0": (
            "raise AssertionError('\\n'.join(_ih[-1:]))")})), 11, None),
        "monkeypatch_checks": (_insert_after(as_handed_in(substitute(source, WRONG_BUT_DEFINED)), "setup",
                                             PATCH_CHECKS), 0, "do not match"),
    }
    naive = as_handed_in(substitute(source, WRONG["02_building_up_attention"]["naive softmax that overflows"][0]))
    for cell in naive.cells:
        if grade_id(cell) == "check_stable_softmax":
            cell.source = "pass"
    subs["check_edited_to_pass"] = (naive, 10, "was modified")
    after = as_handed_in(substitute(source, WRONG["02_building_up_attention"][
        "attention mask applied after the softmax"][0]))
    after.cells = [c for c in after.cells if grade_id(c) != "check_masked_attention"]
    subs["check_deleted"] = (after, 11, "was missing")
    expected = {}
    for name, (nb, score, note) in subs.items():
        (folder / f"{name}.ipynb").write_text(dumps(nb), encoding="utf-8")
        expected[name] = (score, note)
    (folder / "not_json.ipynb").write_bytes(b"\x00this is not a notebook {")
    expected["not_json"] = (0, "not valid JSON")
    (folder / "json_not_notebook.ipynb").write_text('{"hello": [1, 2, 3]}', encoding="utf-8")
    expected["json_not_notebook"] = (0, "not a notebook")
    return expected


def ignores_interrupts(folder: Path) -> Path:
    """A submission whose loop swallows KeyboardInterrupt: only the notebook time limit stops it."""
    source = read(SOURCE)
    nb = _prepend_to(as_handed_in(source), "stable_softmax",
                     "import time\nwhile True:\n    try:\n        time.sleep(0.1)\n"
                     "    except KeyboardInterrupt:\n        pass")
    path = folder / "ignores_interrupts.ipynb"
    path.write_text(dumps(nb), encoding="utf-8")
    return path
