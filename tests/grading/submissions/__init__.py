"""Wrong and adversarial submissions for the grading tests, built from the instructor notebooks.

Kept as small edits (solution bodies substituted by grade_id) rather than as notebook files,
so the repository stays small and nothing here is collected as a notebook test.
"""
