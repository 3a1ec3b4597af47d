"""Small data for the chapters: the book's running example, a character tokenizer, a
built-in text, synthetic sequence tasks (copy, reverse, sort, induction) and the Shakespeare
corpus (``shakespeare_works``, ``shakespeare_text``, ``shakespeare_splits``,
``shakespeare_ids``, defined in ``transformer_lib.corpus``, and its tokenizer
``shakespeare_tokenizer``).

Every task returns ``(inputs, targets)`` as LongTensors of shape ``(batch, L)`` in the
next-token format of a decoder-only model: ``targets[:, t]`` is the token that follows
``inputs[:, t]``, and positions with nothing to learn hold ``IGNORE_INDEX`` (−100, the
default ``ignore_index`` of ``torch.nn.functional.cross_entropy``). Token ``SEP`` (0) is
reserved as separator / start token; content tokens are ``1 … vocab_size − 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from transformer_lib._checks import require_int
from transformer_lib.corpus import (SHAKESPEARE_ALPHABET, shakespeare_ids, shakespeare_splits,
                                    shakespeare_text, shakespeare_works)

__all__ = [
    "SEP",
    "IGNORE_INDEX",
    "TINY_TEXT",
    "RunningExample",
    "running_example",
    "CharTokenizer",
    "copy_task",
    "reverse_task",
    "sort_task",
    "induction_task",
    "task_batches",
    "text_batch",
    "unigram_loss",
    "SHAKESPEARE_ALPHABET",
    "shakespeare_works",
    "shakespeare_text",
    "shakespeare_splits",
    "shakespeare_ids",
    "shakespeare_tokenizer",
]

SEP = 0
IGNORE_INDEX = -100

TINY_TEXT = (
    "attention lets every token look at every other token and decide how much to listen. "
    "a query asks a question, each key offers an answer, and the softmax of their dot products "
    "turns the scores into weights that sum to one. the output is the weighted average of the values. "
    "with many heads the model asks many questions at once. positions enter through sines and cosines, "
    "through rotations of queries and keys, or through a bias that favours nearby tokens. "
    "a causal mask hides the future, so the model can learn to predict the next character "
    "of a text like this one, one token at a time.\n"
)
"""A few hundred characters about attention, for the character-level language model. Chapter 7."""


class RunningExample(NamedTuple):
    """The four-token example shared by several chapters (binary toy features). Chapter 2, through `running_example`."""

    tokens: list[str]
    X: Tensor    # (n=4, d=8)
    W_Q: Tensor  # (d=8, d_k=4)
    W_K: Tensor  # (8, 4)
    W_V: Tensor  # (8, 4)


def running_example(dtype: torch.dtype = torch.float64) -> RunningExample:
    """The running example "AAPL revenue beat expectations": X ``(4, 8)`` and the
    projections W_Q, W_K, W_V ``(8, 4)``, so that Q = X W_Q etc. Chapters 2, 5 and 7."""
    rows = {
        "X": [[1, 0, 1, 0, 1, 0, 0, 1], [0, 1, 0, 1, 0, 1, 1, 0],
              [1, 1, 0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0, 1, 1]],
        "W_Q": [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0],
                [0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0], [0, 0, 0, 1]],
        "W_K": [[0, 1, 0, 0], [1, 0, 0, 1], [0, 0, 1, 0], [0, 0, 0, 1],
                [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
        "W_V": [[1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1],
                [0, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]],
    }
    mats = {k: torch.tensor(v, dtype=dtype) for k, v in rows.items()}
    return RunningExample(["AAPL", "revenue", "beat", "expectations"], **mats)


class CharTokenizer:
    """Map characters to integer ids and back, one id per distinct character (sorted).

    Built from a text or an alphabet (any iterable of single characters). ``encode(str) ->
    (n,)`` LongTensor, ``decode(ids) -> str``. Chapter 7, through `shakespeare_tokenizer`.
    """

    def __init__(self, text_or_alphabet: str | Iterable[str]) -> None:
        chars = sorted(set(text_or_alphabet))
        if not chars:
            raise ValueError("text_or_alphabet: expected at least one character, got an empty input")
        bad = [c for c in chars if not (isinstance(c, str) and len(c) == 1)]
        if bad:
            raise ValueError(f"text_or_alphabet: expected single characters, got {bad[:5]!r}")
        self.alphabet: list[str] = chars
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters. Chapter 7."""
        return len(self.alphabet)

    def encode(self, text: str) -> Tensor:
        """``str`` of n characters -> LongTensor ``(n,)``. Chapter 7."""
        unknown = sorted({c for c in text if c not in self.stoi})
        if unknown:
            raise ValueError(f"text: unknown characters {unknown!r} (not in the tokenizer's alphabet)")
        return torch.tensor([self.stoi[c] for c in text], dtype=torch.long)

    def decode(self, ids: Tensor | Sequence[int]) -> str:
        """Ids ``(n,)`` -> ``str`` of n characters. Chapter 7."""
        ids = torch.as_tensor(ids)
        if ids.dim() != 1 or ids.is_floating_point():
            raise ValueError(f"ids: expected a 1-d integer sequence, got shape {tuple(ids.shape)}, dtype {ids.dtype}")
        bad = [int(i) for i in ids if not 0 <= int(i) < self.vocab_size]
        if bad:
            raise ValueError(f"ids: expected values in [0, {self.vocab_size}), got {bad[:5]}")
        return "".join(self.alphabet[int(i)] for i in ids)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def _generator(generator: torch.Generator | None, seed: int | None) -> torch.Generator:
    if generator is not None and seed is not None:
        raise ValueError("seed: pass either generator or seed, not both")
    if generator is not None:
        return generator
    return torch.Generator().manual_seed(0 if seed is None else seed)


