"""Known-wrong solutions of Exercises 12 (format of ``wrong.py``): the solution bodies substituted
(by grade_id), the checks that must catch them (and only
those), a phrase of the first message."""
from __future__ import annotations

_PLAN = {"check_compute_optimal"}
_RATIO = {"check_tokens_per_parameter"}
_FLAW = {"check_lr_flaw"}
_LIBRARY = "    from transformer_lib.scaling import "

_RIGHT = """
    budgets, n_opt, loss_opt = fit_optima(sweep)
    a, k = power_fit(budgets, n_opt)
    s, k_loss = power_fit(budgets, loss_opt)
    n = k * budget**a
    return n, budget / (6 * n), k_loss * budget**s
"""  # 12.1 solved, for the variants below

_OWN_PARABOLAS = """
    budgets = np.unique(sweep["budget"])
    n_opt, loss_opt = [], []
    for c in budgets:
        here = sweep["budget"] == c
        n, loss = sweep["n_params"][here], sweep["val_loss"][here]
"""
_VERTEX = """
        n_opt.append(math.exp(-a1 / (2 * a2)))
        loss_opt.append(a0 - a1 * a1 / (4 * a2))
"""
_READ = """
    a, k = power_fit(budgets, np.array(n_opt))
    s, k_loss = power_fit(budgets, np.array(loss_opt))
    n = k * budget**a
    return n, budget / (6 * n), k_loss * budget**s
"""
_MATCHED = """
    losses = {}
    for c, d, s, loss in zip(good["budget"], good["d_model"], good["seed"], good["val_loss"]):
        losses[c, d, s] = loss
    gaps = {}
    for c, d, s, loss in zip(flawed["budget"], flawed["d_model"], flawed["seed"], flawed["val_loss"]):
        if (c, d, s) in losses:
            gaps.setdefault(int(d), []).append(loss - losses[c, d, s])
    widths = sorted(d for d, gap in gaps.items() if np.mean(gap) > margin)
    budgets, n_good, _ = fit_optima(good)
    _, n_flawed, _ = fit_optima(flawed)
"""
_SHIFTS = """
    delta_a = power_fit(budgets, n_flawed)[0] - power_fit(budgets, n_good)[0]
    return widths, list(n_flawed / n_good), delta_a
"""

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "appendix_scaling": {
        "plan: the visible answer hard-coded": ({"compute_optimal": """
    return 9329.896466930752, 3572744.183333792, 2.046798117329023
"""}, _PLAN, "N is not the compute-optimal size"),
        "plan: D = C / (2N)": ({"compute_optimal": _RIGHT.replace("(6 * n)", "(2 * n)")}, _PLAN, "not 2"),
        "plan: the parabola fitted in N, not log N": ({"compute_optimal": _OWN_PARABOLAS + """
        a2, a1, a0 = np.polyfit(n, loss, 2)
        n_opt.append(-a1 / (2 * a2))
        loss_opt.append(a0 - a1 * a1 / (4 * a2))
""" + _READ}, _PLAN, "in log N, not in N"),
        "plan: the best point of each budget": ({"compute_optimal": _OWN_PARABOLAS + """
        n_opt.append(n[np.argmin(loss)])
        loss_opt.append(loss.min())
""" + _READ}, _PLAN, "not the best point"),
        "plan: seed 0 only": ({"compute_optimal": _OWN_PARABOLAS + """
        first = sweep["seed"][here] == 0
        a2, a1, a0 = np.polyfit(np.log(n[first]), loss[first], 2)
""" + _VERTEX + _READ}, _PLAN, "all seeds"),
        "plan: the power law fitted in N against C": ({"compute_optimal": """
    budgets, n_opt, loss_opt = fit_optima(sweep)
    n = np.polyval(np.polyfit(budgets, n_opt, 1), budget)
    s, k_loss = power_fit(budgets, loss_opt)
    return n, budget / (6 * n), k_loss * budget**s
"""}, _PLAN, "not in N_opt against C"),
        "plan: log C regressed on log N": ({"compute_optimal": """
    budgets, n_opt, loss_opt = fit_optima(sweep)
    slope, k = power_fit(n_opt, budgets)
    n = (budget / k) ** (1 / slope)
    s, k_loss = power_fit(budgets, loss_opt)
    return n, budget / (6 * n), k_loss * budget**s
"""}, _PLAN, "wrong way round"),
        "plan: N and D swapped": ({"compute_optimal": _RIGHT.replace("n, budget / (6 * n)", "budget / (6 * n), n")},
                                  _PLAN, "swapped"),
        "plan: the loss of the nearest budget": ({"compute_optimal": """
    budgets, n_opt, loss_opt = fit_optima(sweep)
    a, k = power_fit(budgets, n_opt)
    n = k * budget**a
    return n, budget / (6 * n), loss_opt[np.argmin(np.abs(np.log(budgets / budget)))]
"""}, _PLAN, "the loss is not"),
        "plan: the course library": ({"compute_optimal": _LIBRARY + "isoflop_optima, power_law\n" + _RIGHT.replace(
            "fit_optima", "isoflop_optima").replace("power_fit", "power_law")}, _PLAN, "the course library"),
        "ratio: the appendix's 1 - 2a with b for a (exponents swapped)": ({"tokens_per_parameter": """
    exponent = 1 - 2 * b
    r2 = r1 * (c2 / c1) ** exponent
    n2 = math.sqrt(c2 / (6 * r2))
    return exponent, r2, n2, r2 * n2
"""}, _RATIO, "swap the exponents"),
        "ratio: moved from c2 to c1": ({"tokens_per_parameter": """
    exponent = 2 * b - 1
    r2 = r1 * (c1 / c2) ** exponent
    n2 = math.sqrt(c2 / (6 * r2))
    return exponent, r2, n2, r2 * n2
"""}, _RATIO, "the wrong way"),
        "ratio: N = C / (6r) without the root": ({"tokens_per_parameter": """
    exponent = 2 * b - 1
    r2 = r1 * (c2 / c1) ** exponent
    n2 = c2 / (6 * r2)
    return exponent, r2, n2, r2 * n2
"""}, _RATIO, "(C / (6r))^½"),
        "ratio: D = C / (2N)": ({"tokens_per_parameter": """
    exponent = 2 * b - 1
    r2 = r1 * (c2 / c1) ** exponent
    n2 = math.sqrt(c2 / (6 * r2))
    return exponent, r2, n2, c2 / (2 * n2)
"""}, _RATIO, "not 2"),
        "ratio: Chinchilla's constant ratio": ({"tokens_per_parameter": """
    n2 = math.sqrt(c2 / (6 * r1))
    return 0.0, r1, n2, r1 * n2
"""}, _RATIO, "the exponent is not right"),
        "ratio: the visible answer hard-coded": ({"tokens_per_parameter": """
    return -0.46, 2.4045288692348263, 2022252508447.3167, 4862564537444.117
"""}, _RATIO, "the exponent is not right"),
        "lr flaw: rows compared by position": ({"lr_flaw": """
    gaps = {}
    for d, bad, ok in zip(flawed["d_model"], flawed["val_loss"], good["val_loss"]):
        gaps.setdefault(int(d), []).append(bad - ok)
    widths = sorted(d for d, gap in gaps.items() if np.mean(gap) > margin)
    budgets, n_good, _ = fit_optima(good)
    _, n_flawed, _ = fit_optima(flawed)
""" + _SHIFTS}, _FLAW, "the rows were compared by position"),
        "lr flaw: the margin ignored": ({"lr_flaw": _MATCHED.replace("> margin", "> 0") + _SHIFTS}, _FLAW,
                                        "by more than the margin"),
        "lr flaw: the widths the rate suits": ({"lr_flaw": _MATCHED.replace("> margin", "<= margin") + _SHIFTS},
                                               _FLAW, "the learning rate suits"),
        "lr flaw: shifts upside down": ({"lr_flaw": _MATCHED + """
    delta_a = power_fit(budgets, n_flawed)[0] - power_fit(budgets, n_good)[0]
    return widths, list(n_good / n_flawed), delta_a
"""}, _FLAW, "upside down"),
        "lr flaw: delta_a the other way": ({"lr_flaw": _MATCHED + """
    delta_a = power_fit(budgets, n_good)[0] - power_fit(budgets, n_flawed)[0]
    return widths, list(n_flawed / n_good), delta_a
"""}, _FLAW, "wrong sign"),
        "lr flaw: the flawed sweep fitted on the matched rows of the good one only": ({"lr_flaw": _MATCHED.replace(
            "    budgets, n_good, _ = fit_optima(good)\n", """    kept = np.isin(good["seed"], flawed["seed"])
    budgets, n_good, _ = fit_optima({k: v[kept] for k, v in good.items()})
""") + _SHIFTS}, _FLAW, "the shifts are not right"),
        "lr flaw: the course library's fits": ({"lr_flaw": _MATCHED.replace(
            "    budgets, n_good, _ = fit_optima(good)\n    _, n_flawed, _ = fit_optima(flawed)\n",
            _LIBRARY + """isoflop_optima

    budgets, n_good, _ = isoflop_optima(good)
    _, n_flawed, _ = isoflop_optima(flawed)
""") + _SHIFTS}, _FLAW, "the course library"),
        "lr flaw: the visible answer hard-coded": ({"lr_flaw": """
    return [8, 12, 16, 24, 32], [1.2481939946003555, 1.0840249313502852, 1.1177853711993258, 1.0960909240703374], \\
        -0.031181586035091025
"""}, _FLAW, "the disadvantaged widths are not right"),
    },
}
