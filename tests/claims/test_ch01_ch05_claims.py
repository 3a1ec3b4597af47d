"""What the book measures on the trained all-MiniLM-L6-v2, with the margins the chapters assert,
checked on other inputs than the chapters' own (Chapters 1 and 5).

Chapter 1: "mole" enters every sentence as the identical vector (same position), and after six
layers its vectors group by sense: on five sets of six sentences (two per sense: animal, unit,
skin lesion; the first set is the chapter's), same-sense pairs are more similar on average than
cross-sense pairs by more than 0.03, and each sense is closer to itself than to any other by
more than 0.005.

Chapter 5: on five sentences other than the chapter's, the head with the highest previous-token
score is in the first layer, scores above 0.95 and beats every other head by more than 0.4;
the strongest [CLS] head scores above 0.8, at least a third of the 72 heads put more than half
their attention on [CLS], and no head gives [SEP] more than 0.35.

Chapter 5, activation patching: swap one word of a sentence; patched from the clean run into the
corrupted one at the next token only, the previous-token head recovers more than 0.15 of that
token's change after its layer (measured 0.21–0.71 on the fifteen swaps below, three in each of
five sentences other than the chapter's), the median of the layer's other heads stays below 0.12
(measured at most 0.10, in the four-word sentence) and the previous-token head beats it by more
than 0.08 (measured at least 0.11); the fractions of all the layer's heads add up to 1 ± 0.1
(measured 0.96–1.04). Read after the last layer instead, the previous-token head's patch recovers
less than after its own layer in every swap (at most 0.17) and all heads together less than 0.6
(at most 0.42).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lib.bert import load_minilm, tokenize
from transformer_lib.patching import patch_each_head, recovered_fraction, run_with_cache

torch.set_num_threads(1)  # small models: one thread is faster than two competing ones

MOLE_SETS = [
    [["The mole dug a tunnel under the lawn.", "The mole has tiny eyes and strong claws."],
     ["The mole is the SI unit of amount of substance.", "The mole of carbon weighs twelve grams."],
     ["The mole on her cheek was removed.", "The mole on his back was checked by a dermatologist."]],
    [["A mole burrowed through the garden soil.", "A mole eats earthworms underground."],
     ["A mole contains Avogadro's number of atoms.", "A mole of water has a mass of eighteen grams."],
     ["A mole appeared on my skin last summer.", "A mole that changes shape should be seen by a doctor."]],
    [["The mole is a small mammal that lives underground.",
      "The mole ruined the farmer's field with molehills."],
     ["The mole ratio in the chemical equation is two to one.",
      "The mole count of the gas doubled in the reaction."],
     ["The mole on the patient's arm was a benign skin lesion.",
      "The mole was itchy and started to bleed."]],
    [["One mole escaped from the trap in the meadow.", "One mole was spotted digging near the river bank."],
     ["One mole of oxygen gas occupies about 22 litres.", "One mole of sodium chloride dissolved in the beaker."],
     ["One mole on his neck turned out to be melanoma.", "One mole on her face was darker than the others."]],
    [["Every mole in the garden digs its own burrow.", "Every mole hunts worms in the dark soil."],
     ["Every mole of a substance has the same number of particles.",
      "Every mole of electrons carries a charge of one faraday."],
     ["Every mole on your skin should be checked for changes.",
      "Every mole the dermatologist removed was sent to the lab."]],
]
AT = 2  # [CLS] <determiner> mole ...


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


@pytest.fixture(scope="module")
def mole_vectors(minilm):
    model, tok = minilm
    texts = [s for group in MOLE_SETS for sense in group for s in sense]
    ids, mask, tokens = tokenize(tok, texts)
    assert all(t[AT] == "mole" for t in tokens)
    with torch.no_grad():
        out = model(ids, mask)
    k = len(texts) // len(MOLE_SETS)
    return [(out.hidden[0][i:i + k, AT], out.last[i:i + k, AT]) for i in range(0, len(texts), k)]


@pytest.mark.parametrize("index", range(len(MOLE_SETS)))
def test_mole_starts_identical_and_ends_grouped_by_sense(mole_vectors, index):
    before, after = mole_vectors[index]
    assert all(torch.equal(v, before[0]) for v in before)
    e = F.normalize(after, dim=-1)
    cos = e @ e.T
    sense = torch.tensor([0, 0, 1, 1, 2, 2])
    off = ~torch.eye(6, dtype=torch.bool)
    same = (sense[:, None] == sense[None, :]) & off
    assert float(cos[same].mean()) > float(cos[~same & off].mean()) + 0.03
    by = [[float(cos[(sense[:, None] == a) & (sense[None, :] == b) & off].mean()) for b in range(3)]
          for a in range(3)]
    assert all(by[a][a] > by[a][b] + 0.005 for a in range(3) for b in range(3) if a != b)


HEAD_SENTENCES = ["AAPL revenue beat expectations.",   # the chapter's board sentence is not here
                  "The mole dug a tunnel under the lawn.",
                  "Stock prices fell sharply after the central bank raised interest rates.",
                  "A kitten is sleeping on the warm windowsill.",
                  "Investors sold their shares when the quarterly report disappointed."]


@pytest.mark.parametrize("sentence", HEAD_SENTENCES)
def test_trained_heads_found_by_their_scores(minilm, sentence):
    model, tok = minilm
    ids, mask, _ = tokenize(tok, [sentence])
    with torch.no_grad():
        A = torch.stack(model(ids, mask, return_attention=True).attentions)[:, 0]  # (L, h, n, n)
    L, h, n, _ = A.shape
    rows = torch.arange(1, n)
    prev = A[:, :, rows, rows - 1].mean(-1).flatten()
    best, second = prev.topk(2).values.tolist()
    assert best > 0.95 and best > second + 0.4 and int(prev.argmax()) // h == 0
    cls, sep = A[:, :, :, 0].mean(-1), A[:, :, :, n - 1].mean(-1)
    assert float(cls.max()) > 0.8 and int((cls > 0.5).sum()) >= L * h // 3
    assert float(sep.max()) < 0.35


SWAPS = {"AAPL revenue beat expectations.": [("revenue", "profit"), ("beat", "missed"),
                                             ("revenue beat", "revenue topped")],
         "The mole dug a tunnel under the lawn.": [("tunnel", "hole"), ("mole", "dog"),
                                                   ("lawn", "garden")],
         "Stock prices fell sharply after the central bank raised interest rates.": [
             ("central", "national"), ("interest", "tax"), ("prices", "markets")],
         "A kitten is sleeping on the warm windowsill.": [("warm", "cold"), ("kitten", "puppy"),
                                                          ("sleeping", "resting")],
         "Investors sold their shares when the quarterly report disappointed.": [
             ("quarterly", "annual"), ("sold", "bought"), ("shares", "stocks")]}


@pytest.mark.parametrize("sentence", list(SWAPS))
def test_patching_the_previous_token_head_carries_the_left_neighbour(minilm, sentence):
    model, tok = minilm
    for old, new in SWAPS[sentence]:
        ids, mask, _ = tokenize(tok, [sentence, sentence.replace(old, new, 1)])
        (j,) = (ids[0] != ids[1]).nonzero()[:, 0].tolist()
        assert bool(mask.all())
        clean, corrupt, i = ids[:1], ids[1:], j + 1
        with torch.no_grad():
            _, c_cache = run_with_cache(model, clean)
            _, k_cache = run_with_cache(model, corrupt)
            A = torch.stack([c_cache[f"blocks.{l}.attn.hook_pattern"][0] for l in range(len(model.blocks))])
            rows = torch.arange(1, A.shape[-1])
            layer, head = divmod(int(A[:, :, rows, rows - 1].mean(-1).argmax()), A.shape[1])
            r, r_last = (_fractions(model, corrupt, c_cache, k_cache, i, layer, f"blocks.{read}.hook_resid_post")
                         for read in (layer, len(model.blocks) - 1))
        typical = float(np.median(np.delete(r, head)))
        assert r[head] > 0.15 and typical < 0.12 and r[head] - typical > 0.08, (old, new, r)
        assert abs(r.sum() - 1) < 0.1, (old, new, r)
        assert r_last[head] < r[head] and r_last.sum() < 0.6, (old, new, r_last)


def _fractions(model, corrupt, c_cache, k_cache, i, layer, name):
    """The recovered fraction of each head of `layer` patched at position i, read at `name`."""
    d = c_cache[name][0, i] - k_cache[name][0, i]
    along = patch_each_head(model, corrupt, c_cache, positions=i, layers=[layer],
                            metric=lambda out, cache: cache[name][0, i] @ d)[0]
    return recovered_fraction(c_cache[name][0, i] @ d, k_cache[name][0, i] @ d, along).numpy()