def _check_task(batch: int, n: int, vocab_size: int) -> None:
    require_int("batch", batch)
    require_int("n", n)
    require_int("vocab_size", vocab_size, low=2)


def _random_tokens(batch: int, n: int, vocab_size: int, gen: torch.Generator) -> Tensor:
    """Content tokens ``(batch, n)`` uniform in ``1 … vocab_size − 1``."""
    return torch.randint(1, vocab_size, (batch, n), generator=gen)


def _source_then_answer(source: Tensor, answer: Tensor) -> tuple[Tensor, Tensor]:
    """``[source, SEP, answer]`` -> next-token (inputs, targets) supervised on the answer only."""
    batch, n = source.shape
    sep = torch.full((batch, 1), SEP, dtype=torch.long)
    z = torch.cat([source, sep, answer], dim=1)                     # (batch, 2n + 1)
    inputs, targets = z[:, :-1].clone(), z[:, 1:].clone()
    targets[:, :n] = IGNORE_INDEX                                   # the source itself is random
    return inputs, targets


def copy_task(
    batch: int, n: int, vocab_size: int, generator: torch.Generator | None = None, *, seed: int | None = None
) -> tuple[Tensor, Tensor]:
    """Copy: read ``s`` (n random tokens), a ``SEP``, then reproduce ``s``.

    Returns (inputs, targets), each ``(batch, 2n)``; the first n targets are ``IGNORE_INDEX``.
    Deterministic given ``generator`` or ``seed`` (default seed 0). Library: no chapter names it.
    """
    _check_task(batch, n, vocab_size)
    s = _random_tokens(batch, n, vocab_size, _generator(generator, seed))
    return _source_then_answer(s, s)


def reverse_task(
    batch: int, n: int, vocab_size: int, generator: torch.Generator | None = None, *, seed: int | None = None
) -> tuple[Tensor, Tensor]:
    """Reverse: read ``s``, a ``SEP``, then produce ``s`` backwards.

    Returns (inputs, targets), each ``(batch, 2n)``, as :func:`copy_task`. Library: no chapter names it.
    """
    _check_task(batch, n, vocab_size)
    s = _random_tokens(batch, n, vocab_size, _generator(generator, seed))
    return _source_then_answer(s, s.flip(1))


def sort_task(
    batch: int, n: int, vocab_size: int, generator: torch.Generator | None = None, *, seed: int | None = None
) -> tuple[Tensor, Tensor]:
    """Sort: read ``s``, a ``SEP``, then produce ``s`` in ascending order.

    Returns (inputs, targets), each ``(batch, 2n)``, as :func:`copy_task`. Chapter 4.
    """
    _check_task(batch, n, vocab_size)
    s = _random_tokens(batch, n, vocab_size, _generator(generator, seed))
    return _source_then_answer(s, s.sort(dim=1).values)


