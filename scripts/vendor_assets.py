"""Fetch the pinned front-end assets from the npm registry into _assets/vendor/.

The book must read offline, so the pages load MathJax, RequireJS and the
ipywidgets HTML manager from the built site instead of a CDN. package.json pins
the three packages and package-lock.json records each tarball's sha512
integrity. This script downloads the three tarballs from the npm registry with
Python alone (no Node.js or npm needed), refuses any whose hash differs from the
lock file, and copies the few files the pages need (and their licence texts)
into `_assets/vendor/`, which Sphinx copies to `_build/html/_static/vendor/`
(`html_static_path: [_assets]`).

Why `_assets/` and not `_static/`: Jupyter Book adds every .js and .css file
found below a source folder named `_static` to every page, which would load
hundreds of MathJax modules eagerly.

Usage: `python scripts/vendor_assets.py [--check]`. Another registry (a mirror):
set NPM_REGISTRY, e.g. `NPM_REGISTRY=https://registry.npmmirror.com`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "_assets" / "vendor"
REGISTRY = os.environ.get("NPM_REGISTRY", "https://registry.npmjs.org").rstrip("/")

# package -> (destination folder, [(glob relative to the package, subfolder of destination)])
MATHJAX_PARTS = [
    ("LICENSE", ""),
    ("es5/tex-chtml.js", "es5"),            # TeX input + CommonHTML output, one file
    ("es5/input/tex/extensions", "es5"),    # loaded on demand by \require / autoload
    ("es5/output/chtml/fonts/woff-v2", "es5"),  # the TeX fonts
    ("es5/ui", "es5"),                      # context menu, lazy-loaded parts
    ("es5/a11y", "es5"),                    # accessibility components (menu options)
    ("es5/sre", "es5"),                     # speech rule engine used by a11y
    ("es5/adaptors", "es5"),
]
WIDGET_PARTS = [(f"dist/{g}", "dist") for g in (
    "embed-amd.js", "*.woff2", "*.woff", "*.ttf", "*.eot", "*.svg", "embed.js.LICENSE.txt")]
ASSETS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "mathjax": ("mathjax", MATHJAX_PARTS),
    "requirejs": ("requirejs", [("require.js", "")]),
    "@jupyter-widgets/html-manager": ("html-manager", WIDGET_PARTS),
}
# Licence per package, checked against the package's own manifest so that a version
# bump with a licence change is noticed; all allow redistribution with notice.
LICENSES = {
    "mathjax": "Apache-2.0",
    "requirejs": "MIT",
    "@jupyter-widgets/html-manager": "BSD-3-Clause",
}


def pinned() -> dict[str, tuple[str, str]]:
    """{package: (version, sha512 integrity)} from package.json and package-lock.json."""
    deps = json.loads((ROOT / "package.json").read_text())["dependencies"]
    lock = json.loads((ROOT / "package-lock.json").read_text())["packages"]
    out = {}
    for name in ASSETS:
        entry = lock[f"node_modules/{name}"]
        if entry["version"] != deps[name]:
            sys.exit(f"vendor_assets: {name}: package.json pins {deps[name]}, "
                     f"package-lock.json has {entry['version']}")
        out[name] = (entry["version"], entry["integrity"])
    return out


def tarball_url(name: str, version: str) -> str:
    """The registry's address of a package tarball (`@scope/pkg` -> `pkg-1.0.0.tgz`)."""
    return f"{REGISTRY}/{name}/-/{name.split('/')[-1]}-{version}.tgz"


def download(name: str, version: str, integrity: str) -> bytes:
    """The tarball's bytes, after checking them against the lock file's sha512."""
    url = tarball_url(name, version)
    try:
        with urllib.request.urlopen(url, timeout=120) as resp:
            data = resp.read()
    except OSError as err:
        sys.exit(f"vendor_assets: cannot download {url}: {err}")
    algo, _, expected = integrity.partition("-")
    actual = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if actual != expected:
        sys.exit(f"vendor_assets: {url}: {algo} is {actual}, package-lock.json expects {expected}")
    return data


def unpack(data: bytes, dest: Path) -> Path:
    """Extract a npm tarball (files under `package/`) into dest; return the package folder."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse unsafe members
            tar.extractall(dest, filter="data")
        else:
            if any(m.name.startswith(("/", "..")) or ".." in Path(m.name).parts for m in tar):
                sys.exit("vendor_assets: unsafe path in tarball")
            tar.extractall(dest)
    return dest / "package"


def copy_part(src_root: Path, part: tuple[str, str], dest: Path) -> int:
    """Copy one file, folder or glob below src_root into dest; return files copied.

    Paths keep their layout below the part's base folder (`es5/ui` -> `ui`), so
    `es5/tex-chtml.js` finds its extensions and fonts where it expects them.
    """
    pattern, base = part
    matches = sorted(src_root.glob(pattern))
    if not matches:
        sys.exit(f"vendor_assets: nothing matches {src_root / pattern}")
    count = 0
    for src in matches:
        target = dest / src.relative_to(src_root / base)
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True)
            count += sum(1 for p in src.rglob("*") if p.is_file())
        else:
            shutil.copy2(src, target)
            count += 1
    return count


def source_url(meta: dict) -> str:
    """The package's homepage or repository address, for the notice file."""
    repo = meta.get("repository")
    repo_url = repo.get("url", "") if isinstance(repo, dict) else (repo or "")
    return meta.get("homepage") or repo_url


def vendor() -> list[str]:
    """Download, verify and copy every asset into VENDOR; return lines for the notice file."""
    pins = pinned()
    if VENDOR.exists():
        shutil.rmtree(VENDOR)
    VENDOR.mkdir(parents=True)
    notice = ["Third-party files served with the course book (copied from npm packages).", ""]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, (folder, parts)) in enumerate(ASSETS.items()):
            version, integrity = pins[name]
            pkg = unpack(download(name, version, integrity), Path(tmp) / str(i))
            meta = json.loads((pkg / "package.json").read_text())
            if meta["version"] != version:
                sys.exit(f"vendor_assets: {name}: tarball holds {meta['version']}, expected {version}")
            if meta.get("license") != LICENSES[name]:
                sys.exit(f"vendor_assets: {name}: expected licence {LICENSES[name]}, "
                         f"got {meta.get('license')}; review before redistributing")
            n = sum(copy_part(pkg, part, VENDOR / folder) for part in parts)
            notice.append(f"{folder}/: {name}@{version}, licence {meta['license']}, "
                          f"{source_url(meta)} ({n} files)")
    (VENDOR / "NOTICE.txt").write_text("\n".join(notice) + "\n")
    (VENDOR / ".gitignore").write_text("# generated by scripts/vendor_assets.py\n*\n")
    return notice


def check() -> int:
    """Exit status 0 if the vendored copy matches the pinned versions."""
    notice = VENDOR / "NOTICE.txt"
    if not notice.exists():
        print(f"{notice} missing: run scripts/vendor_assets.py")
        return 1
    pinned()  # package.json and package-lock.json agree
    from transformer_lib.doctor import stale_assets

    stale = stale_assets(ROOT)
    for item in stale:
        print(f"vendored copy is not {item}: run scripts/vendor_assets.py")
    return 1 if stale else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that _assets/vendor matches package.json")
    args = parser.parse_args()
    if args.check:
        return check()
    for line in vendor()[2:]:
        print("vendored", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
