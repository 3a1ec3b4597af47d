"""Chapter 2's measured claims hold for five seeds other than the chapter's: scaling the scores by
1/√d_k keeps the attention entropy about the same at every width (unscaled, it collapses), and the
variance of qᵀk/√d_k is within four standard errors of 1 at every width, on fresh samples."""
from __future__ import annotations

import pytest

from notebook_cells import chapter, edited, run

CH2 = "02_building_up_attention"
LAST = "cat_tokens = ["  # the chapter's cells up to this one run first


@pytest.mark.parametrize("seed", range(5))
def test_scaled_entropy_claims_hold_for_five_seeds(seed):
    cells, namespace = chapter(CH2, LAST)
    run(edited(cells, "def mean_entropy", [("manual_seed(2)", f"manual_seed({100 + seed})")]), dict(namespace))


@pytest.mark.parametrize("seed", range(5))
def test_variance_estimates_hold_for_five_seeds(seed):
    """Var(qᵀk)/d_k and the fresh-sample Var(qᵀk/√d_k) are within four standard errors of 1 at every
    width, on the samples of five other seeds."""
    cells, namespace = chapter(CH2, LAST)
    run(edited(cells, "def sample_scores(dk):", [("manual_seed(1)", f"manual_seed({200 + seed})")]), dict(namespace))
