"""What the kernel's side and the grader's side of the checks share: torch is not imported here.

- **the error types**: :class:`CheckFailed` (a check's verdict, shown as an ``AssertionError``)
  and :class:`StudentError` (the student's code gave nothing to judge), and :class:`Opaque`, the
  description recorded in place of a value that is not data;
- **the environment names** through which the grader reaches a kernel (:data:`RECORD_ENV`,
  :data:`SEED_ENV`, :data:`TOKEN_ENV`);
- **the record format**, with its writer (:func:`pack`, :func:`write`, used in the kernel) and
  its reader (:func:`unpack`, :func:`accepted`, :class:`Recorded`, :func:`collect`, used by the
  grader).

A record is one ``NONCE-NNN.npz`` file (:func:`record_name`): plain numeric arrays, plus the uint8
array ``__meta__`` holding JSON ``{"check", "hidden", "cases", "outs"}`` in which ``{"$tensor":
key, "dtype"}``, ``{"$array": key}``, ``{"$opaque": text}`` and ``{"$dict": {...}}`` stand for the
values that are not JSON.

Files come from a process the student controls, so they are hostile: only regular ``.npz`` files
of bounded size are opened, always with ``allow_pickle=False``; the JSON is bounded in size and
depth, every reference must name an array of the file, and anything malformed makes the whole
file count as absent (which then scores as "no result"). Of a check cell's files only those it
was to write are read (:func:`accepted`: its nonce, numbered from 000, as many as the
instructor's run recorded, within a quota of bytes), and one at a time (:class:`Recorded`), so that
the grader never holds more than one record file of a submission in memory.
"""
from __future__ import annotations

import builtins
import json
import os
import shutil
import stat
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

RECORD_ENV = "TRANSFORMER_LIB_GRADING_RECORD_DIR"
SEED_ENV = "TRANSFORMER_LIB_GRADING_SEED"
TOKEN_ENV = "TRANSFORMER_LIB_GRADING_TOKEN"  # set by the grader for each kernel it starts (to find its processes)
BUILTIN_ERRORS = frozenset(name for name, value in vars(builtins).items()
                           if isinstance(value, type) and issubclass(value, BaseException))  # named in messages
MAX_FILE_BYTES = 20_000_000  # uncompressed, per record file
MAX_META_BYTES = 2_000_000
MAX_DEPTH = 8
MAX_CALLS = 64  # record files of one check cell, when the instructor's run has not said how many
MAX_CELL_BYTES = 64_000_000  # of one check cell's record files, on disk


# ---------------------------------------------------------------- the error types

class CheckFailed(AssertionError):
    """A failure found by a check: its message names the likely misconception. A notebook shows it
    as the AssertionError the exercise notebooks promise."""


CheckFailed.__name__ = CheckFailed.__qualname__ = "AssertionError"


