"""How the course is installed, on this machine and on a newcomer's: torch's CPU build, the same
commands everywhere, and a Binder image that gets what `make install` gets.

`requirements/torch.txt` is the one file that names torch's version and index: `torch==2.13.0+cpu`
from PyTorch's CPU wheel index (an extra index) except on macOS, where the plain wheel is the CPU
build. pip resolves the Makefile's torch command here (a dry run that downloads nothing) and must
choose a CPU build. The reader's install lines (guides/running.md, CONTRIBUTING.md) and Binder's
`binder/postBuild` are the Makefile's commands, with `requirements/runtime.txt` in place of
`requirements.txt`; the package list of Binder's environment is built from its commands (the pins
of the files it installs, torch's marker evaluated for Linux) and must be closed under the
packages' dependencies and free of CUDA. A full pip resolution of `runtime.txt` gives the same 154
packages, but takes minutes here, so it is not run by the tests.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from repo_paths import REPO
from transformer_lib import doctor

TORCH_FILE = REPO / "requirements" / "torch.txt"
CUDA = ("nvidia-", "cuda-", "triton")
LINUX, MAC, WINDOWS = ({"sys_platform": p} for p in ("linux", "darwin", "win32"))


def _normalised(command: str) -> str:
    """A `pip install` command without its launcher and the flags that only change what it prints or
    caches; `requirements.txt` (everything) read as `requirements/runtime.txt` (what the chapters need)."""
    argv = shlex.split(command)
    argv = argv[argv.index("install") + 1:]
    argv = [a for a in argv if a not in ("--quiet", "--no-cache-dir")]
    return " ".join("requirements/runtime.txt" if a == "requirements.txt" else a for a in argv)


def makefile_installs() -> list[str]:
    """The `pip install` commands of `make install`'s recipe, in order (the commands of a recipe line
    split at the shell's `&`, `&&` and `;`; continued lines joined)."""
    lines = (REPO / "Makefile").read_text().replace("\\\n", " ").splitlines()
    commands = [part.strip() for ln in lines if ln.startswith("\t") for part in re.split(r"&&|;|&", ln)]
    return [c for c in commands if c.startswith("$(BIN)/pip install") and "$(MUTMUT)" not in c]


def bash_installs(text: str) -> list[str]:
    """The `pip install` lines of a text's ```bash blocks (comments dropped)."""
    blocks = re.findall(r"^\s*```bash\n(.*?)^\s*```", text, re.S | re.M)
    return [ln.split(" #")[0].strip() for block in blocks for ln in block.splitlines()
            if re.match(r"\s*(python -m )?pip install", ln)]


def postbuild_installs() -> list[str]:
    return [ln.strip() for ln in (REPO / "binder" / "postBuild").read_text().splitlines()
            if ln.startswith("python -m pip install")]


# ------------------------------------------------------------------ torch

def test_torch_txt_names_the_cpu_build_for_each_platform():
    index, linux = doctor.torch_pin(TORCH_FILE, LINUX)
    assert index == "https://download.pytorch.org/whl/cpu"
    assert linux == "2.13.0+cpu" and doctor.torch_pin(TORCH_FILE, WINDOWS)[1] == "2.13.0+cpu"
    assert doctor.torch_pin(TORCH_FILE, MAC)[1] == "2.13.0"  # no +cpu build exists for macOS
    text = TORCH_FILE.read_text()
    assert "--extra-index-url" in text and "--index-url" not in text.replace("--extra-index-url", ""), \
        "the CPU index must be an extra index: torch's dependencies come from the default one"


