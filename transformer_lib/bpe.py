"""Byte-level byte-pair encoding (BPE), trained as GPT-2 defines it.

    text -> split on the special tokens -> GPT-2 pre-tokens -> UTF-8 bytes of each pre-token
         -> repeatedly merge the most frequent adjacent pair (counted within pre-tokens)

The base alphabet is the 256 byte values, so no text is ever unknown. Each merge joins the
most frequent adjacent pair of tokens into one new token; pairs are counted inside the
pre-tokens only (a word and the space before it, a run of digits, …), weighted by how often
each pre-token occurs, so that no token spans two words. Ties between equally frequent pairs go
to the lexicographically greater pair of byte strings (the convention of Stanford's CS336).
Special tokens are cut out of the training text first and are never merged across.

The pair counts are updated incrementally: a merge changes the counts of the pairs in the
pre-tokens that contain it, and only those are touched; a heap with lazy deletion finds the
most frequent pair. The tokenizer that applies the merges is `transformer_lib.tokenizer`.
Chapter 11.
"""
from __future__ import annotations

import heapq
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import regex

__all__ = ["GPT2_PATTERN", "check_special_tokens", "special_pattern", "split_special", "pretokenize",
           "pretoken_counts", "merge_delta", "train_bpe"]

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""GPT-2's pre-tokenisation pattern: contractions, words (with the space before them), runs of
digits, runs of other symbols, whitespace. Needs the ``regex`` package for ``\\p{…}``. Chapter 11."""

_PRETOKEN = regex.compile(GPT2_PATTERN)


def check_special_tokens(special_tokens: object) -> list[str]:
    """The special tokens as a list of distinct non-empty strings (``None`` -> ``[]``); else
    ``TypeError``/``ValueError`` naming ``special_tokens``. Chapter 11, through `pretoken_counts`."""
    if special_tokens is None:
        return []
    if isinstance(special_tokens, (str, bytes)) or not isinstance(special_tokens, Iterable):
        raise TypeError(f"special_tokens: expected a list of strings, got {type(special_tokens).__name__}")
    tokens = list(special_tokens)
    bad = [t for t in tokens if not isinstance(t, str) or not t]
    if bad:
        raise ValueError(f"special_tokens: expected non-empty strings, got {bad[:3]!r}")
    if len(set(tokens)) != len(tokens):
        repeated = sorted({t for t in tokens if tokens.count(t) > 1})
        raise ValueError(f"special_tokens: expected distinct tokens, got {repeated!r} more than once")
    return tokens


def special_pattern(special_tokens: Sequence[str]) -> regex.Pattern | None:
    """A pattern matching any special token, the longest first where two overlap (so that
    ``<|a|><|b|>`` is one token if it is special, not ``<|a|>`` and then ``<|b|>``). Chapter 11, through `Tokenizer`."""
    if not special_tokens:
        return None
    ordered = sorted(special_tokens, key=lambda t: (-len(t), t))
    return regex.compile("|".join(regex.escape(t) for t in ordered))


def split_special(text: str, special_tokens: Sequence[str]) -> Iterator[tuple[str, bool]]:
    """``text`` as consecutive pieces ``(piece, is_special)``: the special tokens, longest first
    where two overlap, and the (non-empty) text between them. Chapter 11, through `pretoken_counts`."""
    pattern = special_pattern(special_tokens)
    start = 0
    for m in pattern.finditer(text) if pattern is not None else ():
        if m.start() > start:
            yield text[start:m.start()], False
        yield m.group(), True
        start = m.end()
    if start < len(text):
        yield text[start:], False


def pretokenize(text: str) -> list[str]:
    """GPT-2's pre-tokens of ``text`` (a text without special tokens): ``"Hello, world!"`` ->
    ``["Hello", ",", " world", "!"]``. Joined, they give ``text`` back. Chapter 11."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    return _PRETOKEN.findall(text)


def pretoken_counts(text: str, special_tokens: Sequence[str] = ()) -> Counter[str]:
    """How often each pre-token occurs in ``text``, with the special tokens cut out first (no
    pre-token spans one). Chapter 11."""
    counts: Counter[str] = Counter()
    for piece, special in split_special(text, check_special_tokens(special_tokens)):
        if not special:
            counts.update(_PRETOKEN.findall(piece))
    return counts


def _read_text(text_or_path: object) -> str:
    if isinstance(text_or_path, str):
        return text_or_path
    if isinstance(text_or_path, os.PathLike):
        return Path(text_or_path).read_text(encoding="utf-8")
    raise TypeError("text_or_path: expected the text (a str) or a path (a pathlib.Path), got "
                    f"{type(text_or_path).__name__}")


def _desc(token: bytes) -> tuple[int, ...]:
    """A key that sorts byte strings in reverse lexicographic order (a prefix sorts after the
    longer string), so that a min-heap pops the greatest pair first among equal counts."""
    return (*(255 - b for b in token), 256)


def _merge_word(word: tuple[int, ...], pair: tuple[int, int], new: int) -> tuple[int, ...]:
    """``word`` with every occurrence of ``pair`` replaced by ``new``, left to right."""
    a, b = pair
    out: list[int] = []
    i, n = 0, len(word)
    while i < n:
        try:
            j = word.index(a, i)
        except ValueError:
            break
        if j + 1 < n and word[j + 1] == b:
            out.extend(word[i:j])
            out.append(new)
            i = j + 2
        else:
            out.extend(word[i:j + 1])
            i = j + 1
    out.extend(word[i:])
    return tuple(out)


