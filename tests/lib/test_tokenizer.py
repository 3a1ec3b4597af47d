"""Byte-level BPE (`transformer_lib.bpe`, `transformer_lib.tokenizer`; Chapter 11) against
independent references, nothing downloaded:

- the trainer equals a slow, obviously correct trainer written here (recount every pair after
  every merge), on small corpora built with ties, overlapping pairs and special tokens;
- the encoder equals Hugging Face `tokenizers` (a `BPE` model with GPT-2's byte-level
  pre-tokenizer) given the same vocabulary and merges, id for id, on held-out Shakespeare,
  English, German, Chinese, emoji, strings with overlapping special tokens and random Unicode; `Tokenizer.from_files`
  reads the files `tokenizers` writes;
- ``decode(encode(s)) == s`` for many seeded random strings over all of Unicode, and decoding
  broken UTF-8 equals Python's own decoder with ``errors="replace"``;
- ``encode_iterable`` equals ``encode`` for random cuts of the input, and streams a large input
  in a small fraction of the memory ``encode`` needs (tracemalloc).
"""
from __future__ import annotations

import json
import random
import tracemalloc
import unicodedata
from collections import Counter

import pytest
import regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers
from transformers.convert_slow_tokenizer import bytes_to_unicode as hf_bytes_to_unicode

from repo_paths import REPO
from torch_helpers import error_message
from transformer_lib.bpe import GPT2_PATTERN, merge_delta, pretoken_counts, pretokenize, train_bpe
from transformer_lib.data import shakespeare_splits
from transformer_lib.tokenizer import Tokenizer, bytes_to_unicode

SPECIAL = ["<|endoftext|>", "<|end|>", "<|endoftext|><|end|>"]  # two overlap: the longest must win
TEXTS = [
    "Hello, world! It's 2024: naïve café, résumé — “quotes”.",
    "Die Straße heißt Größe; Äpfel, Öl und Übermut. Fußgängerübergänge!",
    "我爱北京天安门。机器学习和自然语言处理。",
    "emoji 🙂👍🏽 and a family 👨‍👩‍👧 in one grapheme",
    "a<|endoftext|>b<|end|>c<|endoftext|><|end|>d<|endoftext|><|endoftext|><|en",
    "  lots   of\n\n\n  space \t\t tabs  \n",
    "I'll we've they're don't DON'T 's 'S 'll've",
]
ATOMS = ["a", "b", "ab", " ", "  ", "\n", "\t", "'", "s", "ll", "ve", "<|end", "|>", "<|endoftext|>", "<|", "1",
         "23", "é", "ß", "🙂", "你好", ".", "!!", "\u200d"]


