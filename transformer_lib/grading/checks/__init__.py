"""The check functions the exercise notebooks call: one module per chapter.

``from transformer_lib.grading import checks`` then ``checks.check_stable_softmax(f)``. The
checks of chapter N live in ``chNN_<topic>.py`` beside this file, each module in two halves:

- above its line ``# ==== judging``, what runs in the student's kernel: each ``check_*`` function
  builds its inputs (the visible example, or with ``hidden=1`` inputs drawn from the grading run's
  seed), calls the student's function under a watch and hands what came back to
  :func:`~transformer_lib.grading._harness.run_check`; nothing there compares or knows an answer;
- below it, the judges (:func:`~transformer_lib.grading._judging.judge`): each computes its own
  reference from the inputs, from first principles or from ``torch``, compares with explicit
  tolerances and raises an ``AssertionError`` naming the likely misconception.

While a student works, a check judges at once and prints one ``✓`` line or raises. Under grading
the kernel loads only the upper halves and records; the grader judges
(:mod:`~transformer_lib.grading.judge`). Shared helpers: ``grading/_harness.py`` (kernel side)
and ``grading/_judging.py`` (judges).
"""
from .._harness import CheckFailed
from .ch01_embeddings import *  # noqa: F403
from .ch02_attention import *  # noqa: F403
from .ch02_permutation import *  # noqa: F403
from .ch03_block import *  # noqa: F403
from .ch04_residual import *  # noqa: F403
from .ch05_multihead import *  # noqa: F403
from .ch06_positional import *  # noqa: F403
from .ch07_causal import *  # noqa: F403
from .ch07_cache import *  # noqa: F403
from .ch07_patching import *  # noqa: F403
from .ch08_moe import *  # noqa: F403
from .ch09_counting import *  # noqa: F403
from .ch10_beyond_words import *  # noqa: F403
from .ch10_efficient import *  # noqa: F403
from .ch11_pairs import *  # noqa: F403
from .ch11_tokens import *  # noqa: F403
from .ch12_scaling import *  # noqa: F403
