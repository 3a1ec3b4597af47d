"""Report: the last step of grading (prepare → run → judge → report), in the grader's process.

``feedback`` writes ``grades.csv`` and per submission ``results.json`` and ``feedback.md``;
``classreport`` the class report (``class_report.md``, ``class_report.csv``); ``gradescope``
a Gradescope autograder for one exercise notebook; ``escaping`` shows a submission's text in
them capped and as it is. Like the judges, none of this is visible inside the sandbox.
"""
