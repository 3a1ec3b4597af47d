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