def book_text(limit: int = 60_000) -> str:
    """The markdown of the book's chapters, a corpus the repository ships."""
    parts = []
    for path in sorted((REPO / "chapters").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        parts += ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    return "\n".join(parts)[:limit]


def random_char(rng: random.Random) -> str:
    """Any character Unicode has assigned (Python's tables; where the `regex` package and
    `tokenizers` disagree on unassigned code points, the pattern splits them differently)."""
    while True:
        c = chr(rng.randint(0, 0x10FFFF))
        if unicodedata.category(c) not in ("Cn", "Cs"):
            return c


def random_text(rng: random.Random, n: int, unicode_share: float = 0.2) -> str:
    """Atoms that exercise the pattern and the special tokens, and any assigned character."""
    return "".join(random_char(rng) if rng.random() < unicode_share else rng.choice(ATOMS) for _ in range(n))


@pytest.fixture(scope="module")
def trained():
    vocab, merges = train_bpe(book_text() + "".join(TEXTS) * 20, 700, SPECIAL)   # merges "'ll", "  ", …
    return vocab, merges, Tokenizer(vocab, merges, SPECIAL)


def hugging_face(vocab, merges, special) -> HFTokenizer:
    """Hugging Face's byte-level BPE with our vocabulary and merges, in GPT-2's byte stand-ins."""
    stand_in = hf_bytes_to_unicode()

    def s(token: bytes) -> str:
        return "".join(stand_in[b] for b in token)
    names = {t.encode(): t for t in special}
    hf = HFTokenizer(models.BPE(vocab={names.get(t) or s(t): i for i, t in vocab.items()},
                                merges=[(s(a), s(b)) for a, b in merges]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(list(special))
    return hf


# ---------------------------------------------------------------- the reference trainer

def slow_bpe(text: str, vocab_size: int, special: list[str]) -> list[tuple[bytes, bytes]]:
    """Byte-level BPE the obvious way: split off the special tokens, pre-tokenise, and before
    every merge count every adjacent pair of every pre-token again."""
    pieces = regex.split("|".join(map(regex.escape, special)), text) if special else [text]
    words = Counter(tuple(bytes([b]) for b in t.encode()) for p in pieces for t in regex.findall(GPT2_PATTERN, p))
    merges: list[tuple[bytes, bytes]] = []
    while 256 + len(merges) + len(special) < vocab_size:
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))          # ties: the greater pair of byte strings
        merges.append(best)
        merged = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def tie_corpora() -> list[str]:
    rng = random.Random(3)
    corpora = ["ab cd ef", "aaaa aaa aa a aaaa", "ab ba ab ba abab baba", "low lower lowest newer wider new",
               "x<|endoftext|>y x<|end|>y<|endoftext|><|end|>xy", book_text(3000)]
    corpora += ["".join(rng.choice("ab c\n'é") for _ in range(rng.randint(1, 200))) for _ in range(12)]
    return corpora


@pytest.mark.parametrize("index", range(len(tie_corpora())))
def test_trainer_equals_the_slow_reference(index):
    text = tie_corpora()[index]
    special = [t for t in SPECIAL if t in text]
    for vocab_size in (257 + len(special), 280, 330):
        vocab, merges = train_bpe(text, vocab_size, special)
        assert merges == slow_bpe(text, vocab_size, special), (text[:40], vocab_size)
        assert len(vocab) == 256 + len(merges) + len(special) <= vocab_size


def test_ties_go_to_the_greater_pair_worked_example():
    """"ab cd": the pairs (a, b), ( , c), (c, d) occur once each; the greatest pair of byte
    strings is (c, d), then (a, b), then ( , cd)."""
    _, merges = train_bpe("ab cd", 259)
    assert merges == [(b"c", b"d"), (b"a", b"b"), (b" ", b"cd")]


def test_vocab_layout_bytes_then_merges_then_special_tokens():
    vocab, merges = train_bpe("the cat<|endoftext|>the hat", 262, ["<|endoftext|>"])
    assert [vocab[i] for i in range(256)] == [bytes([i]) for i in range(256)]
    assert [vocab[256 + k] for k in range(len(merges))] == [a + b for a, b in merges]
    assert vocab[max(vocab)] == b"<|endoftext|>" and len(vocab) == 262
    assert all(b"|" not in a + b for a, b in merges)            # nothing merged across the special token
    vocab, merges = train_bpe("ab", 1000)                         # one pair to merge, then none left
    assert merges == [(b"a", b"b")] and len(vocab) == 257


def test_training_from_a_path(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXTS[1], encoding="utf-8")
    assert train_bpe(path, 300) == train_bpe(TEXTS[1], 300)


def test_merge_delta_equals_recounting():
    """The change of a word's pair counts under one merge equals counting before and after."""
    rng = random.Random(5)
    for _ in range(300):
        word = [rng.randint(0, 3) for _ in range(rng.randint(0, 12))]
        pair = (rng.randint(0, 3), rng.randint(0, 3))
        merged, i = [], 0
        while i < len(word):
            if tuple(word[i:i + 2]) == pair:
                merged.append(9)
                i += 2
            else:
                merged.append(word[i])
                i += 1
        expected = Counter(zip(merged, merged[1:]))
        expected.subtract(Counter(zip(word, word[1:])))
        assert merge_delta(word, pair, 9) == {p: k for p, k in expected.items() if k}, (word, pair)


# ---------------------------------------------------------------- pre-tokenisation and encoding

def test_pretokens_equal_hugging_face_byte_level():
    stand_in = hf_bytes_to_unicode()
    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    rng = random.Random(1)
    for text in TEXTS + [random_text(rng, 30) for _ in range(300)]:
        ours = ["".join(stand_in[b] for b in t.encode()) for t in pretokenize(text)]
        assert ours == [piece for piece, _ in split.pre_tokenize_str(text)], text
        assert "".join(pretokenize(text)) == text


def test_bytes_to_unicode_is_gpt2s():
    assert bytes_to_unicode() == hf_bytes_to_unicode()


def test_encoder_equals_hugging_face_id_for_id(trained):
    vocab, merges, ours = trained
    hf = hugging_face(vocab, merges, SPECIAL)
    rng = random.Random(2)
    for text in TEXTS + [book_text(20_000)] + [random_text(rng, rng.randint(0, 40)) for _ in range(1500)]:
        assert ours.encode(text) == hf.encode(text).ids, text[:80]


def test_encoder_equals_hugging_face_on_shakespeare():
    """Trained on 200,000 characters of the training split, equal on 50,000 held-out ones."""
    train, validation = shakespeare_splits()
    vocab, merges = train_bpe(train[:200_000], 1000, ["<|endoftext|>"])
    ours, hf = Tokenizer(vocab, merges, ["<|endoftext|>"]), hugging_face(vocab, merges, ["<|endoftext|>"])
    text = validation[:25_000] + "<|endoftext|>" + validation[-25_000:]
    assert ours.encode(text) == hf.encode(text).ids
    assert ours.decode(ours.encode(text)) == text


def test_overlapping_special_tokens_match_longest_first(trained):
    vocab, _, tok = trained
    ids = tok.encode("<|endoftext|><|end|><|end|>")
    assert [vocab[i] for i in ids] == [b"<|endoftext|><|end|>", b"<|end|>"]


def test_from_files_reads_what_tokenizers_writes(trained, tmp_path):
    vocab, merges, ours = trained
    hf = hugging_face(vocab, merges, SPECIAL)
    hf.model.save(str(tmp_path))
    loaded = Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", SPECIAL)
    assert loaded.vocab == vocab and list(loaded.ranks) == merges
    for text in TEXTS:
        assert loaded.encode(text) == ours.encode(text)


def test_round_trip_over_random_unicode(trained):
    tok = trained[2]
    rng = random.Random(4)
    for _ in range(2000):
        text = random_text(rng, rng.randint(0, 30), unicode_share=0.6)
        assert tok.decode(tok.encode(text)) == text


def test_decoding_broken_utf8_replaces_like_python(trained):
    """Single-byte ids that cut characters apart decode as Python's own decoder does."""
    tok = trained[2]
    rng = random.Random(6)
    for _ in range(500):
        data = bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 12)))
        assert tok.decode(list(data)) == data.decode("utf-8", errors="replace")
    assert tok.decode(list("€".encode())[:2]) == "\ufffd"


