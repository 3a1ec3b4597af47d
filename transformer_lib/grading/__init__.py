"""Graded exercises: checks, release of student notebooks, and the autograder.

A grading run reads in one direction: prepare → run → judge → report.

- ``checks``    the check functions exercise notebooks call (``checks.check_stable_softmax(f)``),
  each with a kernel half and a judge; their helpers ``_harness`` and ``_calls`` (kernel: inputs,
  records, the watch around a call) and ``_judging``; ``_watch``, the watch a graded kernel
  carries from its start (and which holds each check cell's seed and record names)
- ``notebook``  nbgrader cell roles and markers; ``release`` writes the student versions
- ``prepare``   restores the instructor's check cells and gives them the checks' kernel half
- ``rules``, ``costs``  the grader's reading of a submission's code: the constructs it refuses, and
  which checks a refusal costs
- ``runner``, ``worker``, ``procs``  run one notebook in its own process and kernel, with time
  limits, and kill every process it started
- ``sandbox``   bubblewrap around each submission's worker and kernel, and resource limits
- ``slots``, ``zygote``, ``forking``  warm sandboxes (grader running as root): one per job, whose
  process has imported torch once and forks each submission's worker and kernel
- ``records``   what a check cell recorded, read back as hostile data
- ``judge``     verdicts from the records, in the grader's process
- ``grade``, ``report``  the grading run and the reports (grades.csv, results.json, feedback.md);
  ``escaping``: a submission's text in them, capped and shown as it is
- ``classreport``  the class report of a grading run (class_report.md, class_report.csv)
- ``check``     the pre-submit check: a student's notebook run as the grader will, visible checks only
- ``bench``     times the grading of 20 submissions
- ``gradescope``  writes a Gradescope autograder for one exercise notebook
- ``student``   the student copy (``release --student DIR``): no instructor notebook, solution,
  hidden test or judge; its visible checks judge against stored expected values

Command line: ``python -m transformer_lib.grading release`` and
``python -m transformer_lib.grading grade SOURCE.ipynb SUBMISSIONS... --out DIR`` and
``python -m transformer_lib.grading check exercises/NN_topic.ipynb``.
"""

__all__ = ["checks", "notebook", "prepare", "rules", "costs", "worker", "runner", "procs", "sandbox", "slots", "zygote", "forking",
           "records", "judge", "grade", "report", "escaping", "classreport", "check", "bench", "gradescope",
           "student"]
