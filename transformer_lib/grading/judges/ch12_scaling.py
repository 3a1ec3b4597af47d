"""The judges of the checks for the exercises of the scaling appendix (Exercises 12): a compute-optimal
plan for a budget the sweep did not run, the tokens per parameter from the data exponent, and a
sweep whose learning rate was not scaled with the width.

The judges fit the sweeps with the course library (``transformer_lib.scaling``) and run in the
grader. The inputs and the calls of the student's functions are in the kernel half,
:mod:`transformer_lib.grading.checks.ch12_scaling`. Chapter 12.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..protocol import CheckFailed, typename
from .common import judge, number, pair


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
