"""Chapter 6's check cells can fail: each is run again with one line broken and must raise.

The chapter's code cells up to the ALiBi check run once, in-process (plots go to Agg, IPython
magics are dropped, the training of the extrapolation experiment is not reached); each case then
runs its edited cell in a copy of that namespace. The extrapolation claims are tested over five
seeds in test_positional_claims.py."""
from __future__ import annotations

import contextlib
import io
import os

import nbformat
import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from repo_paths import REPO  # noqa: E402

STEM = "06_positional_information"
LAST = "def my_slopes(H)"


def _run(source: str, namespace: dict) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(source, "<cell>", "exec"), namespace)


@pytest.fixture(scope="module")
def chapter() -> tuple[list[str], dict]:
    import matplotlib.pyplot as plt
    nb = nbformat.read(REPO / "chapters" / f"{STEM}.ipynb", as_version=4)
    cells = ["\n".join(line for line in c.source.splitlines() if not line.startswith("%"))
             for c in nb.cells if c.cell_type == "code"]
    namespace: dict = {"__name__": "__main__"}
    for source in cells[: _find(cells, LAST) + 1]:
        _run(source, namespace)
    plt.close("all")
    return cells, namespace


def _find(cells: list[str], phrase: str) -> int:
    found = [i for i, source in enumerate(cells) if phrase in source]
    assert len(found) == 1, f"{phrase!r} is in {len(found)} cells"
    return found[0]


BROKEN = {  # name: (cell phrase, line, broken line)
    "symmetry: positions permuted with the tokens": (
        "perm = [0, 5, 2, 3, 4, 1]", "layer(embed(swapped) + pe)", "layer(embed(swapped) + pe[perm])"),
    "sinusoidal: sin and cos swapped": (
        "def my_sinusoidal", "P[:, 0::2] = torch.sin(i * omega)", "P[:, 0::2] = torch.cos(i * omega)"),
    "sinusoidal: exponent k/d": (
        "def my_sinusoidal", "torch.arange(0, d, 2, dtype=torch.float64) / d",
        "torch.arange(0, d // 2, dtype=torch.float64) / d"),
    "rotation: the transposed rotation": (
        "d_rot, base = 16", "R = torch.tensor([[c, s], [-s, c]]", "R = torch.tensor([[c, -s], [s, c]]"),
    "rope: rotation the wrong way": (
        "def my_rope_interleaved", "torch.cat([-x2, x1], dim=-1)", "torch.cat([x2, -x1], dim=-1)"),
    "rope: the closed form with m − n": (
        "def closed_form_score", "closed_form_score(n - m)", "closed_form_score(m - n)"),
    "rope layer: positions stretched, not shifted": (
        "LlamaRotaryEmbedding(cfg)", "torch.arange(10) + 1000", "torch.arange(10) * 2"),
    "alibi: signed distance instead of |i − j|": (
        "def my_slopes(H)", "(i_a - j_a).abs()", "(i_a - j_a)"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_on_a_broken_line(chapter, name):
    phrase, old, new = BROKEN[name]
    cells, namespace = chapter
    source = cells[_find(cells, phrase)]
    assert source.count(old) == 1, f"{old!r} is not once in the cell"
    with pytest.raises(AssertionError):
        _run(source.replace(old, new), dict(namespace))


@pytest.mark.parametrize("phrase", sorted({phrase for phrase, _, _ in BROKEN.values()}))
def test_check_passes_unbroken(chapter, phrase):
    cells, namespace = chapter
    _run(cells[_find(cells, phrase)], dict(namespace))
