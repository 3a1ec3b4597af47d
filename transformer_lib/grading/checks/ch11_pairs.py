"""Checks for Exercise 11.2 of the tokens appendix: the pair counts a merge changes, updated
beside each occurrence of the merged pair rather than recounted.

Words are lists of symbols (short strings). Above the judging line: what runs in the student's
kernel (the inputs, visible and hidden, the calls of the student's function, the dict it returns
written out as rows ``[a, b, change]``, the only form the record keeps, and its work: the symbols
it reads from the words, on the corpus and on one four times as large with the same occurrences,
as 10.3 measures its work at two sizes). Below it: the judge, which recounts the pairs of every
word before and after the merge, decides the growth of the work and runs in the grader.
Chapter 11.
"""
from __future__ import annotations

from typing import Any, Callable

from .._calls import call
from .._harness import draw, hidden_generator, run_check, typename

__all__ = ["check_pair_changes"]


def _symbols(g: Any, alphabet: str, low: int, high: int) -> list[str]:
    return [alphabet[draw(g, 0, len(alphabet) - 1)] for _ in range(draw(g, low, high))]


# ---------------------------------------------------------------- 11.2 the pair counts a merge changes

_BAD = "(keys that are not pairs of strings, or changes that are not whole numbers)"
_FILL = "-"   # the symbol that lengthens the words of the larger corpus (never part of a checked pair)


def _as_rows(changes: Any) -> Any:
    """A dict ``{(a, b): change}`` as rows ``[a, b, change]`` sorted, zero changes left out; anything
    else is recorded by its type."""
    if type(changes) is not dict:
        return f"not a dict but {typename(changes)}"
    rows = []
    for key, value in dict.items(changes):
        if not (type(key) is tuple and len(key) == 2 and all(type(s) is str for s in key) and type(value) is int):
            return _BAD
        if value:
            rows.append([key[0], key[1], value])
    return sorted(rows)


class _Word:
    """A word whose symbols are counted as the student's code reads them (by index, slice, loop,
    ``in``, ``index``, ``count``, comparison): the work of 11.2, like the work 10.3 counts in
    torch's operations. The length is free."""

    __slots__ = ("_symbols", "_reads")

    def __init__(self, symbols: list[str], reads: list[int]) -> None:
        self._symbols, self._reads = tuple(symbols), reads

    def __len__(self) -> int:
        return len(self._symbols)

    def __getitem__(self, i: Any) -> Any:
        got = self._symbols[i]
        if isinstance(i, slice):
            self._reads[0] += len(got)
            return list(got)
        self._reads[0] += 1
        return got

    def __iter__(self) -> Any:
        for s in self._symbols:
            self._reads[0] += 1
            yield s

    def __reversed__(self) -> Any:
        return iter(self[::-1])

    def __contains__(self, symbol: Any) -> bool:
        return any(s == symbol for s in self)

    def index(self, symbol: Any, start: int = 0, stop: int | None = None) -> int:
        return list(self[start:stop]).index(symbol) + range(len(self))[start:stop].start

    def count(self, symbol: Any) -> int:
        return sum(s == symbol for s in self)

    def __eq__(self, other: Any) -> bool:
        return list(self) == (list(other) if isinstance(other, (list, tuple, _Word)) else other)

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Any) -> list:
        return list(self) + list(other)

    def __radd__(self, other: Any) -> list:
        return list(other) + list(self)

    def __repr__(self) -> str:
        return repr(list(self._symbols))


def _places(words: list[list[str]], pair: list[str]) -> list[list[int]]:
    """Every place ``[w, i]`` with ``words[w][i : i + 2] == pair``, overlapping ones included, in order."""
    return [[w, i] for w, word in enumerate(words) for i in range(len(word) - 1) if word[i:i + 2] == list(pair)]


def _gap(word: list[str], pair: list[str]) -> int | None:
    """A place ``j`` to lengthen ``word`` at (before ``word[j]``) that leaves every merged occurrence of
    ``pair`` with the same neighbours: neither ``word[j - 1]`` nor ``word[j]`` is part of one; None if
    there is none."""
    inside, i = set(), 0
    while i + 1 < len(word):
        step = 2 if word[i:i + 2] == list(pair) else 1
        inside |= {i, i + 1} if step == 2 else set()
        i += step
    return next((j for j in range(len(word) + 1) if j - 1 not in inside and j not in inside), None)


