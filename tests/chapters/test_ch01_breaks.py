"""Chapter 1, data-independent weights: each check cell fails when the code it guards (or the input it is
given) is broken, and passes unbroken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import pytest

from notebook_cells import chapter, check_fails_when_broken, edited, run

CH1 = "01_data_independent_weights"
LAST = "h_large = 1e4"  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none

# name: (chapter, [(cell phrase, [(line, broken line), ...])], phrase of the failing line)
BROKEN = {
    "small bandwidth: values shuffled against their keys": (
        CH1, [("h_small = min_gap /", [("nadaraya_watson(x_train, x_train, y_train, h_small)",
                 "nadaraya_watson(x_train, x_train, y_train.flip(0), h_small)")])],
        "close(pred_small, y_train"),
    "mole: the input vector described without its segment row": (
        CH1, [("mole_out = out_m.last", [("+ minilm.type_emb.weight[0])",
                 "+ 0)")])],
        "torch.testing.assert_close(mole_in[0], by_hand"),
    "mole: vectors read before attention": (
        CH1, [("mole_out = out_m.last", [("mole_out = out_m.last[:, at]",
                 "mole_out = out_m.hidden[0][:, at]")])],
        "assert not torch.allclose(mole_out[0]"),
    "mole: senses mislabelled": (
        CH1, [("unit_vectors = F.normalize", [("sense_of = torch.tensor([list(mole_sentences).index(s) for s in senses])",
                 "sense_of = torch.tensor([0, 1, 2, 0, 1, 2])")])],
        "assert mole_same > mole_cross + 0.03"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


@pytest.mark.parametrize("phrase", ["h_small = min_gap /", "mole_out = out_m.last", "unit_vectors = F.normalize"])
def test_check_passes_unbroken(phrase):
    cells, namespace = chapter(CH1, LAST, SKIP)
    run(edited(cells, phrase, []), dict(namespace))