def induction_task(
    batch: int,
    n: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
    *,
    seed: int | None = None,
    distinct: bool = False,
    max_gap: int = 0,
) -> tuple[Tensor, Tensor]:
    """Induction: a random segment r of n tokens occurs twice; predict the second copy.

    With ``max_gap=0`` the sequence is ``[SEP, r, r]``: inputs ``[SEP, r_0 … r_{n−1}, r_0 …
    r_{n−2}]``, each of inputs and targets ``(batch, 2n)``. With ``max_gap=G > 0`` each
    sequence draws its own gap g uniform in ``0 … G`` and reads ``[SEP, f_1 … f_{G−g}, r,
    f'_1 … f'_g, r]`` with G filler tokens f, f' (random content tokens): the copies are n + g
    apart, so no fixed offset finds the previous occurrence, only its content does. Inputs and
    targets are ``(batch, 2n + G)`` and the second copy always ends the sequence. Targets are
    supervised only inside the second copy (target ``r_{i+1}`` after ``r_i``), where the answer
    is "find the previous occurrence of the current token and copy the token after it".
    ``distinct=True`` draws r and the fillers without repeated tokens (needs ``n + G <
    vocab_size``), so the previous occurrence is unique. Chapter 7.
    """
    _check_task(batch, n, vocab_size)
    require_int("max_gap", max_gap, low=0)
    gen = _generator(generator, seed)
    m = n + max_gap                                                 # distinct tokens drawn
    if distinct:
        if m > vocab_size - 1:
            raise ValueError(f"n: expected n + max_gap <= vocab_size - 1 = {vocab_size - 1} "
                             f"distinct tokens, got n={n}, max_gap={max_gap}")
        tokens = torch.rand(batch, vocab_size - 1, generator=gen).argsort(dim=1)[:, :m] + 1
    else:
        tokens = _random_tokens(batch, m, vocab_size, gen)
    if max_gap == 0:
        content = torch.cat([tokens, tokens], dim=1)                  # [r, r]
    else:                                                           # tokens = [r, fillers]
        gap = torch.randint(0, max_gap + 1, (batch, 1), generator=gen)
        k = torch.arange(2 * n + max_gap)                           # content position
        start = max_gap - gap                                       # first copy: start … start+n−1
        source = torch.where(k < start, n + k,                      # prefix fillers
                 torch.where(k < start + n, k - start,              # first copy
                 torch.where(k < m, k, k - m)))                     # gap fillers, second copy
        content = tokens.gather(1, source)
    z = torch.cat([torch.full((batch, 1), SEP, dtype=torch.long), content], dim=1)  # (batch, 2n + G + 1)
    inputs, targets = z[:, :-1].clone(), z[:, 1:].clone()
    targets[:, : m + 1] = IGNORE_INDEX
    return inputs, targets


def task_batches(
    task: Callable[..., tuple[Tensor, Tensor]], batch: int, n: int, vocab_size: int, seed: int = 0, **kwargs
) -> Iterator[tuple[Tensor, Tensor]]:
    """Endless stream of fresh batches ``(inputs, targets)`` of a task, each as the task returns
    them (``(batch, 2n)`` for the tasks here), all drawn from one generator seeded by ``seed``.
    Chapter 7.
    """
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield task(batch, n, vocab_size, gen, **kwargs)


def text_batch(
    ids: Tensor, batch: int, block: int, generator: torch.Generator | None = None, *, seed: int | None = None
) -> tuple[Tensor, Tensor]:
    """Random windows of an encoded text ``(N,)`` -> (inputs, targets) ``(batch, block)``.

    ``targets`` is ``inputs`` shifted by one character. Chapter 7.
    """
    ids = torch.as_tensor(ids)
    if ids.dim() != 1:
        raise ValueError(f"ids: expected a 1-d tensor of token ids, got shape {tuple(ids.shape)}")
    require_int("batch", batch)
    if not 1 <= require_int("block", block) <= ids.shape[0] - 1:
        raise ValueError(f"block: expected 1 <= block <= len(ids) - 1 = {ids.shape[0] - 1}, got {block}")
    gen = _generator(generator, seed)
    start = torch.randint(0, ids.shape[0] - block, (batch,), generator=gen)
    offsets = start[:, None] + torch.arange(block)[None, :]
    return ids[offsets], ids[offsets + 1]


def unigram_loss(ids: Tensor, vocab_size: int | None = None) -> float:
    """Cross-entropy (nats) of the best context-free predictor: the entropy of token frequencies,
    ids ``(…) -> float``.

    A language model that ignores the context cannot beat this; ``ln(vocab_size)`` is the loss
    of a uniform guess. Library: no chapter names it.
    """
    ids = torch.as_tensor(ids).reshape(-1)
    counts = torch.bincount(ids, minlength=vocab_size or 0).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def shakespeare_tokenizer() -> CharTokenizer:
    """The Shakespeare corpus's character tokenizer, over its fixed alphabet
    ``SHAKESPEARE_ALPHABET`` (84 ids, the same for both splits). Chapter 7."""
    return CharTokenizer(SHAKESPEARE_ALPHABET)
