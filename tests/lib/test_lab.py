"""The training lab (`python -m transformer_lib.lab`, Chapter 7): on a budget of a few seconds
with a tiny model its test and validation losses fall far below the untrained model's, its last
line parses and states what it did, its checkpoint reloads into `GPT` with the same losses on
the test and validation text and samples the same text with the same seed; it trains on none
of the held-out text, decays only the weight matrices and embeddings, and reports its
evaluation time; its splits, schedule and evaluation protocol are checked against independent
computations, and every bad option is refused by name."""
from __future__ import annotations

import importlib.util
import math
import re

import pytest
import torch
import torch.nn.functional as F

from transformer_lib import lab
from transformer_lib.block import LayerNorm, RMSNorm
from transformer_lib.config import ModelConfig
from transformer_lib.corpus import SHAKESPEARE_ALPHABET, shakespeare_ids, shakespeare_text
from transformer_lib.data import CharTokenizer
from transformer_lib.model import GPT

from repo_paths import REPO

# scripts/lab_sweep.py: what the guide's numbers come from
_spec = importlib.util.spec_from_file_location("lab_sweep", REPO / "scripts" / "lab_sweep.py")
lab_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_sweep)

LAST = lab_sweep.LAST  # the lab's last line, as scripts/lab_sweep.py reads it
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--batch", "16", "--threads", "1",
        "--warmup", "10", "--lr", "1e-2", "--no-progress"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 3-second lab run; also records every gradient clipping it asked for (max_norm, norm
    before), the gradient's norm each time the optimiser steps, the model and the optimiser,
    and the text every training batch was drawn from."""
    out = tmp_path_factory.mktemp("lab")
    import contextlib
    import io

    buffer, clipped, clip, stepped = io.StringIO(), [], torch.nn.utils.clip_grad_norm_, []
    seen = dict(models=[], optimisers=set(), texts=[])

    def recording_clip(parameters, max_norm, *args, **kwargs):
        norm = clip(parameters, max_norm, *args, **kwargs)
        clipped.append((max_norm, float(norm)))
        return norm

    def recording_batch(ids, *args, **kwargs):
        if not seen["texts"] or seen["texts"][-1] is not ids:
            seen["texts"].append(ids)
        return text_batch(ids, *args, **kwargs)

    def recording_gpt(config):
        seen["models"].append(GPT(config))
        return seen["models"][-1]

    def before_step(optimizer, args, kwargs):  # each optimiser steps on its share of the parameters
        seen["optimisers"].add(optimizer)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        stepped.append(float(sum(g.pow(2).sum() for g in grads)))
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    text_batch = lab.text_batch
    handle = register_optimizer_step_pre_hook(before_step)
    try:
        with contextlib.redirect_stdout(buffer), pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
            mp.setattr(lab, "text_batch", recording_batch)
            mp.setattr(lab, "GPT", recording_gpt)
            assert lab.main(["shakespeare", "--seconds", "3", "--seed", "1", "--out", str(out), "--curve", "1", *TINY]) == 0
    finally:
        handle.remove()
    torch.set_num_threads(1)
    return out, buffer.getvalue().rstrip("\n").split("\n"), clipped, stepped, seen


def test_the_last_line_parses_and_the_loss_falls(run):
    out, lines, _, _, _ = run
    m = LAST.fullmatch(lines[-1])
    assert m, lines[-1]
    test, val = float(m["test_loss"]), float(m["val_loss"])
    steps, tokens, seconds = int(m["steps"]), int(m["tokens"]), float(m["seconds"])
    assert tokens == steps * 16 * 64 and steps > 20
    assert 3.0 <= seconds < 4.0
    untrained = math.log(len(SHAKESPEARE_ALPHABET))           # 4.43: a model that knows nothing
    assert test < untrained - 0.5 and val < untrained - 0.5, (test, val)
    curve = (out / "curve.csv").read_text().split("\n")[1:-1]
    losses = [float(row.split(",")[2]) for row in curve]
    assert len(losses) >= 3 and losses[-1] < losses[0], losses


def test_the_evaluation_time_is_reported_and_bounded(run):
    """The last line states the time spent after training (both splits evaluated, the checkpoint
    saved, 500 characters sampled): for the tiny model a second or two, bounded generously."""
    _, lines, _, _, _ = run
    assert 0.0 < float(LAST.fullmatch(lines[-1])["eval_seconds"]) < 20.0, lines[-1]


def test_the_splits_are_contiguous_disjoint_and_the_sizes_stated():
    """Train, test and validation are the corpus's first 85 %, the next N // 20 characters and the
    last N // 10 characters, in order, without gap or overlap: compared with the text itself,
    sliced and encoded character by character. Validation is the corpus's own split, unchanged."""
    train, test, val = lab.lab_splits()
    text = shakespeare_text()
    n = len(text)
    assert (len(train), len(test), len(val)) == (n - n // 10 - n // 20, n // 20, n // 10)
    assert len(test) / n == pytest.approx(0.05, abs=1e-6) and len(val) / n == pytest.approx(0.10, abs=1e-6)
    table = {c: i for i, c in enumerate(SHAKESPEARE_ALPHABET)}
    cut_test, cut_val = n - n // 10 - n // 20, n - n // 10
    for ids, (a, b) in ((train, (0, cut_test)), (test, (cut_test, cut_val)), (val, (cut_val, n))):
        for start in (a, (a + b) // 2, b - 1000):  # three stretches of each split
            assert ids[start - a:start - a + 1000].tolist() == [table[c] for c in text[start:start + 1000]]
    assert torch.equal(val, shakespeare_ids()[1])


def test_training_reads_only_the_training_split(run):
    """Every training batch is drawn from the lab's training split, which holds none of the test
    and validation text."""
    _, _, _, _, seen = run
    train, test, val = lab.lab_splits()
    assert len(seen["texts"]) == 1 and torch.equal(seen["texts"][0], train)
    assert len(train) + len(test) + len(val) == len(shakespeare_text())


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest(run):
    """Muon updates every nn.Linear weight of the blocks; AdamW the embeddings (the learned positions
    and the token embedding, tied to the output matrix) with weight decay 0.1, and the norms' gains
    without; Muon decays its matrices by 0.1 too. Each parameter sits in exactly one group, the tied
    output matrix once, and each group ends the run at a tenth of its own peak learning rate."""
    _, _, _, _, seen = run
    (model,) = seen["models"]
    adamw, muon = sorted(seen["optimisers"], key=lambda o: type(o).__name__)
    assert type(adamw) is torch.optim.AdamW and type(muon) is torch.optim.Muon
    groups = [*adamw.param_groups, *muon.param_groups]
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    names = {id(p): name for name, p in model.named_parameters()}
    matrices = {f"{name}.weight" for name, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and name.startswith("blocks.")}
    assert len(matrices) == 6 and {names[id(p)] for g in muon.param_groups for p in g["params"]} == matrices
    assert all(g["weight_decay"] == 0.1 for g in muon.param_groups)
    decay = [g for g in adamw.param_groups if g["weight_decay"] == 0.1]
    plain = [g for g in adamw.param_groups if g["weight_decay"] == 0.0]
    assert len(decay) == len(plain) == 1 and len(adamw.param_groups) == 2
    assert sorted(names[id(p)] for p in decay[0]["params"]) == ["pos_emb.weight", "tok_emb.weight"]
    assert model.lm_head.weight is model.tok_emb.weight
    norms = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, (LayerNorm, RMSNorm))}
    assert sorted(names[id(p)] for p in plain[0]["params"]) == sorted(norms) == [
        "blocks.0.norm1.weight", "blocks.0.norm2.weight", "norm_f.weight"]
    for opt, peak in ((adamw, 1e-2), (muon, lab.LAB_DEFAULTS["muon_lr"])):
        for g in opt.param_groups:
            assert g["peak"] == peak and g["lr"] == pytest.approx(0.1 * peak, rel=0.05), (type(opt), g["lr"], peak)


