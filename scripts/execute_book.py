"""Execute the book's notebooks side by side into the execution cache, before the book is built.

`jupyter-book build` (myst-nb, `execute_notebooks: cache`) executes every notebook whose code
is not in `_build/.jupyter_cache` yet, one after the other. This script runs first (`make book`,
and the tests' builds): it adds the notebooks of `_toc.yml` that the book executes to the same
cache and executes those not cached yet with jupyter-cache's `local-parallel` executor, one
process per core, each in its notebook's folder, as myst-nb would. The build then finds every
notebook in the cache. A notebook that fails here is left to the build, which executes it again
and reports the error.

    python scripts/execute_book.py [--cache _build/.jupyter_cache] [--timeout 120]
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def notebooks(repo: Path = REPO) -> list[Path]:
    """The notebooks of `_toc.yml` the book executes (the exercise pages are shown unexecuted)."""
    files = re.findall(r"^\s*-?\s*file:\s*([^\s#]+)", (repo / "_toc.yml").read_text(), flags=re.M)
    return [repo / f"{f}.ipynb" for f in files if not f.startswith("exercises/") and (repo / f"{f}.ipynb").exists()]


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--cache", type=Path, default=REPO / "_build" / ".jupyter_cache")
    args.add_argument("--timeout", type=int, default=120, help="seconds per cell (as _config.yml)")
    opts = args.parse_args(argv)
    from jupyter_cache import get_cache
    from jupyter_cache.executors import load_executor

    cache = get_cache(opts.cache)
    records = [cache.add_nb_to_project(str(path)) for path in notebooks()]
    stale = [r.pk for r in records if cache.get_cached_project_nb(r.pk) is None]
    if not stale:
        return 0
    start = time.perf_counter()
    result = load_executor("local-parallel", cache=cache).run_and_cache(filter_pks=stale, timeout=opts.timeout)
    print(f"executed {len(result.succeeded)} notebook(s) side by side in {time.perf_counter() - start:.0f} s"
          + (f"; {len(result.errored)} left to the build, which reports their errors" if result.errored else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
