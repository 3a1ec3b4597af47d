"""The guides of "Using this course" and the README cannot drift from the code.

Every shell line of their ```bash blocks that starts with ``make`` or runs ``python -m
transformer_lib`` is run: ``make`` targets as a dry run (``make -n``: the target exists and its
recipe expands), the grader's sub-commands parsed by the grader's own parser, and the quick ones
(``release --check``, ``check``, ``gradescope``, ``doctor``) run for real. The sample outputs the
guides include (``guides/samples/``) are made by the code here: a class report and a feedback file
from a real grading run (chapter 2, ``--seed guide``, sandboxed), the ``check`` command's report,
``doctor``'s items. Set ``UPDATE_GUIDE_SAMPLES=1`` to rewrite them after a change of the grader.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import REPO

sys.path.insert(0, str(REPO / "tests" / "grading"))  # the known-wrong submissions live with the grading tests
from submissions.helpers import as_handed_in, substitute  # noqa: E402
from submissions.wrong import WRONG  # noqa: E402
from transformer_lib.grading.run import sandbox  # noqa: E402
from transformer_lib.grading.__main__ import parser  # noqa: E402
from transformer_lib.grading.prepare.notebook import dumps, read, release  # noqa: E402

GUIDES = sorted((REPO / "guides").glob("*.md")) + [REPO / "README.md"]
SAMPLES = REPO / "guides" / "samples"
UPDATE = os.environ.get("UPDATE_GUIDE_SAMPLES") == "1"
SOURCE = REPO / "exercises" / "source" / "02_building_up_attention.ipynb"
RUN_FOR_REAL = {"release", "check", "gradescope"}  # quick: run them; the others are parsed only


def shell_commands(text: str) -> list[str]:
    """The commands of a text's ```bash blocks (continuations joined, comments dropped) that start
    with ``make`` or run ``python -m transformer_lib``."""
    found = []
    for block in re.findall(r"^\s*```bash\n(.*?)^\s*```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split(" #")[0].strip()
            if command.startswith("make ") or "-m transformer_lib" in command:
                found.append(command)
    return found


def test_the_extraction_finds_commands_with_continuations_and_skips_the_rest():
    text = ("```bash\nmake book   # builds\n.venv/bin/python -m transformer_lib.grading grade a.ipynb \\\n"
            "    subs/ --out o/\n.venv/bin/jupyter lab\n```\n`make test` inline is prose\n")
    assert shell_commands(text) == ["make book", ".venv/bin/python -m transformer_lib.grading grade a.ipynb      subs/ "
                                                 "--out o/"]


COMMANDS = [(path.relative_to(REPO).as_posix(), c) for path in GUIDES for c in shell_commands(path.read_text())]


def test_the_guides_show_the_commands_a_reader_needs():
    shown = " ".join(c for _, c in COMMANDS)
    for needed in ("make book", "make test", "make doctor", "transformer_lib.grading check",
                   "transformer_lib.grading grade", "transformer_lib.grading release", "transformer_lib.grading gradescope"):
        assert needed in shown, needed


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}:{c[:40]}" for w, c in COMMANDS])
def test_every_command_in_the_guides_runs(where, command, tmp_path):
    argv = shlex.split(command)
    if argv[0] == "make":
        done = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{where}: {command}\n{done.stderr}"
        return
    module = argv[argv.index("-m") + 1]
    args = argv[argv.index("-m") + 2:]
    if module == "transformer_lib":
        assert args == ["doctor"], f"{where}: {command}"
        return  # run for real by test_the_samples_are_what_the_code_writes
    if module == "transformer_lib.lab":  # the options shown exist; tests/lib/test_lab.py runs the lab
        from transformer_lib import lab
        lab._checked(lab._parser().parse_args(args))
        return
    assert module == "transformer_lib.grading", f"{where}: {command}"
    parsed = parser().parse_args(args)  # the flags and choices the guide shows exist
    if args[0] not in RUN_FOR_REAL or "--student" in args:  # the student copy: tests/grading/test_grading_student.py
        return
    if args[0] == "gradescope":
        args[args.index("--out") + 1] = str(tmp_path / "autograder.zip")
    if args[0] == "release" and "--check" not in args:
        args += ["--dest", str(tmp_path)]  # writes: into a scratch folder
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    ok = {0} if args[0] != "check" else {1}  # the released notebook's checks are not done yet
    assert done.returncode in ok, f"{where}: {command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert parsed.run is not None


# ------------------------------------------------------------------ the sample outputs

def _compare(name: str, text: str, normalise=lambda t: t) -> None:
    path = SAMPLES / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
        return
    assert normalise(path.read_text(encoding="utf-8")) == normalise(text), (
        f"guides/samples/{name} is not what the code writes now: rerun with UPDATE_GUIDE_SAMPLES=1")


GRADED = {  # submission: the known-wrong chapter 2 solutions it holds
    "alice": [], "bob": ["softmax over the wrong axis", "attention missing 1/sqrt(d_k)"],
    "carol": ["softmax via torch.softmax"], "dave": ["score std hard-coded to the visible answer"],
    "erin": ["attention mask applied after the softmax"]}


@pytest.fixture(scope="module")
def guide_run(tmp_path_factory):
    if sandbox.probe() is not None:
        pytest.skip(f"no sandbox here: {sandbox.probe()}")
    subs, out = tmp_path_factory.mktemp("guide_subs"), tmp_path_factory.mktemp("guide_out")
    source = read(SOURCE)
    for name, wrongs in GRADED.items():
        nb = source
        for wrong in wrongs:
            nb = substitute(nb, WRONG["02_building_up_attention"][wrong][0])
        (subs / f"{name}.ipynb").write_text(dumps(as_handed_in(nb)), encoding="utf-8")
    (subs / "frank.ipynb").write_text(dumps(release(source)), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "transformer_lib.grading", "grade", str(SOURCE), str(subs),
                           "--out", str(out), "--jobs", "2", "--quiet", "--seed", "guide", "--sandbox", "bwrap",
                           "--cell-timeout", "120", "--timeout", "600"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_class_report_and_the_feedback_shown_are_what_the_grader_writes(guide_run):
    _compare("class_report.md", (guide_run / "class_report.md").read_text(encoding="utf-8"))
    _compare("feedback.md", (guide_run / "bob" / "feedback.md").read_text(encoding="utf-8"))


def test_the_check_report_shown_is_what_check_prints(tmp_path, monkeypatch):
    from test_grading_check import out_of_order
    from transformer_lib.grading.presubmit import format_report, presubmit

    (tmp_path / "exercises").mkdir()
    monkeypatch.chdir(tmp_path)  # a relative path, as the student types it: the report wraps the same anywhere
    path = Path("exercises") / "02_building_up_attention.ipynb"
    path.write_text(dumps(out_of_order()), encoding="utf-8")
    text = format_report(presubmit(path, SOURCE)) + "\n"
    # the time it ran varies with the machine's load, and with its width the report's wrapping: both left out
    _compare("check_out_of_order.txt", text, lambda t: re.sub(r"ran in [\d.]+ s", "ran in # s", " ".join(t.split())))


def test_the_doctor_items_shown_are_doctor_s():
    done = subprocess.run([sys.executable, "-m", "transformer_lib", "doctor"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if re.match(r"^(ok|warn|FAIL)\s", ln)]
    assert lines, done.stdout + done.stderr

    def items(text: str) -> list[str]:  # the item names and what they say, not the machine's versions
        return [" ".join(ln.split()[:2]) for ln in text.splitlines() if re.match(r"^(ok|warn|FAIL)\s", ln)]
    shown = "\n".join(lines) + "\n" + done.stdout.splitlines()[-1] + "\n"
    _compare("doctor.txt", shown, lambda t: "\n".join(items(t)))


def test_the_check_messages_the_students_guide_quotes_are_the_checks():
    """The ✓ line and the AssertionError the students' guide shows, for a right and a wrong softmax."""
    import io
    from contextlib import redirect_stdout

    from transformer_lib.grading import checks

    def softmax(x, dim=-1, over=None):
        e = (x - x.amax(dim, keepdim=True)).exp()
        return e / e.sum(dim if over is None else over, keepdim=True)

    guide = (REPO / "guides" / "students.md").read_text(encoding="utf-8")
    with redirect_stdout(io.StringIO()) as printed:
        checks.check_stable_softmax(softmax)
    assert printed.getvalue().strip() in guide
    with pytest.raises(AssertionError) as info:
        checks.check_stable_softmax(lambda x, dim=-1: softmax(x, dim, over=0))
    assert f"AssertionError: {info.value}" in guide