def test_without_muon_adamw_updates_every_parameter():
    """``muon_lr = 0``: nanoGPT's recipe, one AdamW that decays every matrix and embedding by 0.1
    and no norm's gain."""
    model = GPT(ModelConfig(vocab_size=65, n_ctx=64, d_model=32, n_layers=2, n_heads=2, bias=False))
    (opt,) = lab.optimisers(model, 1e-3, 0.0)
    assert type(opt) is torch.optim.AdamW
    decay, plain = opt.param_groups
    assert (decay["weight_decay"], plain["weight_decay"], decay["peak"]) == (0.1, 0.0, 1e-3)
    assert {id(p) for p in decay["params"]} == {id(p) for p in model.parameters() if p.dim() >= 2}
    assert {id(p) for p in plain["params"]} == {id(p) for p in model.parameters() if p.dim() < 2}


def test_the_checkpoint_reloads_and_samples_the_same_text(run):
    """The reported test and validation losses are those of the saved weights on the test and the
    validation text, computed again here from the reloaded checkpoint."""
    out, lines, _, _, _ = run
    model, tokenizer = lab.load_checkpoint(out / "checkpoint.pt")
    assert isinstance(model, GPT) and tokenizer.vocab_size == len(SHAKESPEARE_ALPHABET)
    sample = (out / "sample.txt").read_text()[:-1]
    assert sample.startswith(lab.PROMPT) and len(sample) == len(lab.PROMPT) + 500
    assert lab.sample(model, tokenizer, seed=1) == sample
    assert lab.sample(model, tokenizer, seed=2) != sample
    text, n = shakespeare_text(), len(shakespeare_text())
    test_ids = tokenizer.encode(text[n - n // 10 - n // 20:n - n // 10])
    _, val_ids = shakespeare_ids()
    m = LAST.fullmatch(lines[-1])
    test, val = lab.validation_loss(model, test_ids), lab.validation_loss(model, val_ids)
    assert abs(test - float(m["test_loss"])) < 5e-4 and abs(val - float(m["val_loss"])) < 5e-4, (test, val, lines[-1])
    assert abs(test - val) > 1e-3, "the two splits should give different losses"
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert (round(saved["test_loss"], 3), round(saved["val_loss"], 3)) == (float(m["test_loss"]), float(m["val_loss"]))


def test_every_step_clips_the_gradient_to_the_default_norm(run):
    """The lab's default clips at norm 1 on every step, and early steps do get clipped (their
    gradient's norm is larger than 1), so the option is not idle."""
    _, lines, clipped, stepped, _ = run
    steps = int(LAST.fullmatch(lines[-1])["steps"])
    assert len(clipped) == steps and {m for m, _ in clipped} == {lab.LAB_DEFAULTS["clip"]} == {1.0}
    assert max(norm for _, norm in clipped[:20]) > 1.0, clipped[:20]


def test_the_optimiser_steps_on_the_clipped_gradient(run):
    """The order of a step: the gradient is clipped before the optimiser reads it. At every step
    the gradient the optimiser sees has norm at most 1, although early raw gradients are larger;
    a loop that clipped after the step, or never, would hand it those."""
    _, lines, clipped, stepped, seen = run
    per_step = len(seen["optimisers"])  # each optimiser steps on its share: the squared norms add up
    stepped = [math.sqrt(sum(stepped[i:i + per_step])) for i in range(0, len(stepped), per_step)]
    assert len(stepped) == int(LAST.fullmatch(lines[-1])["steps"]) == len(clipped)
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


FINITE_POSITIVE = "expected a finite number > 0, got"
CURVE = "--curve: expected a finite number of seconds >= 0 (0: no curve), got"
CLIP = "--clip: expected a finite number >= 0 (0: no clipping), got"
BAD_OPTIONS = [
    *[([f"--{name}", value], f"--{name}: {FINITE_POSITIVE} {shown}")
      for name in ("seconds", "lr") for value, shown in (("0", "0.0"), ("-1", "-1.0"), ("nan", "nan"), ("inf", "inf"))],
    *[(["--curve", value], f"{CURVE} {shown}") for value, shown in (("-1", "-1.0"), ("nan", "nan"), ("inf", "inf"))],
    *[(["--clip", value], f"{CLIP} {shown}") for value, shown in (("-1", "-1.0"), ("nan", "nan"), ("inf", "inf"))],
    *[(["--muon-lr", value], f"--muon-lr: expected a finite number >= 0 (0: no Muon), got {shown}")
      for value, shown in (("-1", "-1.0"), ("nan", "nan"), ("inf", "inf"))],
    *[([f"--{name}", value], f"--{name}: expected an int >= 1, got {value}")
      for name in ("d-model", "layers", "heads", "batch", "warmup", "threads") for value in ("0", "-2")],
    (["--context", "32"], "--context: expected at least the 64 characters of the evaluation windows, got 32"),
    (["--d-model", "130"], "--d-model: expected a multiple of --heads=4, got 130"),
    (["--heads", "3"], "--d-model: expected a multiple of --heads=3, got 128"),
    (["--seed", "-1"], "--seed: expected an int from 0 to 2**63 - 1, got -1"),
    (["--seed", str(2**64)], f"--seed: expected an int from 0 to 2**63 - 1, got {2**64}"),
]


@pytest.mark.parametrize("args, phrase", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_options_are_refused_by_name(args, phrase):
    """Each bad value is refused before anything trains, with a message naming the option, what
    it expects and what it got."""
    with pytest.raises(SystemExit) as err:
        lab.main(["shakespeare", *args])
    assert phrase in str(err.value), str(err.value)


def test_every_option_with_a_value_has_a_bad_value_tested():
    """The list above covers every option of the command line that takes a number; the others
    are the corpus (argparse's choices), the output folder and a switch."""
    numeric = {a.option_strings[0] for a in lab._parser()._actions if a.type in (int, float)}
    assert numeric == {args[0] for args, _ in BAD_OPTIONS}
    assert {a.dest for a in lab._parser()._actions if a.type not in (int, float)} == {"help", "corpus", "out", "no_progress"}


def test_the_defaults_and_edge_values_are_accepted():
    args = lab._checked(lab._parser().parse_args(["shakespeare"]))
    assert (args.seconds, args.curve, args.clip, args.seed) == (60.0, 0.0, 1.0, 0)
    lab._checked(lab._parser().parse_args(["shakespeare", "--clip", "0", "--curve", "0", "--context", "64", "--muon-lr", "0",
                                           "--seed", str(2**63 - 1)]))


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
    the range over seeds 0-4 at 40 s and 60 s of each split lab_seeds.csv holds (the test split, the one to
    report, first), and each configuration's validation loss at 60 s under its curve. The README quotes the
    reported split's range and names it."""
    import csv

    samples = REPO / "guides" / "samples"
    guide = (REPO / "guides" / "running.md").read_text()
    readme = " ".join((REPO / "README.md").read_text().split())
    seeds = list(csv.DictReader(open(samples / "lab_seeds.csv")))
    for row in seeds:
        assert {k: row[k] for k in lab_sweep.SEED_COLUMNS} == {k: str(lab.LAB_DEFAULTS[k]) for k in lab_sweep.SEED_COLUMNS}, \
            "lab_seeds.csv was measured with other defaults: rerun scripts/lab_sweep.py"
    splits = {"test_loss": "test loss", "val_loss": "validation loss"}
    measured = [column for column in splits if column in seeds[0]]          # test first when there is one
    header = _guide_row(guide, "budget")
    assert header == ["budget", "goal", *[f"{splits[c]}, seeds 0–4" for c in measured], "steps"], header
    for seconds, goal in lab_sweep.GOALS:
        rows = [r for r in seeds if r["seconds"] == str(seconds)]
        steps = sorted(int(r["steps"]) for r in rows)
        cells = _guide_row(guide, f"{seconds} s")
        ranges = []
        for column in measured:
            losses = sorted(float(r[column]) for r in rows)
            assert len(losses) == 5
            ranges.append(f"{losses[0]:.3f}–{losses[-1]:.3f}")
        assert cells == [f"{seconds} s", f"≤ {goal}", *ranges, f"{steps[0]:,}–{steps[-1]:,}"], cells
        quoted = readme.find(f"{ranges[0]} after {seconds} s")
        assert quoted > 0 and splits[measured[0]] in readme[max(0, quoted - 300):quoted], \
            f"README.md: expected the {splits[measured[0]]} {ranges[0]} after {seconds} s, named as such"
    if "eval_seconds" in seeds[0]:   # the evaluation's time the guide states bounds every run's
        bound = re.search(r"plus about (\d+) s to evaluate", " ".join(guide.split()))
        assert bound and max(float(r["eval_seconds"]) for r in seeds) <= int(bound[1]), "guides/running.md"
    curves = list(csv.DictReader(open(samples / "lab_curves.csv")))
    assert [*dict.fromkeys(r["configuration"] for r in curves)] == list(lab_sweep.CONFIGS)
    for name in lab_sweep.CONFIGS:
        last = [r for r in curves if r["configuration"] == name][-1]
        assert float(last["seconds"]) >= 60 and _guide_row(guide, name)[1:] == [f"{int(last['steps']):,}",
                                                                                last["final_val_loss"]], name
    assert "](samples/lab_curves.png)" in guide and (samples / "lab_curves.png").stat().st_size > 10_000
