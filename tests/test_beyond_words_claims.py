"""The appendix's measured claims hold across seeds: attention over a cross-section of firms learns
the generator's asymmetric peers and beats the fixed kernels; the small ViT reads digits, better
with positions than without, and without them cannot see a patch permutation; an LSTM's gradient
vanishes with distance where attention's does not; sliding-window and linear attention cost
linear work, and only tiled attention is exact.

The recipes are those of chapters/appendix_beyond_words.ipynb (same generator, sizes, steps, rates).
"""
from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from transformer_lib.attention import SelfAttention, scaled_dot_product_attention
from transformer_lib.efficient import linear_attention, sliding_window_attention, sliding_window_mask
from transformer_lib.positional import sinusoidal_encoding
from transformer_lib.tiled import tiled_attention
from transformer_lib.vision import VisionTransformer

SEEDS = range(5)
N_FIRMS, N_SECTORS = 30, 3


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, as in the notebook: small ops on many threads are slow on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------ firms

def _cross_sections(count, gen):
    n = N_FIRMS
    size = torch.randn(count, n, generator=gen)
    leverage, rnd, profit = (torch.rand(count, n, generator=gen) for _ in range(3))
    sector = torch.randint(0, N_SECTORS, (count, n), generator=gen)
    f = torch.randn(count, n, generator=gen)
    same = sector[:, :, None] == sector[:, None, :]
    largest = torch.where(same, size[:, None, :], -math.inf).amax(-1, keepdim=True)
    P = same & (size[:, None, :] == largest) & ~torch.eye(n, dtype=torch.bool)
    r = 0.5 * f + (P.float() @ f[..., None])[..., 0] + 0.5 * torch.randn(count, n, generator=gen)
    z = torch.cat([torch.stack([size, leverage, rnd, profit], -1), F.one_hot(sector, N_SECTORS).float()], -1)
    return z, f, r, P


def _sector_weights(z):
    sector = z[..., 4:]
    same = (sector @ sector.transpose(-1, -2)) * (1 - torch.eye(z.shape[1]))
    return same / same.sum(-1, keepdim=True).clamp_min(1)


def _kernel_weights(z, h):
    d2 = ((z[..., :, None, :] - z[..., None, :, :]) ** 2).sum(-1) + torch.diag(torch.full((z.shape[1],), math.inf))
    return torch.softmax(-d2 / (2 * h * h), dim=-1)


def _fit(w, f, r):
    def design(w, f):
        return torch.stack([f, (w @ f[..., None])[..., 0], torch.ones_like(f)], -1).reshape(-1, 3)
    coef = torch.linalg.lstsq(design(w, f).double(), r.reshape(-1, 1).double()).solution.float()
    return lambda w, f: (design(w, f) @ coef).reshape(f.shape)


class _PeerAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.W_Q, self.W_K = torch.nn.Linear(7, 4), torch.nn.Linear(7, 4)
        self.head = torch.nn.Linear(2, 1)
        torch.nn.init.ones_(self.head.weight)

    def forward(self, z, f, keys):
        allowed = keys[:, None, :] & ~torch.eye(z.shape[1], dtype=torch.bool)
        peer, alpha = scaled_dot_product_attention(self.W_Q(z), self.W_K(z), f[..., None], mask=allowed)
        return self.head(torch.stack([f, peer[..., 0]], -1))[..., 0], alpha


def _reference(z):
    return z[..., 0] > z[..., 0].median(-1, keepdim=True).values


def _everyone(z):
    return torch.ones(z.shape[:2], dtype=torch.bool)


