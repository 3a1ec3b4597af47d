"""Prepare: the first step of grading (prepare → run → judge → report).

``notebook`` (nbgrader cell roles and markers; ``release`` writes the student versions),
``submission`` (a submission read without failing, the instructor's check cells put back, and
turned into what the kernel runs), and the grader's reading of a submission's code before it
runs: ``rules`` (the constructs it refuses), ``reach`` (what the allowed modules reach),
``owners`` (which objects the notebook did not create), ``ipython`` (what IPython runs for a
cell) and ``costs`` (which checks a refused construct costs).
"""
