"""The checks' kernel half for the exercises of the tokens appendix (Exercises 11.1 and 11.3): one BPE
merge step with the tie rule and special tokens, and decoding a stream of byte tokens that cut
characters; 11.2, the pair counts a merge changes, is in ``ch11_pairs.py``.

Words are lists of symbols (short strings), so that a merge of ``("a", "b")`` makes the symbol
``"ab"``. What runs in the student's kernel (the inputs, visible and hidden, and the calls of the
student's functions). The judges are in :mod:`transformer_lib.grading.judges.ch11_tokens`.
Chapter 11.
"""
from __future__ import annotations

from typing import Any, Callable

from .._calls import call
from .._harness import draw, hidden_generator, run_check, typename

__all__ = ["check_merge_step", "check_stream_decode"]


def _word(g: Any, alphabet: str, low: int, high: int) -> list[str]:
    return [alphabet[draw(g, 0, len(alphabet) - 1)] for _ in range(draw(g, low, high))]


# ---------------------------------------------------------------- 11.1 one merge step

_MERGE_EXAMPLES = [dict(words=[list("hug"), list("pug"), list("pun"), list("bun"), list("hugs")],
                        counts=[10, 5, 12, 4, 5], inputs="the example"),
                   dict(words=[list("xyz"), list("zyx")], counts=[3, 3], inputs="a tie between pairs"),
                   dict(words=[list("aaaaa"), list("ab")], counts=[1, 2], inputs="a run of one symbol"),
                   dict(words=[list("mn"), list("pq"), list("pq"), list("pq")], counts=[5, 1, 1, 1],
                        inputs="a frequent word against several rare ones"),
                   dict(words=[list("ck"), list("kc"), list("cd")], counts=[2, 2, 3],
                        inputs="words whose pairs meet only when the words are joined"),
                   dict(words=[["<s>", "a", "b"], ["<s>", "a", "c", "</s>"], ["<s>", "a", "</s>"]],
                        counts=[3, 3, 3], special=["<s>", "</s>"], inputs="special tokens")]


def _merge_cases(g: Any) -> list[dict]:
    """A tie between two pairs; runs like "aaaa" (overlapping pairs); words whose pairs only
    cross when the words are joined; counts that turn the unweighted answer around."""
    tie = dict(words=[list("xyz"), list("zyx")], counts=[draw(g, 2, 9)] * 2,        # (x,y),(y,z),(z,y),(y,x): 4-way tie
               inputs="a tie between pairs")
    runs = dict(words=[["a"] * (2 * draw(g, 1, 3) + 1), list("ab"), list("ba")], counts=[draw(g, 1, 3), 1, 1],
                inputs="a run of one symbol")
    heavy = dict(words=[list("mn"), list("pq"), list("pq"), list("pq"), list("nm")], counts=[draw(g, 4, 9), 1, 1, 1, 0],
                 inputs="a frequent word against several rare ones")
    heavy["counts"][4] = heavy["counts"][0] - 1              # (m, n) beats (p, q) only when weighted
    joined = dict(words=[list("ck"), list("kc"), list("cd")], counts=[2, 2, 3],     # "ck"+"kc" joined: (k, k)
                  inputs="words whose pairs meet only when the words are joined")
    rand = dict(words=[_word(g, "abcd", 1, 6) for _ in range(draw(g, 4, 8))], counts=[], inputs="random words")
    marked = dict(words=[["<s>"] + _word(g, "xyz", 2, 4) + ["</s>"] for _ in range(draw(g, 3, 6))] + [list("xy")],
                  counts=[], special=["<s>", "</s>"], inputs="special tokens")
    marked["counts"] = [draw(g, 2, 5) for _ in marked["words"][:-1]] + [1]
    rand["counts"] = [draw(g, 1, 5) for _ in rand["words"]]
    if not any(len(w) > 1 for w in rand["words"]):
        rand["words"][0] = list("ab")
    return [tie, runs, heavy, joined, rand, marked]


def check_merge_step(fn: Callable, words: list[list[str]] | None = None, counts: list[int] | None = None,
                     special: list[str] | None = None, hidden: int = 0) -> None:
    """``fn(words, counts, special) -> (pair, merged_words)``: the most frequent adjacent pair within
    the words (each word's pairs weighted by its count; ties: the greater pair; a pair holding a
    special symbol never counts), and the words with every occurrence merged, left to right.
    Chapter 11."""
    if hidden:
        cases = _merge_cases(hidden_generator("merge_step", hidden))
    else:
        cases = [dict(c) for c in _MERGE_EXAMPLES] if words is None else \
            [dict(words=words, counts=counts, special=list(special or []))]
    for case in cases:
        case["what"] = "merge_step(words, counts, special)"
        case.setdefault("special", [])
    run_check("merge_step", fn, cases, lambda f, c: {"result": call(
        f, [list(w) for w in c["words"]], list(c["counts"]), set(c["special"]))}, hidden)


# ---------------------------------------------------------------- 11.3 decoding a stream of byte tokens

_STREAM_EXAMPLE = [[72, 105, 32, 226], [130], [172, 32, 240, 159], [153, 130, 33]]   # "Hi €" cut, "🙂!"


def _cut(data: bytes, g: Any, most: int) -> list[list[int]]:
    """``data`` cut at random places into tokens of 1 to ``most`` bytes."""
    tokens, i = [], 0
    while i < len(data):
        step = draw(g, 1, most)
        tokens.append(list(data[i:i + step]))
        i += step
    return tokens


def check_stream_decode(fn: Callable, tokens: list[list[int]] | None = None, hidden: int = 0) -> None:
    """``fn(tokens) -> list[str]``: for each token (a list of byte values) the text that can be
    shown once it arrives, every character as soon as its last byte is in; an unfinished
    character at the very end is shown as one U+FFFD. Chapter 11."""
    if hidden:
        g = hidden_generator("stream_decode", hidden)
        pool = ["a", " ", "é", "ß", "д", "€", "你", "好", "🙂", "👍", "\n", "z"]
        text = "".join(pool[draw(g, 0, len(pool) - 1)] for _ in range(draw(g, 12, 24)))
        data = text.encode("utf-8")
        cases = [dict(tokens=_cut(data, g, 3), inputs="tokens of up to three bytes"),
                 dict(tokens=_cut(data, g, 5), inputs="tokens of up to five bytes"),
                 dict(tokens=_cut("€🙂".encode("utf-8")[:draw(g, 4, 6)], g, 2),    # stops inside 🙂
                      inputs="a stream cut inside a character"),
                 dict(tokens=[list(b) for b in (b"", "д".encode("utf-8")[:1], b"", "д".encode("utf-8")[1:])],
                      inputs="empty tokens")]
    elif tokens is None:
        cases = [dict(tokens=_STREAM_EXAMPLE, inputs="the example"),
                 dict(tokens=[[104, 105, 32, 240], [159, 152]],             # "hi " and 3 of the 4 bytes of 😀
                      inputs="a stream cut inside a character")]
    else:
        cases = [dict(tokens=tokens)]
    for case in cases:
        case["what"] = "stream_decode(tokens)"
    run_check("stream_decode", fn, cases, lambda f, c: {"texts": call(f, [list(t) for t in c["tokens"]])}, hidden)
