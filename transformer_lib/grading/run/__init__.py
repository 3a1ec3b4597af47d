"""Run: the second step of grading (prepare → run → judge → report).

``runner`` runs one prepared notebook in a worker process of its own, which starts a fresh
kernel (``worker``) and records what each check cell wrote; ``procs`` finds and kills every
process a run started; ``sandbox`` wraps the worker and kernel in bubblewrap, with resource
limits; ``slots``, ``zygote`` and ``forking`` keep warm sandboxes (a grader running as root),
one per job, whose process has imported torch once and forks each submission's worker and
kernel.
"""
