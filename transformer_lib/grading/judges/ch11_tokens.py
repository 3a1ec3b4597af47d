"""The judges of the checks for the exercises of the tokens appendix (Exercises 11.1 and 11.3): one BPE
merge step with the tie rule and special tokens, and decoding a stream of byte tokens that cut
characters; 11.2, the pair counts a merge changes, is in ``ch11_pairs.py``.

The judges count pairs, merge and decode from first principles (Python's own incremental UTF-8
decoder for 11.3) and run in the grader. The inputs and the calls of the student's functions are in
the kernel half, :mod:`transformer_lib.grading.checks.ch11_tokens`. Chapter 11.
"""
from __future__ import annotations

import codecs
from collections import Counter
from typing import Any

from ..protocol import CheckFailed, typename
from .common import judge


def _fail(misconception: str, expected: Any, got: Any) -> None:
    raise CheckFailed(f"{misconception}\n  expected: {expected!r}\n  got:      {got!r}")


def _pairs(words: list[list[str]], counts: list[int], special: list[str] = ()) -> Counter:
    """The weighted counts of the adjacent pairs within the words, pairs holding a special symbol left out."""
    pairs: Counter = Counter()
    for word, count in zip(words, counts):
        for pair in zip(word, word[1:]):
            if not set(pair) & set(special):
                pairs[pair] += count
    return pairs


def _merge(word: list[str], pair: tuple[str, str], backwards: bool = False) -> list[str]:
    """Every occurrence of ``pair`` merged, left to right (or right to left)."""
    symbols = word[::-1] if backwards else list(word)
    first, second = pair[::-1] if backwards else pair
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == first and symbols[i + 1] == second:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out[::-1] if backwards else out


def _best(pairs: Counter, greater: bool = True) -> tuple[str, str]:
    top = max(pairs.values())
    tied = [p for p, c in pairs.items() if c == top]
    return max(tied) if greater else min(tied)


def _symbols(value: Any, what: str) -> list[list[str]]:
    if not (isinstance(value, list) and all(isinstance(w, list) and all(isinstance(s, str) for s in w)
                                            for w in value)):
        raise CheckFailed(f"{what}: the merged words must be a list of lists of strings (symbols), got "
                          f"{typename(value)}")
    return value


def _longest_run(word: list[str], symbol: str) -> int:
    longest = run = 0
    for s in word:
        run = run + 1 if s == symbol else 0
        longest = max(longest, run)
    return longest


def _merge_ok(cases: list[dict], outs: list[dict]) -> str:
    """The ✓ line: what the cases that ran held (a tie, a run), nothing they did not."""
    facts = []
    for c in cases:
        pairs = _pairs(c["words"], c["counts"], c["special"])
        best, top = _best(pairs), max(pairs.values())
        facts += ["special tokens left out of every pair"] * bool(c["special"])
        tied = sum(count == top for count in pairs.values())
        run = max(_longest_run(w, best[0]) for w in c["words"]) if best[0] == best[1] else 0
        facts += [f"a tie between {tied} pairs taken by the greater"] * (tied > 1) + \
            [f"a run of {run} equal symbols merged from the left"] * (run >= 3)
    return (f"merge_step picks the most frequent pair and merges it, left to right, in "
            f"{sum(len(c['words']) for c in cases)} words" + "".join(f"; {f}" for f in dict.fromkeys(facts)))


