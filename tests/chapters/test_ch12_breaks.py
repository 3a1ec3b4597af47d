"""The appendix "what the FLOPs buy": each check cell fails when the code it guards is broken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import check_fails_when_broken, uncovered_check_cells

SCA = "appendix_scaling"
LAST = "CHINCHILLA_A, KAPLAN_A = "  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none


# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line
#        [, [(module, name, make_broken), ...] library patches]).
# The last cell of the list is the check cell; the ones before it define what it uses.
BROKEN = {
    "S N: the position table counted in N": (
        SCA, [("lib:transformer_lib.scaling:non_embedding_params", [('- parts["embedding"] - parts["positional"]',
                                                                    '- parts["embedding"]')]),
              ("def n_from_scratch(d", [])],
        "assert n_from_scratch(d) == non_embedding_params(config)"),
    "S 6N: the token table counted in N": (
        SCA, [("lib:transformer_lib.scaling:non_embedding_params", [('- parts["embedding"] - parts["positional"]',
                                                                    '- parts["positional"]')]),
              ("config = sweep_config(32)", [])],
        "assert counted == tokens * (6 * N"),
    "S rerun: D computed as C/(2N)": (
        SCA, [("lib:transformer_lib.scaling:steps_for", [("budget / (6 * n_params)", "budget / (2 * n_params)")]),
              ("TOL = 0.005", [])],
        'assert all(p["steps"] == sweep["steps"][i]'),
    "S minima: the fit ignores every seed but the first": (
        SCA, [("lib:transformer_lib.scaling:isoflop_optima", [(
            'rows = np.arange(len(sweep["budget"])) if rows is None else np.asarray(rows)',
            'rows = np.flatnonzero(sweep["seed"] == 0) if rows is None else np.asarray(rows)')]),
              ("room, between, outside = [], [], []", [])],
        "assert min(own) < n_c < max(own)"),
    "S papers: the power law fitted the wrong way round (log C on log N)": (
        SCA, [("lib:transformer_lib.scaling:power_law", [(
            "np.polyfit(np.log(np.asarray(budgets, float)), np.log(np.asarray(values, float)), 1)",
            "np.polyfit(np.log(np.asarray(values, float)), np.log(np.asarray(budgets, float)), 1)")]),
              ("a, k_n = power_law(budgets, n_opt)", []), ("CHINCHILLA_A, KAPLAN_A = ", [])],
        "assert 0 < a_low - KAPLAN_A < 0.1"),
    "S surface: N_opt's exponent α/(α+β) instead of β/(α+β)": (
        SCA, [("lib:transformer_lib.scaling:parametric_optimum", [(
            '(require_positive("budget", budget) / 6) ** (beta / (alpha + beta))',
            '(require_positive("budget", budget) / 6) ** (alpha / (alpha + beta))')]),
              ("fit = parametric_fit(", [])],
        "assert all(0.75 < q / p < 1.35"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a broken cell may meet a nan
@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(SCA, BROKEN) == []
