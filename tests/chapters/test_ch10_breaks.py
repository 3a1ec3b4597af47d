"""The appendix "attention beyond words": each check cell fails when the code it guards is broken.

What a case is and how it runs: `notebook_cells.check_fails_when_broken`.
"""
from __future__ import annotations

import torch.nn.functional as F

import pytest

from notebook_cells import check_fails_when_broken, uncovered_check_cells

APP = "appendix_beyond_words"
LAST = "n_err, w_err = 512, 32"  # the last cell the cases need
SKIP = ()  # cells not run (training no case needs): none


def _full_attention(q, k, v, window):
    """Sliding-window attention as the full masked product: right values, n² work."""
    from transformer_lib.attention import scaled_dot_product_attention
    from transformer_lib.efficient import sliding_window_mask
    return scaled_dot_product_attention(q, k, v, mask=sliding_window_mask(q.shape[-2], window))[0]


# name: (chapter, [(cell phrase, [(line, broken line), ...]), ...], phrase of the failing line
#        [, [(module, name, make_broken), ...] library patches]).
# The last cell of the list is the check cell; the ones before it define what it uses.
BROKEN = {
    "A Nadaraya–Watson: the bandwidth not squared": (
        APP, [("def sector_weights(z)", [("-d2 / (2 * h * h)", "-d2 / (2 * h)")])],
        "assert torch.allclose(mine, chapter1"),
    "A firms: the keys of the main model tied to its queries": (
        APP, [("class PeerAttention", [('"attention": train_peer_attention(tied=False)', '"attention": train_peer_attention(tied=True)')]),
              ("sector = z_test[..., 4:]", [])],
        "assert forward_higher > 0.95"),
    "A firms: the baseline's keys not tied": (
        APP, [("class PeerAttention", [("self.W_K = self.W_Q if tied else torch.nn.Linear(d_z, d_k)",
                                        "self.W_K = torch.nn.Linear(d_z, d_k)")]),
              ("sector = z_test[..., 4:]", [])],
        "assert (s_tied - s_tied.transpose(-1, -2)).abs().max() < 1e-5"),
    "A firms: the baseline untied in its forward pass, its scores() still symmetric": (
        APP, [("class PeerAttention", [("self.W_K = self.W_Q if tied else torch.nn.Linear(d_z, d_k)",
                                        "self.W_K = torch.nn.Linear(d_z, d_k)\n        self.tied = tied"),
                                       ("q, k = self.W_Q(z), self.W_K(z)",
                                        "q, k = self.W_Q(z), (self.W_Q if self.tied else self.W_K)(z)")]),
              ("sector = z_test[..., 4:]", [])],
        'assert errors["attention, W_K tied to W_Q"] > errors["attention"] + 0.05'),
    "A firms: training stopped after 60 of its 150 steps": (
        APP, [("class PeerAttention", [("steps=150, lr=2e-2", "steps=60, lr=2e-2")]),
              ("sector = z_test[..., 4:]", [])],
        'assert min(by_sector["attention"]) > 0.9'),
    "A firms: the learning rate's exponent mistyped": (
        APP, [("class PeerAttention", [("steps=150, lr=2e-2", "steps=15, lr=2e-8")]),
              ("sector = z_test[..., 4:]", [])],
        "assert forward_higher > 0.95"),
    "A patchify: rows of pixels, not patches": (
        APP, [("def patchify_scratch", [])],
        "assert torch.equal(patchify(x, 4), reference)",
        [("transformer_lib.vision", "patchify", lambda original: (
            lambda images, patch: images.reshape(images.shape[0], -1, images.shape[1] * patch * patch)))]),
    "A patchify from scratch: the permutation left out": (
        APP, [("def patchify_scratch", [(".permute(0, 2, 4, 1, 3, 5).reshape", ".reshape")])],
        "assert torch.equal(patchify_scratch(x, 4), reference)"),
    "A ViT: the learning rate's exponent mistyped": (
        APP, [("split = torch.randperm", [("steps=VIT_STEPS, lr=1e-2", "steps=20, lr=1e-8")])],
        "assert acc > 0.9 and acc > acc_bag + 0.02"),
    "A logistic regression: a penalty a thousand times too large": (
        APP, [("def logistic_regression", [("l2=1 / (2 * len(train_idx))", "l2=1000 / (2 * len(train_idx))")])],
        "assert acc_logistic > acc"),
    "A rolled patches: the bag model given positions": (
        APP, [("split = torch.randperm", [("train_vit(positions=False)", "train_vit(positions=True, seed=1)"),
                                          ("assert acc > 0.9 and acc > acc_bag + 0.02, (acc, acc_bag)", "pass")]),
              ("test_images = images[test_idx]", [])],
        "assert bag_change < 1e-4"),
    "A graph: attention ignores the adjacency mask": (
        APP, [("n_nodes, d_node = 8, 6", [])],
        "assert torch.allclose(y_graph[i], w @ v[nbrs]",
        [("transformer_lib.attention", "scaled_dot_product_attention",
          lambda original: lambda q, k, v, mask=None, bias=None: original(q, k, v, bias=bias))]),
    "A graph: the mask not permuted with the nodes": (
        APP, [("n_nodes, d_node = 8, 6", [("y_perm = layer(x_nodes[perm], mask=G[perm][:, perm])",
                                           "y_perm = layer(x_nodes[perm], mask=G)")])],
        "assert torch.allclose(y_perm, y_graph[perm]"),
    "A gradient path: the LSTM's forget gate held open": (
        APP, [("d_rnn, n_grad = 32, 256", [("lstm, head = torch.nn.LSTM(d_rnn, d_rnn, batch_first=True), SelfAttention(d_rnn, d_rnn)\n",
                                            "lstm, head = torch.nn.LSTM(d_rnn, d_rnn, batch_first=True), SelfAttention(d_rnn, d_rnn)\n"
                                            "with torch.no_grad():\n    lstm.bias_ih_l0[d_rnn:2 * d_rnn] = 30.0\n")])],
        "assert grad_lstm[64] < 1e-8 * grad_lstm[1]"),
    "A LSTM work: one matrix of the step counted": (
        APP, [("def best_time(f, repeat=5", [("lstm.weight_ih_l0.numel() + lstm.weight_hh_l0.numel()",
                                              "lstm.weight_hh_l0.numel()")])],
        "assert lstm_madds(1) == 8 * d_rnn**2"),
    "A LSTM work: the attention head without its value product": (
        APP, [("def best_time(f, repeat=5", [])],
        "assert all(a == 3 * n * d_rnn**2 + 2 * n * n * d_rnn",
        [("transformer_lib.attention", "scaled_dot_product_attention", lambda original: (
            lambda q, k, v, mask=None, bias=None: (original(q, k, v[..., :1], mask=mask, bias=bias)[0].expand(
                *v.shape[:-2], q.shape[-2], v.shape[-1]), None)))]),
    "A quadratic wall: linear attention without its normaliser": (
        APP, [("g = torch.Generator().manual_seed(5)", [])],
        "assert torch.allclose(linear_attention(q, k, v), linear_scratch",
        [("transformer_lib.efficient", "linear_attention", lambda original: (
            lambda q, k, v: (F.elu(q) + 1) @ ((F.elu(k) + 1).transpose(-2, -1) @ v)))]),
    "A quadratic wall: the window one key too narrow": (
        APP, [("g = torch.Generator().manual_seed(5)", [])],
        "assert torch.equal(band, sliding_window_mask(300, w))",
        [("transformer_lib.efficient", "sliding_window_mask", lambda original: lambda n, w: original(n, w - 1))]),
    "A cost: the sliding window computed as masked full attention": (
        APP, [("ns_cost, d_cost, w_cost", [])],
        'assert 1.9 < growth["sliding window"] < 2.1',
        [("transformer_lib.efficient", "sliding_window_attention", lambda original: (
            lambda q, k, v, window: _full_attention(q, k, v, window)))]),
    "A accuracy: tiled attention drops the last key": (
        APP, [("n_err, w_err = 512, 32", [])],
        'assert max(errors_wall["diffuse", "tiled"], errors_wall["local", "tiled"]) < 1e-12',
        [("transformer_lib.tiled", "tiled_attention", lambda original: (
            lambda q, k, v, **kw: original(q, k[..., :-1, :], v[..., :-1, :], **kw)))]),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a broken cell may meet a nan
@pytest.mark.parametrize("name", list(BROKEN))
def test_check_fails_when_broken(name, monkeypatch):
    check_fails_when_broken(BROKEN[name], LAST, SKIP, monkeypatch)


def test_every_check_cell_has_a_case():
    assert uncovered_check_cells(APP, BROKEN) == []
