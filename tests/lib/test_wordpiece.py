"""WordPiece (`transformer_lib.wordpiece`; Chapter 11) against Hugging Face `tokenizers` loading
the same ``tokenizer.json`` (MiniLM's, from the pinned package), id for id: English, German
with accents, Chinese, emoji, control and exotic whitespace characters, special tokens in the
text, words over the length limit, truncation, and random strings over every character whose
Unicode category has not changed since Unicode 3.2 (Python's tables are Unicode 14,
`tokenizers`' older: marks and format characters added since are classed differently).
"""
from __future__ import annotations

import random
import unicodedata

import pytest
from tokenizers import Tokenizer as HFTokenizer

from torch_helpers import error_message
from transformer_lib.bert import minilm_dir
from transformer_lib.wordpiece import WordPiece

TEXTS = [
    "Hello, World! It's $5.99 — naïve café, Ünïcödé.", "Die Straße heißt Größe; Äpfel und Öl.",
    "我爱北京天安门。日本語のテキスト、カタカナ", "emoji 🙂👍🏽 and a family 👨‍👩‍👧",
    "[CLS] hello [MASK] there[SEP]", "a" * 101 + " b", "a" * 100, "ΣΊΣΥΦΟΣ ΟΔΟΣ", "İstanbul",
    "tab\tnew\nline\r\x00zero\ufffd \u200b\u2028x\u00a0y\u3000z\x1c\x85 end",
    "unaffable supercalifragilisticexpialidocious", "\U0002B820\U0002B821 \U0002B920\U0002B921", "ﬁ ﬂ ½ ² Ⅻ a^b+c=d<e>f|g~h`i",
    "The board approved a $3B buyback despite declining margins. " * 30,   # over 128 tokens: truncated
]


@pytest.fixture(scope="module")
def pair():
    path = minilm_dir() / "tokenizer.json"
    hf = HFTokenizer.from_file(str(path))
    hf.no_padding()
    return WordPiece.from_file(path), hf


def stable_characters() -> list[int]:
    old = unicodedata.ucd_3_2_0
    return [cp for cp in range(0x30000) if not 0xD800 <= cp < 0xE000
            and unicodedata.category(chr(cp)) == old.category(chr(cp)) != "Cn"]


def test_reads_minilms_file(pair):
    ours, _ = pair
    assert (ours.vocab_size, ours.unk_token, ours.prefix, ours.max_chars, ours.max_length) == \
        (30522, "[UNK]", "##", 100, 128)
    assert ours.lowercase and ours.strip_accents


def test_equals_tokenizers_on_texts(pair):
    ours, hf = pair
    for text in TEXTS:
        theirs = hf.encode(text)
        assert ours.encode(text) == theirs.ids, text[:60]
        assert ours.decode_tokens(theirs.ids) == theirs.tokens
    assert len(ours.encode(TEXTS[-1])) == 128


def test_equals_tokenizers_on_random_strings(pair):
    ours, hf = pair
    chars = stable_characters()
    rng = random.Random(0)
    for _ in range(4000):
        text = "".join(chr(rng.choice(chars)) if rng.random() < 0.4 else rng.choice("abc déf ĳ,.'")
                       for _ in range(rng.randint(1, 10)))
        assert ours.encode(text) == hf.encode(text).ids, [hex(ord(c)) for c in text]


def test_greedy_longest_match_first_by_hand():
    """Greedy takes the longest prefix in the vocabulary: "abc" with {ab, a, ##bc} is [UNK],
    although a + ##bc would spell it."""
    vocab = {t: i for i, t in enumerate(["[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "ab", "a", "##bc"])}
    wp = WordPiece(vocab, max_chars=9)
    assert wp.tokenize_word("unaffable") == ["un", "##aff", "##able"]
    assert wp.tokenize_word("abc") == ["[UNK]"] and wp.tokenize_word("abbc") == ["ab", "##bc"]
    assert wp.tokenize_word("a") == ["a"] and wp.tokenize_word("unaffablex") == ["[UNK]"]
    assert wp.tokenize("Un-affable!") == ["un", "[UNK]", "[UNK]", "[UNK]"]
    assert wp.encode("un") == [1, 3, 2] and wp.encode("un", add_special_tokens=False) == [3]


def test_normaliser_and_pre_tokenizer_by_hand(pair):
    ours, _ = pair
    assert ours.normalize("Crème\tBRÛLÉE\x07 北京") == "creme brulee  北  京 "
    assert ours.pre_tokenize("it's $5.") == ["it", "'", "s", "$", "5", "."]


def test_errors_name_the_argument(pair):
    ours, _ = pair
    cases = [
        (lambda: WordPiece(["a"]), "vocab: expected a non-empty dict of token -> id, got list"),
        (lambda: WordPiece({"[CLS]": 0, "[SEP]": 1}), "vocab: expected the token '[UNK]' (unk_token), not found"),
        (lambda: WordPiece({"[UNK]": 0, "[CLS]": 1, "[SEP]": 2}, max_chars=0),
         "max_chars: expected an int >= 1, got 0"),
        (lambda: WordPiece({"[UNK]": 0, "[CLS]": 1, "[SEP]": 2}, max_length=1),
         "max_length: expected None or an int >= 2 ([CLS] and [SEP]), got 1"),
        (lambda: ours.tokenize(3), "text: expected a str, got int"),
        (lambda: ours.decode_tokens([0, 40000]), "ids: expected ids of the vocabulary (size 30522), got [40000]"),
    ]
    for fn, message in cases:
        assert error_message(fn) == message


def test_from_file_refuses_other_models(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": {"type": "BPE"}, "normalizer": null}', encoding="utf-8")
    assert error_message(WordPiece.from_file, path) == (
        "path: expected a WordPiece model with a BertNormalizer, got model 'BPE' and normalizer None")
