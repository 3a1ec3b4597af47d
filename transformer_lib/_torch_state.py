"""What torch is doing around a call, asked through two private torch functions, and the one
private torch class the library builds on.

The attention layer takes torch's fused kernel only when nothing around it needs the explicit
path: no ``TorchDispatchMode`` is active (``FlopCounterMode`` is one, and has no formula for the
CPU fused kernel; `transformer_lib.memory` uses one) and no ``torch.func`` transform
(``vmap``, ``jacrev``) is running (the fused kernel's backward has no batching rule). Torch
exposes both facts only under private names, which may move in a later release; each
function here then answers True ("something is active"), so the layer falls back to the
explicit path, which is always correct.

``DispatchMode`` is torch's base class for watching every operator call
(``torch.utils._python_dispatch.TorchDispatchMode``); if torch moves it, a placeholder stands in
whose use raises an error that names it. `transformer_lib.memory` subclasses
``EagerDispatchMode``, which keeps torch from importing its compiler on a mode's first call (the
grader's checks keep a copy of it in `grading/_calls.py`: they import nothing of the library
outside their own package, which a notebook could have patched).
This is the only module of the library outside `transformer_lib.grading` that names a private
torch module (a test reads the others).
"""
from __future__ import annotations

try:
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:  # pragma: no cover - depends on the torch release
    _get_current_dispatch_mode = None
try:
    from torch._C._functorch import maybe_current_level
except ImportError:  # pragma: no cover - depends on the torch release
    maybe_current_level = None
try:
    from torch.utils._python_dispatch import TorchDispatchMode as DispatchMode
except ImportError:  # pragma: no cover - depends on the torch release

    class DispatchMode:  # type: ignore[no-redef]
        """Stands in for torch's ``TorchDispatchMode`` where this torch release has none."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("this torch release has no torch.utils._python_dispatch.TorchDispatchMode, "
                               "which measuring peak memory needs")


class EagerDispatchMode(DispatchMode):
    """``DispatchMode`` for modes that never run under ``torch.compile``. Torch wraps a subclass's ``__torch_dispatch__`` in ``torch._disable_dynamo`` unless the
    class's ``_should_skip_dynamo`` says False, and that wrapper's first call imports
    ``torch._dynamo``: about 2 s of CPU in every process that uses the mode. If torch renames the
    hook, the wrapping and the import come back: slower, never wrong."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


def dispatch_mode_active() -> bool:
    """True if a ``TorchDispatchMode`` is active, or if torch cannot say."""
    if _get_current_dispatch_mode is None:
        return True
    try:
        return _get_current_dispatch_mode() is not None
    except Exception:  # noqa: BLE001 - a moved or changed private function: be safe
        return True


def transform_active() -> bool:
    """True inside a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``), or if torch
    cannot say."""
    if maybe_current_level is None:
        return True
    try:
        return maybe_current_level() is not None
    except Exception:  # noqa: BLE001
        return True
