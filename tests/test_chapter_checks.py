"""The chapters' check cells can fail: each is run again on a deliberately broken input (one line
of the cell replaced) and must raise, and the measured claims hold for five seeds.

The chapter's code cells up to the last cell used here run once, in-process (plots go to Agg,
IPython magics are dropped); each case then runs its edited cell in a copy of that namespace.
"""
from __future__ import annotations

import contextlib
import io
import os
import traceback

import nbformat
import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

from repo_paths import REPO  # noqa: E402

CH1 = "01_data_independent_weights"
CH2 = "02_building_up_attention"
# The last cell each chapter must run before the cases: a phrase of its source.
LAST = {CH1: "h_large = 1e4", CH2: "cat_tokens = ["}


def _code_cells(stem: str) -> list[str]:
    nb = nbformat.read(REPO / "chapters" / f"{stem}.ipynb", as_version=4)
    return ["\n".join(line for line in c.source.splitlines() if not line.startswith("%"))
            for c in nb.cells if c.cell_type == "code"]


def _find(cells: list[str], phrase: str) -> int:
    found = [i for i, source in enumerate(cells) if phrase in source]
    assert len(found) == 1, f"{phrase!r} is in {len(found)} cells"
    return found[0]


def _run(source: str, namespace: dict) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(source, "<cell>", "exec"), namespace)


@pytest.fixture(scope="module")
def chapters() -> dict[str, tuple[list[str], dict]]:
    import matplotlib.pyplot as plt
    ran = {}
    for stem, last in LAST.items():
        cells, namespace = _code_cells(stem), {"__name__": "__main__"}
        for source in cells[: _find(cells, last) + 1]:
            _run(source, namespace)
        plt.close("all")
        ran[stem] = (cells, namespace)
    return ran


def _run_edited(chapters, stem: str, phrase: str, edits: list[tuple[str, str]]) -> None:
    """Run the cell containing ``phrase``, each ``old`` replaced by ``new``, in a copy of the namespace."""
    cells, namespace = chapters[stem]
    source = cells[_find(cells, phrase)]
    for old, new in edits:
        assert source.count(old) == 1, f"{old!r} is not once in the cell"
        source = source.replace(old, new)
    _run(source, dict(namespace))


