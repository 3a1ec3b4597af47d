"""The appendix "from text to tokens": each check cell fails when the code it guards is broken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import check_fails_when_broken, uncovered_check_cells

TOK = "appendix_tokens"
LAST = "def wordpiece_by_hand"  # the last cell the cases need
SKIP = ("starts = [0, 900_000", 'glue("n_slices"')  # not run: the slices' training no case needs


# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line
#        [, [(module, name, make_broken), ...] library patches]).
# The last cell of the list is the check cell; the ones before it define what it uses.
BROKEN = {
    "T pre-tokens: whitespace dropped by the pattern": (
        TOK, [("lib:transformer_lib.bpe:pretokenize", [("return _PRETOKEN.findall(text)",
                                                       "return [t for t in _PRETOKEN.findall(text) if t.strip()]")]),
              ("train_text, val_text = shakespeare_splits()", [])],
        "assert set(val_text) <= set(SHAKESPEARE_ALPHABET)"),
    "T UTF-8: six payload bits in the lead byte of two": (
        TOK, [("def utf8(cp)", [("0b11000000 | cp >> 6, 0b10000000 | cp & 0x3F", "0b11000000 | cp >> 5, 0b10000000 | cp & 0x3F")])],
        "assert all(utf8(cp) == chr(cp).encode"),
    "T by hand: ties broken toward the smaller pair": (
        TOK, [("lib:transformer_lib.bpe:_desc", [("255 - b for b in token", "b for b in token")]),
              ("def bpe_by_hand", [])],
        "assert [pair for pair, _ in hand] == merges_ex"),
    "T updated counts: a count that changed not pushed to the heap": (
        TOK, [("lib:transformer_lib.bpe:_PairCounts.merge", [("heapq.heappush(self.heap, self._entry(p, count))", "pass")]),
              ("def cpu_seconds", [])],
        "assert fast == slow"),
    "T encoder: the leftmost known pair merged first, not the one learned first": (
        TOK, [("lib:transformer_lib.tokenizer:Tokenizer._bpe", [
            ("ranked = [(self.ranks.get(pair, len(self.ranks)), i)",
             "ranked = [(0 if pair in self.ranks else len(self.ranks), i)")]),
              ("TRAIN_CHARS = 1_000_000", [("t_train = time.process_time() - start", "t_train = 0.0")]),
              ("def encode_by_hand", [])],
        "assert encode_by_hand(val_text[:2000], merges) == bpe.encode"),
    "T compression: pairs counted once per distinct word, not weighted by frequency": (
        TOK, [("lib:transformer_lib.bpe:_PairCounts.__init__", [("self.counts[pair] += freq", "self.counts[pair] += 1")]),
              ("TRAIN_CHARS = 1_000_000", [("t_train = time.process_time() - start", "t_train = 0.0")]),
              ("SIZES = [256, 512", []), ("assert bytes_per_token[256] == 1.0", [])],
        "assert min(gains) > 0.2 and gains[0] > 2 * max(gains[1:])"),
    "T slices: pairs counted once per distinct word, in every slice": (
        TOK, [("lib:transformer_lib.bpe:_PairCounts.__init__", [("self.counts[pair] += freq", "self.counts[pair] += 1")]),
              ("TRAIN_CHARS = 1_000_000", [("t_train = time.process_time() - start", "t_train = 0.0")]),
              ("SIZES = [256, 512", []), ("starts = [0, 900_000", [])],
        "assert (slice_gains.min(1) > 0.2).all()"),
    "T attention work: the scores counted linear in the length": (
        TOK, [("lib:transformer_lib.counting:flops_breakdown", [('"attention_scores": L * 2 * 2 * n * n * d,',
                                                                '"attention_scores": L * 2 * 2 * n * d,')]),
              ("gpt2 = PRESETS", [])],
        'assert abs(saving["attention_scores"] / c**2 - 1) < 0.01'),
    "T embedding: a tied unembedding counted again": (
        TOK, [("lib:transformer_lib.counting:param_breakdown", [('"unembedding": c.vocab_size * d if untied_head else 0',
                                                                '"unembedding": c.vocab_size * d if c.lm_head else 0')]),
              ("gpt2 = PRESETS", [])],
        "assert all(embedding[V] == V * d"),
    "T languages: the tokenizer trained with Russian text": (
        TOK, [("TRAIN_CHARS = 1_000_000", [("train_text[:TRAIN_CHARS]",
                                            "train_text[:TRAIN_CHARS] + PASSAGES_RU * 50"),
                                           ("TRAIN_CHARS = 1_000_000", "TRAIN_CHARS = 1_000_000\nPASSAGES_RU = "
                                            "'Языковая модель никогда не читает буквы. '")]),
              ("wordpiece = WordPiece.from_file", [])],
        "assert all(b < 0x80 for a, b_ in merges"),
    "T special tokens: not matched in the text": (
        TOK, [("lib:transformer_lib.bpe:special_pattern", [("    if not special_tokens:\n        return None",
                                                           "    return None")]),
              ('special = Tokenizer(vocab, merges, ["<|endoftext|>"])', [])],
        "assert joined == special.encode(left) + [eot]"),
    "T WordPiece: the shortest match first": (
        TOK, [("lib:transformer_lib.wordpiece:WordPiece.tokenize_word", [("for end in range(len(word), start, -1):",
                                                                        "for end in range(start + 1, len(word) + 1):")]),
              ("def wordpiece_by_hand", [])],
        "assert all(wordpiece_by_hand(w, wordpiece.vocab) == wordpiece.tokenize_word(w)"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a broken cell may meet a nan
@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(TOK, BROKEN) == []
