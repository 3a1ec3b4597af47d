"""The checks' kernel half for the exercises of the scaling appendix (Exercises 12): a compute-optimal
plan for a budget the sweep did not run, the tokens per parameter from the data exponent, and a
sweep whose learning rate was not scaled with the width.

A sweep is a dict of columns (NumPy arrays of one length): ``budget`` (FLOPs), ``n_params`` (N,
without the embedding), ``seed``, ``val_loss``, and in Exercise 12.3 also ``d_model`` and
``peak_lr``. :data:`SCALING_SWEEP` is the committed sweep (``chapters/data/scaling_sweep.csv``,
whose copy here a test compares with the file: a graded kernel cannot read the repository). What
runs in the student's kernel (the sweeps, visible and hidden, and the calls of the student's
functions). The judges are in :mod:`transformer_lib.grading.judges.ch12_scaling`. Chapter 12.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from .._calls import call
from .._harness import draw, hidden_generator, run_check

__all__ = ["SCALING_SWEEP", "LR_FLAWED_SWEEP", "check_compute_optimal", "check_tokens_per_parameter",
           "check_lr_flaw"]

# budget -> width -> validation loss of seeds 0, 1, …
_COMMITTED = {
    4e10: {8: (2.404040, 2.444427, 2.411683), 12: (2.339403, 2.341153, 2.344150),
           16: (2.334167, 2.464610, 2.503007), 24: (2.626079, 2.715195, 2.770663),
           32: (2.933108, 2.840407, 2.907472), 44: (2.998812, 3.122851, 3.040072)},
    1.25e11: {8: (2.388462, 2.404930), 12: (2.204341, 2.149833), 16: (2.113131, 2.078795),
              24: (2.081547, 2.134375), 32: (2.445524, 2.295706), 44: (2.642528, 2.684945)},
    4e11: {12: (2.160810, 2.117567), 16: (2.040890, 2.037194), 24: (1.931029, 1.931016),
           32: (1.915646, 1.922067), 44: (2.023296, 1.951266), 64: (2.131119, 2.189661)},
    1.25e12: {24: (1.872628,), 32: (1.825530,), 44: (1.761620,), 64: (1.829588,), 92: (1.930709,),
              128: (2.105797,)},
}
_LAB_LR, _LAB_WIDTH = 8e-3, 128  # the sweep's learning rate: 8e-3 · (128 / d)^½


def _sweep(losses: dict = _COMMITTED) -> dict[str, np.ndarray]:
    rows = [(c, d, 2 * (12 * d * d + 2 * d) + d, s, _LAB_LR * math.sqrt(_LAB_WIDTH / d), loss)
            for c, widths in losses.items() for d, seeds in widths.items() for s, loss in enumerate(seeds)]
    cols = list(zip(*rows))
    return dict(budget=np.array(cols[0]), d_model=np.array(cols[1]), n_params=np.array(cols[2]),
                seed=np.array(cols[3]), peak_lr=np.array(cols[4]), val_loss=np.array(cols[5]))


def _uniform(g: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand(1, generator=g, dtype=torch.float64))


def _normal(g: torch.Generator, size: int, scale: float) -> np.ndarray:
    return scale * torch.randn(size, generator=g, dtype=torch.float64).numpy()


def _take(sweep: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[rows].copy() for k, v in sweep.items()}


def _copy(sweep: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.array(v, copy=True) for k, v in sweep.items()}


def _flawed(good: dict[str, np.ndarray], lr: float, kappa: float) -> dict[str, np.ndarray]:
    """``good`` run with one learning rate ``lr`` at every width: each loss plus κ·(ln(lr / its lr))²."""
    return dict(_copy(good), peak_lr=np.full(len(good["budget"]), lr),
                val_loss=good["val_loss"] + kappa * np.log(lr / good["peak_lr"]) ** 2)


SCALING_SWEEP = _sweep()
"""The committed sweep, a dict of columns. Chapter 12."""
LR_FLAWED_SWEEP = _flawed(SCALING_SWEEP, _LAB_LR, 0.05)
"""The committed sweep as it would look with the lab's 8e-3 at every width (Exercise 12.3). Chapter 12."""
_FIT_KEYS = ("budget", "n_params", "seed", "val_loss")