def _merge_with_delta(word: tuple[int, ...], pair: tuple[int, int],
                      new: int) -> tuple[tuple[int, ...], dict[tuple[int, int], int]]:
    """The merged word and the changes of its pair counts (see :func:`merge_delta`)."""
    a, b = pair
    merged = _merge_word(word, pair, new)
    delta: dict[tuple[int, int], int] = {}
    last = len(merged) - 1
    for j, token in enumerate(merged):
        if token != new:
            continue
        delta[pair] = delta.get(pair, 0) - 1
        if j > 0:
            left = merged[j - 1]
            gone = (b, a) if left == new else (left, a)
            delta[gone] = delta.get(gone, 0) - 1
            delta[left, new] = delta.get((left, new), 0) + 1
        if j < last and merged[j + 1] != new:
            right = merged[j + 1]
            delta[b, right] = delta.get((b, right), 0) - 1
            delta[new, right] = delta.get((new, right), 0) + 1
    return merged, {p: k for p, k in delta.items() if k}


def merge_delta(word: Sequence[int], pair: tuple[int, int], new: int) -> dict[tuple[int, int], int]:
    """How the pair counts of ``word`` change when ``pair`` becomes token ``new``: each merged
    occurrence loses ``pair`` and its neighbour pairs ``(x, a)``, ``(b, y)`` and gains
    ``(x, new)``, ``(new, y)``; two merged occurrences side by side lose ``(b, a)`` and gain
    ``(new, new)``. Only the changed pairs are listed. Library: no chapter names it."""
    return _merge_with_delta(tuple(word), pair, new)[1]


class _PairCounts:
    """Pair counts over distinct pre-tokens, which pre-tokens hold each pair, and a heap of
    ``(-count, key of the pair's bytes, pair)`` with stale entries skipped when popped."""

    def __init__(self, words: list[tuple[int, ...]], freqs: list[int], vocab: dict[int, bytes]) -> None:
        self.words, self.freqs, self.vocab = words, freqs, vocab
        self.counts: Counter[tuple[int, int]] = Counter()
        self.where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
        self.keys = {i: _desc(b) for i, b in vocab.items()}
        for w, (word, freq) in enumerate(zip(words, freqs)):
            for pair in zip(word, word[1:]):
                self.counts[pair] += freq
                self.where[pair].add(w)
        self.heap = [self._entry(p, c) for p, c in self.counts.items()]
        heapq.heapify(self.heap)

    def _entry(self, pair: tuple[int, int], count: int) -> tuple:
        return (-count, self.keys[pair[0]], self.keys[pair[1]], pair)

    def best(self) -> tuple[int, int] | None:
        """The most frequent pair (ties: the greater pair of byte strings), or None."""
        while self.heap:
            neg, _, _, pair = self.heap[0]
            if self.counts.get(pair, 0) == -neg > 0:
                return pair
            heapq.heappop(self.heap)
        return None

    def merge(self, pair: tuple[int, int], new: int) -> None:
        """Replace ``pair`` by token ``new`` in every pre-token that holds it; update only the
        counts that change. ``where`` only grows: a pre-token that lost a pair stays listed
        under it, and merging that pair later leaves it as it is."""
        self.keys[new] = _desc(self.vocab[new])
        delta: dict[tuple[int, int], int] = {}
        for w in self.where.pop(pair):
            word, freq = self.words[w], self.freqs[w]
            if pair[1] not in word:       # it lost the pair since it was listed
                continue
            merged, changes = _merge_with_delta(word, pair, new)
            self.words[w] = merged
            for p, k in changes.items():
                delta[p] = delta.get(p, 0) + k * freq
                if k > 0:
                    self.where[p].add(w)
        for p, change in delta.items():
            if change:
                count = self.counts[p] = self.counts[p] + change
                if count > 0:
                    heapq.heappush(self.heap, self._entry(p, count))
                else:
                    del self.counts[p]


def train_bpe(text_or_path: str | os.PathLike, vocab_size: int,
              special_tokens: Sequence[str] = ()) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train byte-level BPE: ``-> (vocab, merges)``. ``vocab`` maps ids to byte strings: ids
    0–255 are the single bytes, then one id per merge in the order created, then the special
    tokens (GPT-2's layout: 50,257 = 256 + 50,000 merges + ``<|endoftext|>``); ``merges`` lists
    the merged pairs ``(bytes, bytes)`` in order. ``vocab_size`` counts all three; training
    stops early when no pair is left. Chapter 11."""
    text = _read_text(text_or_path)
    special_tokens = check_special_tokens(special_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size: expected an int, got {type(vocab_size).__name__}")
    smallest = 256 + len(special_tokens)
    if vocab_size < smallest:
        raise ValueError(f"vocab_size: expected at least 256 bytes + {len(special_tokens)} special tokens "
                         f"= {smallest}, got {vocab_size}")
    counts = pretoken_counts(text, special_tokens)
    vocab = {i: bytes([i]) for i in range(256)}
    words = [tuple(token.encode("utf-8")) for token in counts]
    state = _PairCounts(words, list(counts.values()), vocab)
    merges: list[tuple[bytes, bytes]] = []
    while len(vocab) < vocab_size - len(special_tokens):
        pair = state.best()
        if pair is None:
            break
        new = len(vocab)
        vocab[new] = vocab[pair[0]] + vocab[pair[1]]
        merges.append((vocab[pair[0]], vocab[pair[1]]))
        state.merge(pair, new)
    for token in special_tokens:
        vocab[len(vocab)] = token.encode("utf-8")
    return vocab, merges
