"""The chapter 12 checks: their copy of the committed sweep is the CSV's, and every input they draw
for the hidden tests is one the course library can fit (the instructor's run must pass on every
grading seed) (Chapter 12)."""
from __future__ import annotations

import numpy as np
import pytest

from transformer_lib.grading import checks
from transformer_lib.grading.protocol import SEED_ENV
from transformer_lib.grading.checks import ch12_scaling
from transformer_lib.scaling import isoflop_optima, peak_lr, read_sweep


def test_the_checks_copy_of_the_sweep_is_the_committed_csv():
    _, committed = read_sweep()
    ours = checks.SCALING_SWEEP
    for key in ("budget", "d_model", "n_params", "seed", "val_loss"):
        assert np.array_equal(ours[key], committed[key]), key
    assert np.allclose(ours["peak_lr"], [peak_lr(int(d)) for d in committed["d_model"]], rtol=1e-12)


def test_the_exercise_notebook_s_tables_are_the_checks_tables():
    """The setup cell holds the sweep as data (under grading only check cells load the checks)."""
    import json

    from repo_paths import REPO
    nb = json.loads((REPO / "exercises" / "source" / "appendix_scaling.ipynb").read_text(encoding="utf-8"))
    setup = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "setup")
    namespace: dict = {}
    exec("".join(setup["source"]), namespace)
    for mine, theirs in ((namespace["sweep"], checks.SCALING_SWEEP), (namespace["flawed"], checks.LR_FLAWED_SWEEP)):
        assert mine.keys() == theirs.keys()
        for key in theirs:
            assert np.allclose(mine[key], theirs[key], rtol=1e-12, atol=0), key


def test_the_flawed_sweep_handicaps_every_width_but_the_one_its_rate_suits():
    extra = checks.LR_FLAWED_SWEEP["val_loss"] - checks.SCALING_SWEEP["val_loss"]
    suited = checks.SCALING_SWEEP["d_model"] == 128
    assert np.all(extra[suited] == 0) and np.all(extra[~suited] > 0)
    assert np.all(np.diff([extra[checks.SCALING_SWEEP["d_model"] == d][0] for d in (8, 16, 32, 64)]) < 0)


@pytest.mark.parametrize("seed", range(12))
def test_every_hidden_sweep_can_be_fitted(seed, monkeypatch):
    monkeypatch.setenv(SEED_ENV, f"test{seed}")
    seen = []

    def keep(name, fn, cases, run, hidden):
        seen.extend(cases)

    monkeypatch.setattr(ch12_scaling, "run_check", keep)
    checks.check_compute_optimal(None, hidden=1)
    checks.check_lr_flaw(None, hidden=1)
    sweeps = [c["sweep"] for c in seen if "sweep" in c]
    sweeps += [s for c in seen if "good" in c for s in (c["good"], c["flawed"])]
    assert len(sweeps) == 3 + 2 * 2
    for sweep in sweeps:
        budgets, n_opt, _ = isoflop_optima(sweep)                # raises if a parabola has no minimum
        assert len(budgets) == 4 and np.all(np.isfinite(n_opt)) and np.all(n_opt > 0)


def _script():
    import importlib.util

    from repo_paths import REPO
    spec = importlib.util.spec_from_file_location("sweep_tables", REPO / "scripts" / "sweep_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _block(text: str) -> dict:
    """The ``_COMMITTED``/``LOSSES`` dictionary a text holds, read as a Python literal."""
    import ast
    import re

    m = re.search(r"^[ ]*(?:_COMMITTED|LOSSES) = (\{.*?\n[ ]*\})\n", text, re.S | re.M)
    return ast.literal_eval(m.group(1))


def test_scripts_sweep_tables_rewrites_both_copies_from_another_sweep(tmp_path):
    """scripts/sweep_tables.py (what `make scaling` runs after the sweep) leaves the committed copies as
    they are, and from a CSV with other losses writes copies that hold exactly those losses."""
    import json

    from repo_paths import REPO
    script = _script()
    assert script.updated() == {}
    lines = (REPO / "chapters" / "data" / "scaling_sweep.csv").read_text().splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("budget,"))
    other = tmp_path / "sweep.csv"
    other.write_text("\n".join(lines[:header + 1] + [  # every loss moved, by a different amount each
        ",".join(f"{float(v) + 0.001 * i:.6f}" if k == 9 else v for k, v in enumerate(ln.split(",")))
        for i, ln in enumerate(lines[header + 1:])]) + "\n")
    _, sweep = read_sweep(other)
    expected = {}
    for c, d, loss in zip(sweep["budget"], sweep["d_model"], sweep["val_loss"]):
        expected.setdefault(float(c), {}).setdefault(int(d), []).append(float(loss))
    changes = script.updated(csv_path=other)
    assert set(changes) == {REPO / script.CHECKS, REPO / script.EXERCISE}
    notebook = json.loads(changes[REPO / script.EXERCISE])
    for text in (changes[REPO / script.CHECKS], *("".join(c["source"]) for c in notebook["cells"]
                                                    if "LOSSES = {" in "".join(c["source"]))):
        assert {c: {d: list(s) for d, s in w.items()} for c, w in _block(text).items()} == expected
