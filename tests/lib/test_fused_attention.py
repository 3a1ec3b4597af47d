"""`MultiHeadAttention`'s two paths compute the same attention (Chapter 7).

The fused path (``F.scaled_dot_product_attention``, taken when no weights are requested) must
give the explicit path's outputs and gradients in every combination of the layer's features:
causal or not, a user mask (none, key padding, a full random mask), plain / RoPE / ALiBi
positions, grouped-query attention, a key/value cache over two calls, explicit positions, and
cross-attention; to 1e-6 in float32 and 1e-12 in float64 (gradients, sums over all positions:
to that fraction of their largest entry). Each case also checks that the fused
path really called torch's kernel and the explicit one did not, so two copies of one path
cannot pass for two paths."""
from __future__ import annotations

import importlib
import io
import itertools
import re
import subprocess
import sys
import tokenize
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from repo_paths import REPO
from transformer_lib.config import ModelConfig
from transformer_lib.model import GPT
from transformer_lib.multihead import MultiHeadAttention

D, H, B = 16, 4, 2
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}


@pytest.fixture
def fused_calls(monkeypatch):
    """How many times torch's fused kernel ran."""
    calls = []
    kernel = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("is_causal", False))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    return calls


def _mask(kind: str, n: int, m: int, seed: int) -> torch.Tensor | None:
    g = torch.Generator().manual_seed(seed)
    if kind == "padding":                            # the last key of sequence 1 is padding
        keep = torch.ones(B, 1, 1, m, dtype=torch.bool)
        keep[1, ..., -1] = False
        return keep
    if kind == "random":                             # may leave a row with no key: output 0
        return torch.rand(B, H, n, m, generator=g) < 0.7
    return None


def _run(layer: MultiHeadAttention, fused: bool, calls: list, steps: list[dict]) -> list[torch.Tensor]:
    """Outputs of the calls in ``steps`` (one, or two sharing a cache) with the given path."""
    layer.fused, before = fused, len(calls)
    cache = {} if len(steps) > 1 else None
    outs = [layer(cache=cache, **step) for step in steps]
    assert (len(calls) > before) == fused, "the fused path must call F.scaled_dot_product_attention"
    return outs


def _agree(layer, calls, steps, dtype):
    fused = _run(layer, True, calls, steps)
    grads_f = torch.autograd.grad(sum((o ** 2).sum() for o in fused), list(layer.parameters()))
    explicit = _run(layer, False, calls, steps)
    grads_e = torch.autograd.grad(sum((o ** 2).sum() for o in explicit), list(layer.parameters()))
    for a, b in zip(fused, explicit):
        torch.testing.assert_close(a, b, atol=TOL[dtype], rtol=TOL[dtype])
    for a, b in zip(grads_f, grads_e):   # sums over every position: float32 to 1e-6 of the largest
        torch.testing.assert_close(a, b, atol=TOL[dtype] * max(1.0, float(b.abs().max())), rtol=0)


