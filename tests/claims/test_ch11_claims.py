"""The tokens appendix's measured claims hold for five training slices other than the five the
page measures: the pair counts kept up to date give the merges of recounting, at least three
times faster; bytes per token on held-out Shakespeare rise with the vocabulary size, each doubling
from 512 on adding less, to more than 2.5 at V = 4,096 and below one token per word; the
Shakespeare BPE costs English < German < Russian tokens per word, with every byte of the Cyrillic
letters a token of its own.

The claims are tested by re-running the appendix's own cells (chapters/appendix_tokens.ipynb)
on the training text cut to start further in, so that its million-character training slice
starts at 0.45, 1.35, 2.25, 3.15 and 3.55 million characters (the page's slices start at 0, 0.9,
1.8, 2.7 and 3.5 million); the assertions checked five times are exactly the ones the page makes.
"""
from __future__ import annotations

import functools
import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

from notebook_cells import code_cells, edited, run, source  # noqa: E402

TOK = "appendix_tokens"
STARTS = [450_000, 1_350_000, 2_250_000, 3_150_000, 3_550_000]


@functools.cache
def _appendix() -> tuple[list, dict]:
    """The appendix's code cells and the namespace after its imports and the corpus's statistics."""
    cells, namespace = code_cells(TOK), {"__name__": "__main__"}
    run(source(cells[0]), namespace)
    run(edited(cells, "train_text, val_text = shakespeare_splits()", []), namespace)
    run(edited(cells, "def bpe_by_hand", []), namespace)
    return cells, namespace


@pytest.mark.timing  # it also asserts the speed-up of keeping the pair counts up to date
@pytest.mark.parametrize("start", STARTS)
def test_claims_for_another_training_slice(start):
    cells, namespace = _appendix()
    ns = dict(namespace)
    ns["train_text"] = namespace["train_text"][start:]        # the page trains on its first 1,000,000
    assert len(ns["train_text"]) >= 1_000_000
    for phrase in ["def cpu_seconds", "TRAIN_CHARS = 1_000_000", "PASSAGES = {", "SIZES = [256, 512",
                   "assert bytes_per_token[256] == 1.0", "wordpiece = WordPiece.from_file"]:
        run(edited(cells, phrase, []), ns)
    assert len(ns["merges"]) == 4096 - 256
    assert ns["t_fast"] < ns["t_slow"] / 3, (ns["t_fast"], ns["t_slow"])