# ---------------------------------------------------------------- streaming

@pytest.mark.parametrize("special", [SPECIAL, None])
def test_encode_iterable_equals_encode_for_any_cuts(trained, special):
    tok = Tokenizer(trained[0], trained[1], special)
    rng = random.Random(7)
    for _ in range(1500):
        text = random_text(rng, rng.randint(0, 30), unicode_share=0.05)
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 8))))
        chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        assert list(tok.encode_iterable(chunks)) == tok.encode(text), chunks
    for text in ["x'll we've", "a  \n\n  b", "<|endoftext|><|end|>x", *TEXTS[3:], TEXTS[4] + book_text(3000)]:
        assert list(tok.encode_iterable(iter(text))) == tok.encode(text), text   # one character at a time


def test_encode_iterable_streams_in_bounded_memory(trained):
    """Streaming 4 or 16 copies of the book's text takes about the same peak memory, a small
    fraction of the text; encoding the text at once takes more than the text."""
    tok = trained[2]
    lines = book_text(20_000).splitlines(keepends=True)

    def peak(copies: int, stream: bool) -> tuple[int, int]:
        tracemalloc.start()
        if stream:
            count = sum(1 for _ in tok.encode_iterable(line for _ in range(copies) for line in lines))
        else:
            count = len(tok.encode("".join(lines) * copies))
        used = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return count, used
    (n4, small), (n16, large), (n16_whole, whole) = peak(4, True), peak(16, True), peak(16, False)
    assert n16 == n16_whole > 3.9 * n4
    assert large < 1.5 * small + 50_000 and large < 16 * 20_000 / 4 < whole, (small, large, whole)


