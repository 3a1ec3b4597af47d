"""Copy the committed sweep's losses from `chapters/data/scaling_sweep.csv` into the two places that
hold them as data, since a graded kernel cannot read the repository:

- `_COMMITTED` in `transformer_lib/grading/checks/ch12_scaling.py`, the checks' copy;
- `LOSSES` in the setup cell of `exercises/source/appendix_scaling.ipynb`, the exercise's.

Each becomes ``{budget: {width: (loss of seed 0, seed 1, …)}}``, six decimals, in the CSV's order.
`make scaling` runs this after the sweep, then `python -m transformer_lib.grading release`, which
writes the student copy (`exercises/appendix_scaling.ipynb`) from the instructor's.
(tests/grading/test_checks_ch12.py checks that the copies are the CSV's.)

    python scripts/sweep_tables.py [--check]   (--check: change nothing, exit 1 if a copy is out of date)
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from transformer_lib.scaling import read_sweep

REPO = Path(__file__).resolve().parents[1]
CHECKS = Path("transformer_lib/grading/checks/ch12_scaling.py")
EXERCISE = Path("exercises/source/appendix_scaling.ipynb")
WIDTH = 100  # the longest line written, indent included (the checks module's limit is 120)
# A top-level or indented `NAME = {` ... `}` block; group 4 is its body.
BLOCK = re.compile(r"(\n(?P<indent>[ ]*)(?P<name>_COMMITTED|LOSSES) = \{\n)(.*?)(\n(?P=indent)\}\n)", re.S)


def table(csv_path: Path) -> dict[float, dict[int, list[float]]]:
    """``{budget: {width: [loss of seed 0, 1, …]}}`` of a sweep's CSV, in the file's order."""
    _, sweep = read_sweep(csv_path)
    out: dict[float, dict[int, dict[int, float]]] = {}
    for c, d, seed, loss in zip(sweep["budget"], sweep["d_model"], sweep["seed"], sweep["val_loss"]):
        out.setdefault(float(c), {}).setdefault(int(d), {})[int(seed)] = float(loss)
    return {c: {d: [seeds[s] for s in sorted(seeds)] for d, seeds in widths.items()} for c, widths in out.items()}


def _budget(c: float) -> str:
    """A budget as the copies write it: 4e10, 1.25e11."""
    mantissa, exponent = f"{c:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def body(losses: dict[float, dict[int, list[float]]], indent: str) -> str:
    """The lines between ``NAME = {`` and ``}``: one budget per entry, wrapped at :data:`WIDTH`."""
    lines = []
    for c, widths in losses.items():
        items = [f"{d}: ({', '.join(f'{x:.6f}' for x in seeds)}{',' if len(seeds) == 1 else ''})"
                 for d, seeds in widths.items()]
        head = f"{indent}    {_budget(c)}: {{"
        line = head
        for i, item in enumerate(items):
            piece = item + (", " if i < len(items) - 1 else "},")
            if len(line) + len(piece.rstrip()) > WIDTH and line != head:
                lines.append(line.rstrip())
                line = " " * len(head) + piece
            else:
                line += piece
        lines.append(line)
    return "\n".join(lines)


def rewritten(text: str, losses: dict[float, dict[int, list[float]]]) -> str:
    """``text`` with its one ``_COMMITTED``/``LOSSES`` block's body replaced by ``losses``."""
    found = list(BLOCK.finditer("\n" + text))
    if len(found) != 1:
        raise ValueError(f"text: expected one _COMMITTED or LOSSES block, found {len(found)}")
    m, padded = found[0], "\n" + text
    return (padded[:m.start(4)] + body(losses, m["indent"]) + padded[m.end(4):])[1:]


def updated(repo: Path = REPO, csv_path: Path | None = None) -> dict[Path, str]:
    """``{path: new text}`` of the copies whose text differs from what the CSV gives."""
    losses = table(csv_path or repo / "chapters" / "data" / "scaling_sweep.csv")
    checks = repo / CHECKS
    text = checks.read_text(encoding="utf-8")
    new_text = rewritten(text, losses)
    out = {checks: new_text} if new_text != text else {}
    notebook = repo / EXERCISE
    text = notebook.read_text(encoding="utf-8")
    nb = json.loads(text)
    cells = [c for c in nb["cells"] if BLOCK.search("\n" + "".join(c["source"]))]
    if len(cells) != 1:
        raise ValueError(f"{EXERCISE}: expected one cell with a LOSSES block, found {len(cells)}")
    new = rewritten("".join(cells[0]["source"]), losses).split("\n")
    cells[0]["source"] = [line + "\n" for line in new[:-1]] + ([new[-1]] if new[-1] else [])
    new_text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new_text != text:
        out[notebook] = new_text
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a copy is out of date")
    args = parser.parse_args(argv)
    changes = updated()
    for path, text in changes.items():
        print(f"{'out of date' if args.check else 'rewrote'}: {path.relative_to(REPO)}")
        if not args.check:
            path.write_text(text, encoding="utf-8")
    if not changes:
        print("the copies are the CSV's")
    return 1 if args.check and changes else 0


if __name__ == "__main__":
    sys.exit(main())
