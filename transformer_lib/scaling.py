"""What the FLOPs buy: an IsoFLOP sweep of the lab's character GPT, defined by compute.

    python -m transformer_lib.scaling [--out chapters/data/scaling_sweep.csv] [--jobs 2]

A point of the sweep is a budget C (FLOPs), a width d and a seed. The model is the lab's
(``transformer_lib.lab``: 2 layers, 4 heads, context 64, no biases, tied embeddings) at width
d; its size N counts the *non-embedding* parameters, Kaplan et al.'s convention: every weight
of the blocks and the norms' gains, not the token table nor the position table (the tied
unembedding is the token table). It trains on D = C / (6N) characters of the Shakespeare
training split, ``steps = round(D / (batch · context))`` steps of the lab's recipe before Muon
(AdamW for every parameter, decaying all of them, the gradient's norm clipped to 1, a linear
warm-up and a cosine to a tenth of the peak that ends at the last step: the schedule runs over
the token budget, not the clock), then is evaluated on the whole validation split
(``lab.validation_loss``). The peak learning rate shrinks with the width (:func:`peak_lr`). One
point runs on one thread and is deterministic: the same seed, thread count and machine give the
same loss to the last bit.

The command runs the whole plan (:data:`PLAN`) two points at a time in two processes, with a
progress bar over the FLOPs, and writes a CSV whose first lines (``#``) record its provenance.
:func:`isoflop_minimum`, :func:`power_law` and :func:`bootstrap_exponents` fit it. Chapter 12.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from transformer_lib._checks import require_int, require_positive
from transformer_lib.config import ModelConfig
from transformer_lib.corpus import SHAKESPEARE_ALPHABET, shakespeare_ids
from transformer_lib.counting import flops_per_token, param_breakdown
from transformer_lib.data import text_batch
from transformer_lib.lab import LAB_DEFAULTS, lr_at, validation_loss
from transformer_lib.model import GPT
from transformer_lib.train import cross_entropy_loss

__all__ = ["WIDTHS", "PLAN", "COLUMNS", "sweep_config", "non_embedding_params", "peak_lr", "steps_for",
           "train_point", "plan_points", "read_sweep", "isoflop_minimum", "isoflop_optima", "power_law",
           "bootstrap_exponents", "parametric_fit", "parametric_optimum", "main"]

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "chapters" / "data" / "scaling_sweep.csv"
BATCH, CONTEXT = LAB_DEFAULTS["batch"], LAB_DEFAULTS["context"]
WIDTHS = (8, 12, 16, 24, 32, 44, 64, 92, 128)
"""The widths d of the sweep, about √2 apart, so that N ≈ 24d² doubles from one to the next. Chapter 12."""
PLAN: dict[float, tuple[tuple[int, ...], tuple[int, ...]]] = {
    4e10: ((8, 12, 16, 24, 32, 44), (0, 1, 2)),
    1.25e11: ((8, 12, 16, 24, 32, 44), (0, 1)),
    4e11: ((12, 16, 24, 32, 44, 64), (0, 1)),
    1.25e12: ((24, 32, 44, 64, 92, 128), (0,)),
}
"""budget C (FLOPs) -> (widths, seeds): six sizes per budget around the optimum, as many seeds
as fit in about 14 minutes on two cores (a small model needs many steps, and a step of a tiny
model costs about as much time as one of a model 16 times larger). Chapter 12.
"""
COLUMNS = ["budget", "d_model", "n_params", "seed", "steps", "tokens", "flops_6nd", "flops_counted",
           "peak_lr", "val_loss", "seconds", "cpu_seconds"]
"""The columns of the sweep's CSV. Chapter 12."""


