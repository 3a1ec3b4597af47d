"""The measurements `guides/running.md` reports for the training lab (`transformer_lib.lab`).

Runs the lab one configuration at a time (nothing else should run on the machine) and writes

- `guides/samples/lab_curves.csv`: for each configuration trained for 60 s, the validation
  loss on every eighth 64-character window every 5 s (the clock paused while it is measured),
  and the final loss on the whole validation split: the split the configurations are compared
  and tuned on;
- `guides/samples/lab_seeds.csv`: the lab's defaults at 40 s and at 60 s over seeds 0–4, their
  loss on the whole test split (the number to report: no choice was made on it) and on the
  whole validation split, and the seconds spent evaluating and sampling after training;
- `guides/samples/lab_curves.png`: the curves, with the goals.

    python scripts/lab_sweep.py [--only curves|seeds]   (about 20 minutes on two cores)
"""
from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from transformer_lib.lab import LAB_DEFAULTS

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "guides" / "samples"
LAST = re.compile(r"test_loss=(?P<test_loss>\d+\.\d{3}) val_loss=(?P<val_loss>\d+\.\d{3}) steps=(?P<steps>\d+) "
                  r"tokens=(?P<tokens>\d+) seconds=(?P<seconds>\d+\.\d) eval_seconds=(?P<eval_seconds>\d+\.\d)")
GOALS = ((40, 1.72), (60, 1.65))
SEED_COLUMNS = ["d_model", "layers", "heads", "context", "batch", "lr", "muon_lr", "warmup", "clip", "threads"]  # the defaults used
# name -> lab options; the last one is the lab's defaults
NO_MUON = ["--muon-lr", "0"]  # AdamW for every parameter
CONFIGS = {
    "reference recipe: 4 layers, batch 12, AdamW lr 1e-3": ["--layers", "4", "--batch", "12", "--lr", "1e-3",
                                                            *NO_MUON],
    "4 layers, batch 12, AdamW lr 5e-3": ["--layers", "4", "--batch", "12", "--lr", "5e-3", *NO_MUON],
    "3 layers, batch 16, AdamW lr 8e-3": ["--layers", "3", "--batch", "16", "--lr", "8e-3", *NO_MUON],
    "1 layer, d = 192, 6 heads, batch 16, AdamW lr 8e-3": ["--layers", "1", "--d-model", "192", "--heads", "6",
                                                           "--batch", "16", "--lr", "8e-3", *NO_MUON],
    "2 layers, batch 24, AdamW lr 8e-3 (the defaults without Muon)": NO_MUON,
    "2 layers, batch 24, Muon lr 0.012, AdamW lr 8e-3 (the defaults)": [],
}


def run_lab(seconds: int, seed: int, options: list[str], curve: float = 0.0) -> tuple[dict, list[list[str]]]:
    """One lab run -> (its last line's values, its curve rows)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "transformer_lib.lab", "shakespeare", "--seconds", str(seconds),
               "--seed", str(seed), "--out", out, "--no-progress", *options]
        if curve:
            cmd += ["--curve", str(curve)]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
        m = LAST.fullmatch(done.stdout.rstrip("\n").split("\n")[-1])
        rows = list(csv.reader(open(Path(out) / "curve.csv")))[1:] if curve else []
    if m is None:
        raise ValueError(f"the lab's last line: expected {LAST.pattern}, got {done.stdout.splitlines()[-1:]}")
    result = dict(test_loss=float(m["test_loss"]), val_loss=float(m["val_loss"]), steps=int(m["steps"]),
                  seconds=float(m["seconds"]), eval_seconds=float(m["eval_seconds"]))
    print(f"{seconds:>3} s seed {seed} {' '.join(options) or '(defaults)'}: {result}", flush=True)
    return result, rows


def curves() -> None:
    with open(OUT / "lab_curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["configuration", "seconds", "steps", "val_loss_every_8th_window", "final_val_loss"])
        for name, options in CONFIGS.items():
            result, rows = run_lab(60, 0, options, curve=5)
            for seconds, steps, loss in rows:
                w.writerow([name, seconds, steps, loss, f"{result['val_loss']:.3f}"])
    plot()


def seeds() -> None:
    config = [LAB_DEFAULTS[k] for k in SEED_COLUMNS]
    with open(OUT / "lab_seeds.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seconds", "seed", "steps", "test_loss", "val_loss", "eval_seconds", *SEED_COLUMNS])
        for seconds, _ in GOALS:
            for seed in range(5):
                result, _ = run_lab(seconds, seed, [])
                w.writerow([seconds, seed, result["steps"], f"{result['test_loss']:.3f}",
                            f"{result['val_loss']:.3f}", f"{result['eval_seconds']:.1f}", *config])


def plot() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from transformer_lib.viz import use_book_style

    use_book_style()  # transparent, mid-grey ink: the figure reads on the light and the dark page

    rows = list(csv.DictReader(open(OUT / "lab_curves.csv")))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for name in dict.fromkeys(r["configuration"] for r in rows):
        mine = [r for r in rows if r["configuration"] == name]
        ax.plot([float(r["seconds"]) for r in mine], [float(r["val_loss_every_8th_window"]) for r in mine],
                marker="o", ms=3, lw=2.5 if name.endswith("(the defaults)") else 1.2, label=name)
    ax.plot([s for s, _ in GOALS], [g for _, g in GOALS], marker="*", ms=12, color="grey", ls="none",
            label="goals: " + ", ".join(f"{g} by {s} s" for s, g in GOALS) + " (each its own budget)")
    ax.set(xlabel="seconds of training (60 s budget)", ylabel="validation loss (nats/char)", ylim=(1.55, 2.6),
           title="The lab on two cores: validation loss against time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "lab_curves.png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["curves", "seeds", "plot"])
    only = parser.parse_args().only
    if only in (None, "curves"):
        curves()
    if only in (None, "seeds"):
        seeds()
    if only == "plot":
        plot()