@pytest.mark.parametrize("pos", ["plain", "rope", "alibi"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_fused_equals_explicit_self_attention(fused_calls, pos, kv_heads):
    """Every combination of causal, user mask, cache and explicit positions (24 per test)."""
    torch.manual_seed(0)
    for causal, mask, cached, explicit_positions in itertools.product(
            [False, True], ["none", "padding", "random"], [False, True], [False, True]):
        layer = MultiHeadAttention(D, H, causal=causal, n_kv_heads=kv_heads, rope=pos == "rope",
                                   alibi=pos == "alibi")
        steps, start = [], 0
        for i, n in enumerate([5, 3] if cached else [7]):
            g = torch.Generator().manual_seed(10 + i)
            step = {"x": torch.randn(B, n, D, generator=g), "mask": _mask(mask, n, start + n, seed=i)}
            if explicit_positions:
                step["positions"] = torch.arange(start, start + n) * 2 + 3
            steps.append(step)
            start += n
        case = f"causal={causal}, mask={mask}, cached={cached}, positions={explicit_positions}"
        try:
            _agree(layer, fused_calls, steps, torch.float32)
        except AssertionError as err:
            raise AssertionError(f"{case}: {err}") from None


@pytest.mark.parametrize("causal,mask,kv_heads", list(itertools.product([False, True],
                                                                         ["none", "padding", "random"], [4, 1])))
def test_fused_equals_explicit_cross_attention(fused_calls, causal, mask, kv_heads):
    torch.manual_seed(1)
    layer = MultiHeadAttention(D, H, causal=causal, n_kv_heads=kv_heads).double()
    g = torch.Generator().manual_seed(2)
    x, context = torch.randn(B, 4, D, generator=g, dtype=torch.float64), \
        torch.randn(B, 6, D, generator=g, dtype=torch.float64)
    _agree(layer, fused_calls, [{"x": x, "context": context, "mask": _mask(mask, 4, 6, seed=3)}],
           torch.float64)


@pytest.mark.parametrize("pos", ["plain", "rope", "alibi"])
@pytest.mark.parametrize("cached", [False, True])
def test_fused_equals_explicit_float64_and_unbatched(fused_calls, pos, cached):
    torch.manual_seed(2)
    layer = MultiHeadAttention(D, H, causal=True, n_kv_heads=2, rope=pos == "rope",
                               alibi=pos == "alibi").double()
    g = torch.Generator().manual_seed(4)
    steps = [{"x": torch.randn(n, D, generator=g, dtype=torch.float64)} for n in ([5, 1] if cached else [6])]
    _agree(layer, fused_calls, steps, torch.float64)


def test_the_causal_flag_is_used_only_where_it_is_right(fused_calls):
    """torch's ``is_causal`` aligns the mask top-left: right for n = m, wrong after a cache."""
    layer = MultiHeadAttention(D, H, causal=True)
    x = torch.randn(1, 4, D)
    cache = {}
    layer(x, cache=cache)
    layer(x[:, :2], cache=cache)
    assert fused_calls == [True, False]


def test_weights_or_flop_counting_take_the_explicit_path(fused_calls):
    layer = MultiHeadAttention(D, H, causal=True, bias=False)
    x = torch.randn(B, 10, D)
    out, w = layer(x, return_weights=True)
    assert w.shape == (B, H, 10, 10) and fused_calls == []
    with FlopCounterMode(display=False) as counter:   # torch has no formula for the CPU kernel
        layer(x)
    assert fused_calls == []
    assert counter.get_total_flops() == 4 * 2 * B * 10 * D * D + 2 * (2 * B * 10 * 10 * D)
    torch.testing.assert_close(layer(x), out, atol=1e-6, rtol=1e-6)
    assert fused_calls == [True]


def test_torch_func_transforms_take_the_explicit_path(fused_calls):
    """torch.func (jacrev, vmap) has no batching rule for the fused kernel's backward: it would warn
    and fall back to a slow loop. The Jacobian is the explicit path's, checked by finite differences."""
    layer = MultiHeadAttention(D, H, causal=True).double()
    x = torch.randn(3, D, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jac = torch.func.jacrev(layer)(x)
    assert fused_calls == [] and jac.shape == (3, D, 3, D)
    eps, e = 1e-6, torch.zeros_like(x)
    e[1, 2] = eps
    torch.testing.assert_close(jac[..., 1, 2], (layer(x + e) - layer(x - e)) / (2 * eps), atol=1e-8, rtol=1e-6)


def test_a_transform_over_the_weights_takes_the_explicit_path_too(fused_calls):
    """The input need not be the transformed tensor: a Jacobian with respect to the weights
    (functional_call) is a torch.func transform as well, and must not warn."""
    layer = MultiHeadAttention(D, H, causal=True).double()
    x = torch.randn(3, D, dtype=torch.float64)
    params = dict(layer.named_parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jac = torch.func.jacrev(lambda p: torch.func.functional_call(layer, p, (x,)))(params)
    assert fused_calls == [] and jac["q_proj.weight"].shape == (3, D, D, D)
    assert layer(x).shape == (3, D) and fused_calls == [True]   # outside the transform: fused again


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi"])
def test_a_gpt_trains_the_same_on_either_path(positional):
    """Inside the whole model: logits and every parameter's gradient agree (float64)."""
    torch.manual_seed(3)
    model = GPT(ModelConfig(vocab_size=23, n_ctx=12, d_model=D, n_layers=2, n_heads=H, n_kv_heads=2,
                            positional=positional)).double()
    idx = torch.randint(0, 23, (B, 12), generator=torch.Generator().manual_seed(5))
    results = []
    for fused in (True, False):
        for m in model.modules():
            if isinstance(m, MultiHeadAttention):
                m.fused = fused
        loss = F.cross_entropy(model(idx).flatten(0, 1), idx.roll(-1, 1).flatten())
        results.append([loss.detach(), *torch.autograd.grad(loss, list(model.parameters()))])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


# ----------------------------------------------------------------------------- torch's private names
def test_torch_state_answers_and_falls_back_to_the_explicit_path(monkeypatch):
    """`_torch_state` says whether a dispatch mode or a torch.func transform is active; if torch
    moved or changed its private functions, it answers True and the layer attends explicitly:
    bit for bit the output of a layer built with fused=False."""
    from torch.utils.flop_counter import FlopCounterMode

    from transformer_lib import _torch_state

    assert not _torch_state.dispatch_mode_active() and not _torch_state.transform_active()
    with FlopCounterMode(display=False):
        assert _torch_state.dispatch_mode_active()
    seen = []
    torch.func.vmap(lambda t: seen.append(_torch_state.transform_active()) or t)(torch.ones(2, 3))
    assert seen == [True]
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, causal=True).eval()
    explicit = MultiHeadAttention(16, 4, causal=True, fused=False).eval()
    explicit.load_state_dict(layer.state_dict())
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(1))
    def forbidden(*args, **kwargs):
        raise AssertionError("the fused kernel was called")
    with torch.no_grad():
        want = explicit(x)
        for name in ("_get_current_dispatch_mode", "maybe_current_level"):
            for broken in (None, lambda: 1 / 0):
                with monkeypatch.context() as mp:
                    mp.setattr(_torch_state, name, broken)
                    assert _torch_state.dispatch_mode_active() or _torch_state.transform_active()
                    mp.setattr(F, "scaled_dot_product_attention", forbidden)
                    assert torch.equal(layer(x), want)
        torch.testing.assert_close(layer(x), want, atol=1e-6, rtol=0)   # the fused path again


PRIVATE = re.compile(r"\btorch\.(?:\w+\.)*_[A-Za-z]\w*")  # torch._C, torch.utils._pytree, torch._dynamo …


def test_only_torch_state_names_private_torch_modules():
    """Outside `transformer_lib/_torch_state.py` (and the grader, whose watch is about torch's
    internals), no module of the library names a private torch module: a torch release that moves
    one breaks a single small tested file, not the layers."""
    found = {}
    for path in sorted((REPO / "transformer_lib").rglob("*.py")):
        relative = path.relative_to(REPO / "transformer_lib").as_posix()
        if relative == "_torch_state.py" or relative.startswith("grading/"):
            continue
        code = [t.string for t in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
                if t.type not in (tokenize.COMMENT, tokenize.STRING)]
        names = PRIVATE.findall(re.sub(r"\s*\.\s*", ".", " ".join(code)))
        if names:
            found[relative] = sorted(set(names))
    assert found == {}
    assert PRIVATE.findall("from torch.utils._pytree import tree_leaves; torch._C._nn") == [
        "torch.utils._pytree", "torch._C._nn"]
    assert PRIVATE.findall("torch.nn.functional.softmax(x); torch.Tensor; torch.__version__") == []


def test_a_torch_without_the_dispatch_mode_gets_a_placeholder_that_names_it(monkeypatch):
    """Were torch to move ``TorchDispatchMode``, the library still imports, and measuring peak memory
    raises an error naming the missing class."""
    import torch.utils._python_dispatch as dispatch

    from transformer_lib import _torch_state

    try:
        monkeypatch.delattr(dispatch, "TorchDispatchMode")
        importlib.reload(_torch_state)
        with pytest.raises(RuntimeError, match="no torch.utils._python_dispatch.TorchDispatchMode"):
            _torch_state.DispatchMode()
    finally:
        monkeypatch.undo()
        importlib.reload(_torch_state)
    assert _torch_state.DispatchMode is dispatch.TorchDispatchMode


_EAGER = """
import sys, torch
from torch.utils._python_dispatch import TorchDispatchMode
{setup}
x = torch.randn(4, 4)
{use}
print("torch._dynamo" in sys.modules)
"""


@pytest.mark.parametrize("setup, use, imported", [
    ("from transformer_lib.memory import peak_memory", "peak_memory(torch.softmax, x, -1)", "False"),
    ("from transformer_lib.grading.checks import check_stable_softmax",
     "check_stable_softmax(lambda t, dim: (t - t.amax(dim, keepdim=True)).exp() / "
     "(t - t.amax(dim, keepdim=True)).exp().sum(dim, keepdim=True))", "False"),
    # the control: a mode of torch's own base class makes torch import its compiler on first use
    ("class Mode(TorchDispatchMode):\n    def __torch_dispatch__(self, f, t, a=(), k=None):\n"
     "        return f(*a, **(k or {}))", "with Mode():\n    x.exp()", "True"),
], ids=["peak_memory", "a graded check", "control"])
def test_the_library_s_dispatch_modes_do_not_import_torch_s_compiler(setup, use, imported):
    """`EagerDispatchMode` keeps torch from wrapping a mode in ``torch._disable_dynamo``, whose first call
    imports ``torch._dynamo`` (about 2 s, once in every graded kernel)."""
    done = subprocess.run([sys.executable, "-c", _EAGER.format(setup=setup, use=use)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == imported, done.stdout[-500:]
