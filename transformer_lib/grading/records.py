"""Results the checks record, loaded safely and compared outside the student's kernel.

Files come from a process the student controls, so they are treated as hostile: only
uncompressed-size-checked ``.npz`` archives of plain numeric arrays are read, always with
``allow_pickle=False``; anything else is ignored (and then shows up as a mismatch).
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

MAX_ARRAY_BYTES = 20_000_000
TOLERANCE_KEY = "__tolerance__"

Records = dict[str, dict[str, np.ndarray]]  # file stem -> array name -> array


def load_records(folder: Path) -> Records:
    """The records in ``folder`` (``{stem: {name: array}}``); unreadable files are skipped."""
    out: Records = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.npz")):
        if not path.is_file() or path.is_symlink():  # never a link, a FIFO or a device the kernel made
            continue
        try:
            with zipfile.ZipFile(path) as zf:
                if sum(info.file_size for info in zf.infolist()) > MAX_ARRAY_BYTES:
                    continue
            with np.load(path, allow_pickle=False) as data:
                arrays = {key: data[key] for key in data.files}
        except Exception:  # a corrupt or hostile file: treat as absent
            continue
        if all(a.dtype.kind in "biuf" for a in arrays.values()):
            out[path.stem] = arrays
    return out


def compare(student: Records, reference: Records) -> str | None:
    """None if the student's records match the reference, else the reason.

    Tolerance per entry: ``2·(atol + rtol·|reference|)`` with ``(atol, rtol)`` taken from the
    reference's own ``__tolerance__`` entry (never from the student's files).
    """
    if set(student) != set(reference):
        missing = sorted(set(reference) - set(student))
        extra = sorted(set(student) - set(reference))
        return f"recorded results differ in kind (missing {missing}, unexpected {extra})"
    for stem, ref_arrays in reference.items():
        got_arrays = student[stem]
        atol, rtol = (ref_arrays.get(TOLERANCE_KEY, np.zeros(2)).tolist() + [0.0, 0.0])[:2]
        names = set(ref_arrays) - {TOLERANCE_KEY}
        if names != set(got_arrays) - {TOLERANCE_KEY}:
            return f"{stem}: recorded arrays differ ({sorted(names)} expected)"
        for name in sorted(names):
            ref = ref_arrays[name].astype(np.float64)
            got = got_arrays[name].astype(np.float64)
            if got.shape != ref.shape:
                return f"{stem}/{name}: shape {got.shape} instead of {ref.shape}"
            if not np.all(np.abs(got - ref) <= 2 * (atol + rtol * np.abs(ref))):
                return f"{stem}/{name}: values differ from the instructor's results"
    return None
