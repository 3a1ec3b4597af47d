"""Graded exercises: checks, release of student notebooks, and the autograder.

- ``checks``    the check functions exercise notebooks call (``checks.check_stable_softmax(f)``)
- ``notebook``  nbgrader cell roles and markers; ``release`` writes the student versions
- ``prepare``   restores the instructor's check cells in a submission
- ``fresh``     gives each check cell a freshly loaded copy of the checks
- ``worker``, ``runner``, ``procs``  run one notebook in its own process and kernel, with time
  limits, and kill every process it started
- ``sandbox``   bubblewrap around each submission's worker and kernel, and resource limits
- ``slots``, ``zygote``  warm sandboxes (grader running as root): one per job, whose process has
  imported torch once and forks each submission's worker and kernel
- ``records``   results the checks record, compared outside the student's kernel
- ``grade``, ``scoring``, ``report``  the grading run, scoring, and the reports (grades.csv,
  results.json, feedback.md)
- ``classreport``  the class report of a grading run (class_report.md, class_report.csv)
- ``check``     the pre-submit check: a student's notebook run as the grader will, visible checks only
- ``bench``     times the grading of 20 submissions
- ``gradescope``  writes a Gradescope autograder for one exercise notebook

Command line: ``python -m transformer_lib.grading release`` and
``python -m transformer_lib.grading grade SOURCE.ipynb SUBMISSIONS... --out DIR`` and
``python -m transformer_lib.grading check exercises/NN_topic.ipynb``.
"""

__all__ = ["checks", "notebook", "prepare", "fresh", "worker", "runner", "procs", "sandbox", "slots", "zygote", "records", "grade",
           "scoring", "report", "classreport", "check", "bench", "gradescope"]
