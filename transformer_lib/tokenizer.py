"""A byte-level BPE tokenizer: text -> token ids -> text, as GPT-2 encodes.

    text -> special tokens cut out (longest first) -> GPT-2 pre-tokens -> UTF-8 bytes
         -> merges applied in the order they were learned -> ids

Within a pre-token the merge learned first that applies is applied first, everywhere in the
pre-token, then the next, until no learned merge applies; the resulting byte strings are looked
up in the vocabulary. Decoding concatenates the tokens' bytes and reads them as UTF-8, with
U+FFFD where the bytes are not valid UTF-8 (a sequence cut inside a character).
`Tokenizer.encode_iterable` encodes a stream (the lines of a large file) with memory bounded by
the longest pre-token, giving exactly the ids of `Tokenizer.encode` on the whole text.
`Tokenizer.from_files` reads GPT-2's ``vocab.json`` and ``merges.txt``, whose byte strings are
written in GPT-2's printable stand-ins for the 256 bytes (`bytes_to_unicode`). Training is in
`transformer_lib.bpe`. Chapter 11.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

from transformer_lib.bpe import _PRETOKEN, check_special_tokens, special_pattern, split_special

__all__ = ["bytes_to_unicode", "Tokenizer"]

_CACHE_SIZE = 1 << 14  # pre-tokens whose ids are remembered (the cache is emptied when full)
_LOOKAHEAD = 2         # characters after a pre-token that can still change it (see encode_iterable)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves,
    the other 68 (controls, space, …) for the characters from U+0100 on, in byte order.
    Chapter 11."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    stand_in, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in stand_in:
            stand_in[b] = chr(256 + extra)
            extra += 1
    return dict(sorted(stand_in.items()))


def _check_vocab(vocab: object) -> dict[int, bytes]:
    if not isinstance(vocab, Mapping):
        raise TypeError(f"vocab: expected a dict of id -> bytes, got {type(vocab).__name__}")
    bad = [(i, t) for i, t in vocab.items() if isinstance(i, bool) or not isinstance(i, int) or i < 0
           or not isinstance(t, bytes) or not t]
    if bad:
        raise ValueError(f"vocab: expected ids >= 0 mapped to non-empty bytes, got {bad[:3]!r}")
    return dict(vocab)


class Tokenizer:
    """Byte-level BPE with ``vocab`` (id -> bytes), ``merges`` (pairs of bytes, in the order
    learned) and optional special tokens (strings, encoded as one id each; added to the
    vocabulary when missing). Chapter 11."""

    def __init__(self, vocab: Mapping[int, bytes], merges: Sequence[tuple[bytes, bytes]],
                 special_tokens: Sequence[str] | None = None) -> None:
        self.vocab = _check_vocab(vocab)
        self.special_tokens = check_special_tokens(special_tokens)
        self.ids = {t: i for i, t in sorted(self.vocab.items(), reverse=True)}  # the smallest id wins
        self.special_ids: dict[str, int] = {}
        for token in self.special_tokens:
            same = [i for i, t in self.vocab.items() if t == token.encode("utf-8")]
            self.special_ids[token] = max(same) if same else max(self.vocab, default=-1) + 1
            self.vocab[self.special_ids[token]] = token.encode("utf-8")
        missing = [bytes([b]) for b in range(256) if bytes([b]) not in self.ids]
        if missing:
            raise ValueError(f"vocab: expected all 256 single bytes, got none for {missing[:3]!r}")
        self.ranks: dict[tuple[bytes, bytes], int] = {}
        for rank, pair in enumerate(merges):
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(p, bytes) for p in pair)):
                raise TypeError(f"merges[{rank}]: expected a pair (bytes, bytes), got {pair!r}")
            if pair[0] + pair[1] not in self.ids:
                raise ValueError(f"merges[{rank}]: expected its result {pair[0] + pair[1]!r} in vocab, not found")
            self.ranks.setdefault(pair, rank)
        self._special = special_pattern(self.special_tokens)
        self._longest = max(map(len, self.special_tokens), default=0)
        self._cache: dict[str, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        """Number of entries of the vocabulary (bytes, merges and special tokens). Chapter 11."""
        return len(self.vocab)

    def _bpe(self, pretoken: str) -> list[int]:
        """The ids of one pre-token: its bytes, merged by rank."""
        ids = self._cache.get(pretoken)
        if ids is not None:
            return ids
        parts = [bytes([b]) for b in pretoken.encode("utf-8")]
        while len(parts) > 1:
            ranked = [(self.ranks.get(pair, len(self.ranks)), i) for i, pair in enumerate(zip(parts, parts[1:]))]
            rank = min(ranked)[0]
            if rank == len(self.ranks):
                break
            first, second = parts[min(ranked)[1]], parts[min(ranked)[1] + 1]
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == first and parts[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = [self.ids[p] for p in parts]
        if len(self._cache) >= _CACHE_SIZE:
            self._cache.clear()
        self._cache[pretoken] = ids
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        """The ids of a text without special tokens."""
        ids: list[int] = []
        for pretoken in _PRETOKEN.findall(text):
            ids.extend(self._bpe(pretoken))
        return ids

    def encode(self, text: str) -> list[int]:
        """``str`` -> token ids ``(n,)``: special tokens one id each, the rest byte-level BPE
        over GPT-2's pre-tokens. Chapter 11."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        ids: list[int] = []
        for piece, special in split_special(text, self.special_tokens):
            ids.extend([self.special_ids[piece]] if special else self._encode_plain(piece))
        return ids

    def _certain(self, text: str) -> tuple[list[int], int]:
        """The ids of the start of ``text`` that no continuation can change, and its length:
        the special tokens whose longest possible extension is in view, then the pre-tokens
        that end ``_LOOKAHEAD`` characters before anything still open (a special token could
        start in the last ``longest − 1`` characters; GPT-2's pattern reads at most two
        characters past a pre-token's end to decide it). The pre-tokens are taken as found in
        ``text``: the same pattern run on a cut-off text could end differently."""
        ids, cut, open_from = [], 0, len(text) - max(self._longest - 1, 0)
        for m in self._special.finditer(text) if self._special is not None else ():
            if m.start() + self._longest > len(text):      # it starts at or after open_from
                break
            ids += self._encode_plain(text[cut:m.start()])
            ids.append(self.special_ids[m.group()])
            cut = m.end()
        for m in _PRETOKEN.finditer(text, cut):
            if m.end() + _LOOKAHEAD > open_from:
                break
            ids += self._bpe(m.group())
            cut = m.end()
        return ids, cut

    def encode_iterable(self, texts: Iterable[str]) -> Iterator[int]:
        """Token ids of the concatenated ``texts`` (e.g. the lines of an open file), yielded as
        soon as they are certain: equal to ``encode("".join(texts))``, holding only the text
        not yet encoded (about one pre-token). Library: no chapter names it."""
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Iterable):
            raise TypeError(f"texts: expected an iterable of strings (e.g. an open file), got {type(texts).__name__}")
        pending = ""
        for chunk in texts:
            if not isinstance(chunk, str):
                raise TypeError(f"texts: expected strings, got an item of type {type(chunk).__name__}")
            ids, cut = self._certain(pending + chunk)
            yield from ids
            pending = (pending + chunk)[cut:]
        yield from self.encode(pending)

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids ``(n,)`` -> ``str``: their bytes, read as UTF-8 with U+FFFD for any byte
        sequence that is not valid UTF-8. Chapter 11."""
        ids = list(ids)
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or i not in self.vocab]
        if bad:
            raise ValueError(f"ids: expected ids of the vocabulary (size {self.vocab_size}), got {bad[:5]!r}")
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")

    @classmethod
    def from_files(cls, vocab_path: str | os.PathLike, merges_path: str | os.PathLike,
                   special_tokens: Sequence[str] | None = None) -> Tokenizer:
        """A tokenizer from GPT-2's files: ``vocab.json`` (token in byte stand-ins -> id) and
        ``merges.txt`` (one merge ``a b`` per line, after a ``#version`` line). Library: no chapter names it."""
        byte_of = {c: b for b, c in bytes_to_unicode().items()}

        def as_bytes(token: str, where: str) -> bytes:
            unknown = sorted({c for c in token if c not in byte_of})
            if unknown:
                raise ValueError(f"{where}: expected GPT-2's byte stand-ins, got {unknown[:3]!r} in {token!r}")
            return bytes(byte_of[c] for c in token)

        with open(vocab_path, encoding="utf-8") as fh:
            entries = json.load(fh)
        special = set(check_special_tokens(special_tokens))
        vocab = {i: t.encode("utf-8") if t in special else as_bytes(t, f"vocab_path {t!r}")
                 for t, i in entries.items()}
        merges = []
        with open(merges_path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                line = line.rstrip("\n")
                if not line or (number == 1 and line.startswith("#version")):
                    continue
                parts = line.split(" ")
                if len(parts) != 2:
                    raise ValueError(f"merges_path line {number}: expected two tokens separated by a space, "
                                     f"got {line!r}")
                merges.append((as_bytes(parts[0], f"merges_path line {number}"),
                               as_bytes(parts[1], f"merges_path line {number}")))
        return cls(vocab, merges, special_tokens)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.ranks)}, "
                f"special_tokens={self.special_tokens!r})")
