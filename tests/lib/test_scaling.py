"""transformer_lib.scaling: the sweep's definition, its fits, and the committed sweep.

Cheap by design: the trainings here are a few dozen steps, or one committed point rerun (the
appendix reruns two others). The claims the appendix makes about the sweep are tested on the
committed CSV seed by seed, so they hold for each seed's points, not only for their pool."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from transformer_lib.config import ModelConfig
from transformer_lib.corpus import shakespeare_ids
from transformer_lib.counting import count_params
from transformer_lib.model import GPT
from transformer_lib.scaling import (BATCH, CONTEXT, DEFAULT_OUT, PLAN, WIDTHS, bootstrap_exponents,
                                     isoflop_minimum, isoflop_optima, non_embedding_params, peak_lr,
                                     plan_points, power_law, read_sweep, steps_for, sweep_config,
                                     train_point)

TOKENS_PER_STEP = BATCH * CONTEXT


@pytest.fixture(scope="module")
def ids():
    return shakespeare_ids()


@pytest.fixture(scope="module")
def sweep():
    return read_sweep(DEFAULT_OUT)


# --- the definition of a point

@pytest.mark.parametrize("d", WIDTHS)
def test_n_counts_every_parameter_but_the_token_and_position_tables(d):
    config = sweep_config(d)
    with torch.device("meta"):
        model = GPT(config)
    tables = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    assert non_embedding_params(config) == count_params(model) - tables
    # Kaplan's 12·L·d², plus the norms' gains: two per block and the final one
    assert non_embedding_params(config) == 12 * config.n_layers * d * d + (2 * config.n_layers + 1) * d


def test_steps_give_c_over_6n_tokens_to_half_a_step():
    for budget, (widths, _) in PLAN.items():
        for d in widths:
            n = non_embedding_params(sweep_config(d))
            assert abs(steps_for(budget, n) * TOKENS_PER_STEP - budget / (6 * n)) <= TOKENS_PER_STEP / 2


def test_the_learning_rate_shrinks_with_width_from_the_labs():
    assert peak_lr(128) == pytest.approx(8e-3)
    assert peak_lr(32) == pytest.approx(2 * peak_lr(128))


def test_plan_is_what_the_appendix_promises():
    budgets = sorted(PLAN)
    assert len(budgets) >= 4 and budgets[-1] / budgets[0] >= 30
    assert all(len(widths) >= 5 and set(widths) <= set(WIDTHS) for widths, _ in PLAN.values())
    assert sum(len(seeds) >= 2 for _, seeds in PLAN.values()) >= 3
    points = plan_points()
    assert len(set(points)) == len(points) == sum(len(w) * len(s) for w, s in PLAN.values())
    assert points[0][0] == budgets[-1]                                  # costliest first


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="d_model: expected a multiple of 4"):
        sweep_config(30)
    with pytest.raises(ValueError, match="budget"):
        steps_for(0, 100)
    with pytest.raises(ValueError, match="n_params: expected at least 3 distinct sizes"):
        isoflop_minimum([1e3, 1e3, 2e3], [2.0, 2.1, 2.2])
    with pytest.raises(ValueError, match="loss: expected a minimum"):
        isoflop_minimum([1e3, 2e3, 4e3], [2.0, 2.5, 2.0])
    with pytest.raises(ValueError, match="seed"):
        train_point(1e8, 8, -1)


def test_a_point_is_deterministic_and_leaves_the_thread_count_alone(ids):
    threads = torch.get_num_threads()
    first = train_point(2e8, 8, 0, ids=ids)
    assert first["steps"] == steps_for(2e8, first["n_params"]) and first["tokens"] == first["steps"] * TOKENS_PER_STEP
    assert train_point(2e8, 8, 0, ids=ids)["val_loss"] == first["val_loss"]
    assert torch.get_num_threads() == threads


# --- the fits, on data whose answer is known

def test_the_parabola_finds_a_known_minimum():
    n = np.array([1e3, 2e3, 4e3, 8e3, 16e3, 32e3])
    loss = 2.0 + 0.3 * (np.log(n) - math.log(5e3)) ** 2
    n_opt, l_opt = isoflop_minimum(n, loss)
    assert n_opt == pytest.approx(5e3, rel=1e-9) and l_opt == pytest.approx(2.0, abs=1e-12)


def _synthetic(a: float, noise: float, seed: int = 0) -> dict[str, np.ndarray]:
    """Sweep rows whose IsoFLOP minima follow N_opt = 0.1·C^a exactly, plus noise in the losses."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in (1e10, 3e10, 1e11, 3e11, 1e12):
        centre = math.log(0.1 * c ** a)
        for k in range(-3, 3):
            for s in (0, 1):
                n = math.exp(centre + 0.7 * k + 0.3)
                rows.append((c, n, s, 3.0 - 0.1 * math.log10(c) + 0.2 * (math.log(n) - centre) ** 2
                             + noise * rng.standard_normal()))
    budget, n, seed, loss = map(np.array, zip(*rows))
    return {"budget": budget, "n_params": n, "seed": seed, "val_loss": loss}


