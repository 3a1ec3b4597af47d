"""Shared set-up for the course's tests.

The environment variables are set before any kernel starts, so notebooks run by nbval
inherit them: no model hub access. (MPLBACKEND is left alone: a kernel that
inherits Agg would show no inline figures.)
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