def sweep_config(d_model: int) -> ModelConfig:
    """The lab's model at width ``d_model`` (2 layers, 4 heads, context 64, no biases). Chapter 12."""
    require_int("d_model", d_model)
    if d_model % LAB_DEFAULTS["heads"]:
        raise ValueError(f"d_model: expected a multiple of {LAB_DEFAULTS['heads']} heads, got {d_model}")
    return ModelConfig(vocab_size=len(SHAKESPEARE_ALPHABET), n_ctx=CONTEXT, d_model=d_model,
                       n_layers=LAB_DEFAULTS["layers"], n_heads=LAB_DEFAULTS["heads"], bias=False)


def non_embedding_params(config: ModelConfig) -> int:
    """N in Kaplan's convention: every parameter but the token and position tables (the blocks'
    matrices and every norm's gain, ≈ 12·L·d²). Chapter 12."""
    parts = param_breakdown(config)
    return sum(parts.values()) - parts["embedding"] - parts["positional"]


def peak_lr(d_model: int) -> float:
    """The peak learning rate at width d: the lab's 8e-3 at d = 128, scaled by (128/d)^½. Chapter 12, through `train_point`."""
    require_int("d_model", d_model)
    return LAB_DEFAULTS["lr"] * math.sqrt(128 / d_model)


def steps_for(budget: float, n_params: int) -> int:
    """Optimizer steps for D = C / (6N) tokens at the lab's batch × context (at least 1). Chapter 12."""
    require_positive("budget", budget)
    require_int("n_params", n_params)
    return max(1, round(budget / (6 * n_params) / (BATCH * CONTEXT)))


def train_point(budget: float, d_model: int, seed: int, threads: int = 1,
                ids: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """Train the width-``d_model`` model on C / (6N) tokens (seed ``seed``, ``threads`` threads) and
    evaluate it on the whole validation split -> a row of the sweep (:data:`COLUMNS`). ``ids``:
    the corpus splits ``(N_train,), (N_val,)`` if already loaded. Chapter 12."""
    require_int("seed", seed, low=0)
    config = sweep_config(d_model)
    n_params = non_embedding_params(config)
    steps = steps_for(budget, n_params)
    train_ids, val_ids = ids if ids is not None else shakespeare_ids()
    previous = torch.get_num_threads()
    torch.set_num_threads(require_int("threads", threads))
    try:
        start, cpu = time.perf_counter(), time.process_time()
        torch.manual_seed(seed)
        model = GPT(config)
        lr, warmup = peak_lr(d_model), min(LAB_DEFAULTS["warmup"], max(1, steps // 10))
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.1, foreach=True)
        gen = torch.Generator().manual_seed(seed)
        for step in range(steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, step / steps, lr, warmup)
            x, y = text_batch(train_ids, BATCH, CONTEXT, gen)
            loss = cross_entropy_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), LAB_DEFAULTS["clip"], foreach=True)
            opt.step()
        val = validation_loss(model, val_ids)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        torch.set_num_threads(previous)
    tokens = steps * BATCH * CONTEXT
    return dict(budget=budget, d_model=d_model, n_params=n_params, seed=seed, steps=steps, tokens=tokens,
                flops_6nd=6 * n_params * tokens, flops_counted=3 * flops_per_token(config, CONTEXT) * tokens,
                peak_lr=lr, val_loss=val, seconds=seconds, cpu_seconds=cpu)


def plan_points(plan: dict | None = None) -> list[tuple[float, int, int]]:
    """The points ``(budget, d_model, seed)`` of a plan (default :data:`PLAN`), costliest first. Library: no chapter names it."""
    plan = PLAN if plan is None else plan
    points = [(c, d, s) for c, (widths, seeds) in plan.items() for d in widths for s in seeds]
    return sorted(points, key=lambda p: (-p[0], -p[1], p[2]))


