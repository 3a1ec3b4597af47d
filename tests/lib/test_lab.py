"""The training lab (`python -m transformer_lib.lab`, Chapter 7): on a budget of a few seconds
with a tiny model its validation loss falls far below the untrained model's, its last line
parses and states what it did, its checkpoint reloads into `GPT` with the same validation loss
and samples the same text with the same seed; its schedule and its evaluation protocol are
checked against independent computations."""
from __future__ import annotations

import importlib.util
import math
import re

import pytest
import torch
import torch.nn.functional as F

from transformer_lib import lab
from transformer_lib.config import ModelConfig
from transformer_lib.corpus import SHAKESPEARE_ALPHABET, shakespeare_ids
from transformer_lib.data import CharTokenizer
from transformer_lib.model import GPT

from repo_paths import REPO

# scripts/lab_sweep.py: what the guide's numbers come from
_spec = importlib.util.spec_from_file_location("lab_sweep", REPO / "scripts" / "lab_sweep.py")
lab_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_sweep)

LAST = re.compile(r"val_loss=(\d+\.\d{3}) steps=(\d+) tokens=(\d+) seconds=(\d+\.\d)")
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--batch", "16", "--threads", "1",
        "--warmup", "10", "--lr", "1e-2", "--no-progress"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 3-second lab run; also records every gradient clipping it asked for (max_norm, norm
    before), and the gradient's norm each time the optimiser steps."""
    out = tmp_path_factory.mktemp("lab")
    import contextlib
    import io

    buffer, clipped, clip, stepped = io.StringIO(), [], torch.nn.utils.clip_grad_norm_, []

    def recording_clip(parameters, max_norm, *args, **kwargs):
        norm = clip(parameters, max_norm, *args, **kwargs)
        clipped.append((max_norm, float(norm)))
        return norm

    def before_step(optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        stepped.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(before_step)
    try:
        with contextlib.redirect_stdout(buffer), pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
            assert lab.main(["shakespeare", "--seconds", "3", "--seed", "1", "--out", str(out), "--curve", "1", *TINY]) == 0
    finally:
        handle.remove()
    torch.set_num_threads(1)
    return out, buffer.getvalue().rstrip("\n").split("\n"), clipped, stepped


def test_the_last_line_parses_and_the_loss_falls(run):
    out, lines, _, _ = run
    m = LAST.fullmatch(lines[-1])
    assert m, lines[-1]
    val, steps, tokens, seconds = float(m[1]), int(m[2]), int(m[3]), float(m[4])
    assert tokens == steps * 16 * 64 and steps > 20
    assert 3.0 <= seconds < 4.0
    untrained = math.log(len(SHAKESPEARE_ALPHABET))           # 4.43: a model that knows nothing
    assert val < untrained - 0.5, val
    curve = (out / "curve.csv").read_text().split("\n")[1:-1]
    losses = [float(row.split(",")[2]) for row in curve]
    assert len(losses) >= 3 and losses[-1] < losses[0], losses


def test_the_checkpoint_reloads_and_samples_the_same_text(run):
    out, lines, _, _ = run
    model, tokenizer = lab.load_checkpoint(out / "checkpoint.pt")
    assert isinstance(model, GPT) and tokenizer.vocab_size == len(SHAKESPEARE_ALPHABET)
    sample = (out / "sample.txt").read_text()[:-1]
    assert sample.startswith(lab.PROMPT) and len(sample) == len(lab.PROMPT) + 500
    assert lab.sample(model, tokenizer, seed=1) == sample
    assert lab.sample(model, tokenizer, seed=2) != sample
    _, val_ids = shakespeare_ids()
    reported = float(LAST.fullmatch(lines[-1])[1])
    assert abs(lab.validation_loss(model, val_ids) - reported) < 5e-4


def test_every_step_clips_the_gradient_to_the_default_norm(run):
    """The lab's default clips at norm 1 on every step, and early steps do get clipped (their
    gradient's norm is larger than 1), so the option is not idle."""
    _, lines, clipped, stepped = run
    steps = int(LAST.fullmatch(lines[-1])[2])
    assert len(clipped) == steps and {m for m, _ in clipped} == {lab.LAB_DEFAULTS["clip"]} == {1.0}
    assert max(norm for _, norm in clipped[:20]) > 1.0, clipped[:20]


def test_the_optimiser_steps_on_the_clipped_gradient(run):
    """The order of a step: the gradient is clipped before the optimiser reads it. At every step
    the gradient the optimiser sees has norm at most 1, although early raw gradients are larger;
    a loop that clipped after the step, or never, would hand it those."""
    _, lines, clipped, stepped = run
    assert len(stepped) == int(LAST.fullmatch(lines[-1])[2]) == len(clipped)
    assert max(stepped) <= 1.0 + 1e-5, max(stepped)
    assert all(abs(seen - min(raw, 1.0)) < 1e-4 for seen, (_, raw) in zip(stepped, clipped))


def test_validation_loss_is_the_mean_over_non_overlapping_windows_of_64():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=7, n_ctx=64, d_model=8, n_layers=1, n_heads=2)).eval()
    ids = torch.randint(0, 7, (64 * 5 + 3,), generator=torch.Generator().manual_seed(1))
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 64, 64):                 # windows 0..63, 64..127, …
            x, y = ids[start:start + 64], ids[start + 1:start + 65]
            total += F.cross_entropy(model(x[None])[0], y, reduction="sum").item()
            count += 64
    assert count == 5 * 64
    assert abs(lab.validation_loss(model, ids, batch=2) - total / count) < 1e-6


