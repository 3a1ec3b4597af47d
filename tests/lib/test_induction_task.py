"""`induction_task(..., max_gap=G)`: the second copy of a segment sits a varying distance after
the first, so only the content of the current token says where to look (Chapter 7)."""

import pytest
import torch

from transformer_lib.data import IGNORE_INDEX, SEP, induction_task, task_batches


def _loop_reference(batch, n, vocab_size, max_gap, seed, distinct):
    """The same random draws as the library, laid out by list concatenation, one row at a time."""
    gen = torch.Generator().manual_seed(seed)
    m = n + max_gap
    if distinct:
        tokens = torch.rand(batch, vocab_size - 1, generator=gen).argsort(dim=1)[:, :m] + 1
    else:
        tokens = torch.randint(1, vocab_size, (batch, m), generator=gen)
    gaps = torch.randint(0, max_gap + 1, (batch, 1), generator=gen)[:, 0].tolist()
    rows = []
    for row, g in zip(tokens.tolist(), gaps):
        r, fill = row[:n], row[n:]
        rows.append([SEP] + fill[:max_gap - g] + r + fill[max_gap - g:] + r)
    z = torch.tensor(rows)
    targets = z[:, 1:].clone()
    targets[:, :m + 1] = IGNORE_INDEX
    return z[:, :-1], targets, gaps


@pytest.mark.parametrize("distinct", [True, False])
def test_layout_matches_a_loop(distinct):
    x, y = induction_task(64, 5, 16, seed=7, distinct=distinct, max_gap=4)
    x_ref, y_ref, gaps = _loop_reference(64, 5, 16, 4, 7, distinct)
    assert x.shape == y.shape == (64, 2 * 5 + 4)
    assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
    assert set(gaps) == set(range(5))


def test_previous_occurrence_is_found_by_content_at_every_gap():
    n, G, V = 6, 5, 20
    x, y = induction_task(600, n, V, seed=3, distinct=True, max_gap=G)
    T = x.shape[1]
    assert (x[:, 0] == SEP).all() and (x[:, 1:] != SEP).all()
    assert all(len(set(row)) == n + G for row in x[:, 1:n + G + 1].tolist())  # all distinct
    distances = []
    for row, target in zip(x.tolist(), y.tolist()):
        assert target[:n + G] == [IGNORE_INDEX] * (n + G)
        prev = [max(j for j in range(q) if row[j] == row[q]) for q in range(T - n + 1, T)]
        assert prev == list(range(prev[0], prev[0] + n - 1))          # the first copy, in order
        assert target[T - n + 1:] == [row[j + 1] for j in prev]       # the token after it
        distances.append(T - n + 1 - prev[0])
    counts = torch.bincount(torch.tensor(distances) - n, minlength=G + 1)
    assert counts.numel() == G + 1 and counts.min() > 600 / (G + 1) / 2   # every gap, uniformly


def test_no_gap_is_the_plain_repeat():
    a = induction_task(9, 4, 11, seed=2, distinct=True)
    b = induction_task(9, 4, 11, seed=2, distinct=True, max_gap=0)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    x, y = a
    assert torch.equal(x[:, 5:], x[:, 1:4]) and torch.equal(y[:, 5:], x[:, 2:5])
    stream = task_batches(induction_task, 3, 4, 20, seed=1, distinct=True, max_gap=6)
    assert next(stream)[0].shape == (3, 2 * 4 + 6)


def test_max_gap_errors_name_the_argument():
    with pytest.raises(ValueError, match="max_gap"):
        induction_task(2, 4, 20, seed=0, max_gap=-1)
    with pytest.raises(TypeError, match="max_gap"):
        induction_task(2, 4, 20, seed=0, max_gap=1.5)
    with pytest.raises(ValueError, match="max_gap=6"):
        induction_task(2, 4, 10, seed=0, distinct=True, max_gap=6)      # 10 > 9 distinct tokens
    assert induction_task(2, 4, 10, seed=0, distinct=True, max_gap=5)[0].shape == (2, 13)
