"""Tests for transformer_lib.data and transformer_lib.train (Chapter 7)."""

import math

import pytest
import torch
from torch import nn

from transformer_lib.data import (
    IGNORE_INDEX,
    SEP,
    TINY_TEXT,
    CharTokenizer,
    copy_task,
    induction_task,
    reverse_task,
    sort_task,
    task_batches,
    text_batch,
    unigram_loss,
)
from transformer_lib.train import cross_entropy_loss, evaluate_loss, train

TASKS = [copy_task, reverse_task, sort_task, induction_task]


# ---------------------------------------------------------------- tokenizer
def test_char_tokenizer_roundtrip():
    tok = CharTokenizer(TINY_TEXT)
    ids = tok.encode(TINY_TEXT)
    assert ids.dtype == torch.long and ids.shape == (len(TINY_TEXT),)
    assert tok.decode(ids) == TINY_TEXT
    assert tok.vocab_size == len(set(TINY_TEXT)) == len(tok)
    assert tok.alphabet == sorted(set(TINY_TEXT))


def test_char_tokenizer_errors():
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match=r"unknown characters \['x', 'z'\]"):
        tok.encode("axbz")
    with pytest.raises(ValueError, match="ids"):
        tok.decode([0, 3])
    with pytest.raises(ValueError, match="text_or_alphabet"):
        CharTokenizer("")


def test_tiny_text_is_a_few_hundred_characters():
    assert 300 <= len(TINY_TEXT) <= 2000 and "attention" in TINY_TEXT


# -------------------------------------------------------------------- tasks
@pytest.mark.parametrize("task", TASKS)
def test_tasks_are_deterministic_and_well_formed(task):
    x1, y1 = task(3, 5, 10, seed=7)
    x2, y2 = task(3, 5, 10, torch.Generator().manual_seed(7))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == y1.shape == (3, 10) and x1.dtype == y1.dtype == torch.long
    assert not torch.equal(task(3, 5, 10, seed=8)[0], x1)
    assert x1.min() >= 0 and x1.max() < 10
    supervised = y1 != IGNORE_INDEX
    assert supervised.any() and y1[supervised].max() < 10
    # next-token format: wherever a target is set and it is not the last position, it is the next input
    inner = supervised[:, :-1]
    assert torch.equal(y1[:, :-1][inner], x1[:, 1:][inner])


def test_copy_reverse_sort_answers():
    for task, answer in [(copy_task, lambda s: s), (reverse_task, lambda s: s.flip(1)),
                         (sort_task, lambda s: s.sort(1).values)]:
        x, y = task(4, 6, 9, seed=1)
        s = x[:, :6]
        assert (s >= 1).all() and (x[:, 6] == SEP).all()
        assert (y[:, :6] == IGNORE_INDEX).all()
        assert torch.equal(y[:, 6:], answer(s))


def test_induction_task_layout():
    x, y = induction_task(2, 5, 20, seed=3, distinct=True)
    r = x[:, 1:6]
    assert (x[:, 0] == SEP).all() and torch.equal(x[:, 6:], r[:, :4])
    assert (y[:, :6] == IGNORE_INDEX).all() and torch.equal(y[:, 6:], r[:, 1:])
    assert all(len(set(row.tolist())) == 5 for row in r)
    x, _ = induction_task(200, 19, 20, seed=4, distinct=True)   # every content token, never SEP
    assert all(sorted(row.tolist()) == list(range(1, 20)) for row in x[:, 1:20])
    with pytest.raises(ValueError, match="n"):
        induction_task(1, 20, 20, seed=0, distinct=True)


def test_task_errors():
    with pytest.raises(ValueError, match="vocab_size"):
        copy_task(2, 3, 1)
    with pytest.raises(ValueError, match="batch"):
        copy_task(0, 3, 5)
    with pytest.raises(ValueError, match="seed"):
        copy_task(2, 3, 5, torch.Generator(), seed=1)


