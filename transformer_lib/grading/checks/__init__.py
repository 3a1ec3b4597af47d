"""The check functions the exercise notebooks call: one module per chapter.

``from transformer_lib.grading import checks`` then ``checks.check_stable_softmax(f)``. The
checks of chapter N live in ``chNN_<topic>.py`` beside this file; their shared helpers
(conversion, comparison, messages, records, the library ban) in ``grading/_checktools.py``.

Each ``check_*`` function runs the student's function (or takes the student's values),
computes its own reference, inside the function, from first principles or from ``torch``,
compares with explicit tolerances and, on failure, raises an ``AssertionError``
(:class:`~transformer_lib.grading._checktools.CheckFailed`) naming the likely misconception.
Checks on inputs the student may not know show expected vs actual; checks of answers worked out
by hand name the wrong entries and the student's values, not the expected ones. On success a
check prints one ``✓`` line. Called with no inputs it uses the visible example; the hidden tests
of the instructor notebooks pass other inputs.
"""
from .._harness import CheckFailed
from .ch01_embeddings import *  # noqa: F403
from .ch02_attention import *  # noqa: F403
from .ch03_block import *  # noqa: F403
from .ch04_residual import *  # noqa: F403
from .ch05_multihead import *  # noqa: F403
from .ch06_positional import *  # noqa: F403
from .ch07_causal import *  # noqa: F403
from .ch08_moe import *  # noqa: F403
from .ch09_counting import *  # noqa: F403
from .ch10_beyond_words import *  # noqa: F403