# ---------------------------------------------------------------- 12.1 a budget the sweep did not run

def _perturbed(g: torch.Generator) -> dict[str, np.ndarray]:
    """The committed sweep with some seeds left out (every size keeps one), its losses moved by a few
    thousandths, its budgets and sizes scaled together, its rows shuffled."""
    sweep = _sweep()
    keep = np.array([s == 0 or draw(g, 0, 1) == 1 for s in sweep["seed"]])
    sweep = _take(sweep, np.flatnonzero(keep))
    scale = 10 ** _uniform(g, -1.0, 1.0)
    sweep["budget"], sweep["n_params"] = sweep["budget"] * scale, sweep["n_params"] * scale
    sweep["val_loss"] = sweep["val_loss"] + _normal(g, len(sweep["val_loss"]), 0.004)
    return _take(sweep, torch.randperm(len(sweep["budget"]), generator=g).numpy())


def _synthetic(g: torch.Generator) -> dict[str, np.ndarray]:
    """A sweep drawn from L(N, D) = E + A/N^α + B/D^β (other exponents than the committed sweep's):
    four budgets across 10^1.5, six sizes a factor 2 apart around each optimum, two seeds."""
    alpha, beta, e = _uniform(g, 0.25, 0.6), _uniform(g, 0.25, 0.6), _uniform(g, 1.0, 2.0)
    n0, d0 = 10 ** _uniform(g, 4, 7), 10 ** _uniform(g, 6, 9)
    big_a, big_b = _uniform(g, 0.3, 0.6) * n0 ** alpha, _uniform(g, 0.3, 0.6) * d0 ** beta
    k = (alpha * big_a / (beta * big_b)) ** (1 / (alpha + beta))
    rows = []
    for c in 6 * n0 * d0 * 10 ** (np.arange(4) / 2):
        n_star = k * (c / 6) ** (beta / (alpha + beta))
        for n in np.round(n_star * 2.0 ** (np.arange(6) - 2.5 + _uniform(g, -0.5, 0.5))):
            for seed in (0, 1):
                rows.append((c, n, seed, e + big_a / n ** alpha + big_b / (c / (6 * n)) ** beta))
    cols = [np.array(c) for c in zip(*rows)]
    return dict(zip(_FIT_KEYS, cols[:3] + [cols[3] + _normal(g, len(rows), 0.002)]))


def _plan_case(sweep: dict[str, np.ndarray], budget: float, what: str) -> dict:
    return dict(sweep={k: sweep[k] for k in _FIT_KEYS}, budget=float(budget), what=what)


def check_compute_optimal(fn: Callable, sweep: dict | None = None, budget: float = 2e11, hidden: int = 0) -> None:
    """``fn(sweep, budget) -> (N, D, loss)``: the compute-optimal size and tokens at ``budget`` from
    the sweep's IsoFLOP parabolas (in log N, every row of a budget) and power laws in C, and the
    loss at the optimum from a power law of the parabolas' minima. Chapter 12."""
    if hidden:
        g = hidden_generator("compute_optimal", hidden)
        cases = []
        for sweep_ in (_sweep(), _perturbed(g), _synthetic(g)):
            low, high = sweep_["budget"].min(), sweep_["budget"].max()
            cases.append(_plan_case(sweep_, low * (high / low) ** _uniform(g, -0.2, 1.3), "compute_optimal(sweep, C)"))
    else:  # by default a second budget too, above the sweep's largest: one answer cannot serve both
        budgets = (budget, 4e12) if sweep is None else (budget,)
        cases = [_plan_case(_sweep() if sweep is None else sweep, c, f"compute_optimal(sweep, {c:g})")
                 for c in budgets]
    run_check("compute_optimal", fn, cases, lambda f, c: {"result": call(f, _copy(c["sweep"]), c["budget"])}, hidden)