def test_task_batches_and_text_batch():
    stream = task_batches(copy_task, 2, 3, 5, seed=0)
    a, b = next(stream), next(stream)
    assert not torch.equal(a[0], b[0])
    again = task_batches(copy_task, 2, 3, 5, seed=0)
    assert torch.equal(next(again)[0], a[0])
    ids = CharTokenizer(TINY_TEXT).encode(TINY_TEXT)
    x, y = text_batch(ids, 4, 16, seed=0)
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="block"):
        text_batch(ids, 1, len(ids))


def test_text_batch_draws_every_valid_window_and_none_past_the_end():
    """With ids 0…N−1 a window is identified by its first id: for N = block + 3 the starts are
    exactly {0, 1, 2} (the target of start 2 ends at the last id), and 300 draws see all three."""
    block = 5
    ids = torch.arange(block + 3)
    x, y = text_batch(ids, 300, block, seed=1)
    assert set(x[:, 0].tolist()) == {0, 1, 2}
    assert torch.equal(y, x + 1) and int(y.max()) == block + 2
    x, y = text_batch(torch.arange(block + 1), 20, block, seed=2)   # one window only
    assert torch.equal(x, torch.arange(block).expand(20, block))


def test_unigram_loss():
    assert unigram_loss(torch.tensor([0, 1, 2, 3])) == pytest.approx(math.log(4))
    assert unigram_loss(torch.tensor([1, 1, 1])) == pytest.approx(0.0)


# -------------------------------------------------------------------- train
def _tiny_model(n_ctx, vocab, d=16, hidden=128):
    """A stand-in that sees the whole sequence: embed, flatten, MLP, per-position logits."""
    return nn.Sequential(
        nn.Embedding(vocab, d), nn.Flatten(), nn.Linear(n_ctx * d, hidden), nn.ReLU(),
        nn.Linear(hidden, n_ctx * vocab), nn.Unflatten(1, (n_ctx, vocab)),
    )


def test_train_reduces_copy_loss():
    n, vocab = 3, 5
    torch.manual_seed(0)
    model = _tiny_model(2 * n, vocab, hidden=64)
    losses = train(model, task_batches(copy_task, 64, n, vocab, seed=0), steps=60, lr=1e-2, seed=0)
    assert len(losses) == 60
    assert losses[0] > 0.9 * math.log(vocab - 1)          # chance level at the start
    assert sum(losses[-5:]) / 5 < 0.1
    held_out = evaluate_loss(model, copy_task(256, n, vocab, seed=123))
    assert held_out < 0.1


def test_train_is_deterministic():
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = nn.Sequential(_tiny_model(4, 5, hidden=32), nn.Dropout(0.2))
        runs.append(train(model, task_batches(copy_task, 8, 2, 5, seed=0), steps=10, seed=3))
    assert runs[0] == runs[1]


def test_train_leaves_global_rng_untouched():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Embedding(4, 4), nn.Dropout(0.5), nn.Linear(4, 4))
    state = torch.get_rng_state()
    train(model, copy_task(2, 2, 4, seed=0), steps=3, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    assert model.training
    model.eval()                                   # the mode the caller had is restored
    train(model, copy_task(2, 2, 4, seed=0), steps=1, seed=1)
    assert not model.training and not model[1].training


def test_train_accepts_callable_and_custom_loss():
    model = nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))
    calls = []
    losses = train(model, lambda step: copy_task(2, 2, 4, seed=step), steps=4,
                   loss_fn=lambda lg, t: cross_entropy_loss(lg, t) * 2, callback=lambda s, v: calls.append(s))
    assert len(losses) == 4 and calls == [0, 1, 2, 3]


class _WithAux(nn.Module):
    """Returns (logits, auxiliary output), as models with extra outputs do."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x), torch.zeros(())


def test_tuple_outputs_use_their_first_element_as_logits():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))
    batch = copy_task(4, 2, 4, seed=0)
    assert evaluate_loss(_WithAux(plain), batch) == pytest.approx(evaluate_loss(plain, batch), rel=1e-9)
    with torch.no_grad():
        first = float(cross_entropy_loss(plain(batch[0]), batch[1]))
    assert train(_WithAux(plain), batch, steps=1)[0] == pytest.approx(first, rel=1e-6)


def _reference_loop(model, batches, steps, lr, loss_fn, grad_clip=None, weight_decay=0.0):
    """AdamW written out with torch.optim, the loss and torch's clip_grad_norm_ per step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for _, (inputs, targets) in zip(range(steps), batches):
        loss = loss_fn(model(inputs), targets)
        opt.zero_grad()
        loss.backward()
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("kw", [dict(loss_fn=lambda lg, t: 2 * cross_entropy_loss(lg[:, 3:5], t[:, 3:5]) + 3),
                                dict(grad_clip=0.05), dict(weight_decay=2.0)])