def read_sweep(path: str | Path = DEFAULT_OUT) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """A sweep's CSV -> (provenance ``{key: value}``, ``{column: array (points,)}``). Chapter 12."""
    lines = Path(path).read_text().splitlines()
    provenance = dict(line[2:].split(": ", 1) for line in lines if line.startswith("# "))
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    if not rows or list(rows[0]) != COLUMNS:
        raise ValueError(f"path: expected a sweep CSV with columns {COLUMNS}, got {list(rows[0]) if rows else []}")
    ints = {"d_model", "n_params", "seed", "steps", "tokens"}
    return provenance, {k: np.array([(int if k in ints else float)(r[k]) for r in rows]) for k in COLUMNS}


def isoflop_minimum(n_params: Sequence[float], loss: Sequence[float]) -> tuple[float, float]:
    """The minimum of a parabola in log N fitted to one budget's points ``(points,), (points,)``
    -> ``(N_opt, loss at N_opt)``; the parabola must open upwards. Chapter 12."""
    x, y = np.log(np.asarray(n_params, float)), np.asarray(loss, float)
    if x.shape != y.shape or len(np.unique(x)) < 3:
        raise ValueError(f"n_params: expected at least 3 distinct sizes, with one loss each, got "
                         f"{len(np.unique(x))} sizes and shapes {x.shape}, {y.shape}")
    a, b, c = np.polyfit(x, y, 2)
    if not a > 0:
        raise ValueError(f"loss: expected a minimum (a parabola opening upwards), got curvature {a:.3g}")
    x0 = -b / (2 * a)
    return float(np.exp(x0)), float(c - b * b / (4 * a))


