"""The student copy: what an instructor hands out, with no solution, no hidden test and no judge.

``python -m transformer_lib.grading release --student DIR`` writes into ``DIR`` the book (its
chapters, guides and configuration), what installing needs (``requirements/``, ``pyproject.toml``,
the ``Makefile``, ``binder/``), the student exercise notebooks (released afresh from
``exercises/source/``) and the library without the chapters' judges (``grading/judges/chNN_*.py``;
the checks' kernel halves, the part a graded kernel runs, are copied whole). The instructor
notebooks and the judges stay behind, since a judge computes its own reference and so holds the
exercise's answer (a parameter-count formula, a decoding-batch rule).

In their place the copy's visible checks judge against **stored expected values**: at release
time each instructor notebook is run with its visible checks only (hidden-test regions removed),
as the grader runs it; every recorded call must pass the real judges, and then its inputs, the
instructor's outcomes and the ✓ line the judge printed are stored in
``transformer_lib/grading/released/expected.npz``, beside the released notebooks that the
``check`` command restores check cells from. Each stored output is compared with the tolerance
the real judge allows it, measured at release time by shifting the instructor's numbers until
the judge refuses them (:func:`tolerance`). A copy's check names the output that differs and the
student's value on the visible example, never the expected one (an exercise worked by hand would
show its answer); the misconception the real judge would name is in the grader's feedback.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import secrets
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .judges.common import JUDGES, Judge, show
from .prepare.notebook import check_cells, dumps, grade_id, is_check, read, release, strip_hidden, validate
from .prepare.submission import FOLDER, for_kernel, restore_checks
from .protocol import CheckFailed, Opaque, pack, typename, unpack
from .run.runner import allow_runs

REPO = FOLDER.parents[1]
RELEASED = FOLDER / "released"  # in a student copy: the released notebooks and expected.npz
EXPECTED = "expected.npz"
COPIED = ("README.md", "intro.md", "bibliography.md", "references.bib", "_config.yml", "_toc.yml", "Makefile",
          "pyproject.toml", "requirements.txt", "package.json", "package-lock.json", ".gitignore", "chapters",
          "guides", "requirements", "binder", "_ext", "_assets", "scripts/execute_book.py", "scripts/vendor_assets.py")
SKIPPED = ("__pycache__", "*.pyc", ".ipynb_checkpoints", "vendor")  # _assets/vendor: `make install` fetches it
REGISTER = '''"""The judges of a student copy: no chapter's judges, only the visible examples' expected values.

They are stored in ``transformer_lib/grading/released/``; importing this package registers, for
every check, a judge that compares with them (:func:`~transformer_lib.grading.student.register_stored`).
"""
from ..student import register_stored
from .common import JUDGES, judge_here, render, verdict

register_stored()

__all__ = ["JUDGES", "judge_here", "render", "verdict"]
'''  # the judges/__init__.py of a student copy
_REGISTERED: set[Path] = set()
_STEPS = [m * 10.0 ** -k for k in range(12, 0, -1) for m in (1, 2, 5)]  # the shifts tried, smallest first


class ReleaseError(RuntimeError):
    """An instructor notebook that cannot give the expected values (a check fails on its solution)."""


# ---------------------------------------------------------------- comparing with a stored outcome

def _numeric(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray, np.generic, float, int)) and not isinstance(value, bool)


def _array(value: Any) -> np.ndarray:
    return value.detach().double().numpy() if isinstance(value, torch.Tensor) else np.asarray(value, dtype=np.float64)


def _integral(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return not (value.is_floating_point() or value.is_complex())
    return np.asarray(value).dtype.kind in "biu"


def differs(got: Any, ref: Any, tol: float) -> str | None:
    """None if ``got`` matches the stored ``ref`` (numbers within ``tol``, absolute or relative to
    ``ref``, integers and everything else exactly), else what differs, in words."""
    if isinstance(ref, dict):
        if not isinstance(got, dict) or set(got) != set(ref):
            return f"expected a dict with the keys {sorted(ref)}, got {typename(got)}"
        return next((f"[{k!r}]: {d}" for k in ref if (d := differs(got[k], ref[k], tol))), None)
    if isinstance(ref, list):
        if not isinstance(got, list) or len(got) != len(ref):
            return f"expected {len(ref)} values, got {typename(got) if not isinstance(got, list) else len(got)}"
        return next((f"[{i}]: {d}" for i, (g, r) in enumerate(zip(got, ref)) if (d := differs(g, r, tol))), None)
    if _numeric(ref):
        if not _numeric(got) or isinstance(got, np.ndarray) and got.dtype.kind not in "biuf":
            return f"expected numbers, got {typename(got)}"
        g, r = _array(got), _array(ref)
        if g.shape != r.shape and not (g.size == r.size == 1):
            return f"the shape is {g.shape}, not {r.shape}"
        g = g.reshape(r.shape)
        exact = tol == 0 or _integral(ref)
        bad = ~(np.isclose(g, r, rtol=0 if exact else tol, atol=0 if exact else tol, equal_nan=True))
        if bad.any():
            whole = exact and np.all(np.isfinite(g)) and np.all(g == np.round(g))
            yours = np.array2string(g.astype(np.int64), separator=", ", threshold=40, edgeitems=3) if whole else show(g)
            if r.size == 1:
                return f"yours is {yours}"
            where = [tuple(int(i) for i in ix) for ix in np.argwhere(bad)[:4]] if r.ndim else []
            return (f"{int(bad.sum())} of {r.size} numbers differ" + (f" (at {where}{' …' if bad.sum() > 4 else ''})"
                                                                      if where else "") + f"; yours: {yours}")
        return None
    if isinstance(ref, bool):
        return None if type(got) in (bool, np.bool_) and bool(got) == bool(ref) else f"yours is {show_plain(got)}"
    if isinstance(ref, Opaque):
        return None if isinstance(got, Opaque) and got == ref else f"yours is {typename(got)}"
    return None if type(got) is type(ref) and got == ref else f"yours is {show_plain(got)}"


def show_plain(value: Any) -> str:
    """A value the check shows: its text if it is a plain Python value (capped), else its type."""
    return repr(value)[:200] if value is None or isinstance(value, (bool, str, int, float, list)) else typename(value)


def _shift(value: Any, eps: float) -> Any:
    """``value`` with ``eps`` added to every floating-point number in it."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value + eps
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value + eps
    if isinstance(value, float):
        return value + eps
    if isinstance(value, list):
        return [_shift(v, eps) for v in value]
    if isinstance(value, dict):
        return {k: _shift(v, eps) for k, v in value.items()}
    return value


