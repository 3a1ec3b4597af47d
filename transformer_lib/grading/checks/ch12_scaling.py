"""Checks for the exercises of the scaling appendix (Exercises 12): a compute-optimal plan for a
budget the sweep did not run, the tokens per parameter from the data exponent, and a sweep whose
learning rate was not scaled with the width.

A sweep is a dict of columns (NumPy arrays of one length): ``budget`` (FLOPs), ``n_params`` (N,
without the embedding), ``seed``, ``val_loss``, and in Exercise 12.3 also ``d_model`` and
``peak_lr``. :data:`SCALING_SWEEP` is the committed sweep (``chapters/data/scaling_sweep.csv``,
whose copy here a test compares with the file: a graded kernel cannot read the repository).
Above the judging line: what runs in the student's kernel (the sweeps, visible and hidden, and the
calls of the student's functions). Below it: the judges, which fit the sweeps with the course
library (``transformer_lib.scaling``) and run in the grader. Chapter 12.
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
    4e10: {8: (2.442420, 2.430533, 2.458873), 12: (2.339402, 2.347668, 2.344151),
           16: (2.342735, 2.476476, 2.401695), 24: (2.612248, 2.749709, 2.785858),
           32: (2.908236, 2.828630, 2.829624), 44: (2.995079, 3.123637, 3.065270)},
    1.25e11: {8: (2.378350, 2.415022), 12: (2.203594, 2.162071), 16: (2.109107, 2.103530),
              24: (2.121842, 2.092311), 32: (2.460581, 2.261820), 44: (2.665444, 2.680565)},
    4e11: {12: (2.152028, 2.184453), 16: (2.056749, 2.037832), 24: (1.926022, 1.928044),
           32: (1.921469, 1.922409), 44: (1.989250, 1.949960), 64: (2.130874, 2.189064)},
    1.25e12: {24: (1.858126,), 32: (1.830060,), 44: (1.772640,), 64: (1.826707,), 92: (1.927518,),
              128: (2.104626,)},
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


# ==== judging: runs in the grader, never loaded into a graded kernel ====
from .._harness import CheckFailed, typename  # noqa: E402
from .._judging import judge, number, pair  # noqa: E402


def _wrong(misconception: str, got: Any = None) -> None:
    """Fail naming the misconception, with the student's own value (never the expected one)."""
    shown = "" if got is None else f"\n  got: {np.array2string(np.asarray(got, float), precision=6)}"
    raise CheckFailed(misconception + shown)


def _count(cases: list, what: str) -> str:
    return f"{len(cases)} {what}{'s' if len(cases) > 1 else ''}"


def _near(got: Any, ref: Any, rtol: float = 1e-6) -> bool:
    got, ref = np.asarray(got, float), np.asarray(ref, float)
    return got.shape == ref.shape and bool(np.all(np.abs(got - ref) <= rtol * np.abs(ref) + 1e-12))


def _numbers(result: Any, what: str, names: tuple[str, ...]) -> list[float]:
    return [number(v, f"{what}: {name}") for v, name in zip(pair(result, what, names), names)]