def test_custom_loss_grad_clip_and_weight_decay_change_the_trajectory(kw):
    """train with a custom loss, clipping or weight decay reproduces a hand-written loop step
    for step, and ends measurably away from the default run."""
    def fresh():
        torch.manual_seed(0)
        return _tiny_model(6, 5, hidden=32)

    def batches():
        return task_batches(copy_task, 16, 3, 5, seed=0)

    loss_fn = kw.get("loss_fn", cross_entropy_loss)
    expected = _reference_loop(fresh(), batches(), 8, 1e-2, loss_fn, kw.get("grad_clip"), kw.get("weight_decay", 0.0))
    got = train(fresh(), batches(), steps=8, lr=1e-2, **kw)
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)
    default = train(fresh(), batches(), steps=8, lr=1e-2)
    assert abs(got[-1] - default[-1]) > 1e-3


def test_train_errors():
    model = nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))
    with pytest.raises(ValueError, match="batches"):
        train(model, [copy_task(2, 2, 4)], steps=2)
    with pytest.raises(ValueError, match="steps"):
        train(model, copy_task(2, 2, 4), steps=-1)
    with pytest.raises(ValueError, match="targets"):
        cross_entropy_loss(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))


def test_evaluate_loss_token_weighted_and_restores_mode():
    """Two batches with 24 and 4 supervised tokens: the mean over all 28 tokens (a sum of
    per-token losses, by hand), not the mean of the two batch means."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))
    a = copy_task(8, 3, 4, seed=0)
    b_in, b_tgt = copy_task(8, 3, 4, seed=1)
    b_tgt = b_tgt.clone()
    b_tgt[2:] = IGNORE_INDEX                      # only 2 rows × 2 … keep 4 supervised tokens
    b_tgt[:2, 3] = IGNORE_INDEX
    assert int((a[1] != IGNORE_INDEX).sum()) == 24 and int((b_tgt != IGNORE_INDEX).sum()) == 4
    with torch.no_grad():
        per_token = [nn.functional.cross_entropy(model(x).reshape(-1, 4), t.reshape(-1), reduction="none",
                                                 ignore_index=IGNORE_INDEX)[t.reshape(-1) != IGNORE_INDEX]
                     for x, t in (a, (b_in, b_tgt))]
    expected = float(torch.cat(per_token).mean())
    assert abs(expected - float((per_token[0].mean() + per_token[1].mean()) / 2)) > 1e-3
    assert evaluate_loss(model, [a, (b_in, b_tgt)]) == pytest.approx(expected, rel=1e-6)
    assert evaluate_loss(model, [a, a]) == pytest.approx(float(per_token[0].mean()), rel=1e-6)
    assert model.training


def test_evaluate_loss_runs_in_eval_mode():
    """With dropout p = 0.5 the loss in eval mode is deterministic and equals the loss of the
    model switched to eval() by hand; a custom loss_fn is used as given."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(4, 16), nn.Dropout(0.5), nn.Linear(16, 4))
    batch = copy_task(8, 3, 4, seed=0)
    model.eval()
    with torch.no_grad():
        direct = float(cross_entropy_loss(model(batch[0]), batch[1]))
    model.train()
    assert evaluate_loss(model, batch) == pytest.approx(direct, rel=1e-6)
    assert evaluate_loss(model, batch, loss_fn=lambda lg, t: cross_entropy_loss(lg, t) * 0 + 7.0) == 7.0
    assert model.training