def test_the_other_places_take_torch_from_torch_txt():
    """pyproject's dependency is torch.txt's version; the Gradescope set-up uses its index; the
    Makefile, Binder and doctor install from the file itself."""
    version = doctor.torch_pin(TORCH_FILE, MAC)[1]
    with open(REPO / "pyproject.toml", "rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    assert f"torch=={version}" in deps
    from transformer_lib.grading.report import gradescope

    assert gradescope.TORCH_INDEX == doctor.torch_pin(TORCH_FILE)[0]
    for where, commands in (("Makefile", makefile_installs()), ("binder/postBuild", postbuild_installs())):
        assert _normalised(commands[0]) == "--no-deps -r requirements/torch.txt", f"{where}: {commands[0]}"
        assert not [c for c in commands[1:] if "torch" in c], f"{where}: torch installed twice"


def _dry_run(args: list[str]) -> list[dict]:
    """What `pip install ARGS` would install here (nothing is downloaded; the unreachable index is
    asked once, without retries)."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--retries", "0", "--report", "-", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0 and re.search(r"No matching distribution|Could not find a version", done.stderr):
        pytest.skip(f"pip cannot reach a torch wheel from here (offline?): {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)["install"]


def test_make_install_chooses_a_cpu_build_of_torch():
    command = makefile_installs()[0]
    args = shlex.split(command)[shlex.split(command).index("install") + 1:]
    [item] = _dry_run([a for a in args if a != "--quiet"])
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    wheel = item["download_info"]["url"].rsplit("/", 1)[-1]
    assert name == "torch" and version == doctor.torch_pin(TORCH_FILE)[1], (name, version, wheel)
    if sys.platform != "darwin":
        assert version.endswith("+cpu") and "%2Bcpu-" in wheel, wheel
    assert not re.search(r"cu\d{2,3}", wheel), f"a CUDA build: {wheel}"
    requires = " ".join(item["metadata"].get("requires_dist", []))
    assert "nvidia" not in requires and "triton" not in requires, requires


# ------------------------------------------------------------------ the same commands everywhere

@pytest.mark.parametrize("where", ["guides/running.md", "CONTRIBUTING.md", "binder/postBuild"])
def test_the_reader_s_and_binder_s_commands_are_make_install_s(where):
    text = (REPO / where).read_text()
    commands = postbuild_installs() if where.startswith("binder") else bash_installs(text)
    assert [_normalised(c) for c in commands] == [_normalised(c) for c in makefile_installs()], where


def test_the_prose_names_torch_as_torch_txt_does():
    """The guides quote torch's pins; the old one-line install (no model, no corpus, no CPU index)
    is gone."""
    pins = {doctor.torch_pin(TORCH_FILE, env)[1] for env in (LINUX, MAC)}
    for where in ("guides/running.md", "CONTRIBUTING.md", "README.md"):
        text = (REPO / where).read_text()
        assert "pip install torch==" not in text, where
        assert set(re.findall(r"torch==([\w.+]+)", text)) <= pins, where


# ------------------------------------------------------------------ Binder

def binder_packages() -> dict[str, str]:
    """{package: version} of the environment binder/postBuild installs: the pins of each file it
    installs, torch's for Linux (Binder's machines), and the course's library."""
    out = {}
    for command in postbuild_installs():
        argv = shlex.split(command)
        for i, arg in enumerate(argv):
            if arg == "-r":
                path = REPO / argv[i + 1]
                if path == TORCH_FILE:
                    out["torch"] = doctor.torch_pin(TORCH_FILE, LINUX)[1]
                else:
                    out.update({canonicalize_name(k): v for k, v in doctor.read_pins(path).items()})
            elif arg == "-e":
                out["transformer-lib"] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return out


def test_binder_runs_python_3_11_and_its_postbuild_stops_on_an_error():
    assert (REPO / "binder" / "runtime.txt").read_text().strip() == "python-" + ".".join(map(str, doctor.PYTHON))
    text = (REPO / "binder" / "postBuild").read_text()
    assert text.startswith("#!/bin/bash\n") and "set -euo pipefail" in text
    assert (REPO / "binder" / "postBuild").stat().st_mode & 0o111, "postBuild must be executable"
    assert not (REPO / "binder" / "requirements.txt").exists() and not (REPO / "binder" / "environment.yml").exists()


def test_binder_s_environment_is_complete_and_has_nothing_cuda():
    """Every dependency (markers evaluated for Linux and Python 3.11, the installed metadata) of every
    package Binder installs is in the list, except those of the two packages installed with
    --no-deps; the list holds the CPU torch and no GPU library."""
    from importlib import metadata

    packages = binder_packages()
    assert packages["torch"].endswith("+cpu") and len(packages) > 150
    assert not [p for p in packages if p.startswith(CUDA)]
    no_deps = {canonicalize_name(n) for f in ("model", "corpus") for n in doctor.read_pins(REPO / "requirements" / f"{f}.txt")}
    env = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11", "extra": ""}
    missing = {}
    for name in set(packages) - no_deps:
        for line in metadata.distribution(name).requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                if canonicalize_name(req.name) not in packages:
                    missing[req.name] = name
    assert not missing, f"needed (by) but not installed on Binder: {missing}"