def test_the_schedule_warms_up_then_decays_to_a_tenth_at_the_budget():
    peak = 3e-3
    assert lab.lr_at(0, 0.0, peak, warmup=10) == pytest.approx(peak / 10)
    assert lab.lr_at(9, 0.0, peak, warmup=10) == pytest.approx(peak)
    assert lab.lr_at(100, 0.5, peak, warmup=10) == pytest.approx(peak * 0.55)
    assert lab.lr_at(100, 1.0, peak, warmup=10) == pytest.approx(peak * 0.1)
    assert lab.lr_at(100, 1.5, peak, warmup=10) == pytest.approx(peak * 0.1)


@pytest.mark.parametrize("args, phrase", [
    (["--seconds", "0"], "--seconds: expected a finite number > 0, got 0.0"),
    (["--seconds", "inf"], "--seconds: expected a finite number > 0, got inf"),
    (["--lr", "nan"], "--lr: expected a finite number > 0, got nan"),
    (["--curve", "-1"], "--curve: expected a finite number of seconds >= 0 (0: no curve), got -1.0"),
    (["--curve", "nan"], "--curve: expected a finite number of seconds >= 0 (0: no curve), got nan"),
    (["--context", "32"], "--context: expected at least the 64 characters"),
    (["--batch", "0"], "--batch: expected an int >= 1, got 0"),
    (["--clip", "-1"], "--clip: expected a number >= 0 (0: no clipping), got -1.0"),
])
def test_bad_options_are_refused_by_name(args, phrase, capsys):
    with pytest.raises(SystemExit) as err:
        lab.main(["shakespeare", *args])
    assert phrase in str(err.value)


def test_sample_is_deterministic_and_uses_the_tokenizer():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=len(SHAKESPEARE_ALPHABET), n_ctx=64, d_model=16, n_layers=1, n_heads=2))
    tok = CharTokenizer(SHAKESPEARE_ALPHABET)
    a, b = lab.sample(model, tok, n=80, seed=3), lab.sample(model, tok, n=80, seed=3)
    assert a == b and len(a) == len(lab.PROMPT) + 80 and set(a) <= set(SHAKESPEARE_ALPHABET)


def _guide_row(text: str, first_cell: str) -> list[str]:
    """The cells of the guide's table row that begins with ``first_cell``."""
    rows = [ln for ln in text.splitlines() if ln.startswith(f"| {first_cell} |")]
    assert len(rows) == 1, f"guides/running.md: expected one table row starting with {first_cell!r}, got {rows}"
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def test_the_guide_reports_the_measurements_of_the_current_defaults():
    """guides/running.md (and the README) quote what scripts/lab_sweep.py measured with the lab's current defaults:
    the range over seeds 0-4 at 40 s and 60 s, and each configuration's loss at 60 s under its curve."""
    import csv

    samples = REPO / "guides" / "samples"
    guide = (REPO / "guides" / "running.md").read_text()
    readme = (REPO / "README.md").read_text()
    seeds = list(csv.DictReader(open(samples / "lab_seeds.csv")))
    for row in seeds:
        assert {k: row[k] for k in lab_sweep.SEED_COLUMNS} == {k: str(lab.LAB_DEFAULTS[k]) for k in lab_sweep.SEED_COLUMNS}, \
            "lab_seeds.csv was measured with other defaults: rerun scripts/lab_sweep.py"
    for seconds, goal in lab_sweep.GOALS:
        losses = sorted(float(r["val_loss"]) for r in seeds if r["seconds"] == str(seconds))
        steps = sorted(int(r["steps"]) for r in seeds if r["seconds"] == str(seconds))
        assert len(losses) == 5
        cells = _guide_row(guide, f"{seconds} s")
        assert cells[1] == f"≤ {goal}" and cells[2] == f"{losses[0]:.3f}–{losses[-1]:.3f}", cells
        assert cells[3] == f"{steps[0]:,}–{steps[-1]:,}", cells
        assert f"{losses[0]:.3f}–{losses[-1]:.3f} after {seconds} s" in " ".join(readme.split()), "README.md"
    curves = list(csv.DictReader(open(samples / "lab_curves.csv")))
    assert [*dict.fromkeys(r["configuration"] for r in curves)] == list(lab_sweep.CONFIGS)
    for name in lab_sweep.CONFIGS:
        last = [r for r in curves if r["configuration"] == name][-1]
        assert float(last["seconds"]) >= 60 and _guide_row(guide, name)[1:] == [f"{int(last['steps']):,}",
                                                                                last["final_val_loss"]], name
    defaults = [r for r in curves if "(the defaults)" in r["configuration"]]
    below = next(round(float(r["seconds"])) for r in defaults if float(r["val_loss_every_8th_window"]) < 1.88)
    assert f"below 1.88 after {below} s" in " ".join(guide.split()) and f"below 1.88 after {below} s" in " ".join(
        readme.split()), "the time to 1.88 quoted is not the curve's"
    assert "](samples/lab_curves.png)" in guide and (samples / "lab_curves.png").stat().st_size > 10_000
