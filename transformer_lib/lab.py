"""The training lab: a character-level GPT trained on Shakespeare against the clock.

    python -m transformer_lib.lab shakespeare --seconds 60 --seed 0 [--out DIR]

trains the library's ``GPT`` on the lab's training split of the Shakespeare corpus
(``transformer_lib.corpus``, see :func:`lab_splits`) for ``--seconds`` of wall time, with
torch's Muon for the blocks' weight matrices and AdamW for the embeddings and the norms' gains
(:func:`optimisers`; ``--muon-lr 0``: AdamW for everything, nanoGPT's recipe), weight decay 0.1
on every matrix and embedding and none on the gains and biases, the gradient's norm clipped to 1
(``--clip``), and learning rates that warm up
linearly over the first steps and then follows a cosine from its peak down to a tenth of it,
reached exactly when the time is up (the schedule is a function of the elapsed fraction of the
budget, not of a step count). A progress bar shows the running training loss, then a second
one the evaluation. The lab measures the test loss and the validation loss, each the mean
next-character cross-entropy over the whole split in non-overlapping windows of 64 characters
(the same protocol whatever context the model trains with): the validation split is the one
the defaults were tuned on, the test split was never used to choose anything, so its loss is
the one to report. It writes ``checkpoint.pt``, ``sample.txt`` and, with ``--curve S``,
``curve.csv`` (the loss on every eighth validation window each S seconds, the clock paused
while it is measured) to DIR, and prints as its last line::

    test_loss=1.627 val_loss=1.623 steps=1615 tokens=2480640 seconds=60.0 eval_seconds=6.6

(``eval_seconds``: the time after training, to evaluate both splits, save and sample; about 7 s
with the defaults on two cores.)

The model size, batch, context, peak learning rates, warm-up, clipping and threads are options;
their defaults are the configuration that `guides/running.md` reports (`scripts/lab_sweep.py`
measures it). Chapter 7.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor, nn

from transformer_lib.config import ModelConfig
from transformer_lib.corpus import SHAKESPEARE_ALPHABET, shakespeare_ids
from transformer_lib.data import CharTokenizer, text_batch
from transformer_lib.model import GPT
from transformer_lib.train import cross_entropy_loss, evaluate_loss

__all__ = ["EVAL_WINDOW", "LAB_DEFAULTS", "WEIGHT_DECAY", "lab_splits", "optimisers", "lr_at",
           "validation_loss", "load_checkpoint", "sample", "main"]

EVAL_WINDOW = 64
# The configuration the lab trains by default (the README's).
LAB_DEFAULTS = dict(vocab_size=len(SHAKESPEARE_ALPHABET), d_model=128, layers=2, heads=4, context=64,
                    batch=24, lr=8e-3, muon_lr=0.012, warmup=100, clip=1.0, threads=2)
WEIGHT_DECAY = 0.1    # on parameters with two or more dimensions only
PROMPT = "KING.\n"


def lab_splits() -> tuple[Tensor, Tensor, Tensor]:
    """The lab's three contiguous splits of the corpus's N characters as ids: ``(train, test,
    validation)``. Validation is the corpus's own (:func:`~transformer_lib.corpus.shakespeare_ids`),
    the last ``N // 10`` characters; test is the ``N // 20`` characters just before it, cut
    from the end of the corpus's training split; the lab trains on the rest, the first 85 %.
    Chapter 7."""
    train, val = shakespeare_ids()
    k = (len(train) + len(val)) // 20
    return train[:-k], train[-k:], val


def optimisers(model: nn.Module, lr: float, muon_lr: float,
               weight_decay: float = WEIGHT_DECAY) -> list[torch.optim.Optimizer]:
    """The lab's optimisers. With ``muon_lr > 0``, torch's Muon updates the blocks' weight matrices
    (the 2-D parameters under ``blocks.``: Q, K, V, output and MLP projections) with peak learning
    rate ``muon_lr``, and AdamW (peak ``lr``) everything else; with ``muon_lr = 0`` AdamW updates
    every parameter, as in nanoGPT. AdamW decays the parameters with two or more dimensions
    (embeddings, and the matrices it updates) by ``weight_decay``, the norms' gains and biases not
    at all; Muon decays its matrices by the same factor. Each parameter group carries its peak
    learning rate as ``"peak"``; a tied parameter appears once. Chapter 7."""
    named = dict(model.named_parameters())      # the tied output matrix once, as tok_emb.weight
    muon = [p for n, p in named.items() if muon_lr > 0 and p.dim() == 2 and n.startswith("blocks.")]
    muon_ids = {id(p) for p in muon}
    rest = [p for p in named.values() if id(p) not in muon_ids]
    groups = [dict(params=[p for p in rest if p.dim() >= 2], weight_decay=weight_decay, peak=lr),
              dict(params=[p for p in rest if p.dim() < 2], weight_decay=0.0, peak=lr)]
    found = [torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.99), foreach=True)]
    if muon:
        found.append(torch.optim.Muon([dict(params=muon, peak=muon_lr)], lr=muon_lr, weight_decay=weight_decay))
    return found


def lr_at(step: int, elapsed: float, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Learning rate after ``step`` steps and a fraction ``elapsed`` of the time budget: a linear
    warm-up over ``warmup`` steps, times a cosine from ``peak`` to ``floor·peak`` at
    ``elapsed = 1``. Chapter 7."""
    cosine = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(max(elapsed, 0.0), 1.0)))
    return peak * min(1.0, (step + 1) / warmup) * cosine