def _corpus(words: list[list[str]], counts: list[int], pair: list[str], inputs: str) -> dict:
    """A case: the corpus and, to measure the work, a corpus with about 4 times the symbols and the same
    occurrences beside the same symbols (the words that hold the pair lengthened away from them to about
    4 times their symbols, the others 4 times as many)."""
    holds = sorted({w for w, _ in _places(words, pair)})
    gaps = {w: _gap(words[w], pair) for w in holds}
    wide = [w for w in holds if gaps[w] is not None]
    fill = -(-3 * sum(len(words[w]) for w in holds) // max(1, len(wide)))
    words2 = [list(word) for word in words]
    for w in wide:
        words2[w][gaps[w]:gaps[w]] = [_FILL] * fill
    others = [i for i in range(len(words)) if i not in holds]
    words2 += [list(words[i]) for i in others] * 3
    counts2 = list(counts) + [counts[i] for i in others] * 3
    return dict(words=words, counts=counts, pair=list(pair), at=_places(words, pair),
                words2=words2, counts2=counts2, at2=_places(words2, pair), inputs=inputs)


def _measured_changes(fn: Callable, case: dict) -> dict:
    """The student's function on the case's two corpora, with the symbols it read from the words of each."""
    out: dict[str, Any] = {"work": {}}
    for size, corpus in (("", "corpus"), ("2", "larger")):
        reads = [0]
        words = [_Word(w, reads) for w in case["words" + size]]
        out["changes" + size] = call(fn, words, list(case["counts" + size]), tuple(case["pair"]),
                                     [tuple(p) for p in case["at" + size]], after=_as_rows)
        out["work"][corpus] = reads[0]
    return out


_PAIR_EXAMPLES = [
    ([list("cabab"), list("abx"), list("xy"), list("yab"), list("ab")], [2, 1, 5, 3, 4], ["a", "b"],
     "occurrences side by side, at the ends of words, weighted counts"),
    ([list("caaaaac"), list("aaaa"), list("bac")], [1, 2, 3], ["a", "a"], "runs of one symbol")]


def _pair_cases(g: Any) -> list[dict]:
    """Occurrences side by side, runs of one symbol (overlapping places), occurrences at the ends of
    words, and a random corpus, each word with a random count."""
    def counts(words: list) -> list[int]:
        return [draw(g, 1, 6) for _ in words]

    side = [list("xy" * draw(g, 2, 4)) + _symbols(g, "yz", 0, 2), _symbols(g, "xz", 1, 3) + list("xyxy"), list("zyx"),
            list("zz") + list("xy" * draw(g, 2, 3))]
    run = [list("b") + ["a"] * draw(g, 2, 7) + list("b"), ["a"] * draw(g, 3, 6), list("cab")]
    ends = [list("pq") + _symbols(g, "rs", 1, 3), _symbols(g, "rs", 2, 3) + list("pq"), list("pq"), list("qp")]
    rand = [_symbols(g, "abc", 2, 8) for _ in range(draw(g, 4, 7))]
    rand[0][:2] = ["c", "a", "b"]                     # one word that holds the pair and can be lengthened
    return [_corpus(side, counts(side), ["x", "y"], "occurrences side by side"),
            _corpus(run, counts(run), ["a", "a"], "a run of one symbol"),
            _corpus(ends, counts(ends), ["p", "q"], "occurrences at the start and the end of a word"),
            _corpus(rand, counts(rand), ["a", "b"], "a random corpus")]


def check_pair_changes(fn: Callable, words: list[list[str]] | None = None, counts: list[int] | None = None,
                       pair: tuple[str, str] | None = None, hidden: int = 0) -> None:
    """``fn(words, counts, pair, at) -> {(x, y): change}``: how the pair counts of the corpus (each
    word's pairs counted ``counts[w]`` times) change when every occurrence of ``pair`` is merged, left
    to right, given the places ``at`` (``(w, i)``, in order, overlapping ones included) where it
    occurs; reading only the symbols next to the occurrences, so that the work does not grow with
    the corpus. Chapter 11."""
    if hidden:
        cases = _pair_cases(hidden_generator("pair_changes", hidden))
    elif words is None:
        cases = [_corpus([list(w) for w in ws], cs, p, kind) for ws, cs, p, kind in _PAIR_EXAMPLES]
    else:
        cases = [_corpus([list(w) for w in words], list(counts or [1] * len(words)),
                         ["a", "b"] if pair is None else list(pair), "")]
    for case in cases:
        case["what"] = "pair_changes(words, counts, pair, at)"
    run_check("pair_changes", fn, cases, _measured_changes, hidden)


# ==== judging: runs in the grader, never loaded into a graded kernel ====
import math  # noqa: E402
from collections import Counter  # noqa: E402

from .._harness import CheckFailed  # noqa: E402
from .._judging import judge  # noqa: E402
from .ch11_tokens import _fail, _longest_run, _merge  # noqa: E402


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
