"""WordPiece, the tokenizer of BERT and of the course's trained MiniLM.

    text -> special tokens ([CLS], [MASK], …) kept whole
         -> normalise: drop control characters, whitespace -> " ", spaces around CJK
            characters, strip accents, lower-case
         -> pre-tokenise: split on whitespace, every punctuation mark a word of its own
         -> each word: greedy longest match first against the vocabulary, pieces after the
            first written "##…"; a word with no match, or over 100 characters, is [UNK]
         -> [CLS] ids [SEP]

Read from the ``tokenizer.json`` that ships with a model (`WordPiece.from_file`): its vocabulary,
unknown token, continuation prefix, length limit, normaliser switches, added tokens and
truncation length. `transformer_lib.bert.tokenize` uses it. Chapter 11.
"""
from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Mapping, Sequence

from transformer_lib.bpe import split_special

__all__ = ["is_cjk", "is_punctuation", "WordPiece"]

# The blocks of CJK ideographs as Hugging Face's normaliser lists them (its fifth range starts at
# U+2B920, where Google's BERT has U+2B820).
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_ASCII_PUNCTUATION = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def is_cjk(char: str) -> bool:
    """True for a CJK ideograph (the blocks BERT splits into single-character words). Chapter 11, through `WordPiece`."""
    return any(low <= ord(char) <= high for low, high in _CJK)


def is_punctuation(char: str) -> bool:
    """True for BERT's punctuation: every ASCII symbol (``$``, ``+``, ``^`` too) and every
    Unicode punctuation mark (categories P*). Chapter 11, through `WordPiece`."""
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def _is_whitespace(char: str) -> bool:
    return char in "\t\n\r" or unicodedata.category(char) in ("Zs", "Zl", "Zp")


def _is_control(char: str) -> bool:
    """Controls, formats, private use and surrogates (Cc, Cf, Co, Cs); unassigned code points
    (Cn) stay, as in Hugging Face's normaliser."""
    return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf", "Co", "Cs")