class StudentError(Exception):
    """The student's code did not return a value to judge: ``code`` says why (``raised``,
    ``not_implemented``, ``banned``, ``library``, ``lookup``, ``thread``, ``not_callable``),
    ``detail`` gives a name (an exception type, a function) for the message."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(code, detail)
        self.code, self.detail = code, detail
        self.where: tuple[int, str] = (0, "")  # line and text of the notebook's code that did it


class Opaque:
    """A value that is not data (a function, an object of the notebook's): only a description of it
    is recorded. Its description never carries text the notebook chose."""

    def __init__(self, description: str) -> None:
        self.description = description

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.description == self.description


def typename(value: Any) -> str:
    """The type of ``value`` for a message; a class the notebook defined is not named."""
    if value is None:
        return "None (did you forget to return the result?)"
    if isinstance(value, Opaque):
        return value.description
    kind = type(value)
    module = str(getattr(kind, "__module__", ""))
    known = module.split(".")[0] in {"builtins", "numpy", "torch"} and \
        getattr(sys.modules.get(module), kind.__name__, None) is kind
    return kind.__name__ if known else "an object"


# ---------------------------------------------------------------- writing a record (in the kernel)

def record_name(nonce: str, seq: int) -> str:
    """The name of a check cell's record file number ``seq``: the only names the grader reads."""
    return f"{nonce}-{seq:03d}.npz"


def pack(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` (captured data) as JSON, its arrays moved to ``arrays`` (read back by :func:`unpack`)."""
    torch = sys.modules.get("torch")  # a tensor can only come from a process that imported torch
    if torch is not None and isinstance(value, torch.Tensor):
        key = f"a{len(arrays)}"
        arrays[key] = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
        return {"$tensor": key, "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, (np.ndarray, np.generic)):
        key = f"a{len(arrays)}"
        arrays[key] = np.asarray(value)
        return {"$array": key}
    if isinstance(value, Opaque):
        return {"$opaque": value.description}
    if isinstance(value, dict):
        return {"$dict": {str(k): pack(v, arrays) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return [pack(v, arrays) for v in value]
    return value


def write(path: str, name: str, cases: list[dict], outs: list[dict], hidden: int) -> None:
    """Write one check call (its cases and the student's outcomes) to ``path``: the arrays, and the
    rest as JSON in the uint8 array ``__meta__`` (no pickles: the grader reads it with
    ``allow_pickle=False``)."""
    arrays: dict[str, np.ndarray] = {}
    meta = {"check": name, "hidden": int(hidden),
            "cases": [pack(c, arrays) for c in cases], "outs": [pack(o, arrays) for o in outs]}
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)


# ---------------------------------------------------------------- reading records (in the grader)


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
    """The value :func:`pack` wrote, tensors as torch tensors."""
    if depth > MAX_DEPTH:
        raise _Malformed("too deep")
    if isinstance(value, list):
        return [unpack(v, arrays, depth + 1) for v in value]
    if isinstance(value, dict):
        if "$tensor" in value:
            import torch  # the grader's side: only a record that holds a tensor needs it

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


def accepted(folder: Path, nonce: str, count: int) -> list[Path]:
    """The record files of one check cell to read: ``NONCE-000.npz``, ``NONCE-001.npz``, … up to
    ``count`` of them, each a regular file (not a link) of at most ``MAX_FILE_BYTES``, together at
    most ``MAX_CELL_BYTES``; the first missing or unacceptable one ends the list. Nothing else in
    ``folder`` is looked at."""
    found: list[Path] = []
    total = 0
    for seq in range(min(count, MAX_CALLS)):
        path = folder / record_name(nonce, seq)
        try:
            info = os.lstat(path)
        except OSError:
            break
        total += info.st_size
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES or total > MAX_CELL_BYTES:
            break
        found.append(path)
    return found


class Recorded(Sequence):
    """The calls recorded in ``paths``, read when asked for, one at a time (None if unreadable)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = list(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Call | None:  # type: ignore[override]
        try:
            return _read(self.paths[i])
        except IndexError:
            raise
        except Exception:  # a corrupt or hostile file: absent
            return None

    def __iter__(self) -> Iterator[Call | None]:
        return (self[i] for i in range(len(self)))


def collect(folder: Path, nonces: dict[str, str], expected: dict[str, int] | None,
            keep: Path | None) -> dict[str, Sequence[Call | None]]:
    """Per check cell (``folder/<grade_id>``), the calls of the files :func:`accepted` keeps
    (``expected[grade_id]`` of them, else at most ``MAX_CALLS``): moved to ``keep/<grade_id>`` and
    read when judged, or read now (the unreadable left out) if ``keep`` is None."""
    found: dict[str, Sequence[Call | None]] = {}
    for gid, nonce in nonces.items():
        paths = accepted(folder / gid, nonce, (expected or {}).get(gid, MAX_CALLS))
        if keep is None:
            found[gid] = [c for c in Recorded(paths) if c is not None]
        else:
            (keep / gid).mkdir(parents=True, exist_ok=True)
            found[gid] = Recorded([Path(shutil.move(str(p), keep / gid / p.name)) for p in paths])
    return found
