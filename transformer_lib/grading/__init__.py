"""Graded exercises: checks, release of student notebooks, and the autograder.

A grading run reads in one direction, and the folders follow it: prepare → run → judge → report.

- ``checks/``   the check functions exercise notebooks call (``checks.check_stable_softmax(f)``):
  each chapter's **kernel half**, what runs in the student's kernel (inputs, the call of the
  student's function under a watch, a record); its helpers ``_harness`` and ``_calls`` (inputs,
  records, the watch around a call) and ``_watch``, the watch a graded kernel carries from its
  start (and which holds each check cell's seed and record names)
- ``protocol``  what the kernel's side and the grader's side share, without torch: the error
  types, the environment names, the record format with its writer and its reader
- ``prepare/``  ``notebook`` (nbgrader cell roles and markers; ``release`` writes the student
  versions), ``submission`` (restores the instructor's check cells and gives them the checks'
  kernel half), and the grader's reading of a submission's code: ``rules`` (the constructs it
  refuses), ``reach`` and ``owners`` (what an allowed module reaches, who owns an object),
  ``ipython`` (what IPython runs for a cell), ``costs`` (which checks a refusal costs)
- ``run/``      ``runner``, ``worker``, ``procs``: run one notebook in its own process and kernel,
  with time limits, and kill every process it started; ``sandbox``: bubblewrap around each
  submission's worker and kernel, and resource limits; ``slots``, ``zygote``, ``forking``: warm
  sandboxes (grader running as root), one per job, whose process has imported torch once and
  forks each submission's worker and kernel
- ``judges/``   each chapter's judges (``chNN_<topic>.py``, beside its kernel half in ``checks/``)
  and what they share (``common``); ``verdicts``: a run's scores and messages from its records,
  in the grader's process. Never visible inside the sandbox
- ``report/``   ``feedback`` (grades.csv, results.json, feedback.md), ``classreport``
  (class_report.md, class_report.csv), ``gradescope`` (a Gradescope autograder for one exercise
  notebook), ``escaping`` (a submission's text in them, capped and shown as it is)
- ``grade``     the grading run, stage by stage
- ``presubmit`` the pre-submit check (``check`` on the command line): a student's notebook run as
  the grader will, visible checks only
- ``bench``     times the grading of 20 submissions
- ``student``   the student copy (``release --student DIR``): no instructor notebook, solution,
  hidden test or judge; its visible checks judge against stored expected values

Command line: ``python -m transformer_lib.grading release`` and
``python -m transformer_lib.grading grade SOURCE.ipynb SUBMISSIONS... --out DIR`` and
``python -m transformer_lib.grading check exercises/NN_topic.ipynb``.
"""

__all__ = ["checks", "protocol", "prepare", "run", "judges", "report", "grade", "presubmit", "bench",
           "student"]
