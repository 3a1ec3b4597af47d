"""Chapter 2, building up attention: each check cell fails when the code it guards (or the input it is
given) is broken, and passes unbroken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import chapter, check_fails_when_broken, edited, run

CH2 = "02_building_up_attention"
LAST = "cat_tokens = ["  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none

# name: (chapter, [(cell phrase, [(line, broken line), ...])], phrase of the failing line)
BROKEN = {
    "running example: Q and K projections swapped": (
        CH2, [("syllabus = {", [("Q_t, K_t, V_t = Xt @ WQt, Xt @ WKt, Xt @ WVt",
                 "Q_t, K_t, V_t = Xt @ WKt, Xt @ WQt, Xt @ WVt")])],
        "torch.equal(M, torch.tensor"),
    "running example: S = K Qᵀ": (
        CH2, [("syllabus = {", [("S_t = Q_t @ K_t.T",
                 "S_t = K_t @ Q_t.T")])],
        "torch.equal(M, torch.tensor"),
    "running example: V from W_Q": (
        CH2, [("syllabus = {", [("Xt @ WVt\n",
                 "Xt @ WQt\n")])],
        "torch.equal(M, torch.tensor"),
    "entropy: the scale dropped": (
        CH2, [("def mean_entropy", [("(1.0, math.sqrt(dk), dk)",
                 "(1.0, 1.0, dk)")])],
        "scaled_H.max() - scaled_H.min()"),
    "entropy: divided by d_k instead of √d_k": (
        CH2, [("def mean_entropy", [("(1.0, math.sqrt(dk), dk)",
                 "(1.0, dk, dk)")])],
        "scaled_H.max() - scaled_H.min()"),
    "±2σ share: scores not Gaussian (uniform)": (
        CH2, [("two_sigma_mass = math.erf", [("inside = (samples[dk].abs()",
                 "inside = ((torch.rand(N_mc) * 2 - 1) * math.sqrt(3 * dk)).abs()\ninside = (inside")])],
        "assert abs(inside - two_sigma_mass)"),
    "stable softmax: no shift": (
        CH2, [("def softmax_decimal", [("stable = softmax(scores)",
                 "stable = naive_softmax(scores)")])],
        "torch.softmax(scores, 0)"),
    "stable softmax: a stray temperature": (
        CH2, [("def softmax_decimal", [("stable = softmax(scores)",
                 "stable = softmax(scores / 2)")])],
        "torch.softmax(scores, 0)"),
    "step 2: a direction outside the null space": (
        CH2, [("v0 = vecs[:, 0]", [("v0 = vecs[:, 0]",
                 "v0 = vecs[:, -1]")])],
        "null_len < 1e-12"),
    "step 1: equal normalisers claimed for random tokens": (
        CH2, [("normaliser = np.exp", [("Xu = Xr / np.linalg.norm(Xr, axis=1, keepdims=True)",
                 "Xu = X / np.linalg.norm(X, axis=1, keepdims=True)")])],
        "step1_rand_asym > 1e-3"),
    "erratum: a table that is softmax(S/T) for one T": (
        CH2, [("cat_tokens = [", [("cat_published = np.array([[.49, .28, .23], [.12, .63, .25],\n                          [.15, .30, .55]])",
                 "cat_published = np.round(softmax(torch.tensor(cat_scores) / 1.2).numpy(), 3)"),
                ("assert cat_err[2] <= 0.005",
                 "pass")])],
        "best_err > 0.005"),
    "variance: the fresh scores divided by d_k, not √d_k": (
        CH2, [("def sample_scores(dk):", [("(sample_scores(dk) / math.sqrt(dk))",
                 "(sample_scores(dk) / dk)")])],
        "assert abs(scaled - 1) < 4 * se"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


@pytest.mark.parametrize("phrase", ["syllabus = {", "def mean_entropy", "def softmax_decimal", "cat_tokens = ["])
def test_check_passes_unbroken(phrase):
    cells, namespace = chapter(CH2, LAST, SKIP)
    run(edited(cells, phrase, []), dict(namespace))
