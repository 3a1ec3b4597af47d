"""Execute the book's notebooks side by side into the execution cache, before the book is built.

`jupyter-book build` (myst-nb, `execute_notebooks: cache`) executes every notebook whose code
is not in `_build/.jupyter_cache` yet, one after the other. This script runs first (`make book`,
and the tests' builds): it adds the notebooks of `_toc.yml` that the book executes to the same
cache and executes those not cached yet, one process per core, each in its notebook's folder, as
myst-nb would, printing one line per notebook and a summary. The build then finds every notebook
in the cache. A notebook that fails here is left to the build, which executes it again and
reports the error.

jupyter-cache keys a notebook on its code alone, so outputs computed with an older
`transformer_lib` would be reused after the library changed. Beside the cache this script keeps
a hash of the library's files and of the pinned requirements (`library.sha256`); when they differ,
every cached notebook is dropped and executed again.

The kernels are started with CurveZMQ transport encryption when pyzmq has it (as the kernel
specification of ipykernel allows), so that they do not warn about plain-text TCP.

    python scripts/execute_book.py [--root .] [--cache _build/.jupyter_cache] [--timeout 120]
"""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAMP = "library.sha256"  # beside the cache's own files
HASHED = ("transformer_lib", "requirements")  # what a cached output depends on besides its notebook


def notebooks(repo: Path = REPO) -> list[Path]:
    """The notebooks of `_toc.yml` the book executes (the exercise pages are shown unexecuted)."""
    files = re.findall(r"^\s*-?\s*file:\s*([^\s#]+)", (repo / "_toc.yml").read_text(), flags=re.M)
    return [repo / f"{f}.ipynb" for f in files if not f.startswith("exercises/") and (repo / f"{f}.ipynb").exists()]


def library_hash(repo: Path = REPO) -> str:
    """sha256 over the path and bytes of every file under `transformer_lib/` and `requirements/`
    (caches such as `__pycache__` left out), in path order."""
    digest = hashlib.sha256()
    for folder in HASHED:
        for path in sorted((repo / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                digest.update(path.relative_to(repo).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def drop_if_stale(cache, folder: Path, digest: str) -> bool:
    """Remove every executed notebook from ``cache`` (a jupyter-cache in ``folder``) if they were
    executed with another library than the one hashed to ``digest``; record ``digest``. True if
    notebooks were dropped."""
    stamp = folder / STAMP
    stale = bool(cache.list_cache_records()) and (not stamp.exists() or stamp.read_text().strip() != digest)
    if stale:
        cache.clear_cache()
    folder.mkdir(parents=True, exist_ok=True)
    stamp.write_text(digest + "\n")
    return stale


def kernel_config():
    """The kernels' configuration: CurveZMQ encryption of their sockets where pyzmq supports it."""
    import zmq
    from traitlets.config import Config

    return Config({"KernelManager": {"transport_encryption": "auto"}}) if zmq.has("curve") else Config()


def execute(job: tuple[int, str, str, int]) -> tuple[str, bool, float, str]:
    """Execute one notebook of the cache (a worker process): ``job`` is (pk, uri, cache folder,
    timeout per cell); return (uri, succeeded, seconds, the error's first line)."""
    from jupyter_cache import get_cache
    from jupyter_cache.cache.db import NbProjectRecord
    from jupyter_cache.executors.utils import create_cache_bundle, single_nb_execution

    pk, uri, folder, timeout = job
    cache = get_cache(folder)
    start = time.perf_counter()
    try:
        project_nb = cache.get_project_notebook(pk)
        result = single_nb_execution(project_nb.nb, cwd=str(Path(uri).parent), timeout=timeout,
                                     allow_errors=False, config=kernel_config())
    except Exception as err:  # noqa: BLE001 - a dead kernel or a missing kernel: left to the build
        return uri, False, time.perf_counter() - start, f"{type(err).__name__}: {err}".splitlines()[0]
    if result.err is not None:
        NbProjectRecord.set_traceback(uri, result.exc_string, cache.db)
        lines = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(result.err)).splitlines() if ln.strip()]
        return uri, False, result.time, (lines[-1] if lines else type(result.err).__name__)
    cache.cache_notebook_bundle(create_cache_bundle(project_nb, result.cwd, None, result.time, result.exc_string),
                                check_validity=False, overwrite=True)
    return uri, True, result.time, ""


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--root", type=Path, default=REPO, help="the book's folder (with _toc.yml)")
    args.add_argument("--cache", type=Path, help="the execution cache (default: ROOT/_build/.jupyter_cache)")
    args.add_argument("--timeout", type=int, default=120, help="seconds per cell (as _config.yml)")
    opts = args.parse_args(argv)
    root = opts.root.resolve()
    folder = (opts.cache or root / "_build" / ".jupyter_cache").resolve()
    from jupyter_cache import get_cache

    cache = get_cache(folder)
    if drop_if_stale(cache, folder, library_hash(root)):
        print("transformer_lib or the pinned requirements changed since the notebooks were executed: "
              "executing every notebook again")
    records = [cache.add_nb_to_project(str(path)) for path in notebooks(root)]
    stale = [r for r in records if cache.get_cached_project_nb(r.pk) is None]
    if not stale:
        print(f"all {len(records)} notebooks are in the execution cache, executed with this library")
        return 0
    processes = max(1, min(os.cpu_count() or 1, len(stale)))
    print(f"executing {len(stale)} of {len(records)} notebooks, {processes} at a time:", flush=True)
    start, failed = time.perf_counter(), []
    jobs = [(r.pk, r.uri, str(folder), opts.timeout) for r in stale]
    with multiprocessing.Pool(processes) as pool:
        for uri, ok, seconds, error in pool.imap_unordered(execute, jobs):
            name = Path(uri).relative_to(root).as_posix() if Path(uri).is_relative_to(root) else uri
            print(f"  {'ok' if ok else 'FAILED':<6} {seconds:5.1f} s  {name}" + (f"  ({error})" if error else ""),
                  flush=True)
            if not ok:
                failed.append(name)
    print(f"executed {len(stale) - len(failed)} of {len(stale)} notebooks in {time.perf_counter() - start:.0f} s"
          + (f"; {len(failed)} failed: the build executes {'it' if len(failed) == 1 else 'them'} again and shows "
             "the error" if failed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
