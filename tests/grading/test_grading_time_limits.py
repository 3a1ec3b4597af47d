"""The short-limits grading run (``limits``, conftest.py), judged: a cell over ``--cell-timeout`` is
interrupted and scores 0, the checks after it are graded; a kernel that ignores the interrupt is
stopped at ``--timeout``; a submission that forges the ``kernel_pid`` its worker reports cannot make
the grader kill another process. The run was started by test_grading_cli.py and has run in the
background since; this file comes after the sandbox's tests in the same unit (tests/conftest.py)."""
from __future__ import annotations

from submissions.adversarial import GRADE_IDS
from submissions.helpers import grades


def test_time_limits_and_a_forged_kernel_pid(limits):
    expected, proc, out, logs, victim = limits
    assert proc.wait(timeout=900) == 0, (logs / "stderr").read_text(errors="replace")[-3000:]
    rows = grades(out)
    for name, (score, note) in expected.items():
        row = rows[name]
        assert float(row["total"]) == score and note in row["notes"], (
            f"{name}: {row['total']} points, expected {score}; notes: {row['notes']!r}; "
            f"per check: { {g: row[g] for g in GRADE_IDS} }")
    assert "ran longer than 120 s and was stopped" in rows["ignores_interrupts"]["notes"]
    assert rows["ignores_interrupts"]["check_hand_weights"] == "2"
    assert rows["ignores_interrupts"]["check_attention"] == "0"
    assert "ran longer than 20 s and was interrupted" in rows["loop_forever"]["notes"]
    assert victim.poll() is None, "the grader killed a process named by a forged kernel_pid"
