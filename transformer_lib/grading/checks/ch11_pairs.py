"""The checks' kernel half for Exercise 11.2 of the tokens appendix: the pair counts a merge changes,
updated beside each occurrence of the merged pair rather than recounted.

Words are lists of symbols (short strings). What runs in the student's kernel (the inputs, visible
and hidden, the calls of the student's function, the dict it returns written out as rows ``[a, b,
change]``, the only form the record keeps, and its work: the symbols it reads from the words, on the
corpus and on one four times as large with the same occurrences, as 10.3 measures its work at two
sizes). The judges are in :mod:`transformer_lib.grading.judges.ch11_pairs`. Chapter 11.
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