def test_power_law_and_bootstrap_recover_a_known_exponent():
    exact = _synthetic(0.6, 0.0)
    budgets, n_opt, _ = isoflop_optima(exact)
    a, k = power_law(budgets, n_opt)
    assert a == pytest.approx(0.6, abs=1e-9) and k == pytest.approx(0.1, rel=1e-6)
    draws = bootstrap_exponents(_synthetic(0.6, 0.01), samples=300)
    low, high = np.percentile(draws, [2.5, 97.5])
    assert low < 0.6 < high and 0.005 < high - low < 0.3


# --- the committed sweep

def test_the_committed_csv_holds_the_plan_and_its_provenance(sweep):
    provenance, s = sweep
    assert {"commit", "torch", "threads", "date", "command"} <= set(provenance)
    assert "uncommitted" not in provenance["commit"] and provenance["torch"].startswith(torch.__version__.split("+")[0])
    assert sorted(zip(s["budget"], s["d_model"], s["seed"])) == sorted(plan_points())
    assert all(s["n_params"] == [non_embedding_params(sweep_config(int(d))) for d in s["d_model"]])
    assert all(s["tokens"] == s["steps"] * TOKENS_PER_STEP)
    assert all(np.abs(s["tokens"] - s["budget"] / (6 * s["n_params"])) <= TOKENS_PER_STEP / 2)
    assert all(s["flops_6nd"] == 6 * s["n_params"] * s["tokens"])


def test_a_committed_point_the_appendix_does_not_rerun_is_reproduced(sweep, ids):
    _, s = sweep
    i = min(np.flatnonzero(s["seed"] == 2), key=lambda i: s["cpu_seconds"][i])   # the appendix reruns seed 0
    again = train_point(s["budget"][i], int(s["d_model"][i]), int(s["seed"][i]), ids=ids)
    assert again["val_loss"] == pytest.approx(s["val_loss"][i], abs=5e-3)


# --- the appendix's claims, seed by seed

A_CLAIM = (0.49 + 0.15, 1.0)   # "far above Chinchilla's 0.49", and b = 1 − a > 0, for every seed's own fit
MIN_TOKENS_PER_PARAMETER = 80  # "more than 4 × 20 at every budget", and falling as the budget grows


def _one_seed(s: dict[str, np.ndarray], seed: int) -> np.ndarray:
    """The rows of one seed, and seed 0's at the budgets that ran only seed 0."""
    only_first = [c for c in np.unique(s["budget"]) if set(s["seed"][s["budget"] == c]) == {0}]
    return np.flatnonzero((s["seed"] == seed) | np.isin(s["budget"], only_first) & (s["seed"] == 0))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_claims_hold_for_each_seed_alone(sweep, seed):
    _, s = sweep
    budgets, n_opt, loss_opt = isoflop_optima(s, _one_seed(s, seed))
    a, _ = power_law(budgets, n_opt)
    assert A_CLAIM[0] < a < A_CLAIM[1], a
    per_param = budgets / (6 * n_opt ** 2)
    assert per_param.min() > MIN_TOKENS_PER_PARAMETER and np.all(np.diff(per_param) < 0)
    assert np.all(np.diff(loss_opt) < 0)
