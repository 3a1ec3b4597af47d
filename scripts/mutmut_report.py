"""Summarise a mutmut run of transformer_lib: kill rate per module and unexplained survivors.

Reads the results mutmut left in ``mutants/transformer_lib/*.py.meta`` and the list of
equivalent mutants in ``scripts/mutmut_equivalent.md`` (lines ``- `NAME`: reason``). Prints,
for each module with checked mutants, how many were killed (by a failing test or a timeout),
how many survived as equivalent, how many survived unexplained and how many are not run yet
(an interrupted run resumes where it stopped), then every unexplained survivor with the
command that shows its diff. Exits 1 if there is one.

    python scripts/mutmut_report.py              # every module mutmut has results for
    python scripts/mutmut_report.py attention    # one module
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "mutants" / "transformer_lib"
EQUIVALENT = REPO / "scripts" / "mutmut_equivalent.md"

KILLED = {1, 3, 36, 37, 24, -24, 152, 255}  # a test failed, timed out, or the type check caught it
SURVIVED = {0}
NOT_RUN = {None, 5, 33, 34}  # not checked yet, no test reaches the function, skipped


def equivalent_names() -> dict[str, str]:
    """Mutant name -> the reason it cannot change behaviour."""
    pattern = re.compile(r"^- `([\w.]+)`:\s*(.+)$")
    return {m[1]: m[2] for line in EQUIVALENT.read_text().splitlines() if (m := pattern.match(line))}


def main(argv: list[str]) -> int:
    if not RESULTS.is_dir():
        raise SystemExit("no mutmut results: run `make mutants` (or `mutmut run`) first")
    wanted = set(argv)
    equivalent = equivalent_names()
    unexplained: list[str] = []
    print(f"{'module':12s} {'killed':>7s} {'equiv.':>7s} {'survived':>9s} {'no test':>8s} {'not run':>8s} "
          f"{'kill rate':>10s}")
    for meta in sorted(RESULTS.rglob("*.py.meta")):
        module = meta.name.removesuffix(".py.meta")
        if wanted and module not in wanted:
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        count: Counter[str] = Counter()
        for name, code in codes.items():
            if code in KILLED:
                count["killed"] += 1
            elif code in SURVIVED and name in equivalent:
                count["equivalent"] += 1
            elif code in SURVIVED:
                count["survived"] += 1
                unexplained.append(name)
            elif code in NOT_RUN:
                count["no test" if code in (5, 33) else "not run"] += 1
            else:
                count["survived"] += 1  # suspicious, segfault: read them
                unexplained.append(name)
        checked = count["killed"] + count["equivalent"] + count["survived"]
        if not checked:
            continue
        rate = count["killed"] / max(1, checked - count["equivalent"])  # equivalent ones left out
        print(f"{module:12s} {count['killed']:7d} {count['equivalent']:7d} {count['survived']:9d} "
              f"{count['no test']:8d} {count['not run']:8d} {100 * rate:9.1f}%")
    for name in unexplained:
        print(f"  unexplained survivor: {name}   (mutmut show {name})")
    if unexplained:
        print(f"{len(unexplained)} survivor(s) need a test that kills them, or an entry in "
              f"{EQUIVALENT.relative_to(REPO)} saying why none can")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
