"""The judges of the checks: one module per chapter, beside the checks' kernel halves.

``transformer_lib/grading/judges/chNN_<topic>.py`` holds the judges of the checks in
``transformer_lib/grading/checks/chNN_<topic>.py``: each registers, with
:func:`~transformer_lib.grading.judges.common.judge`, one judge per check, which computes its own
reference from the recorded inputs (from first principles or from ``torch``), compares with
explicit tolerances and raises an ``AssertionError`` naming the likely misconception. What every
chapter's judges share (the registry, the verdict, the messages a student reads) is in
:mod:`~transformer_lib.grading.judges.common`.

Importing this package registers every judge. The grader imports it; a graded kernel never does
(under the sandbox this folder is not there at all), and while a student works in the course's
repository a check imports it when it judges at once. A student copy ships this package without
the chapters' modules: its ``__init__`` registers judges that compare with stored expected values
(:mod:`~transformer_lib.grading.student`).
"""
from . import ch01_embeddings  # noqa: F401
from . import ch02_attention  # noqa: F401
from . import ch02_permutation  # noqa: F401
from . import ch03_block  # noqa: F401
from . import ch04_residual  # noqa: F401
from . import ch05_multihead  # noqa: F401
from . import ch06_positional  # noqa: F401
from . import ch07_cache  # noqa: F401
from . import ch07_causal  # noqa: F401
from . import ch07_patching  # noqa: F401
from . import ch08_moe  # noqa: F401
from . import ch09_counting  # noqa: F401
from . import ch10_beyond_words  # noqa: F401
from . import ch10_efficient  # noqa: F401
from . import ch11_pairs  # noqa: F401
from . import ch11_tokens  # noqa: F401
from . import ch12_scaling  # noqa: F401
from .common import JUDGES, judge_here, render, verdict

__all__ = ["JUDGES", "judge_here", "render", "verdict"]
