"""The judges of the checks for Exercise 11.2 of the tokens appendix: the pair counts a merge changes,
updated beside each occurrence of the merged pair rather than recounted.

The judge recounts the pairs of every word before and after the merge, decides the growth of the
work and runs in the grader. The inputs and the calls of the student's functions are in the kernel
half, :mod:`transformer_lib.grading.checks.ch11_pairs`. Chapter 11.
"""
from __future__ import annotations

import math
from collections import Counter

from ..protocol import CheckFailed, typename
from .ch11_tokens import _fail, _longest_run, _merge
from .common import judge


def _rows(delta: Counter) -> list[list]:
    return sorted([a, b, k] for (a, b), k in delta.items() if k)


def _recounted(words: list[list[str]], counts: list[int], pair: tuple[str, str]) -> Counter:
    """The weighted pair counts of the merged words minus those of the words: every pair recounted."""
    delta: Counter = Counter()
    for word, count in zip(words, counts):
        merged = _merge(word, pair)
        for p in zip(merged, merged[1:]):
            delta[p] += count
        for p in zip(word, word[1:]):
            delta[p] -= count
    return delta


def _each_alone(words: list[list[str]], counts: list[int], pair: tuple[str, str]) -> Counter:
    """The changes with each occurrence's neighbours read from the unmerged word, as if no two
    occurrences stood side by side."""
    a, b = pair
    delta: Counter = Counter()
    for word, count in zip(words, counts):
        i, found = 0, []
        while i + 1 < len(word):
            if (word[i], word[i + 1]) == pair:
                found.append(i)
            i += 2 if (word[i], word[i + 1]) == pair else 1
        for i in found:
            delta[pair] -= count
            if i > 0:
                delta[(word[i - 1], a)] -= count
                delta[(word[i - 1], a + b)] += count
            if i + 2 < len(word):
                delta[(b, word[i + 2])] -= count
                delta[(a + b, word[i + 2])] += count
    return delta


def _wrapped(words: list[list[str]], counts: list[int], pair: tuple[str, str]) -> Counter:
    """The changes with the symbol before an occurrence at the start of a word read as ``word[-1]``."""
    delta = _recounted(words, counts, pair)
    for word, count in zip(words, counts):
        if tuple(word[:2]) == pair:
            delta[(word[-1], pair[0])] -= count
            delta[(word[-1], pair[0] + pair[1])] += count
    return delta


def _symbols_read(case: dict, out: dict) -> tuple[float, float]:
    """How many times the larger corpus's symbols the smaller's are, and how many times the symbols
    the student's function read on it."""
    work = [(out.get("work") or {}).get(corpus) if isinstance(out.get("work"), dict) else None
            for corpus in ("corpus", "larger")]
    if not all(isinstance(w, int) and w >= 0 for w in work):
        raise CheckFailed(f"{case['what']}: the check could not count the symbols your function reads")
    grown = sum(map(len, case["words2"])) / sum(map(len, case["words"]))
    return grown, work[1] / max(1, work[0])


def _pair_ok(cases: list[dict], outs: list[dict]) -> str:
    """The ✓ line: side by side, runs, occurrences at the ends of words and weights are claimed only
    where a case held them; the growth of the reads as measured."""
    facts = []
    for c in cases:
        pair = tuple(c["pair"])
        for word in c["words"]:
            merged = _merge(word, pair)
            if pair[0] == pair[1] and _longest_run(word, pair[0]) >= 3:
                facts.append(f"a run of {_longest_run(word, pair[0])} equal symbols")
            elif any(x == y == pair[0] + pair[1] for x, y in zip(merged, merged[1:])):
                facts.append("occurrences side by side")
        if any(w[:2] == list(pair) for w in c["words"]):
            facts.append("an occurrence at the start of a word")
        if any(w[-2:] == list(pair) for w in c["words"]):
            facts.append("an occurrence at the end of a word")
        if any(k != 1 for k in c["counts"]):
            facts.append("weighted counts")
    read = [_symbols_read(c, o) for c, o in zip(cases, outs)]
    n = sum(len(c["words"]) for c in cases)
    return (f"pair_changes gives the change of every pair count for {n} words"
            + "".join(f"; {f}" for f in dict.fromkeys(facts))
            + f"; with {', '.join(f'{grown:.1f}' for grown, _ in read)} times the symbols and the same occurrences "
              f"it read {', '.join(f'{growth:.1f}' for _, growth in read)} times as many (1 for an update beside "
              "each occurrence, as many times as the corpus for a recount)")


@judge("pair_changes", compare=("changes", "changes2"), ok=_pair_ok)
def _pair_changes(case: dict, out: dict) -> None:
    pair, what = tuple(case["pair"]), case["what"]
    for size in ("", "2"):
        words, counts, got = case["words" + size], case["counts" + size], out["changes" + size]
        if not isinstance(got, list):
            detail = got if isinstance(got, str) else typename(got)
            raise CheckFailed(f"{what} must return a dict {{(x, y): change}} with whole-number changes, got {detail}")
        expected = _recounted(words, counts, pair)
        if got == _rows(expected):
            if size == "":
                grown, growth = _symbols_read(case, out)
                if growth > math.sqrt(grown):   # an update beside each occurrence reads as much; a recount grown-fold
                    raise CheckFailed(
                        f"{what} reads the words in proportion to the corpus, not to the merge's occurrences: on a "
                        f"corpus with {grown:.1f} times the symbols and the same occurrences it read {growth:.1f} "
                        f"times as many symbols (1 for an update beside each occurrence, {grown:.1f} for a recount). "
                        "Go to the places in `at` and read only the symbol just before and the one just after each "
                        "occurrence: a loop over a word, a copy or slice of it, `in` or index() read all of it")
            continue
        expected = _rows(expected)
        for hint, variant in {
            "the signs are flipped: a pair that disappears has a negative change (after minus before)":
                Counter({p: -k for p, k in _recounted(words, counts, pair).items()}),
            "each word's pairs count as many times as the word occurs: multiply its changes by counts[w]":
                _recounted(words, [1] * len(words), pair),
            "two merged occurrences side by side (x y x y with pair (x, y)) share a neighbour: the pair (y, x) "
            "between them becomes (xy, xy), it does not give (y, xy) and (xy, x)": _each_alone(words, counts, pair),
            "an occurrence at the start of a word has no symbol before it (words[w][i - 1] with i = 0 is the "
            "word's last symbol)": _wrapped(words, counts, pair),
        }.items():
            if got == _rows(variant):
                _fail(hint, expected, got)
        places = sum(count * sum(word[i:i + 2] == list(pair) for i in range(len(word) - 1))
                     for word, count in zip(words, counts))
        if sum(k for _, _, k in got) == -places != sum(k for _, _, k in expected):
            _fail("each listed place was merged, but in a run like a a a the places (w, 0) and (w, 1) overlap: "
                  "merging left to right, a place that starts where the last merged occurrence ends does not merge "
                  "(every merge shortens the word's pairs by one)", expected, got)
        _fail("the changes are not right: compare the pairs of each word before and after the merge", expected, got)