def _optima(sweep: dict, how: str = "log") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each budget's parabola (``log``: in log N through every row, as the library; ``linear``: in N;
    ``first``: log N, the first seed only; ``best``: the best row instead of a parabola)."""
    from transformer_lib.scaling import isoflop_minimum, isoflop_optima

    if how == "log":
        return isoflop_optima(sweep)
    budgets, n_opt, l_opt = np.unique(sweep["budget"]), [], []
    for c in budgets:
        here = sweep["budget"] == c
        n, loss = sweep["n_params"][here], sweep["val_loss"][here]
        if how == "first":
            first = sweep["seed"][here] == sweep["seed"][here].min()
            m, low = isoflop_minimum(n[first], loss[first])
        elif how == "best":
            m, low = n[np.argmin(loss)], loss.min()
        else:
            a2, a1, a0 = np.polyfit(n, loss, 2)
            m, low = -a1 / (2 * a2), a0 - a1 * a1 / (4 * a2)
        n_opt.append(m)
        l_opt.append(low)
    return budgets, np.array(n_opt), np.array(l_opt)


def _plan(sweep: dict, c: float, how: str = "log") -> tuple[float, float, float]:
    from transformer_lib.scaling import power_law

    budgets, n_opt, l_opt = _optima(sweep, how)
    a, k = power_law(budgets, n_opt)
    s, k_loss = power_law(budgets, l_opt)
    n = k * c ** a
    return n, c / (6 * n), k_loss * c ** s


@judge("compute_optimal", compare=("result",), rtol=1e-6,
       ok=lambda cases, outs: f"compute_optimal plans N, D = C/(6N) and the loss from the IsoFLOP parabolas in "
                              f"log N and power laws in C, on {_count(cases, 'sweep')}")
def _compute_optimal(case: dict, out: dict) -> None:
    sweep, c, what = case["sweep"], case["budget"], case["what"]
    n, d, loss = _numbers(out["result"], what, ("N", "D", "loss"))
    ref_n, ref_d, ref_loss = _plan(sweep, c)
    if _near(n, ref_n):
        if not _near(d, ref_d):
            if _near(d, c / (2 * n), 1e-4):
                _wrong("D is not C / (6N): training costs 6 FLOPs per parameter and token (2 forward, 4 backward), "
                       "not 2", d)
            _wrong("N is right but D is not: the budget buys D = C / (6N) tokens", d)
        if not _near(loss, ref_loss):
            _wrong("N and D are right but the loss is not: fit a straight line through log L_opt against log C "
                   "(L_opt: each budget's parabola at its vertex) and read it at C", loss)
        return
    if _near([n, d], [ref_d, ref_n], 1e-4):
        _wrong("N and D are swapped: N is the number of parameters, D the number of tokens", [n, d])
    hints = {"linear": "fit each budget's parabola in log N, not in N: the IsoFLOP curve is a parabola in log N",
             "best": "fit a parabola to each budget's points and take its vertex, not the best point of the sweep",
             "first": "fit each budget's parabola to every row of that budget, all seeds, not to one seed"}
    for how, hint in hints.items():
        try:
            with np.errstate(all="ignore"):
                variant = _plan(sweep, c, how)[0]
        except (ValueError, ZeroDivisionError):
            continue
        if _near(n, variant, 1e-4) or not (np.isfinite(variant) or np.isfinite(n)):
            _wrong(f"N is not the compute-optimal size: {hint}", n)
    from transformer_lib.scaling import power_law

    budgets, n_opt, _ = _optima(sweep)
    if _near(n, np.polyval(np.polyfit(budgets, n_opt, 1), c), 1e-4):
        _wrong("N_opt ∝ C^a is a straight line in log N_opt against log C, not in N_opt against C", n)
    with np.errstate(all="ignore"):
        slope, k_c = power_law(n_opt, budgets)  # C ≈ k_c · N_opt^slope, read backwards
        backwards = (c / k_c) ** (1 / slope)
    if _near(n, backwards, 1e-4):
        _wrong("the line was fitted the wrong way round: regress log N_opt on log C, not log C on log N_opt", n)
    _wrong("N is not the compute-optimal size: fit a parabola in log N to each budget's rows, then a straight "
           "line through log N_opt against log C", n)


@judge("tokens_per_parameter", compare=("result",), rtol=1e-9,
       ok=lambda cases, outs: f"tokens_per_parameter gives the exponent 2b − 1 and the optimum at the second "
                              f"budget, for {_count(cases, 'data exponent')}")
def _tokens_per_parameter(case: dict, out: dict) -> None:
    b, c1, r1, c2, what = case["b"], case["c1"], case["r1"], case["c2"], case["what"]
    exponent, r2, n2, d2 = _numbers(out["result"], what, ("exponent", "r2", "N2", "D2"))
    if not _near(exponent, 2 * b - 1, 1e-9):
        if _near(exponent, 1 - 2 * b, 1e-9) and b != 0.5:
            _wrong("the exponent has the wrong sign: 1 − 2a holds for a, N_opt's exponent; b is D_opt's, and "
                   "C = 6ND gives a = 1 − b (did you swap the exponents?)", exponent)
        _wrong("the exponent is not right: D_opt/N_opt ∝ C^b / C^a with a = 1 − b", exponent)
    if not _near(r2, r1 * (c2 / c1) ** (2 * b - 1), 1e-9):
        if _near(r2, r1 * (c1 / c2) ** (2 * b - 1), 1e-9) and b != 0.5:
            _wrong("the ratio moved the wrong way: r2 = r1 · (c2 / c1)^exponent", r2)
        _wrong("r2 is not right: the tokens per parameter scale as C^exponent from r1 at c1", r2)
    if not (_near(n2, math.sqrt(c2 / (6 * r2)), 1e-9) and _near(d2, r2 * n2, 1e-9)):
        if _near(n2, c2 / (6 * r2), 1e-6):
            _wrong("N2 is not C / (6 r2): with D = rN, C = 6ND = 6rN², so N = (C / (6r))^½", n2)
        if _near(d2, c2 / (2 * n2), 1e-6):
            _wrong("D2 is not C / (6N): training costs 6 FLOPs per parameter and token, not 2", d2)
        _wrong("N2 and D2 do not make the budget c2 = 6 N2 D2 with r2 tokens per parameter", [n2, d2])


def _key_rows(sweep: dict) -> dict[tuple, list[float]]:
    rows: dict[tuple, list[float]] = {}
    for c, d, s, loss in zip(sweep["budget"], sweep["d_model"], sweep["seed"], sweep["val_loss"]):
        rows.setdefault((float(c), int(d), int(s)), []).append(float(loss))
    return rows


def _disadvantaged(good: dict, flawed: dict, margin: float, by_position: bool = False) -> list[int]:
    if by_position:
        n = min(len(good["val_loss"]), len(flawed["val_loss"]))
        gaps = list(zip(flawed["d_model"][:n], flawed["val_loss"][:n] - good["val_loss"][:n]))
    else:
        ok, bad = _key_rows(good), _key_rows(flawed)
        gaps = [(key[1], np.mean(bad[key]) - np.mean(ok[key])) for key in bad if key in ok]
    widths = sorted({int(d) for d, _ in gaps})
    return [d for d in widths if np.mean([gap for w, gap in gaps if w == d]) > margin]


def _widths(value: Any, what: str) -> list[int]:
    items = list(value) if isinstance(value, (list, np.ndarray)) and np.ndim(value) == 1 else None
    if items is None or not all(type(d) is int or np.ndim(d) == 0 and np.asarray(d).dtype.kind in "iu"
                                for d in items):
        raise CheckFailed(f"{what}: the widths must be a list of whole numbers, got {typename(value)}")
    return [int(d) for d in items]


@judge("lr_flaw",
       ok=lambda cases, outs: f"lr_flaw finds the widths one learning rate disadvantages and how far the optima "
                              f"and the exponent move, for {_count(cases, 'flawed sweep')}")
def _lr_flaw(case: dict, out: dict) -> None:
    from transformer_lib.scaling import power_law

    good, flawed, margin, what = case["good"], case["flawed"], case["margin"], case["what"]
    widths, shifts, delta_a = pair(out["result"], what, ("widths", "shifts", "delta_a"))
    widths = _widths(widths, what)
    expected = _disadvantaged(good, flawed, margin)
    if widths != expected:
        if widths == _disadvantaged(good, flawed, margin, by_position=True):
            _wrong("the rows were compared by position: match them by budget, width and seed (the tables are "
                   "not in the same order, and need not have the same rows)", widths)
        if widths == _disadvantaged(good, flawed, 0.0) and margin > 0:
            _wrong("a width is disadvantaged when its loss is higher by more than the margin, on average", widths)
        if widths == sorted(set(int(d) for d in good["d_model"]) - set(expected)):
            _wrong("these are the widths the learning rate suits: the disadvantaged ones lose more than the "
                   "margin", widths)
        _wrong("the disadvantaged widths are not right: compare each width's loss in the two sweeps, row by row "
               "(same budget, width and seed), averaged over its rows", widths)
    budgets, n_good, _ = _optima(good)
    _, n_bad, _ = _optima(flawed)
    try:
        shifts = np.asarray(shifts, float)
    except (TypeError, ValueError):
        raise CheckFailed(f"{what}: the shifts must be a list of numbers, got {typename(shifts)}") from None
    if shifts.shape != n_good.shape:
        raise CheckFailed(f"{what}: expected one shift per budget ({len(n_good)} budgets), got shape {shifts.shape}")
    if not _near(shifts, n_bad / n_good):
        if _near(shifts, n_good / n_bad):
            _wrong("the shifts are upside down: N_opt of the flawed sweep divided by N_opt of the committed one",
                   shifts)
        _wrong("the shifts are not right: fit each sweep's IsoFLOP parabolas in log N on all of its own rows and "
               "divide the flawed sweep's N_opt by the committed one's, budget by budget", shifts)
    delta = power_law(budgets, n_bad)[0] - power_law(budgets, n_good)[0]
    delta_a = number(delta_a, f"{what}: delta_a")
    if not _near(delta_a, delta):
        if _near(-delta_a, delta):
            _wrong("delta_a has the wrong sign: a of the flawed sweep minus a of the committed one", delta_a)
        _wrong("delta_a is not right: fit N_opt ∝ C^a to each sweep's optima and subtract", delta_a)