def test_train_and_loss_error_messages_name_the_argument_the_expected_and_the_actual_value():
    model = nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))
    batch = copy_task(2, 2, 4)
    cases = [
        (lambda: cross_entropy_loss(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long)), ValueError,
         r"targets: expected shape \(2, 3\) to match logits \(2, 3, 4\), got \(2, 4\)"),
        (lambda: train(model, 5, steps=1), TypeError,
         r"batches: expected an iterable of \(inputs, targets\), a callable step -> \(inputs, targets\), "
         r"or one \(inputs, targets\) tuple, got int"),
        (lambda: train(model, batch, steps=1, lr=0), ValueError, "lr: expected a finite number > 0, got 0"),
        (lambda: train(nn.Linear(2, 2).requires_grad_(False), batch, steps=1), ValueError,
         "model: expected at least one trainable parameter, got none"),
        (lambda: train(model, [batch], steps=2), ValueError, "batches: ran out after 1 batches, expected steps=2"),
        (lambda: train(model, batch, steps=-1), ValueError, "steps: expected an int >= 0, got -1"),
        (lambda: evaluate_loss(model, []), ValueError,
         "batches: expected at least one batch with a supervised target, got none"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=f"^{message}$"):
            call()
    assert train(model, batch, steps=0) == []          # zero steps is allowed: nothing to do


def test_train_defaults_are_adamw_at_lr_1e3_seed_0_without_weight_decay_or_clipping():
    """The documented defaults, against a hand-written AdamW loop (lr = 1e-3, no weight decay,
    no clipping, cross-entropy) whose dropout masks come from torch.manual_seed(0): train's
    default seed."""
    def fresh():
        torch.manual_seed(0)
        return nn.Sequential(_tiny_model(6, 5, hidden=32), nn.Dropout(0.3))

    def batches():
        return task_batches(copy_task, 16, 3, 5, seed=0)

    with torch.random.fork_rng(devices=[]):
        model = fresh().train()
        torch.manual_seed(0)
        expected = _reference_loop(model, batches(), 8, 1e-3, cross_entropy_loss)
    got = train(fresh(), batches(), steps=8)
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert expected[-1] < expected[0] - 1e-3                  # the steps did move the model