def _windows(ids: Tensor, every: int = 1) -> tuple[Tensor, Tensor]:
    """Non-overlapping windows of ``EVAL_WINDOW`` characters: inputs and targets
    ``(n_windows, 64)``, every ``every``-th window."""
    x = ids[:-1].unfold(0, EVAL_WINDOW, EVAL_WINDOW)[::every]
    y = ids[1:].unfold(0, EVAL_WINDOW, EVAL_WINDOW)[::every]
    return x, y


def validation_loss(model: GPT, ids: Tensor, every: int = 1, batch: int = 512, bar=None) -> float:
    """Mean next-character cross-entropy (nats) of ``model`` over ``ids (N,)`` in non-overlapping
    windows of 64 characters (every ``every``-th window); ``bar`` (a tqdm bar) advances by the
    windows of each batch. Chapter 7."""
    x, y = _windows(ids, every)

    def batches():
        for i in range(0, len(x), batch):
            yield x[i:i + batch], y[i:i + batch]
            if bar is not None:
                bar.update(len(x[i:i + batch]))
    return evaluate_loss(model, batches())


def sample(model: GPT, tokenizer: CharTokenizer, n: int = 500, seed: int = 0, prompt: str = PROMPT) -> str:
    """``prompt`` and ``n`` characters sampled from ``model`` (temperature 0.8, top-10) with a
    generator seeded by ``seed``: the same text for the same weights and seed. Chapter 7."""
    was_training = model.training
    ids = model.eval().generate(tokenizer.encode(prompt), n, temperature=0.8, top_k=10,
                                generator=torch.Generator().manual_seed(seed))
    model.train(was_training)
    return tokenizer.decode(ids)


