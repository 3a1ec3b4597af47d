"""Random tensors and parameters shared by the library's tests (seeded, float64)."""
from __future__ import annotations

import torch
from torch import nn

D64 = torch.float64


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    """A seeded standard-normal float64 tensor of the given shape."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=D64)


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random values for every parameter (norm gains stay near 1), so that copying each one,
    biases included, is actually tested: torch initialises biases and norm shifts to 0 (and
    ``nn.MultiheadAttention``'s ``in_proj_bias`` and ``out_proj.bias`` too), so copying the wrong
    one would go unseen."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5 + (p == 1).to(p.dtype))
    return module
