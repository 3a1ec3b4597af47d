"""Text a submission chose, made safe to show: the one place the reports escape it.

A submission controls some of the text in the reports: the lines of its code the grader refuses,
its cells' labels, what its kernel left in a log. :func:`cap` bounds it (one line, no control
characters, at most ``limit`` characters); :func:`markdown` also makes every character that
Markdown or HTML would read literal (``class_report.md``, ``feedback.md``); :func:`csv_field`
keeps a spreadsheet from reading it as a formula (``grades.csv``, ``class_report.csv``).
``results.json`` declares its text plain (``output_format: text``), so it is only capped.
"""
from __future__ import annotations

import re

__all__ = ["cap", "markdown", "csv_field"]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_MARKDOWN = re.compile(r"([\\`*\[\]<>|~&!])")  # what starts code, emphasis, links, images, HTML, tables


def cap(text: str, limit: int = 300, lines: bool = False) -> str:
    """``text`` without control characters (and, unless ``lines``, on one line), at most ``limit``
    characters (cut with " …")."""
    text = _CONTROL.sub(" ", str(text))
    if not lines:
        text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(0, limit - 2)] + " …"


def markdown(text: str, limit: int = 300) -> str:
    """``text`` capped, each Markdown or HTML special character escaped with a backslash (shown as it is)."""
    return _MARKDOWN.sub(r"\\\1", cap(text, limit))


def csv_field(text: str, limit: int = 2000) -> str:
    """``text`` capped, with a quote in front if a spreadsheet would read it as a formula."""
    text = cap(text, limit)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text