@judge("merge_step", compare=("result",), ok=_merge_ok)
def _merge_step(case: dict, out: dict) -> None:
    words, counts, special, what = case["words"], case["counts"], case["special"], case["what"]
    result = out["result"]
    if not (isinstance(result, list) and len(result) == 2):
        raise CheckFailed(f"{what} must return a pair (pair, merged_words), got {typename(result)}")
    got_pair, got_words = result
    if not (isinstance(got_pair, list) and len(got_pair) == 2 and all(isinstance(s, str) for s in got_pair)):
        raise CheckFailed(f"{what}: the pair must be a tuple of two symbols (strings), got {typename(got_pair)}")
    got_pair = tuple(got_pair)
    pairs = _pairs(words, counts, special)
    best = _best(pairs)
    if got_pair != best:
        joined = [s for w, c in zip(words, counts) for _ in range(c) for s in w]
        hints = {"a special symbol is never part of a merge: leave out every pair that holds one":
                 _best(_pairs(words, counts)),
                 "pairs are counted inside each word, never across two words: do not join the words":
                 _best(_pairs([joined], [1], special)),
                 "each word's pairs count as many times as the word occurs: weight them by its count":
                 _best(_pairs(words, [1] * len(words), special)),
                 "among equally frequent pairs take the greater one (compare the pairs as tuples of strings)":
                 _best(pairs, greater=False)}
        for hint, variant in hints.items():
            if got_pair == variant:
                _fail(f"the pair is not the most frequent one: {hint}", best, got_pair)
        _fail("the pair is not the most frequent adjacent pair within the words", best, got_pair)
    got_words = _symbols(got_words, what)
    expected = [_merge(w, best) for w in words]
    if got_words != expected:
        if got_words == [_merge(w, best, backwards=True) for w in words]:
            _fail("merge the occurrences left to right: in a run like a a a the first two merge", expected, got_words)
        if got_words == [m[:-1] if m[-1:] == w[-1:] else m for w, m in zip(words, expected)]:
            _fail("the last symbol of a word is dropped when it is not part of a merge: keep every symbol",
                  expected, got_words)
        if got_words == [list(w) for w in words]:
            _fail("the words are returned unmerged: replace every occurrence of the pair by one symbol",
                  expected, got_words)
        _fail("the merged words are not right: every occurrence of the pair, left to right, becomes the "
              "symbol a + b", expected, got_words)


def _decoded(tokens: list[list[int]], errors: str = "replace", final: bool = True) -> list[str]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors=errors)
    return [decoder.decode(bytes(t), final=final and i == len(tokens) - 1) for i, t in enumerate(tokens)]


def _stream_ok(cases: list[dict], outs: list[dict]) -> str:
    """The ✓ line: cut characters and an unfinished end are claimed only where a case held them."""
    cut = unfinished = 0
    for c in cases:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for t in c["tokens"]:
            decoder.decode(bytes(t))
            cut += bool(decoder.getstate()[0])
        unfinished += bool(decoder.getstate()[0])
    return (f"stream_decode shows each character once its last byte is in, for {sum(len(c['tokens']) for c in cases)}"
            f" tokens, {cut - unfinished} of which end inside a character"
            + ("; U+FFFD for an unfinished end" if unfinished else ""))


@judge("stream_decode", compare=("texts",), ok=_stream_ok)
def _stream_decode(case: dict, out: dict) -> None:
    tokens, what = case["tokens"], case["what"]
    got = out["texts"]
    if not (isinstance(got, list) and all(isinstance(s, str) for s in got)):
        raise CheckFailed(f"{what} must return a list of strings, one per token, got {typename(got)}")
    expected = _decoded(tokens)
    if len(got) != len(expected):
        raise CheckFailed(f"{what} must return one string per token: {len(expected)} tokens, {len(got)} strings")
    if got == expected:
        return
    alone = [bytes(t).decode("utf-8", errors="replace") for t in tokens]
    if got == alone:
        _fail("each token was decoded on its own: a token can end inside a character; keep its bytes until the "
              "character's last byte arrives", expected, got)
    if got == _decoded(tokens, final=False):
        _fail("after the last token, an unfinished character is shown as one U+FFFD ('\\ufffd')", expected, got)
    if got == [bytes(t).decode("utf-8", errors="ignore") for t in tokens]:
        _fail("bytes were dropped (errors='ignore'): a character cut by a token boundary must still be shown, "
              "once complete, and an unfinished end as U+FFFD", expected, got)
    if "".join(got) == "".join(expected) and got != expected:
        _fail("the text is right but shown too late or too early: show each character with the token that "
              "completes it", expected, got)
    _fail("the shown texts are not right", expected, got)