@pytest.mark.parametrize("seed", SEEDS)
def test_peer_attention_is_asymmetric_and_beats_the_kernels(seed):
    gen = torch.Generator().manual_seed(seed)
    z_tr, f_tr, r_tr, _ = _cross_sections(500, gen)
    z_te, f_te, r_te, P_te = _cross_sections(200, gen)

    def mse(pred):
        return float(((pred - r_te) ** 2).mean())
    kernels = [mse(_fit(_sector_weights(z_tr), f_tr, r_tr)(_sector_weights(z_te), f_te))]
    fits = {h: _fit(_kernel_weights(z_tr, h), f_tr, r_tr) for h in (0.25, 0.5, 1.0, 2.0)}
    h = min(fits, key=lambda h: float(((fits[h](_kernel_weights(z_tr, h), f_tr) - r_tr) ** 2).mean()))
    kernels.append(mse(fits[h](_kernel_weights(z_te, h), f_te)))
    for keys in (_reference, _everyone):
        torch.manual_seed(seed)
        model = _PeerAttention()
        opt = torch.optim.Adam(model.parameters(), lr=2e-2)
        batches = torch.Generator().manual_seed(seed)
        for _ in range(150):
            i = torch.randint(0, len(z_tr), (32,), generator=batches)
            loss = F.mse_loss(model(z_tr[i], f_tr[i], keys(z_tr[i]))[0], r_tr[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            pred, alpha = model(z_te, f_te, keys(z_te))
        assert mse(pred) < 0.6 * min(kernels), (keys.__name__, mse(pred), kernels)
    follower = P_te.any(-1)
    to_leader = (alpha * P_te).sum(-1)[follower].mean()
    from_leader = (alpha.transpose(-1, -2) * P_te).sum(-1)[follower].mean()
    assert to_leader > 0.6 and from_leader < 0.2 and to_leader > 4 * from_leader, (to_leader, from_leader)


# ------------------------------------------------------------------------------ ViT

@pytest.fixture(scope="module")
def digits():
    """The digits as the appendix reads them, from the CSV file scikit-learn ships."""
    root = Path(importlib.util.find_spec("sklearn").submodule_search_locations[0])
    raw = np.loadtxt(root / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    images = torch.tensor(raw[:, :64], dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    split = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    return images, torch.tensor(raw[:, 64], dtype=torch.long), split[:1300], split[1300:]


def test_the_digits_file_is_what_load_digits_returns(digits):
    from sklearn.datasets import load_digits
    data = load_digits()
    images, labels, _, _ = digits
    assert torch.equal(images, torch.tensor(data.images, dtype=torch.float32)[:, None] / 16.0)
    assert torch.equal(labels, torch.tensor(data.target))


def _train_vit(digits, positions, seed, steps=200, lr=1e-2):
    images, labels, train_idx, _ = digits
    torch.manual_seed(seed)
    model = VisionTransformer((8, 8), patch=4, channels=1, n_classes=10, d_model=32, n_heads=2,
                              n_layers=1, d_ff=64, positions=positions)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    batches = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = train_idx[torch.randint(0, len(train_idx), (32,), generator=batches)]
        loss = F.cross_entropy(model(images[i]), labels[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    return model.eval()


def test_vit_reads_digits_and_uses_positions(digits):
    images, labels, _, test_idx = digits
    x, y = images[test_idx], labels[test_idx]
    rolled = x.roll(shifts=(4, 4), dims=(-2, -1))
    for seed in SEEDS:
        vit, bag = _train_vit(digits, True, seed), _train_vit(digits, False, seed)
        with torch.no_grad():
            acc = float((vit(x).argmax(-1) == y).float().mean())
            acc_bag = float((bag(x).argmax(-1) == y).float().mean())
            acc_rolled = float((vit(rolled).argmax(-1) == y).float().mean())
            assert (bag(rolled) - bag(x)).abs().max() < 1e-4
        assert acc > 0.9 and acc > acc_bag + 0.02 and acc_rolled < acc - 0.3, (seed, acc, acc_bag, acc_rolled)


# ------------------------------------------------------------------------------ LSTM vs attention

@pytest.mark.parametrize("seed", SEEDS)
def test_lstm_gradient_vanishes_with_distance_attention_does_not(seed):
    torch.manual_seed(seed)
    lstm, head = torch.nn.LSTM(32, 32, batch_first=True), SelfAttention(32, 32)
    grads = []
    for f in (lambda x: lstm(x)[0], head):
        x = torch.randn(1, 256, 32, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        y = f(x)
        u = torch.randn(y.shape[-1], generator=torch.Generator().manual_seed(seed + 1))
        (y[0, -1] @ u).backward()
        grads.append(x.grad[0].norm(dim=-1).flip(0))
    g_lstm, g_attn = grads
    assert g_lstm[64] < 1e-8 * g_lstm[1]
    assert g_attn[64] > 1e-2 * g_attn[1] and g_attn[255] > 1e6 * g_lstm[255].clamp_min(1e-30)


def test_lstm_time_grows_with_n():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 32, batch_first=True)

    def best(n):
        x = torch.randn(8, n, 32)
        with torch.no_grad():
            times = []
            for _ in range(5):
                start = time.perf_counter()
                lstm(x)
                times.append(time.perf_counter() - start)
        return min(times)
    assert best(512) > 4 * best(64)


# ------------------------------------------------------------------------------ the quadratic wall

def test_flops_grow_quadratically_for_exact_and_linearly_for_the_answers():
    growth = {}
    for name, f in {"exact": lambda q, k, v: scaled_dot_product_attention(q, k, v)[0],
                    "tiled": lambda q, k, v: tiled_attention(q, k, v, block_q=256, block_k=256),
                    "sliding": lambda q, k, v: sliding_window_attention(q, k, v, 32),
                    "linear": linear_attention}.items():
        counts = []
        for n in (1024, 2048):
            q, k, v = (torch.randn(1, n, 32) for _ in range(3))
            with FlopCounterMode(display=False) as counter:
                f(q, k, v)
            counts.append(counter.get_total_flops())
        growth[name] = counts[1] / counts[0]
    assert 3.9 < growth["exact"] < 4.1 and 3.9 < growth["tiled"] < 4.1
    assert 1.9 < growth["sliding"] < 2.1 and 1.9 < growth["linear"] < 2.1


def test_linear_and_sliding_attention_are_faster_at_n_2048():
    q, k, v = (torch.randn(1, 2048, 32, generator=torch.Generator().manual_seed(i)) for i in range(3))

    def best(f):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            f()
            times.append(time.perf_counter() - start)
        return min(times)
    exact = best(lambda: scaled_dot_product_attention(q, k, v))
    assert exact > 5 * best(lambda: linear_attention(q, k, v))
    assert exact > 3 * best(lambda: sliding_window_attention(q, k, v, 32))


@pytest.mark.parametrize("seed", SEEDS)
def test_only_tiled_attention_is_exact(seed):
    n, w = 512, 32
    g = torch.Generator().manual_seed(seed)
    diffuse = [torch.randn(1, n, 32, generator=g, dtype=torch.float64) for _ in range(3)]
    pos = 3.0 * sinusoidal_encoding(n, 32, dtype=torch.float64)[None]
    errors = {}
    for kind, (q, k, v) in (("diffuse", diffuse), ("local", [pos, pos, diffuse[2]])):
        exact, weights = scaled_dot_product_attention(q, k, v)
        outside = float((weights * ~sliding_window_mask(n, w)).sum(-1).mean())
        assert outside < 0.01 if kind == "local" else outside > 0.5
        for name, out in (("tiled", tiled_attention(q, k, v, block_q=128, block_k=128)),
                          ("sliding", sliding_window_attention(q, k, v, w)),
                          ("linear", linear_attention(q, k, v))):
            errors[kind, name] = float((out - exact).norm() / exact.norm())
    assert max(errors["diffuse", "tiled"], errors["local", "tiled"]) < 1e-12
    assert errors["local", "sliding"] < 0.1 * errors["diffuse", "sliding"]
    assert min(errors["diffuse", "linear"], errors["local", "linear"]) > 0.05