def _accepts(spec: Judge, case: dict, out: dict) -> bool:
    try:
        spec.fn(case, out)
        return True
    except CheckFailed:
        return False
    except Exception:  # noqa: BLE001 - a judge that breaks on a shifted value refuses it
        return False


def tolerance(spec: Judge, case: dict, out: dict, key: str) -> float:
    """The largest shift of the numbers of ``out[key]`` (one of 1e-12 … 0.5, both signs) that the
    real judge still accepts on ``case``: 0 (exact) if it refuses the smallest or the output holds
    no floating-point number, -1 if it accepts any (the judge does not judge that output)."""
    if differs(_shift(out[key], 1.0), out[key], 0) is None:
        return 0.0
    if _accepts(spec, case, {**out, key: _shift(out[key], 1e3)}):
        return -1.0
    tol = 0.0
    for eps in _STEPS:
        if not all(_accepts(spec, case, {**out, key: _shift(out[key], s)}) for s in (eps, -eps)):
            break
        tol = eps
    return tol


# ---------------------------------------------------------------- the stored judges (in a copy)

def _stored_fn(name: str, calls: list[dict]):  # noqa: ANN202
    def judge_stored(case: dict, out: dict) -> None:
        what = case.get("what", name)
        for call in calls:
            for ref_case, ref_out, tols in zip(call["cases"], call["outs"], call["tols"]):
                if differs(case, ref_case, 0) is None:
                    for key, tol in tols.items():
                        found = differs(out.get(key), ref_out.get(key), tol) if tol >= 0 else None
                        if found:
                            raise CheckFailed(f"{what}: {key!r} differs from the expected value of this visible "
                                              f"example: {found}")
                    return
        raise CheckFailed(f"{what}: this student copy knows the expected values of the check cells' own examples "
                          "only, and this call has other inputs")
    return judge_stored


def _stored_ok(calls: list[dict]):  # noqa: ANN202
    def ok(cases: list[dict], outs: list[dict]) -> str:
        for call in calls:
            if len(call["cases"]) == len(cases) and all(differs(c, r, 0) is None for c, r in zip(cases, call["cases"])):
                return call["ok"]
        return "passed"
    return ok


def register_stored(folder: Path = RELEASED) -> None:
    """Register, for every check of the stored expected values, a judge that compares with them."""
    path = folder / EXPECTED
    if not path.is_file() or path in _REGISTERED:  # every chapter's module asks; the file is read once
        return
    _REGISTERED.add(path)
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    for name, spec in json.loads(bytes(arrays.pop("__meta__")).decode()).items():
        calls = [{"cases": unpack(c["cases"], arrays), "outs": unpack(c["outs"], arrays), "tols": c["tols"],
                  "ok": c["ok"]} for c in spec["calls"]]
        JUDGES[name] = Judge(name, _stored_fn(name, calls), ok=_stored_ok(calls), bans=tuple(spec["bans"]))