BROKEN = {  # name: (chapter, cell phrase, [(line, broken line)], a phrase of the assertion that must fail)
    "running example: Q and K projections swapped": (
        CH2, "syllabus = {", [("Q_t, K_t, V_t = Xt @ WQt, Xt @ WKt, Xt @ WVt",
                               "Q_t, K_t, V_t = Xt @ WKt, Xt @ WQt, Xt @ WVt")], "torch.equal(M, torch.tensor"),
    "running example: S = K Qᵀ": (CH2, "syllabus = {", [("S_t = Q_t @ K_t.T", "S_t = K_t @ Q_t.T")],
                                  "torch.equal(M, torch.tensor"),
    "running example: V from W_Q": (CH2, "syllabus = {", [("Xt @ WVt\n", "Xt @ WQt\n")],
                                    "torch.equal(M, torch.tensor"),
    "entropy: the scale dropped": (CH2, "def mean_entropy", [("(1.0, math.sqrt(dk), dk)", "(1.0, 1.0, dk)")],
                                   "scaled_H.max() - scaled_H.min()"),
    "entropy: divided by d_k instead of √d_k": (CH2, "def mean_entropy",
                                                 [("(1.0, math.sqrt(dk), dk)", "(1.0, dk, dk)")],
                                                 "scaled_H.max() - scaled_H.min()"),
    "±2σ share: scores not Gaussian (uniform)": (
        CH2, "two_sigma_mass = math.erf",
        [("inside = (samples[dk].abs()",
          "inside = ((torch.rand(N_mc) * 2 - 1) * math.sqrt(3 * dk)).abs()\ninside = (inside")],
        "assert abs(inside - two_sigma_mass)"),
    "stable softmax: no shift": (CH2, "def softmax_decimal", [("stable = softmax(scores)",
                                                               "stable = naive_softmax(scores)")],
                                 "torch.softmax(scores, 0)"),
    "stable softmax: a stray temperature": (CH2, "def softmax_decimal", [("stable = softmax(scores)",
                                                                          "stable = softmax(scores / 2)")],
                                            "torch.softmax(scores, 0)"),
    "step 2: a direction outside the null space": (CH2, "v0 = vecs[:, 0]", [("v0 = vecs[:, 0]", "v0 = vecs[:, -1]")],
                                                   "null_len < 1e-12"),
    "step 1: equal normalisers claimed for random tokens": (
        CH2, "normaliser = np.exp", [("Xu = Xr / np.linalg.norm(Xr, axis=1, keepdims=True)",
                                      "Xu = X / np.linalg.norm(X, axis=1, keepdims=True)")],
        "step1_rand_asym > 1e-3"),
    "erratum: a table that is softmax(S/T) for one T": (
        CH2, "cat_tokens = [",
        [("cat_published = np.array([[.49, .28, .23], [.12, .63, .25],\n"
          "                          [.15, .30, .55]])",
          "cat_published = np.round(softmax(torch.tensor(cat_scores) / 1.2).numpy(), 3)"),
         ("assert cat_err[2] <= 0.005", "pass")],
        "best_err > 0.005"),
    "small bandwidth: values shuffled against their keys": (
        CH1, "h_small = min_gap /", [("nadaraya_watson(x_train, x_train, y_train, h_small)",
                                      "nadaraya_watson(x_train, x_train, y_train.flip(0), h_small)")],
        "close(pred_small, y_train"),
    "mole: the input vector described without its segment row": (
        CH1, "mole_out = out_m.last", [("+ minilm.type_emb.weight[0])", "+ 0)")],
        "torch.testing.assert_close(mole_in[0], by_hand"),
    "variance: the fresh scores divided by d_k, not √d_k": (
        CH2, "def sample_scores(dk):", [("(sample_scores(dk) / math.sqrt(dk))", "(sample_scores(dk) / dk)")],
        "assert abs(scaled - 1) < 4 * se"),
    "mole: vectors read before attention": (
        CH1, "mole_out = out_m.last", [("mole_out = out_m.last[:, at]", "mole_out = out_m.hidden[0][:, at]")],
        "assert not torch.allclose(mole_out[0]"),
    "mole: senses mislabelled": (
        CH1, "unit_vectors = F.normalize",
        [("sense_of = torch.tensor([list(mole_sentences).index(s) for s in senses])",
          "sense_of = torch.tensor([0, 1, 2, 0, 1, 2])")],
        "assert mole_same > mole_cross + 0.03"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_on_a_broken_input(chapters, name):
    stem, phrase, edits, failing = BROKEN[name]
    with pytest.raises(AssertionError) as info:
        _run_edited(chapters, stem, phrase, edits)
    cells = chapters[stem][0]
    source = cells[_find(cells, phrase)]
    for old, new in edits:
        source = source.replace(old, new)
    line = [tb for tb in traceback.extract_tb(info.tb) if tb.filename == "<cell>"][-1].lineno
    assert failing in source.splitlines()[line - 1], source.splitlines()[line - 1]


@pytest.mark.parametrize("stem,phrase", [(CH2, "syllabus = {"), (CH2, "def mean_entropy"),
                                         (CH2, "def softmax_decimal"), (CH2, "cat_tokens = ["),
                                         (CH1, "h_small = min_gap /"), (CH1, "mole_out = out_m.last"),
                                         (CH1, "unit_vectors = F.normalize")])
def test_check_passes_unbroken(chapters, stem, phrase):
    cells, namespace = chapters[stem]
    _run(cells[_find(cells, phrase)], dict(namespace))


@pytest.mark.parametrize("seed", range(5))
def test_scaled_entropy_claims_hold_for_five_seeds(chapters, seed):
    _run_edited(chapters, CH2, "def mean_entropy", [("manual_seed(2)", f"manual_seed({100 + seed})")])


@pytest.mark.parametrize("seed", range(5))
def test_variance_estimates_hold_for_five_seeds(chapters, seed):
    """Var(qᵀk)/d_k and the fresh-sample Var(qᵀk/√d_k) are within four standard errors of 1 at every
    width, on the samples of five other seeds."""
    _run_edited(chapters, CH2, "def sample_scores(dk):", [("manual_seed(1)", f"manual_seed({200 + seed})")])
