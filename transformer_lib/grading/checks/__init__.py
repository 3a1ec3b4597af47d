"""The check functions the exercise notebooks call: one module per chapter, the kernel half.

``from transformer_lib.grading import checks`` then ``checks.check_stable_softmax(f)``. A check
has two halves, in two files of the same name:

- ``checks/chNN_<topic>.py`` (this package): what runs in the student's kernel. Each ``check_*``
  function builds its inputs (the visible example, or with ``hidden=1`` inputs drawn from the
  grading run's seed), calls the student's function under a watch and hands what came back to
  :func:`~transformer_lib.grading._harness.run_check`; nothing here compares or knows an answer;
- ``judges/chNN_<topic>.py`` (:mod:`transformer_lib.grading.judges`): the judges. Each computes
  its own reference from the inputs, from first principles or from ``torch``, compares with
  explicit tolerances and raises an ``AssertionError`` naming the likely misconception.

While a student works, a check judges at once and prints one ``✓`` line or raises. Under grading
the kernel loads this package alone and records; the grader judges
(:mod:`~transformer_lib.grading.judges.verdicts`), and in the sandbox the judges' folder is not
there at all.
Shared helpers: ``grading/_harness.py`` and ``grading/_calls.py`` (kernel side),
``grading/judges/common.py`` (judges) and ``grading/protocol.py`` (what both sides share: the
error types, the environment names, the record format).
"""
from ..protocol import CheckFailed
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