# ---------------------------------------------------------------- errors

def test_errors_name_the_argument(trained):
    vocab, merges, tok = trained
    cases = [
        (lambda: train_bpe(3, 300), "text_or_path: expected the text (a str) or a path (a pathlib.Path), got int"),
        (lambda: train_bpe("ab", 258, ["<a>", "<b>", "<c>"]),
         "vocab_size: expected at least 256 bytes + 3 special tokens = 259, got 258"),
        (lambda: train_bpe("ab", 300.0), "vocab_size: expected an int, got float"),
        (lambda: train_bpe("ab", 300, "<s>"), "special_tokens: expected a list of strings, got str"),
        (lambda: train_bpe("ab", 300, ["<s>", "<s>"]), "special_tokens: expected distinct tokens, got ['<s>'] more than once"),
        (lambda: train_bpe("ab", 300, [""]), "special_tokens: expected non-empty strings, got ['']"),
        (lambda: pretokenize(b"ab"), "text: expected a str, got bytes"),
        (lambda: tok.encode(["a"]), "text: expected a str, got list"),
        (lambda: tok.decode([0, 10**6]), f"ids: expected ids of the vocabulary (size {len(vocab)}), got [1000000]"),
        (lambda: list(tok.encode_iterable("abc")), "texts: expected an iterable of strings (e.g. an open file), got str"),
        (lambda: list(tok.encode_iterable([b"ab"])), "texts: expected strings, got an item of type bytes"),
        (lambda: Tokenizer([b"a"], merges), "vocab: expected a dict of id -> bytes, got list"),
        (lambda: Tokenizer({0: "a"}, merges), "vocab: expected ids >= 0 mapped to non-empty bytes, got [(0, 'a')]"),
        (lambda: Tokenizer({i: bytes([i]) for i in range(255)}, []),
         "vocab: expected all 256 single bytes, got none for [b'\\xff']"),
        (lambda: Tokenizer(vocab, [("a", "b")]), "merges[0]: expected a pair (bytes, bytes), got ('a', 'b')"),
        (lambda: Tokenizer({i: bytes([i]) for i in range(256)}, [(b"a", b"b")]),
         "merges[0]: expected its result b'ab' in vocab, not found"),
    ]
    for fn, message in cases:
        assert error_message(fn) == message


def test_from_files_errors(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps({"a\u4e00": 0}), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n", encoding="utf-8")
    assert error_message(Tokenizer.from_files, tmp_path / "vocab.json", tmp_path / "merges.txt") == (
        "vocab_path 'a一': expected GPT-2's byte stand-ins, got ['一'] in 'a一'")
    stand_in = bytes_to_unicode()
    (tmp_path / "vocab.json").write_text(json.dumps({stand_in[b]: b for b in range(256)}), encoding="utf-8")
    assert error_message(Tokenizer.from_files, tmp_path / "vocab.json", tmp_path / "merges.txt") == (
        "merges_path line 2: expected two tokens separated by a space, got 'a b c'")


def test_pretoken_counts_cut_out_special_tokens():
    counts = pretoken_counts("hi<|endoftext|>hi there", ["<|endoftext|>"])
    assert counts == Counter({"hi": 2, " there": 1})
    assert pretokenize("it's  me\n") == ["it", "'s", " ", " me", "\n"]