def power_law(budgets: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """Least squares in log-log: values ≈ k · C^a over ``(budgets,)`` -> ``(a, k)``. Chapter 12."""
    a, log_k = np.polyfit(np.log(np.asarray(budgets, float)), np.log(np.asarray(values, float)), 1)
    return float(a), float(np.exp(log_k))


def isoflop_optima(sweep: dict[str, np.ndarray], rows: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One :func:`isoflop_minimum` per budget, fitted to every row of that budget (all sizes, all
    seeds; ``rows``: indices of the rows to use, default all) -> ``(budgets, N_opt, loss_opt)``,
    each ``(budgets,)``. Chapter 12."""
    rows = np.arange(len(sweep["budget"])) if rows is None else np.asarray(rows)
    budget, n, loss = sweep["budget"][rows], sweep["n_params"][rows], sweep["val_loss"][rows]
    budgets = np.unique(budget)
    fits = np.array([isoflop_minimum(n[budget == c], loss[budget == c]) for c in budgets])
    return budgets, fits[:, 0], fits[:, 1]


def bootstrap_exponents(sweep: dict[str, np.ndarray], samples: int = 1000, seed: int = 0) -> np.ndarray:
    """Bootstrap of the exponent a of N_opt ∝ C^a over a sweep's points and seeds -> ``(samples,)``.

    Each sample draws, within each budget, as many rows (size, seed) as it has, with
    replacement, refits every budget's parabola and the power law; a draw with fewer than three
    sizes, or a parabola without a minimum inside the sizes drawn, is drawn again. D_opt = C / (6 N_opt), so its exponent is 1 − a. Chapter 12.
    """
    require_int("samples", samples)
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(sweep["budget"] == c) for c in np.unique(sweep["budget"])]
    out: list[float] = []
    while len(out) < samples:
        rows = np.concatenate([rng.choice(g, size=len(g)) for g in groups])
        try:
            budgets, n_opt, _ = isoflop_optima(sweep, rows)
        except ValueError:
            continue
        drawn = [sweep["n_params"][rows][sweep["budget"][rows] == c] for c in budgets]
        if all(n.min() <= m <= n.max() for n, m in zip(drawn, n_opt)):
            out.append(power_law(budgets, n_opt)[0])
    return np.array(out)


def parametric_fit(n_params: Sequence[float], tokens: Sequence[float], loss: Sequence[float]) -> dict[str, float]:
    """Hoffmann et al.'s L(N, D) = E + A/N^α + B/D^β fitted to points ``(points,)`` each, by least
    squares with a soft L1 loss (robust, as their Huber loss) from a few starts -> ``{E, A, B, alpha,
    beta, a}``; ``a = β/(α + β)`` is the exponent of N_opt under C = 6ND. Chapter 12."""
    from scipy.optimize import least_squares

    log_n, log_d = np.log(np.asarray(n_params, float)), np.log(np.asarray(tokens, float))
    y = np.asarray(loss, float)

    def residuals(p: np.ndarray) -> np.ndarray:
        e, log_a, log_b, alpha, beta = p
        return e + np.exp(log_a - alpha * log_n) + np.exp(log_b - beta * log_d) - y

    starts = [[1.0, 3.0, 3.0, al, be] for al in (0.2, 0.5) for be in (0.2, 0.5)]
    bounds = ([0.0, -5.0, -5.0, 0.02, 0.02], [float(y.min()), 30.0, 30.0, 2.0, 2.0])
    best = min((least_squares(residuals, x0, loss="soft_l1", f_scale=0.01, bounds=bounds) for x0 in starts),
               key=lambda fit: fit.cost)
    e, log_a, log_b, alpha, beta = best.x
    return dict(E=float(e), A=float(np.exp(log_a)), B=float(np.exp(log_b)), alpha=float(alpha),
                beta=float(beta), a=float(beta / (alpha + beta)))


def parametric_optimum(fit: dict[str, float], budget: float) -> float:
    """N_opt of a :func:`parametric_fit` at budget C under C = 6ND: G·(C/6)^a with
    G = (αA / (βB))^(1/(α+β)). Chapter 12."""
    alpha, beta = fit["alpha"], fit["beta"]
    g = (alpha * fit["A"] / (beta * fit["B"])) ** (1 / (alpha + beta))
    return float(g * (require_positive("budget", budget) / 6) ** (beta / (alpha + beta)))


def _provenance(jobs: int, threads: int, argv: list[str]) -> dict[str, str]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "unknown"
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--", "transformer_lib") else ""
    return {"commit": git("rev-parse", "HEAD") + dirty, "torch": torch.__version__,
            "threads": f"{threads} per point, {jobs} points at a time",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(["python -m transformer_lib.scaling", *argv])}


def _worker(point: tuple[float, int, int], threads: int) -> dict:
    return train_point(*point, threads=threads)


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring): run :data:`PLAN`, write the CSV. Chapter 12."""
    from tqdm import tqdm

    p = argparse.ArgumentParser(prog="python -m transformer_lib.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--jobs", type=int, default=2, help="points trained at a time, one process each")
    p.add_argument("--threads", type=int, default=1, help="threads per point")
    p.add_argument("--no-progress", action="store_true")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    points, provenance = plan_points(), _provenance(args.jobs, args.threads, argv)
    rows, start = [], time.perf_counter()
    bar = tqdm(total=sum(c for c, _, _ in points) / 1e12, disable=args.no_progress, file=sys.stderr,
               bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} TFLOPs {elapsed}{postfix}")
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_worker, point, args.threads) for point in points]
        for future in as_completed(futures):
            rows.append(row := future.result())
            bar.set_postfix_str(f"C={row['budget']:.0e} d={row['d_model']} seed {row['seed']}: "
                                f"{row['val_loss']:.3f}", refresh=False)
            bar.update(row["budget"] / 1e12)
    bar.close()
    rows.sort(key=lambda r: (r["budget"], r["d_model"], r["seed"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        f.writelines(f"# {k}: {v}\n" for k, v in provenance.items())
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "budget": f"{r['budget']:g}", "peak_lr": f"{r['peak_lr']:.6g}",
                        "val_loss": f"{r['val_loss']:.6f}", "seconds": f"{r['seconds']:.1f}",
                        "cpu_seconds": f"{r['cpu_seconds']:.1f}"})
    print(f"{len(rows)} points in {time.perf_counter() - start:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