class WordPiece:
    """A WordPiece tokenizer over ``vocab`` (token -> id). ``special_tokens`` are matched in the
    raw text and kept whole; ``max_length`` (if given) truncates an encoding, [CLS] and [SEP]
    included. Chapter 11."""

    def __init__(self, vocab: Mapping[str, int], unk_token: str = "[UNK]", prefix: str = "##",
                 max_chars: int = 100, lowercase: bool = True, strip_accents: bool | None = None,
                 special_tokens: Sequence[str] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
                 max_length: int | None = None) -> None:
        if not isinstance(vocab, Mapping) or not vocab:
            raise TypeError(f"vocab: expected a non-empty dict of token -> id, got {type(vocab).__name__}")
        for name, token in (("unk_token", unk_token), ("[CLS]", "[CLS]"), ("[SEP]", "[SEP]")):
            if token not in vocab:
                raise ValueError(f"vocab: expected the token {token!r} ({name}), not found")
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
            raise ValueError(f"max_chars: expected an int >= 1, got {max_chars!r}")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 2):
            raise ValueError(f"max_length: expected None or an int >= 2 ([CLS] and [SEP]), got {max_length!r}")
        self.vocab, self.unk_token, self.prefix, self.max_chars = dict(vocab), unk_token, prefix, max_chars
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.special_tokens = [t for t in special_tokens if t in self.vocab]
        self.max_length = max_length
        self.tokens = {i: t for t, i in self.vocab.items()}

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> WordPiece:
        """The WordPiece tokenizer a ``tokenizer.json`` describes (BERT normaliser, BERT
        pre-tokenizer, WordPiece model), e.g. MiniLM's. Chapter 11."""
        with open(path, encoding="utf-8") as fh:
            spec = json.load(fh)
        model, norm = spec.get("model") or {}, spec.get("normalizer") or {}
        if model.get("type") != "WordPiece" or norm.get("type") != "BertNormalizer":
            raise ValueError(f"path: expected a WordPiece model with a BertNormalizer, got model "
                             f"{model.get('type')!r} and normalizer {norm.get('type')!r}")
        if not (norm.get("clean_text") and norm.get("handle_chinese_chars")):
            raise ValueError("path: expected a BertNormalizer with clean_text and handle_chinese_chars")
        truncation = spec.get("truncation") or {}
        return cls(model["vocab"], unk_token=model["unk_token"], prefix=model["continuing_subword_prefix"],
                   max_chars=model["max_input_chars_per_word"], lowercase=norm["lowercase"],
                   strip_accents=norm.get("strip_accents"),
                   special_tokens=[t["content"] for t in spec.get("added_tokens", []) if t.get("special")],
                   max_length=truncation.get("max_length"))

    @property
    def vocab_size(self) -> int:
        """Number of entries of the vocabulary (30,522 for MiniLM). Chapter 11."""
        return len(self.vocab)

    def normalize(self, text: str) -> str:
        """BERT's normaliser: control characters dropped, whitespace -> one space each, spaces
        around CJK ideographs, accents stripped (NFD, marks removed) and lower-case, as set.
        Chapter 11."""
        chars = []
        for c in text:
            if c in ("\0", "\ufffd") or _is_control(c):
                continue
            chars.append(" " if _is_whitespace(c) else f" {c} " if is_cjk(c) else c)
        text = "".join(chars)
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
        return "".join(c.lower() for c in text) if self.lowercase else text

    @staticmethod
    def pre_tokenize(text: str) -> list[str]:
        """BERT's pre-tokenizer: words split at whitespace, each punctuation mark a word of its
        own: ``"it's $5."`` -> ``["it", "'", "s", "$", "5", "."]``. Chapter 11."""
        words, current = [], []
        for c in text:
            if _is_whitespace(c) or is_punctuation(c):
                if current:
                    words.append("".join(current))
                current = []
                if is_punctuation(c):
                    words.append(c)
            else:
                current.append(c)
        if current:
            words.append("".join(current))
        return words

    def tokenize_word(self, word: str) -> list[str]:
        """One word -> its pieces, greedy longest match first: ``"unaffable"`` -> ``["una",
        "##ffa", "##ble"]`` with a vocabulary that has them; [UNK] if some position has no
        match or the word is longer than ``max_chars``. Chapter 11."""
        if len(word) > self.max_chars:
            return [self.unk_token]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.vocab:
                    break
            else:
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """``str`` -> WordPiece tokens, without [CLS] and [SEP]. Chapter 11."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        tokens = []
        for piece, special in split_special(text, self.special_tokens):
            if special:
                tokens.append(piece)
                continue
            for word in self.pre_tokenize(self.normalize(piece)):
                tokens.extend(self.tokenize_word(word))
        return tokens

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``str`` -> ids ``(n,)``: ``[CLS] … [SEP]`` (with ``add_special_tokens``), truncated
        to ``max_length`` if set. Chapter 11."""
        ids = [self.vocab[t] for t in self.tokenize(text)]
        if not add_special_tokens:
            return ids if self.max_length is None else ids[:self.max_length]
        if self.max_length is not None:
            ids = ids[:self.max_length - 2]
        return [self.vocab["[CLS]"], *ids, self.vocab["[SEP]"]]

    def decode_tokens(self, ids: Sequence[int]) -> list[str]:
        """Ids ``(n,)`` -> the tokens they stand for. Chapter 5."""
        bad = [i for i in ids if i not in self.tokens]
        if bad:
            raise ValueError(f"ids: expected ids of the vocabulary (size {self.vocab_size}), got {bad[:5]!r}")
        return [self.tokens[i] for i in ids]

    def __repr__(self) -> str:
        return f"WordPiece(vocab_size={self.vocab_size}, max_chars={self.max_chars}, lowercase={self.lowercase})"
