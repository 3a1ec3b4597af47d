"""transformer_lib.vision against independent references: patchify against F.unfold, the ViT's
patch embedding against a Conv2d with kernel = stride = patch, [CLS] at position 0, and the
permutation invariance that positions remove."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_helpers import error_message
from transformer_lib.vision import VisionTransformer, patchify


@pytest.mark.parametrize("shape,p", [((2, 3, 8, 12), 4), ((1, 1, 6, 6), 2), ((3, 2, 5, 5), 5), ((2, 4, 4), 1)])
def test_patchify_equals_unfold(shape, p):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    x4 = x if x.dim() == 4 else x[:, None]
    expected = F.unfold(x4, kernel_size=p, stride=p).transpose(1, 2)
    assert torch.equal(patchify(x, p), expected)


def test_patchify_order_by_hand():
    img = torch.arange(16.0).reshape(1, 1, 4, 4)     # pixel value = 4·row + column
    out = patchify(img, 2)
    assert out[0, 1].tolist() == [2.0, 3.0, 6.0, 7.0]      # patch (0, 1): top right, row-major inside
    assert out[0, 2].tolist() == [8.0, 9.0, 12.0, 13.0]    # patch (1, 0): bottom left
    two = torch.stack([img[0, 0], 100 + img[0, 0]])[None]  # channel 1 = channel 0 + 100
    assert patchify(two, 2)[0, 0].tolist() == [0.0, 1.0, 4.0, 5.0, 100.0, 101.0, 104.0, 105.0]


def test_patchify_errors_name_the_argument():
    with pytest.raises(ValueError, match="patch: expected a divisor of H=8 and W=6, got 4"):
        patchify(torch.zeros(1, 1, 8, 6), 4)
    with pytest.raises(ValueError, match=r"images: expected shape \(b, C, H, W\)"):
        patchify(torch.zeros(8, 8), 4)
    with pytest.raises(TypeError, match="images: expected a torch.Tensor"):
        patchify([[0.0]], 1)


def _model(positions=True, seed=0):
    torch.manual_seed(seed)
    return VisionTransformer((8, 12), patch=4, channels=3, n_classes=5, d_model=16, n_heads=2,
                             n_layers=2, positions=positions).eval()


def test_tokens_match_a_conv2d_patch_embedding_with_cls_first_and_2d_positions():
    model = _model()
    conv = torch.nn.Conv2d(3, 16, kernel_size=4, stride=4)
    with torch.no_grad():
        conv.weight.copy_(model.embed.weight.reshape(16, 3, 4, 4))
        conv.bias.copy_(model.embed.bias)
    x = torch.randn(2, 3, 8, 12)
    patches = conv(x).flatten(2).transpose(1, 2)                        # (b, 6, d), row-major
    pos = torch.stack([model.row[a] + model.col[b] for a in range(2) for b in range(3)])
    tokens = model.tokens(x)
    assert tokens.shape == (2, 7, 16)
    torch.testing.assert_close(tokens[:, 0], model.cls.expand(2, -1))
    torch.testing.assert_close(tokens[:, 1:], patches + pos, atol=1e-6, rtol=1e-5)


def _swap_patches(x):  # exchange the patches (0, 0) and (1, 2) of an (8, 12) image with 4 × 4 patches
    y = x.clone()
    y[..., :4, :4], y[..., 4:, 8:] = x[..., 4:, 8:], x[..., :4, :4]
    return y


def test_without_positions_the_output_ignores_where_patches_are():
    x = torch.randn(3, 3, 8, 12)
    bag, vit = _model(positions=False), _model(positions=True)
    with torch.no_grad():
        torch.testing.assert_close(bag(_swap_patches(x)), bag(x), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(vit(_swap_patches(x)), vit(x), atol=1e-3)


def test_cls_weights_are_the_last_blocks_attention():
    model = _model()
    x = torch.randn(2, 3, 8, 12)
    with torch.no_grad():
        logits, weights = model(x, return_weights=True)
        h = model.tokens(x)
        h = model.blocks[0](h)
        _, full = model.blocks[1].attn(model.blocks[1].norm1(h), return_weights=True)
    assert logits.shape == (2, 5) and weights.shape == (2, 7)
    torch.testing.assert_close(weights, full[:, :, 0].mean(1))
    torch.testing.assert_close(weights.sum(-1), torch.ones(2))
    torch.testing.assert_close(logits, model(x))


def test_constructor_errors_name_the_argument():
    with pytest.raises(ValueError, match="patch: expected a divisor of H=8 and W=12, got 5"):
        VisionTransformer((8, 12), patch=5, channels=1, n_classes=2)
    with pytest.raises(TypeError, match="positions: expected a bool"):
        VisionTransformer((8, 8), patch=4, channels=1, n_classes=2, positions=1)


def test_every_vision_error_in_full():
    assert error_message(lambda: patchify(torch.zeros(1, 1, 8, 8), 2.0)) == "patch: expected an int, got float (2.0)"
    good = dict(image_size=(8, 8), patch=4, channels=1, n_classes=2, d_model=8, n_layers=1)
    for name in ("patch", "channels", "n_classes", "d_model", "n_layers"):
        assert error_message(lambda: VisionTransformer(**{**good, name: 0})) == f"{name}: expected an int >= 1, got 0"
    assert error_message(lambda: VisionTransformer(**{**good, "image_size": (8, 6)})) == (
        "patch: expected a divisor of H=8 and W=6, got 4")                   # only W is not a multiple


def test_vision_defaults_and_initialisation():
    """Defaults d_model 32, 2 heads, 1 layer, d_ff = 4·d_model, positions on; [CLS], row and
    column vectors start as N(0, 0.02²) like GPT-2's embeddings; d_ff reaches every block."""
    torch.manual_seed(0)
    model = VisionTransformer((8, 8), patch=4, channels=1, n_classes=2)
    assert model.embed.out_features == 32 and len(model.blocks) == 1 and model.positions is True
    assert model.blocks[0].attn.n_heads == 2 and model.blocks[0].mlp.fc1.out_features == 128
    torch.manual_seed(0)
    wide = VisionTransformer((64, 64), patch=2, channels=1, n_classes=2, d_model=256, d_ff=24)
    assert wide.blocks[0].mlp.fc1.out_features == 24
    for vectors in (wide.cls, wide.row, wide.col):
        assert 0.017 < float(vectors.detach().std()) < 0.023


def test_three_layers_run_in_order():
    """With 3 blocks the logits are head(norm(b2(b1(b0(tokens))))[CLS]), assembled by hand, and
    the returned weights are the last block's."""
    torch.manual_seed(3)
    model = VisionTransformer((8, 8), patch=4, channels=1, n_classes=3, d_model=8, n_layers=3).eval()
    images = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        x = model.tokens(images)
        for block in model.blocks:
            x = block(x)
        expected = model.head(model.norm(x)[:, 0])
        logits, weights = model(images, return_weights=True)
        before_last = model.blocks[1](model.blocks[0](model.tokens(images)))
        _, w_last = model.blocks[2].attn(model.blocks[2].norm1(before_last), return_weights=True)
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(weights, w_last[:, :, 0].mean(dim=1), atol=1e-6, rtol=0)
