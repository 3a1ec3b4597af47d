"""A minimal, deterministic training loop for the small models of the book.

Any ``nn.Module`` that maps inputs ``(batch, n)`` to logits ``(batch, n, V)`` trains with
:func:`train`; the default loss is the cross-entropy over the last dimension, ignoring
targets equal to −100 (``transformer_lib.data.IGNORE_INDEX``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib._checks import require_int, require_positive
from transformer_lib.data import IGNORE_INDEX

__all__ = ["cross_entropy_loss", "train", "evaluate_loss"]

Batch = tuple[Tensor, Tensor]
LossFn = Callable[[Tensor, Tensor], Tensor]


def cross_entropy_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy ``(…, V), (…) -> ()`` over targets that are not −100. Chapter 7."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets: expected shape {tuple(logits.shape[:-1])} to match logits {tuple(logits.shape)}, "
            f"got {tuple(targets.shape)}"
        )
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


def _logits(output: Tensor | tuple | list) -> Tensor:
    """Models may return logits or a tuple whose first element is the logits."""
    return output[0] if isinstance(output, (tuple, list)) else output


def _batch_stream(batches: Iterable[Batch] | Callable[[int], Batch] | Batch) -> Iterator[Batch]:
    """Iterable of batches, callable ``step -> batch``, or one fixed ``(inputs, targets)`` batch."""
    if isinstance(batches, tuple) and len(batches) == 2 and all(isinstance(t, Tensor) for t in batches):
        fixed = batches
        return iter(lambda: fixed, None)
    if callable(batches) and not hasattr(batches, "__iter__"):
        make = batches
        return (make(step) for step in range(10**12))
    try:
        return iter(batches)
    except TypeError as err:
        raise TypeError(
            "batches: expected an iterable of (inputs, targets), a callable step -> (inputs, targets), "
            f"or one (inputs, targets) tuple, got {type(batches).__name__}"
        ) from err


def train(
    model: nn.Module,
    batches: Iterable[Batch] | Callable[[int], Batch] | Batch,
    steps: int,
    lr: float = 1e-3,
    seed: int = 0,
    loss_fn: LossFn | None = None,
    *,
    weight_decay: float = 0.0,
    grad_clip: float | None = None,
    callback: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``model`` for ``steps`` AdamW steps and return the loss of every step.

    ``batches`` yields ``(inputs (batch, n), targets (batch, n))``; the model maps inputs to
    logits ``(batch, n, V)`` (or a tuple whose first element is the logits). ``loss_fn(logits,
    targets)`` defaults to :func:`cross_entropy_loss`. Randomness inside the loop (dropout) is
    seeded by ``seed`` in a forked RNG state, so the caller's global RNG is left untouched
    and two runs with the same model initialisation and batches give the same losses.
    ``callback(step, loss)`` is called after each step. Chapter 7.
    """
    require_int("steps", steps, low=0)
    require_positive("lr", lr)
    loss_fn = loss_fn or cross_entropy_loss
    stream = _batch_stream(batches)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model: expected at least one trainable parameter, got none")
    # foreach: one fused update for all parameters; for the course's tiny models on CPU the
    # per-parameter loop otherwise costs more than the forward pass.
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)
    losses: list[float] = []
    was_training = model.training
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(steps):
            try:
                inputs, targets = next(stream)
            except StopIteration:
                raise ValueError(f"batches: ran out after {step} batches, expected steps={steps}") from None
            loss = loss_fn(_logits(model(inputs)), targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip is not None:
                nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            losses.append(float(loss.detach()))
            if callback is not None:
                callback(step, losses[-1])
    model.train(was_training)
    return losses


@torch.no_grad()
def evaluate_loss(
    model: nn.Module,
    batches: Iterable[Batch] | Callable[[int], Batch] | Batch,
    steps: int | None = None,
    loss_fn: LossFn | None = None,
) -> float:
    """Mean loss of ``model`` (in eval mode, no gradients) over ``steps`` batches.

    With the default cross-entropy the mean is weighted by the number of supervised target
    tokens; with a custom ``loss_fn`` it is the plain mean over batches. ``steps=None`` uses
    every batch of a finite iterable (a fixed batch or a callable needs ``steps``; default 1
    for a fixed batch). Chapter 7.
    """
    fixed = isinstance(batches, tuple) and len(batches) == 2 and all(isinstance(t, Tensor) for t in batches)
    if steps is None and (fixed or callable(batches) and not hasattr(batches, "__iter__")):
        steps = 1
    stream = _batch_stream(batches)
    if steps is not None:
        stream = islice(stream, steps)
    was_training = model.training
    model.eval()
    total, weight = 0.0, 0.0
    for inputs, targets in stream:
        logits = _logits(model(inputs))
        if loss_fn is None:
            count = float((targets != IGNORE_INDEX).sum())
            total += float(cross_entropy_loss(logits, targets)) * count
            weight += count
        else:
            total += float(loss_fn(logits, targets))
            weight += 1.0
    model.train(was_training)
    if weight == 0:
        raise ValueError("batches: expected at least one batch with a supervised target, got none")
    return total / weight
