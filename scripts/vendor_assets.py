"""Copy the pinned front-end assets from node_modules/ into _assets/vendor/.

The book must read offline, so the pages load MathJax, RequireJS and the
ipywidgets HTML manager from the built site instead of a CDN. `npm ci` installs
the versions pinned in package-lock.json; this script copies the few files the
pages need (and their licence texts) into `_assets/vendor/`, which Sphinx
copies to `_build/html/_static/vendor/` (`html_static_path: [_assets]`).

Why `_assets/` and not `_static/`: Jupyter Book adds every .js and .css file
found below a source folder named `_static` to every page, which would load
hundreds of MathJax modules eagerly.

Usage: `python scripts/vendor_assets.py [--check]` (run after `npm ci`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_MODULES = ROOT / "node_modules"
VENDOR = ROOT / "_assets" / "vendor"

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
# Licence per package, checked against node_modules so that a version bump
# with a licence change is noticed; all allow redistribution with notice.
LICENSES = {
    "mathjax": "Apache-2.0",
    "requirejs": "MIT",
    "@jupyter-widgets/html-manager": "BSD-3-Clause",
}


def pinned_versions() -> dict[str, str]:
    """Return the exact versions package.json pins for the vendored packages."""
    deps = json.loads((ROOT / "package.json").read_text())["dependencies"]
    return {name: deps[name] for name in ASSETS}


def installed_manifest(name: str) -> dict:
    """Read node_modules/<name>/package.json, or exit with a hint."""
    path = NODE_MODULES / name / "package.json"
    if not path.exists():
        sys.exit(f"vendor_assets: {path} is missing; run `npm ci --ignore-scripts` first")
    return json.loads(path.read_text())


def source_url(meta: dict) -> str:
    """The package's homepage or repository address, for the notice file."""
    repo = meta.get("repository")
    repo_url = repo.get("url", "") if isinstance(repo, dict) else (repo or "")
    return meta.get("homepage") or repo_url


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


def vendor() -> list[str]:
    """Copy every asset into VENDOR; return lines for the notice file."""
    pins = pinned_versions()
    if VENDOR.exists():
        shutil.rmtree(VENDOR)
    VENDOR.mkdir(parents=True)
    notice = ["Third-party files served with the course book (copied from npm packages).", ""]
    for name, (folder, parts) in ASSETS.items():
        meta = installed_manifest(name)
        if meta["version"] != pins[name]:
            sys.exit(f"vendor_assets: {name}: package.json pins {pins[name]}, "
                     f"node_modules has {meta['version']}; run `npm ci --ignore-scripts`")
        if meta.get("license") != LICENSES[name]:
            sys.exit(f"vendor_assets: {name}: expected licence {LICENSES[name]}, "
                     f"got {meta.get('license')}; review before redistributing")
        n = sum(copy_part(NODE_MODULES / name, part, VENDOR / folder) for part in parts)
        notice.append(f"{folder}/: {name}@{meta['version']}, licence {meta['license']}, "
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
    text = notice.read_text()
    stale = [f"{n}@{v}" for n, v in pinned_versions().items() if f"{n}@{v}," not in text]
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