def in_copy() -> bool:
    """True in a student copy (the library has stored expected values, not the judges)."""
    return (RELEASED / EXPECTED).is_file()


# ---------------------------------------------------------------- computing them (instructor side)

def visible_run(path: Path, cell_timeout: float, timeout: float) -> dict[str, list]:
    """The visible check calls of instructor notebook ``path`` run as the grader runs it (its
    hidden-test regions removed), each checked by the real judges: ``{check name: [stored call]}``."""
    from . import judges  # noqa: F401 - registers the judges
    from .judges.verdicts import judge_calls
    from .run.procs import kill_tagged
    from .run.runner import run_notebook  # noqa: PLC0415

    nb = read(path)
    validate(nb)
    for cell in nb.cells:
        if is_check(cell):
            cell.source = strip_hidden(cell.source)
    prefix = f"release-{secrets.token_hex(8)}-"
    try:
        run = run_notebook(for_kernel(restore_checks(nb, nb)[0]), cell_timeout, timeout, token_prefix=prefix)
    finally:
        kill_tagged(prefix, prefix=True)
    events = {e["grade_id"]: e for e in run.cells if e["grade_id"]}
    found: dict[str, list] = {}
    for _, cell in check_cells(nb):
        gid = grade_id(cell)
        event, calls = events.get(gid), run.records.get(gid, [])
        why = (run.worker_error or "it did not run" if event is None else
               f"{event['ename']}: {event['evalue'][:300]}" if event["status"] != "ok" else
               judge_calls(calls, calls, compare=False))
        if why:
            raise ReleaseError(f"{path.name}: check {gid!r} fails on the instructor notebook: {why}")
        for call in calls:
            spec = JUDGES[call.check]
            tols = [{key: tolerance(spec, case, out, key) for key in out} for case, out in zip(call.cases, call.outs)]
            ok = spec.ok(call.cases, call.outs) if callable(spec.ok) else spec.ok
            found.setdefault(call.check, []).append({"cases": call.cases, "outs": call.outs, "tols": tols, "ok": ok})
    return found


def write_expected(path: Path, found: dict[str, list]) -> None:
    """Store the visible calls (and each check's bans) as one ``.npz``: arrays, and JSON in ``__meta__``."""
    arrays: dict[str, np.ndarray] = {}
    meta = {name: {"bans": list(JUDGES[name].bans),
                   "calls": [{"cases": pack(c["cases"], arrays), "outs": pack(c["outs"], arrays), "tols": c["tols"],
                              "ok": c["ok"]} for c in calls]} for name, calls in sorted(found.items())}
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez_compressed(path, **arrays)


def _copy(src: Path, dest: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*SKIPPED), dirs_exist_ok=True)
    elif src.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)


def write_copy(dest: Path | str, repo: Path = REPO, jobs: int = 2, cell_timeout: float = 120.0,
               timeout: float = 900.0) -> list[Path]:
    """Write the student copy of the course at ``repo`` into ``dest`` (which must not exist or be
    empty); return the exercise notebooks written. Raises ReleaseError if a check fails on an
    instructor notebook, :class:`~transformer_lib.grading.prepare.notebook.MarkerError` if one is
    malformed."""
    dest, sources = Path(dest), sorted((repo / "exercises" / "source").glob("*.ipynb"))
    if not sources:
        raise ReleaseError(f"no instructor notebooks in {repo / 'exercises' / 'source'}: make the student copy from "
                           "the course repository")
    if dest.exists() and any(dest.iterdir()):
        raise ReleaseError(f"{dest} is not empty: give a new folder for the student copy")
    released = {src.name: dumps(release(read(src))) for src in sources}  # refuses a malformed notebook first
    allow_runs()
    with cf.ThreadPoolExecutor(max(1, jobs)) as pool:
        found: dict[str, list] = {}
        for part in pool.map(lambda src: visible_run(src, cell_timeout, timeout), sources):
            found.update(part)
    for name in COPIED:
        _copy(repo / name, dest / name)
    _copy(repo / "transformer_lib", dest / "transformer_lib")
    for module in (dest / "transformer_lib" / "grading" / "judges").glob("ch[0-9]*.py"):
        module.unlink()  # a judge computes its own reference: it holds the exercise's answer
    (dest / "transformer_lib" / "grading" / "judges" / "__init__.py").write_text(REGISTER, encoding="utf-8")
    folder = dest / "transformer_lib" / "grading" / "released"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in released.items():
        for where in (dest / "exercises" / name, folder / name):
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_text(text, encoding="utf-8")
        written.append(dest / "exercises" / name)
    write_expected(folder / EXPECTED, found)
    return written
