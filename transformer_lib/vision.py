"""A Vision Transformer (Dosovitskiy et al., 2021): image patches as tokens, a [CLS] token.

An image is cut into non-overlapping ``p × p`` patches, read in row-major order (left to right,
then top to bottom), each flattened channel first, then pixel row, then pixel column
(the order of ``torch.nn.functional.unfold`` and of a ``Conv2d`` with ``kernel_size = stride =
p``). A linear map embeds each patch; a learned [CLS] vector goes in front at position 0, and
learned 2-D positions (a row vector plus a column vector per patch) are added. The transformer
blocks of chapter 3 follow; the class scores are read from the [CLS] token alone.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer_lib._checks import require_bool, require_int, require_tensor
from transformer_lib.block import LayerNorm, TransformerBlock

__all__ = ["patchify", "VisionTransformer"]


def patchify(images: Tensor, patch: int) -> Tensor:
    """``(b, C, H, W)`` (or ``(b, H, W)``, one channel) ``-> (b, (H/p)(W/p), C·p·p)``.

    Patches in row-major order; inside a patch, channel first, then row, then column.
    ``H`` and ``W`` must be multiples of ``p = patch``. Chapter 10.
    """
    require_tensor("images", images)
    require_int("patch", patch)
    if images.dim() == 3:
        images = images.unsqueeze(1)
    if images.dim() != 4:
        raise ValueError(f"images: expected shape (b, C, H, W) or (b, H, W), got {tuple(images.shape)}")
    b, c, h, w = images.shape
    if h % patch or w % patch:
        raise ValueError(f"patch: expected a divisor of H={h} and W={w}, got {patch}")
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)   # (b, C, rows, p, cols, p)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


class VisionTransformer(nn.Module):
    """A small ViT classifier: ``(b, C, H, W)`` images ``-> (b, n_classes)`` logits.

    ``image_size`` is ``(H, W)``; ``d_ff`` is the MLP width (default ``4 · d_model``);
    ``positions=False`` drops the 2-D position vectors, which makes
    the model blind to where a patch is (it sees a set of patches). Chapter 10.
    """

    def __init__(self, image_size: tuple[int, int], patch: int, channels: int, n_classes: int,
                 d_model: int = 32, n_heads: int = 2, n_layers: int = 1, d_ff: int | None = None,
                 positions: bool = True):
        super().__init__()
        for name, value in (("patch", patch), ("channels", channels), ("n_classes", n_classes),
                            ("d_model", d_model), ("n_layers", n_layers)):
            require_int(name, value)
        require_bool("positions", positions)
        h, w = image_size
        if h % patch or w % patch:
            raise ValueError(f"patch: expected a divisor of H={h} and W={w}, got {patch}")
        self.patch, self.grid, self.positions = patch, (h // patch, w // patch), positions
        self.embed = nn.Linear(channels * patch * patch, d_model)
        self.cls = nn.Parameter(0.02 * torch.randn(d_model))
        self.row = nn.Parameter(0.02 * torch.randn(self.grid[0], d_model))
        self.col = nn.Parameter(0.02 * torch.randn(self.grid[1], d_model))
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.norm = LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def tokens(self, images: Tensor) -> Tensor:
        """``(b, C, H, W) -> (b, 1 + n_patches, d_model)``: [CLS] first, then the embedded
        patches plus their row and column vectors. Library: no chapter names it."""
        x = self.embed(patchify(images, self.patch))                     # (b, L, d)
        if self.positions:
            x = x + (self.row[:, None, :] + self.col[None, :, :]).flatten(0, 1)
        return torch.cat([self.cls.expand(x.shape[0], 1, -1), x], dim=1)

    def forward(self, images: Tensor, return_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``(b, C, H, W) -> (b, n_classes)``; with ``return_weights`` also the last block's
        attention of [CLS] to every token, averaged over heads, ``(b, 1 + n_patches)``. Chapter 10."""
        x = self.tokens(images)
        for block in self.blocks[:-1]:
            x = block(x)
        last = self.blocks[-1]
        if return_weights:
            _, weights = last.attn(last.norm1(x), return_weights=True)   # (b, h, n, n)
        logits = self.head(self.norm(last(x))[:, 0])
        return (logits, weights[:, :, 0].mean(dim=1)) if return_weights else logits
