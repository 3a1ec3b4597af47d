"""Command line: ``python -m transformer_lib.grading {release,grade,check,bench}``.

    release  [--source exercises/source] [--dest exercises] [--check]
    release  --student DIR [--jobs 2]
    grade    SOURCE.ipynb SUBMISSION... --out DIR [--jobs N] [--cell-timeout S] [--timeout S] [--quiet]
             [--sandbox auto|bwrap|none] [--memory GB] [--seed SEED]
    check    STUDENT.ipynb [--source INSTRUCTOR.ipynb] [--cell-timeout S] [--timeout S]
    bench    [--n 20] [--jobs 2]
    gradescope SOURCE.ipynb --out autograder.zip
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def _release(args: argparse.Namespace) -> int:
    from .prepare.notebook import MarkerError, release_all

    if args.student is not None:
        return _student(args)
    try:
        changed = release_all(args.source, args.dest, check=args.check)
    except MarkerError as err:
        print(f"release refused: {err}", file=sys.stderr)
        return 2
    if args.check:
        for path in changed:
            print(f"out of date: {path} (run `python -m transformer_lib.grading release`)", file=sys.stderr)
        return 1 if changed else 0
    for path in changed:
        print(f"wrote {path}")
    return 0


def _student(args: argparse.Namespace) -> int:
    from .prepare.notebook import MarkerError
    from .student import ReleaseError, write_copy

    try:
        written = write_copy(args.student, jobs=args.jobs)
    except (MarkerError, ReleaseError) as err:
        print(f"release refused: {err}", file=sys.stderr)
        return 2
    print(f"wrote the student copy {args.student}: {len(written)} exercise notebooks, the chapters, the guides, the "
          "library with the checks' kernel half and the visible examples' expected values; no instructor notebook, "
          "solution, hidden test or judge")
    return 0


def _grade(args: argparse.Namespace) -> int:
    from .grade import GradingError, GradingInterrupted, grade
    from .prepare.notebook import MarkerError
    from .run.sandbox import SandboxError

    for signum in (signal.SIGINT, signal.SIGTERM):  # workers and kernels are killed, partial reports written
        signal.signal(signum, _interrupt)
    try:
        results = grade(args.source, args.submissions, args.out, jobs=args.jobs,
                        cell_timeout=args.cell_timeout, timeout=args.timeout, progress=not args.quiet,
                        sandbox=args.sandbox, memory=int(args.memory * 2**30), seed=args.seed)
    except (GradingError, MarkerError, FileNotFoundError, SandboxError) as err:
        print(f"grading stopped: {err}", file=sys.stderr)
        return 2
    except GradingInterrupted as err:
        print(f"grading interrupted: partial reports written to {args.out} ({err.graded} of {len(err.results)} "
              "submissions graded; the others score 0 with a note)", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("grading interrupted before any submission ran; no report written", file=sys.stderr)
        return 130
    for r in results:
        print(f"{r.name}: {r.total:g} / {r.max_score:g}" + (f"  ({len(r.notes)} note(s))" if r.notes else ""))
    print(f"reports written to {args.out}")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _check(args: argparse.Namespace) -> int:
    from .presubmit import format_report, presubmit
    from .prepare.submission import SubmissionError

    try:
        report = presubmit(args.notebook, args.source, cell_timeout=args.cell_timeout, timeout=args.timeout)
    except (SubmissionError, FileNotFoundError, ValueError) as err:
        print(f"check stopped: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    return 0 if report.ok else 1


def _bench(args: argparse.Namespace) -> int:
    from .bench import bench_grading

    return 0 if bench_grading(n=args.n, jobs=args.jobs) else 1


def _gradescope(args: argparse.Namespace) -> int:
    from .report.gradescope import build

    print(f"wrote {build(args.source, args.out)}")
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line's parser (each sub-command's function is its ``run`` default)."""
    parser = argparse.ArgumentParser(prog="python -m transformer_lib.grading",
                                     description="Release and grade the course's exercise notebooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="write the student notebooks from the instructor notebooks")
    rel.add_argument("--source", type=Path, default=Path("exercises/source"))
    rel.add_argument("--dest", type=Path, default=Path("exercises"))
    rel.add_argument("--check", action="store_true", help="only report student notebooks that are out of date")
    rel.add_argument("--student", type=Path, metavar="DIR",
                     help="write a student copy of the course into DIR instead: no solution, hidden test or judge")
    rel.add_argument("--jobs", type=int, default=2, help="with --student: instructor notebooks run in parallel")
    rel.set_defaults(run=_release)
    gr = sub.add_parser("grade", help="grade submissions against an instructor notebook")
    gr.add_argument("source", type=Path, help="the instructor notebook (exercises/source/NN_topic.ipynb)")
    gr.add_argument("submissions", nargs="+", type=Path, help="submitted notebooks, or folders of them")
    gr.add_argument("--out", type=Path, required=True, help="folder for grades.csv and the reports")
    gr.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel")
    gr.add_argument("--cell-timeout", type=float, default=30.0, help="seconds per cell before an interrupt")
    gr.add_argument("--timeout", type=float, default=300.0, help="seconds per notebook before it is killed")
    gr.add_argument("--quiet", action="store_true", help="no progress bar")
    gr.add_argument("--sandbox", choices=("auto", "bwrap", "none"), default="auto",
                    help="run each submission in bubblewrap (auto: if it is installed; none: never)")
    gr.add_argument("--memory", type=float, default=4.0, help="GB of memory per submission before it is stopped")
    gr.add_argument("--seed", help="seed of the hidden inputs (default: a new random one; the class report "
                                   "names it, so that a run can be repeated)")
    gr.set_defaults(run=_grade)
    ch = sub.add_parser("check", help="run your exercise notebook as the grader will, visible checks only")
    ch.add_argument("notebook", type=Path, help="your notebook (exercises/NN_topic.ipynb)")
    ch.add_argument("--source", type=Path, help="the instructor notebook (default: exercises/source/ of the course)")
    ch.add_argument("--cell-timeout", type=float, default=30.0, help="seconds per cell, as the grader's default")
    ch.add_argument("--timeout", type=float, default=300.0, help="seconds per notebook, as the grader's default")
    ch.set_defaults(run=_check)
    be = sub.add_parser("bench", help="time the grading of n chapter-2 submissions")
    be.add_argument("--n", type=int, default=20)
    be.add_argument("--jobs", type=int, default=2)
    be.set_defaults(run=_bench)
    gs = sub.add_parser("gradescope", help="write a Gradescope autograder (zip) for one exercise notebook")
    gs.add_argument("source", type=Path, help="the instructor notebook (exercises/source/NN_topic.ipynb)")
    gs.add_argument("--out", type=Path, default=Path("autograder.zip"))
    gs.set_defaults(run=_gradescope)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the sub-command."""
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