# ---------------------------------------------------------------- 12.2 tokens per parameter from b

def check_tokens_per_parameter(fn: Callable, b: float = 0.27, c1: float = 5.9e23, r1: float = 20.0,
                               c2: float = 5.9e25, hidden: int = 0) -> None:
    """``fn(b, c1, r1, c2) -> (exponent, r2, N2, D2)``: with D_opt ∝ C^b and C = 6ND, the exponent of
    D_opt/N_opt in C, and from r1 tokens per parameter at budget c1, the tokens per parameter, N_opt
    and D_opt at budget c2. Chapter 12."""
    if hidden:
        g = hidden_generator("tokens_per_parameter", hidden)
        bs = [_uniform(g, 0.55, 0.9), _uniform(g, 0.1, 0.45), 0.5]
        cases = [dict(b=b_, c1=10 ** _uniform(g, 15, 24), r1=_uniform(g, 2, 300), c2=10 ** _uniform(g, 15, 26))
                 for b_ in bs]
    else:  # and a data exponent above ½, where the ratio grows with the budget
        cases = [dict(b=b, c1=c1, r1=r1, c2=c2), dict(b=0.62, c1=1e18, r1=40.0, c2=3e20)]
    for case in cases:
        case["what"] = "tokens_per_parameter(b, c1, r1, c2)"
    run_check("tokens_per_parameter", fn, cases, lambda f, c: {"result": call(f, c["b"], c["c1"], c["r1"], c["c2"])},
              hidden)


# ---------------------------------------------------------------- 12.3 one learning rate for every width

def check_lr_flaw(fn: Callable, good: dict | None = None, flawed: dict | None = None, margin: float = 0.02,
                  hidden: int = 0) -> None:
    """``fn(good, flawed, margin) -> (widths, shifts, delta_a)``: the widths whose loss in ``flawed``
    exceeds ``good``'s by more than ``margin`` on average over the rows both ran (matched by budget,
    width and seed), N_opt(flawed) / N_opt(good) at each budget (ascending) and a(flawed) − a(good).
    Chapter 12."""
    if hidden:
        g = hidden_generator("lr_flaw", hidden)
        cases = []
        for width in (8, (12, 16, 24, 44, 64)[draw(g, 0, 4)]):
            good_ = _sweep()
            flawed_ = _flawed(good_, _LAB_LR * math.sqrt(_LAB_WIDTH / width), _uniform(g, 0.03, 0.08))
            flawed_["val_loss"] = flawed_["val_loss"] + _normal(g, len(flawed_["val_loss"]), 0.003)
            if width != 8:  # this one ran seed 0 only
                flawed_ = _take(flawed_, np.flatnonzero(flawed_["seed"] == 0))
            flawed_ = _take(flawed_, torch.randperm(len(flawed_["budget"]), generator=g).numpy())
            cases.append(dict(good=good_, flawed=flawed_, margin=_uniform(g, 0.01, 0.03)))
    else:
        cases = [dict(good=_sweep() if good is None else good, flawed=_flawed(_sweep(), _LAB_LR, 0.05)
                      if flawed is None else flawed, margin=margin)]
        if good is None and flawed is None:  # and a flawed sweep of seed 0 only, its rows in reverse order
            other = _flawed(_sweep(), _LAB_LR * math.sqrt(_LAB_WIDTH / 16), 0.05)
            cases.append(dict(good=_sweep(), flawed=_take(other, np.flatnonzero(other["seed"] == 0)[::-1]),
                              margin=margin))
    for case in cases:
        case["what"] = "lr_flaw(good, flawed, margin)"
    run_check("lr_flaw", fn, cases, lambda f, c: {"result": call(f, _copy(c["good"]), _copy(c["flawed"]),
                                                                 c["margin"])}, hidden)