def test_evaluate_loss_on_a_callable_a_fixed_batch_and_a_step_limit():
    """A callable without steps is read once (step 0), a fixed batch once, an iterable up to
    steps; each against summed per-token cross-entropies divided by the supervised count."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(5, 8), nn.Linear(8, 5))

    def make(step):
        x, y = copy_task(4, 3, 5, seed=step)
        y = y.clone()
        y[: step + 1, -1] = IGNORE_INDEX                  # batches with different token counts
        return x, y

    def by_hand(steps):
        with torch.no_grad():
            pairs = [make(s) for s in steps]
            total = sum(float(nn.functional.cross_entropy(model(x).reshape(-1, 5), y.reshape(-1), reduction="sum",
                                                          ignore_index=IGNORE_INDEX)) for x, y in pairs)
            return total / sum(int((y != IGNORE_INDEX).sum()) for _, y in pairs)

    assert evaluate_loss(model, make) == pytest.approx(by_hand([0]), rel=1e-6)
    assert evaluate_loss(model, make, steps=3) == pytest.approx(by_hand([0, 1, 2]), rel=1e-6)
    assert evaluate_loss(model, make(2)) == pytest.approx(by_hand([2]), rel=1e-6)
    assert evaluate_loss(model, [make(1), make(2), make(3)], steps=2) == pytest.approx(by_hand([1, 2]), rel=1e-6)
    assert evaluate_loss(model, [make(1), make(2), make(3)]) == pytest.approx(by_hand([1, 2, 3]), rel=1e-6)


def test_data_error_messages_name_the_argument_the_expected_and_the_actual_value():
    tok = CharTokenizer("abc")
    cases = [
        (lambda: CharTokenizer(""), "text_or_alphabet: expected at least one character, got an empty input"),
        (lambda: CharTokenizer(["ab", "c"]), r"text_or_alphabet: expected single characters, got \['ab'\]"),
        (lambda: tok.encode("axbz"), r"text: unknown characters \['x', 'z'\] \(not in the tokenizer's alphabet\)"),
        (lambda: tok.decode([0, 3]), r"ids: expected values in \[0, 3\), got \[3\]"),
        (lambda: tok.decode(torch.zeros(2, 2, dtype=torch.long)),
         r"ids: expected a 1-d integer sequence, got shape \(2, 2\), dtype torch.int64"),
        (lambda: tok.decode(torch.tensor([0.5])),
         r"ids: expected a 1-d integer sequence, got shape \(1,\), dtype torch.float32"),
        (lambda: copy_task(2, 3, 1), "vocab_size: expected an int >= 2, got 1"),
        (lambda: reverse_task(0, 3, 5), "batch: expected an int >= 1, got 0"),
        (lambda: sort_task(2, 0, 5), "n: expected an int >= 1, got 0"),
        (lambda: copy_task(2, 3, 5, torch.Generator(), seed=1), "seed: pass either generator or seed, not both"),
        (lambda: induction_task(1, 20, 20, seed=0, distinct=True),
         "n: expected n \\+ max_gap <= vocab_size - 1 = 19 distinct tokens, got n=20, max_gap=0"),
        (lambda: induction_task(1, 3, 20, max_gap=-1), "max_gap: expected an int >= 0, got -1"),
        (lambda: text_batch(torch.zeros(2, 3, dtype=torch.long), 1, 1),
         r"ids: expected a 1-d tensor of token ids, got shape \(2, 3\)"),
        (lambda: text_batch(torch.arange(10), 1, 10), r"block: expected 1 <= block <= len\(ids\) - 1 = 9, got 10"),
        (lambda: text_batch(torch.arange(10), 1, 0), "block: expected an int >= 1, got 0"),
        (lambda: text_batch(torch.arange(10), 0, 3), "batch: expected an int >= 1, got 0"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=f"^{message}$"):
            call()
    assert repr(tok) == "CharTokenizer(vocab_size=3)"


class _Switch(nn.Module):
    """Logits from head a until `use_a` is switched off, then from head b only."""

    def __init__(self):
        super().__init__()
        self.emb, self.a, self.b, self.use_a = nn.Embedding(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), True

    def forward(self, x):
        return (self.a if self.use_a else self.b)(self.emb(x))


def test_a_parameter_without_gradient_is_left_alone():
    """Head a gets a gradient at step 0 only: gradients are reset to None (not zeros), so
    AdamW skips it afterwards and its momentum cannot keep moving it, as in a torch loop that
    calls opt.zero_grad() (set_to_none=True by default)."""
    torch.manual_seed(0)
    model = _Switch()
    batch = copy_task(4, 2, 4, seed=0)
    after_first = {}

    def switch(step, loss):
        if step == 0:
            model.use_a = False
            after_first.update({k: v.clone() for k, v in model.a.state_dict().items()})

    train(model, batch, steps=4, lr=0.1, callback=switch)
    for k, v in model.a.state_dict().items():
        assert torch.equal(v, after_first[k]), k


def test_callback_receives_each_step_and_its_loss():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))
    batch = copy_task(4, 2, 4, seed=0)
    with torch.no_grad():
        first = float(cross_entropy_loss(model(batch[0]), batch[1]))
    seen = []
    losses = train(model, batch, steps=3, callback=lambda step, loss: seen.append((step, loss)))
    assert seen == list(enumerate(losses)) and seen[0][1] == pytest.approx(first, rel=1e-6)


class _CallableBatches(list):
    """A list of batches that is also callable (as some loaders are): iterated, never called."""

    def __call__(self, step):
        raise AssertionError("an iterable of batches must be iterated, not called")


def test_an_iterable_that_is_also_callable_is_iterated():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))
    batches = _CallableBatches([copy_task(4, 2, 4, seed=s) for s in range(3)])
    with torch.no_grad():
        first = float(cross_entropy_loss(model(batches[0][0]), batches[0][1]))
    assert train(model, batches, steps=3)[0] == pytest.approx(first, rel=1e-6)


def test_a_callable_stream_does_not_run_out():
    """A callable step -> batch serves as many steps as asked (here 130), never a fixed few."""
    model = nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))
    batch, steps = copy_task(2, 2, 4, seed=0), []
    with torch.no_grad():
        expected = float(cross_entropy_loss(model(batch[0]), batch[1]))
    assert evaluate_loss(model, lambda step: steps.append(step) or batch, steps=130) == pytest.approx(expected, rel=1e-6)
    assert steps == list(range(130))


def test_text_batch_accepts_one_character_windows():
    """block = 1 is the smallest window: each input is one id and its target the next one."""
    x, y = text_batch(torch.arange(5), 6, 1, seed=0)
    assert x.shape == y.shape == (6, 1) and torch.equal(y, x + 1) and int(x.max()) <= 3


def test_text_batch_windows_start_where_torch_randint_draws_them():
    """The window starts are torch.randint(0, N − block) drawn from the given generator or
    seed (never the global RNG): rebuilt here with torch alone."""
    ids = torch.arange(50)
    starts = torch.randint(0, 50 - 8, (4,), generator=torch.Generator().manual_seed(7))
    expected = starts[:, None] + torch.arange(8)
    torch.manual_seed(123)                          # the global RNG must not matter
    for x, y in (text_batch(ids, 4, 8, seed=7), text_batch(ids, 4, 8, torch.Generator().manual_seed(7))):
        assert torch.equal(x, expected) and torch.equal(y, expected + 1)


def test_decode_error_lists_the_first_five_bad_ids():
    with pytest.raises(ValueError, match=r"^ids: expected values in \[0, 3\), got \[3, 4, 5, 6, 7\]$"):
        CharTokenizer("abc").decode([0, 3, 4, 5, 6, 7, 8])


def test_tokenizer_edges():
    """An empty text encodes to an empty LongTensor (torch.tensor([]) alone would be float);
    a bad alphabet's error lists its first five offending entries."""
    empty = CharTokenizer("abc").encode("")
    assert empty.dtype == torch.long and empty.shape == (0,)
    with pytest.raises(ValueError, match=r"^text_or_alphabet: expected single characters, "
                                         r"got \['ab', 'cd', 'ef', 'gh', 'ij'\]$"):
        CharTokenizer(["ab", "cd", "ef", "gh", "ij", "kl"])


