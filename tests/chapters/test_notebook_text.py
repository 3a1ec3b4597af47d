"""The text of every notebook, checked without building the book: markdown cells, figure captions
and alt texts hold no control character but the newline (a "\\t" typed into a JSON string becomes
a TAB, and "\\times" then shows as "<TAB>imes"), and every glue role is closed (an unclosed
`{glue:text}` role is printed literally on the page, without a warning)."""
from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest

from repo_paths import REPO, tracked_files

NOTEBOOKS = tracked_files("*.ipynb")


def texts(path: Path) -> list[tuple[str, str]]:
    """(where, text) for each markdown cell, figure caption and alt text of a notebook."""
    found = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            found.append((f"cell {i} (markdown)", source))
        mystnb = cell.get("metadata", {}).get("mystnb", {})
        if "caption" in mystnb.get("figure", {}):
            found.append((f"cell {i} (caption)", mystnb["figure"]["caption"]))
        if "alt" in mystnb.get("image", {}):
            found.append((f"cell {i} (alt text)", mystnb["image"]["alt"]))
    return found


def control_characters(text: str) -> list[str]:
    """The control characters of ``text`` other than the newline, each with what precedes it."""
    return [f"{ch!r} after {text[max(0, i - 20):i]!r}" for i, ch in enumerate(text)
            if unicodedata.category(ch) == "Cc" and ch != "\n"]


# a glue role's content is a key, optionally ':' and a format spec, and nothing else
_GLUE = re.compile(r"\{glue(?::\w+)?\}`([^`]*)`?")
_GLUE_CONTENT = re.compile(r"[\w.-]+(?::[^\s`]*)?")


def unclosed_glue(text: str) -> list[str]:
    """Glue roles of ``text`` whose content is not `key` or `key:format` (an unclosed backtick)."""
    return [m.group(0)[:60] for m in _GLUE.finditer(text) if not _GLUE_CONTENT.fullmatch(m.group(1))]


def test_the_detectors_find_the_two_known_defects():
    assert control_characters("two $n \times n$ matrices") == ["'\\t' after 'two $n '"]
    assert control_characters("line one\nline two") == []
    broken = ("{glue:text}`wall_ratio:.0f} times less, and the gap\n"
              "doubles with every {glue:text}`wall_n_max`")
    assert unclosed_glue(broken) == [broken[:60]]
    assert unclosed_glue("{glue:text}`wall_ratio:.0f` times less, {glue}`n` and {glue:md}`t`") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_markdown_captions_and_alt_texts_have_no_control_characters(path):
    bad = {where: found for where, text in texts(path) if (found := control_characters(text))}
    assert not bad, f"{path.relative_to(REPO)}: control characters {bad}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_glue_role_is_closed(path):
    bad = {where: found for where, text in texts(path) if (found := unclosed_glue(text))}
    assert not bad, f"{path.relative_to(REPO)}: unclosed glue roles {bad}"
