"""The records a check call leaves under grading, read back in the grader's process.

A record is one ``NNN-name.npz`` file written by :func:`transformer_lib.grading._harness.write`:
plain numeric arrays, plus the uint8 array ``__meta__`` holding JSON ``{"check", "hidden",
"cases", "outs"}`` in which ``{"$tensor": key, "dtype"}``, ``{"$array": key}``, ``{"$opaque":
text}`` and ``{"$dict": {...}}`` stand for the values that are not JSON.

Files come from a process the student controls, so they are hostile: only regular ``.npz`` files
of bounded size are opened, always with ``allow_pickle=False``; the JSON is bounded in size and
depth, every reference must name an array of the file, and anything malformed makes the whole
file count as absent (which then scores as "no result").
"""
from __future__ import annotations

import json
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._harness import Opaque

MAX_FILE_BYTES = 20_000_000  # uncompressed, per record file
MAX_META_BYTES = 2_000_000
MAX_DEPTH = 8


@dataclass
class Call:
    """One call of a check in a check cell: the check's name, whether it was a hidden test
    (its number in the cell, 0 for a visible one), and per case its inputs and the outcome."""

    check: str
    hidden: int
    cases: list[dict]
    outs: list[dict]


class _Malformed(ValueError):
    pass


def unpack(value: Any, arrays: dict[str, np.ndarray], depth: int = 0) -> Any:
    """The value :func:`~transformer_lib.grading._harness.pack` wrote, tensors as torch tensors."""
    if depth > MAX_DEPTH:
        raise _Malformed("too deep")
    if isinstance(value, list):
        return [unpack(v, arrays, depth + 1) for v in value]
    if isinstance(value, dict):
        if "$tensor" in value:
            arr = arrays.get(value["$tensor"]) if isinstance(value["$tensor"], str) else None
            dtype = getattr(torch, str(value.get("dtype")), None)
            if arr is None or not isinstance(dtype, torch.dtype):
                raise _Malformed("bad tensor")
            return torch.from_numpy(np.array(arr)).to(dtype)
        if "$array" in value:
            arr = arrays.get(value["$array"]) if isinstance(value["$array"], str) else None
            if arr is None:
                raise _Malformed("bad array")
            return np.array(arr)
        if "$opaque" in value:
            return Opaque(str(value["$opaque"])[:200])
        if "$dict" in value and isinstance(value["$dict"], dict):
            return {str(k): unpack(v, arrays, depth + 1) for k, v in value["$dict"].items()}
        raise _Malformed("unknown object")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value[:200] if isinstance(value, str) else value
    raise _Malformed("unknown value")


def _read(path: Path) -> Call:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # never a link, never block on a FIFO
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Malformed("not a regular file")
        with zipfile.ZipFile(fh) as zf:
            if sum(info.file_size for info in zf.infolist()) > MAX_FILE_BYTES:
                raise _Malformed("too large")
        fh.seek(0)
        with np.load(fh, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    meta = arrays.pop("__meta__", None)
    if meta is None or meta.dtype != np.uint8 or meta.size > MAX_META_BYTES:
        raise _Malformed("no metadata")
    if any(a.dtype.kind not in "biuf" for a in arrays.values()):
        raise _Malformed("not numbers")
    raw = json.loads(meta.tobytes().decode("utf-8"))
    if not isinstance(raw, dict) or not isinstance(raw.get("check"), str) or type(raw.get("hidden")) is not int:
        raise _Malformed("bad metadata")
    cases, outs = unpack(raw.get("cases"), arrays), unpack(raw.get("outs"), arrays)
    if not (isinstance(cases, list) and isinstance(outs, list) and len(cases) == len(outs)
            and all(isinstance(c, dict) for c in cases + outs)):
        raise _Malformed("bad cases")
    return Call(raw["check"][:100], raw["hidden"], cases, outs)


def load_calls(folder: Path) -> list[Call]:
    """The check calls recorded in ``folder``, in the order they were made; a file that cannot be
    read as a record is skipped."""
    calls: list[Call] = []
    if not folder.is_dir():
        return calls
    for path in sorted(folder.glob("*.npz")):
        try:
            calls.append(_read(path))
        except Exception:  # a corrupt or hostile file: treat as absent
            continue
    return calls