def test_running_example_values_and_projections_by_hand():
    """The four tokens, and V = X·W_V and K = X·W_K worked out by hand (each row of X picks
    four rows of the projection and adds them)."""
    from transformer_lib.data import running_example

    ex = running_example()
    assert ex.tokens == ["AAPL", "revenue", "beat", "expectations"]
    v = [[1, 1, 1, 1], [1, 1, 1, 1], [2, 0, 2, 0], [0, 2, 0, 2]]
    k = [[1, 1, 1, 1], [1, 1, 1, 2], [2, 2, 0, 1], [0, 0, 2, 2]]
    assert torch.equal(ex.X @ ex.W_V, torch.tensor(v, dtype=torch.float64))
    assert torch.equal(ex.X @ ex.W_K, torch.tensor(k, dtype=torch.float64))
    assert ex.W_V.shape == ex.W_K.shape == (8, 4)


def test_induction_task_allows_repeats_by_default():
    """distinct defaults to False: n + max_gap may exceed the vocabulary (tokens repeat)."""
    x, _ = induction_task(2, 20, 5, seed=0)
    assert x.shape == (2, 40) and len(set(x[0, 1:21].tolist())) < 20


def test_induction_task_with_gap_one_has_length_2n_plus_1():
    """max_gap = 1 already takes the gap layout: inputs and targets (batch, 2n + 1)."""
    x, y = induction_task(3, 4, 10, seed=0, max_gap=1)
    assert x.shape == y.shape == (3, 9)


def test_default_seed_is_zero_against_torch_randint():
    """Without generator or seed a task draws its source from torch.Generator seeded with 0,
    as task_batches does by default: rebuilt here with torch.randint alone."""
    source = torch.randint(1, 5, (2, 3), generator=torch.Generator().manual_seed(0))
    assert torch.equal(copy_task(2, 3, 5)[0][:, :3], source)
    assert torch.equal(next(task_batches(copy_task, 2, 3, 5))[0][:, :3], source)
