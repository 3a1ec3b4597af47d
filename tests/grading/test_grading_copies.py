"""Exercises are transfers of their chapter's idea, not its cells retyped.

For every solution region of ``exercises/source/``, its code lines (blank lines, comments and lines
under 20 characters left out; whitespace collapsed) are compared with the code lines of its
chapter's cells and with the course library's source: the test fails for a solution of which half
or more of the lines appear in the chapter, or in the library. The exercises rewritten as transfers
(``TRANSFERS``) may share no line at all with the chapter or with the library's source. It reads
files only, so it costs well under a second.
"""
from __future__ import annotations

import functools
import io
import re
import tokenize

import pytest

from repo_paths import REPO
from transformer_lib.grading.prepare.notebook import BEGIN_SOLUTION, END_SOLUTION, grade_id, is_solution, read, regions

SOURCES = sorted((REPO / "exercises" / "source").glob("*.ipynb"))
MIN_LENGTH = 20  # shorter lines (`return x`, `H = X @ W1 + b1`) say too little to count as copied


def _without_comments(source: str) -> str:
    """``source`` with its comments removed (by Python's tokenizer; a cell it cannot read, for example
    one with IPython magics it trips over, keeps its text up to each line's ``#``)."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type != tokenize.COMMENT]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return "\n".join(line.split("#")[0] for line in source.splitlines())


def code_lines(source: str) -> list[str]:
    """The lines that count: comments and blank lines removed, whitespace collapsed, at least
    ``MIN_LENGTH`` characters long."""
    lines = (" ".join(line.split()) for line in _without_comments(source).splitlines())
    return [line for line in lines if len(line) >= MIN_LENGTH]


def solutions(nb) -> dict[str, list[str]]:
    """``{grade_id#k: code lines}`` of every solution region of an instructor notebook."""
    found = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or not is_solution(cell):
            continue
        lines = cell.source.splitlines()
        for k, (begin, end) in enumerate(regions(cell.source, BEGIN_SOLUTION, END_SOLUTION, grade_id(cell))):
            found[f"{grade_id(cell)}#{k}"] = code_lines("\n".join(lines[begin + 1:end]))
    return found


def chapter_lines(stem: str) -> set[str]:
    nb = read(REPO / "chapters" / f"{stem}.ipynb")
    return {line for cell in nb.cells if cell.cell_type == "code"
            for line in code_lines(re.sub(r"^\s*[%!].*$", "", cell.source, flags=re.M))}


@functools.cache
def library_lines() -> frozenset[str]:
    """The code lines of the course library's source, the checks' judges included (a student can read them)."""
    return frozenset(line for path in (REPO / "transformer_lib").rglob("*.py") for line in code_lines(path.read_text()))


def copied(stem: str, seen: frozenset[str] | None = None) -> dict[str, list[str]]:
    """``{solution: its lines found in the chapter}`` (or in ``seen``) for the solutions of which half or more are."""
    seen = chapter_lines(stem) if seen is None else seen
    found = {}
    for name, lines in solutions(read(REPO / "exercises" / "source" / f"{stem}.ipynb")).items():
        hits = [line for line in lines if line in seen]
        if lines and 2 * len(hits) >= len(lines):
            found[name] = hits
    return found


# The exercises rewritten as transfers: not one of their solution lines appears in the chapter or the library.
TRANSFERS = {"05_multi_head_attention": ["gqa_counts#1"], "07_causal_masking": ["find_head#0"],
             "appendix_tokens": ["merge_step#0", "pair_changes#0"],
             "appendix_beyond_words": ["cross_section_attention#0", "vit_tokens#0", "sliding_window#0",
                                       "causal_linear_attention#0"]}
# Solutions known to retype the library, each to be rewritten as a transfer (then taken off this list).
LIBRARY_COPIES = {"02_building_up_attention": {
    "attention#0": "Exercise 2.3 is transformer_lib.attention.scaled_dot_product_attention's body"}}


@pytest.mark.parametrize("stem", sorted(TRANSFERS))
def test_a_transfer_shares_no_line_with_its_chapter_or_the_library(stem):
    found = solutions(read(REPO / "exercises" / "source" / f"{stem}.ipynb"))
    seen = chapter_lines(stem) | library_lines()
    for name in TRANSFERS[stem]:
        assert found[name] and [line for line in found[name] if line in seen] == [], name


@pytest.mark.parametrize("stem", [p.stem for p in SOURCES])
def test_no_solution_copies_its_chapter(stem):
    assert copied(stem) == {}, f"solutions with half or more of their lines in chapters/{stem}.ipynb"
    assert set(copied(stem, library_lines())) == set(LIBRARY_COPIES.get(stem, {})), \
        "solutions with half or more of their lines in transformer_lib/"


def test_the_copy_test_catches_a_copy():
    """A solution pasted from the chapter is caught; the same idea in other lines is not."""
    chapter = chapter_lines("05_multi_head_attention")
    pasted = code_lines("*lead, h, n, d_k = x.shape\nreturn x.transpose(-3, -2).reshape(*lead, n, h * d_k)  # merge")
    assert pasted and all(line in chapter for line in pasted)
    own = code_lines("heads = [x[..., i, :, :] for i in range(x.shape[-3])]\nreturn torch.cat(heads, dim=-1)")
    assert own and not any(line in chapter for line in own)
    assert code_lines("# a comment that is long enough\n\nshort = 1\n") == []