def load_checkpoint(path: str | Path) -> tuple[GPT, CharTokenizer]:
    """A ``checkpoint.pt`` written by the lab -> ``(GPT with its weights, its tokenizer)``.
    Chapter 7."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = GPT(ModelConfig(**state["config"]))
    model.load_state_dict(state["model"])
    return model.eval(), CharTokenizer(state["alphabet"])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m transformer_lib.lab", description=__doc__.split("\n\n")[0])
    p.add_argument("corpus", choices=["shakespeare"])
    p.add_argument("--seconds", type=float, default=60.0, help="wall-clock training budget (default 60)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("_build/lab"), help="folder for checkpoint, sample, curve")
    p.add_argument("--d-model", type=int, default=LAB_DEFAULTS["d_model"])
    p.add_argument("--layers", type=int, default=LAB_DEFAULTS["layers"])
    p.add_argument("--heads", type=int, default=LAB_DEFAULTS["heads"])
    p.add_argument("--context", type=int, default=LAB_DEFAULTS["context"])
    p.add_argument("--batch", type=int, default=LAB_DEFAULTS["batch"])
    p.add_argument("--lr", type=float, default=LAB_DEFAULTS["lr"], help="AdamW's peak learning rate")
    p.add_argument("--muon-lr", type=float, default=LAB_DEFAULTS["muon_lr"],
                   help="Muon's peak learning rate for the blocks' matrices (0: AdamW for every parameter)")
    p.add_argument("--warmup", type=int, default=LAB_DEFAULTS["warmup"], help="warm-up steps")
    p.add_argument("--clip", type=float, default=LAB_DEFAULTS["clip"],
                   help="clip the gradient's norm to this value (0: no clipping)")
    p.add_argument("--threads", type=int, default=LAB_DEFAULTS["threads"])
    p.add_argument("--curve", type=float, default=0.0, help="measure a validation curve every S seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _checked(args: argparse.Namespace) -> argparse.Namespace:
    for name in ("seconds", "lr"):
        if not 0 < getattr(args, name) < math.inf:
            raise SystemExit(f"--{name}: expected a finite number > 0, got {getattr(args, name)}")
    if not 0 <= args.muon_lr < math.inf:
        raise SystemExit(f"--muon-lr: expected a finite number >= 0 (0: no Muon), got {args.muon_lr}")
    if not 0 <= args.curve < math.inf:
        raise SystemExit(f"--curve: expected a finite number of seconds >= 0 (0: no curve), got {args.curve}")
    for name in ("d_model", "layers", "heads", "batch", "warmup", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: expected an int >= 1, got {getattr(args, name)}")
    if not 0 <= args.clip < math.inf:
        raise SystemExit(f"--clip: expected a finite number >= 0 (0: no clipping), got {args.clip}")
    if args.context < EVAL_WINDOW:
        raise SystemExit(f"--context: expected at least the {EVAL_WINDOW} characters of the evaluation "
                         f"windows, got {args.context}")
    if args.d_model % args.heads:
        raise SystemExit(f"--d-model: expected a multiple of --heads={args.heads}, got {args.d_model}")
    if not 0 <= args.seed < 2**63:
        raise SystemExit(f"--seed: expected an int from 0 to 2**63 - 1, got {args.seed}")
    return args


def _train(model: GPT, train_ids: Tensor, val_ids: Tensor, args: argparse.Namespace,
           curve: list[tuple[float, int, float]]) -> tuple[int, float]:
    """The timed loop; returns (steps, training seconds). Chapter 7."""
    from tqdm import tqdm

    opts = optimisers(model, args.lr, args.muon_lr)
    gen = torch.Generator().manual_seed(args.seed)
    bar = tqdm(total=round(args.seconds), unit="s", disable=args.no_progress, file=sys.stderr, desc="training",
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s{postfix}")
    steps, clock, running, next_curve = 0, 0.0, None, args.curve
    while clock < args.seconds:
        start = time.perf_counter()
        for group in (g for opt in opts for g in opt.param_groups):
            group["lr"] = lr_at(steps, clock / args.seconds, group["peak"], args.warmup)
        x, y = text_batch(train_ids, args.batch, args.context, gen)
        loss = cross_entropy_loss(model(x), y)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip, foreach=True)
        for opt in opts:
            opt.step()
        steps += 1
        clock += time.perf_counter() - start
        value = loss.item()
        running = value if running is None else 0.95 * running + 0.05 * value
        bar.set_postfix_str(f"loss {running:.3f}, step {steps}", refresh=False)
        bar.update(min(clock, args.seconds) - bar.n)
        if args.curve and (clock >= next_curve or clock >= args.seconds):   # clock paused
            curve.append((clock, steps, validation_loss(model, val_ids, every=8)))
            next_curve += args.curve
    bar.close()
    return steps, clock


def _evaluate(model: GPT, test_ids: Tensor, val_ids: Tensor, args: argparse.Namespace) -> tuple[float, float, str]:
    """After training: the test and validation losses over the whole splits and the sample, under
    a second progress bar (in windows of 64 characters, then the sample's characters) ->
    ``(test loss, validation loss, sample)``. Chapter 7."""
    from tqdm import tqdm

    n_sample = 500
    windows = (len(test_ids) - 1) // EVAL_WINDOW + (len(val_ids) - 1) // EVAL_WINDOW
    with tqdm(total=windows + n_sample, unit="", disable=args.no_progress, file=sys.stderr, desc="evaluating",
              bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}{postfix}") as bar:
        bar.set_postfix_str("test split", refresh=False)
        test = validation_loss(model, test_ids, bar=bar)
        bar.set_postfix_str("validation split", refresh=False)
        val = validation_loss(model, val_ids, bar=bar)
        bar.set_postfix_str(f"sampling {n_sample} characters")
        text = sample(model, CharTokenizer(SHAKESPEARE_ALPHABET), n=n_sample, seed=args.seed)
        bar.update(n_sample)
    return test, val, text


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring). Chapter 7."""
    args = _checked(_parser().parse_args(argv))
    torch.set_num_threads(args.threads)
    train_ids, test_ids, val_ids = lab_splits()
    config = ModelConfig(vocab_size=len(SHAKESPEARE_ALPHABET), n_ctx=args.context, d_model=args.d_model,
                         n_layers=args.layers, n_heads=args.heads, bias=False)
    torch.manual_seed(args.seed)
    model = GPT(config)
    curve: list[tuple[float, int, float]] = []
    steps, seconds = _train(model, train_ids, val_ids, args, curve)
    start = time.perf_counter()
    test, val, text = _evaluate(model, test_ids, val_ids, args)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(config), "model": model.state_dict(), "alphabet": SHAKESPEARE_ALPHABET,
                "seed": args.seed, "test_loss": test, "val_loss": val}, args.out / "checkpoint.pt")
    (args.out / "sample.txt").write_text(text + "\n")
    if curve:
        with open(args.out / "curve.csv", "w", newline="") as f:
            csv.writer(f).writerows([("seconds", "steps", "val_loss_every_8th_window"),
                                     *[(f"{s:.2f}", n, f"{v:.4f}") for s, n, v in curve]])
    evaluating = time.perf_counter() - start
    print(text)
    print(f"test_loss={test:.3f} val_loss={val:.3f} steps={steps} tokens={steps * args.batch * args.context} "
          f"seconds={seconds:.1f} eval_seconds={evaluating:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
