"""The residual stream: what each sub-layer reads and writes, and what the gradient sees.

A pre-norm block adds each sub-layer's output to a running state,

    x1  = x  + Attn(LN1(x))        (write 1)
    out = x1 + MLP(LN2(x1))        (write 2)

so after L blocks the state is the embedding plus the sum of 2L writes. `Stream` holds the
states and the writes of one forward pass (`GPT.forward(idx, return_stream=True)` fills it),
`logit_lens` reads any state through the model's final norm and unembedding,
`input_gradient_norm` measures how much gradient reaches the input of a stack of blocks,
`residual_jacobian_norms` how far each block's Jacobian is from the identity, and
`block_gradient_norms` the gradient each block's parameters receive. Chapter 4.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib._checks import require_instance, require_int, require_tensor

__all__ = ["Stream", "recording", "logit_lens", "input_gradient_norm", "residual_jacobian_norms",
           "block_gradient_norms"]


class Stream(NamedTuple):
    """The residual stream of one forward pass; every tensor is ``(b, n, d)`` (``(n, d)`` for
    unbatched ids).

    ``states``: 2L + 1 states, after the embedding and then after every sub-layer (block 0's
    attention, block 0's MLP, block 1's attention, …); ``states[-1]`` is what the final norm
    reads. ``writes``: the 2L sub-layer outputs in the same order, the f(·) of x + f(·). In
    pre-norm with residuals ``states[k + 1] = states[k] + writes[k]``. Chapter 4.
    """

    states: list[Tensor]
    writes: list[Tensor]

    def unbatched(self) -> "Stream":
        """The same stream with the batch dimension of size 1 dropped: ``(1, n, d) -> (n, d)``.
        Chapter 4, through `GPT`."""
        return Stream([s[0] for s in self.states], [w[0] for w in self.writes])


@contextmanager
def recording(blocks: Iterable[nn.Module], stream: Stream) -> Iterator[None]:
    """While the ``with`` block runs the ``blocks`` (``TransformerBlock``s), append to
    ``stream`` each block's state between its two sub-layers and its output (``states``) and
    its two writes (``writes``), all ``(b, n, d)``, read at the blocks' own hook points
    ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out`` and ``hook_resid_post``; so they are
    the block's own values in all four variants (pre/post-norm, with or without residuals).
    Chapter 4, through `GPT`.
    """
    where = {"hook_attn_out": stream.writes, "hook_resid_mid": stream.states,
             "hook_mlp_out": stream.writes, "hook_resid_post": stream.states}
    handles = [getattr(block, name).register_forward_hook(
        lambda _module, _args, out, to=to: to.append(out))
        for block in blocks for name, to in where.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def logit_lens(model: nn.Module, state: Tensor) -> Tensor:
    """Read a state of the stream as the model reads its last one, through the final norm and
    the unembedding: ``(…, d_model) -> (…, vocab_size)``. Applied to ``states[-1]`` it gives the
    model's logits; applied to an earlier state, the prediction the stream holds so far (the
    "logit lens"). Chapter 4.
    """
    require_tensor("state", state)
    for name in ("norm_f", "lm_head"):
        if not hasattr(model, name):
            raise TypeError(f"model: expected a GPT with a `{name}`, got {type(model).__name__}")
    return model.lm_head(model.norm_f(state))


def input_gradient_norm(blocks: Iterable[nn.Module], x: Tensor, seed: int = 0) -> float:
    """How much gradient reaches the input of a stack of blocks: ``‖gᵀ J‖ / ‖g‖`` for the
    Jacobian J of ``blocks[-1](… blocks[0](x))`` at ``x`` ``(b, n, d)`` and a random output
    gradient g (standard normal, seeded by ``seed``). 1 means the stack passes the gradient on
    unchanged in size; ≪ 1 it vanishes, ≫ 1 it explodes. Chapter 4.
    """
    require_tensor("x", x)
    blocks = list(require_instance("blocks", blocks, Iterable, "an iterable of modules (a ModuleList)"))
    require_int("seed", seed, low=0)
    x = x.detach().clone().requires_grad_(True)
    out = x
    for block in blocks:
        out = block(out)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    (grad,) = torch.autograd.grad(out, x, grad_outputs=g)
    return float(grad.norm() / g.norm())


def residual_jacobian_norms(blocks: Iterable[nn.Module], x: Tensor) -> list[float]:
    """How far each block of a stack is from the identity: writing block ℓ as ``x ↦ x + f_ℓ(x)``,
    the spectral norm ``‖J_ℓ‖₂`` of ``J_ℓ = ∂f_ℓ/∂x = ∂block_ℓ/∂x − I`` at the state block ℓ
    receives when the stack runs on ``x`` ``(b, n, d)``. Returns one number per block, bottom
    first. The Jacobian has ``(b·n·d)²`` entries: keep ``x`` small. Chapter 4.
    """
    require_tensor("x", x)
    blocks = list(require_instance("blocks", blocks, Iterable, "an iterable of modules (a ModuleList)"))
    eye = torch.eye(x.numel(), dtype=x.dtype, device=x.device)
    norms, state = [], x.detach()
    for block in blocks:
        jac = torch.autograd.functional.jacobian(block, state, vectorize=True)
        norms.append(float(torch.linalg.matrix_norm(jac.reshape(x.numel(), x.numel()) - eye, ord=2)))
        with torch.no_grad():
            state = block(state)
    return norms


def block_gradient_norms(model: nn.Module, idx: Tensor, targets: Tensor,
                         parameter: str | None = None) -> list[float]:
    """The gradient each block of a GPT receives: for ids ``idx`` ``(b, n)`` and next tokens
    ``targets`` ``(b, n)``, the cross-entropy is back-propagated once and block ℓ's entry is
    the norm of the gradient of all its parameters together, ``√(Σ_p ‖∂loss/∂p‖²)``, or with
    ``parameter`` (a name inside a block, e.g. ``"mlp.fc2.weight"``) of that one parameter.
    Returns L numbers, bottom block first; the model's own ``.grad`` fields are left
    untouched. Chapter 4.
    """
    require_tensor("idx", idx)
    require_tensor("targets", targets)
    if targets.shape != idx.shape:
        raise ValueError(f"targets: expected shape {tuple(idx.shape)} (that of idx), got {tuple(targets.shape)}")
    if parameter is None:
        per_block = [[p for p in block.parameters() if p.requires_grad] for block in model.blocks]
    else:
        require_instance("parameter", parameter, str, "a str")
        named = [dict(block.named_parameters()) for block in model.blocks]
        if not all(parameter in params for params in named):
            raise ValueError(f"parameter: expected the name of a parameter of every block, such as "
                             f"{next(iter(named[0]))!r}, got {parameter!r}")
        per_block = [[params[parameter]] for params in named]
    logits = model(idx)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    grads = iter(torch.autograd.grad(loss, [p for ps in per_block for p in ps]))  # one backward pass
    return [float(torch.sqrt(sum((g * g).sum() for _, g in zip(ps, grads)))) for ps in per_block]
