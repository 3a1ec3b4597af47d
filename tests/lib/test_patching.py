"""`transformer_lib.patching` and `transformer_lib.attribution` against an independent
implementation: forward hooks on Hugging Face's `GPT2LMHeadModel` and `BertModel`, built from
configs with random weights (nothing downloaded) and loaded into a `GPT` and a `BertEncoder`
(Chapters 4, 5 and 7).

Every cached activation equals the one the hooks read from Hugging Face's modules; a patched
run (one head at some positions, one position of the stream, a whole layer, a pattern, a
function of the activation) gives the logits of Hugging Face's run patched by its hooks with
the values of its own clean run; the direct logit attributions add up to Hugging Face's logits
and each head's share equals the one computed from Hugging Face's activations. All in float32,
to 1e-5. Without patches a run gives the model's output bit for bit, in every architecture.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from transformers.models.bert import modeling_bert
from transformers.models.gpt2 import modeling_gpt2

from torch_helpers import error_message
from transformer_lib.attribution import direct_logit_attribution
from transformer_lib.bert import BertEncoder, bert_config
from transformer_lib.config import ModelConfig
from transformer_lib.model import GPT
from transformer_lib.multihead import MultiHeadAttention
from transformer_lib.patching import (Patch, activation_names, patch_each_head, recovered_fraction,
                                      run_with_cache, run_with_patch)

torch.set_num_threads(1)  # small models: one thread is faster than two competing ones

TOL = dict(atol=1e-5, rtol=0)
V, N, D, H, L = 50, 12, 32, 4, 2
DK = D // H


def _ids(seed: int, vocab: int = V, shape: tuple = (2, N)) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _jitter(hf):
    """Random biases and norm gains too, so that every tensor matters (activations of order 1,
    where float32 keeps 1e-5)."""
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return hf


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=L, n_embd=D, n_head=H, vocab_size=V, n_positions=16,
                                     resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                                     attn_implementation="eager")
    hf = _jitter(transformers.GPT2LMHeadModel(config).eval())
    ours = GPT.from_gpt2_state_dict(hf.state_dict(), ModelConfig(
        vocab_size=V, n_ctx=16, d_model=D, n_layers=L, n_heads=H, mlp="gelu_tanh")).eval()
    return hf, ours


@pytest.fixture(scope="module")
def bert():
    hfc = transformers.BertConfig(vocab_size=37, hidden_size=D, num_hidden_layers=L,
                                  num_attention_heads=H, intermediate_size=64,
                                  max_position_embeddings=20, layer_norm_eps=1e-12,
                                  attn_implementation="eager")
    torch.manual_seed(0)
    hf = _jitter(transformers.BertModel(hfc, add_pooling_layer=False).eval())
    return hf, BertEncoder.from_bert_state_dict(hf.state_dict(), bert_config(hfc, pooler=False)).eval()


# --------------------------------------------------------------------------- the hooks
def _heads(t: torch.Tensor) -> torch.Tensor:          # (b, n, d) -> (b, n, h, d_k)
    return t.view(*t.shape[:2], H, DK)


def gpt2_sites(hf) -> dict:
    """Our name -> (Hugging Face module, its input or output, to our layout, back)."""
    same = (lambda t: t, lambda t: t)
    sites = {}
    for l, blk in enumerate(hf.transformer.h):
        at = f"blocks.{l}."
        sites |= {at + "hook_resid_pre": (blk, "in", *same),
                  at + "attn.hook_z": (blk.attn.c_proj, "in", _heads, lambda t: t.flatten(2)),
                  at + "hook_attn_out": (blk.attn, "out", *same),
                  at + "attn.hook_pattern": (blk.attn, "weights", *same),
                  # no module outputs the state between the sub-layers: the attention's
                  # output plus the block's input, patched through the attention's output
                  at + "hook_resid_mid": (blk.attn, "mid", *same),
                  at + "hook_mlp_out": (blk.mlp, "out", *same),
                  at + "hook_resid_post": (blk, "out", *same)}
    return sites


def bert_sites(hf) -> dict:
    same = (lambda t: t, lambda t: t)
    sites = {}
    for l, layer in enumerate(hf.encoder.layer):
        at, attn = f"blocks.{l}.", layer.attention
        sites |= {at + "hook_resid_pre": (layer, "in", *same),
                  at + "attn.hook_z": (attn.output.dense, "in", _heads, lambda t: t.flatten(2)),
                  at + "hook_attn_out": (attn.output.dense, "out", *same),
                  at + "attn.hook_pattern": (attn.self, "weights", *same),
                  at + "hook_resid_mid": (attn.output, "out", *same),
                  at + "hook_mlp_out": (layer.output.dense, "out", *same),
                  at + "hook_resid_post": (layer, "out", *same)}
    return sites


def hooked_run(hf, sites: dict, run, patches: dict | None = None, monkeypatch=None) -> tuple:
    """Run ``run()`` with forward hooks that record every site (in our layout) and replace the
    patched ones: ``patches[name]`` maps our-layout activation -> new activation. A pattern is
    replaced inside Hugging Face's eager attention (the product with the values redone); GPT-2's
    state between the sub-layers, by the attention output that gives it."""
    patches, seen, handles = patches or {}, {}, []

    def hook(name, where, to_ours, to_theirs):
        def pre(module, args, kwargs):
            t = args[0] if args else kwargs["hidden_states"]
            seen[name] = ours = patches.get(name, lambda a: a)(to_ours(t))
            if name in patches:
                t = to_theirs(ours)
                args, kwargs = ((t, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": t})
            return args, kwargs

        def post(module, args, output):
            index = 1 if where == "weights" else 0
            t = output[index] if isinstance(output, tuple) else output
            if where == "mid":                  # the block's input, read by its pre-hook
                resid = seen[name.replace("hook_resid_mid", "hook_resid_pre")]
                seen[name] = ours = patches.get(name, lambda a: a)(resid + t)
                return (ours - resid, *output[1:])
            seen[name] = ours = to_ours(t)
            if name in patches and where == "out":
                ours = seen[name] = patches[name](ours)
                return (to_theirs(ours), *output[1:]) if isinstance(output, tuple) else to_theirs(ours)
            return output
        return pre, post

    for name, (module, where, to_ours, to_theirs) in sites.items():
        pre, post = hook(name, where, to_ours, to_theirs)
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True) if where == "in"
                       else module.register_forward_hook(post))
    for modeling in (modeling_gpt2, modeling_bert):
        original = modeling.eager_attention_forward

        def eager(module, query, key, value, *args, _original=original, **kwargs):
            for what, t in (("q", query), ("k", key), ("v", value)):   # (b, h, n, d_k) -> ours
                seen[f"blocks.{module.layer_idx}.attn.hook_{what}"] = t.transpose(1, 2)
            out, w = _original(module, query, key, value, *args, **kwargs)
            name = f"blocks.{module.layer_idx}.attn.hook_pattern"
            if name not in patches:
                return out, w
            w = patches[name](w)
            return (w @ value).transpose(1, 2).contiguous(), w
        monkeypatch.setattr(modeling, "eager_attention_forward", eager)
    try:
        with torch.no_grad():
            return run(), seen
    finally:
        for handle in handles:
            handle.remove()


def _both(hf, ours, idx, monkeypatch):
    """Hugging Face's logits and hooked activations, and our output and cache, on ``idx``."""
    logits, seen = hooked_run(hf, gpt2_sites(hf), lambda: hf(idx).logits, monkeypatch=monkeypatch)
    with torch.no_grad():
        out, cache = run_with_cache(ours, idx)
    return logits, seen, out, cache


# --------------------------------------------------------------------------- GPT-2
def test_gpt_cache_equals_hugging_face_hooks(gpt2, monkeypatch):
    hf, ours = gpt2
    logits, seen, out, cache = _both(hf, ours, _ids(1), monkeypatch)
    torch.testing.assert_close(out, logits, **TOL)
    assert set(cache) == set(activation_names(ours)) == set(seen) | {
        f"blocks.{l}.attn.hook_{what}" for l in range(L) for what in ("result", "scores")}
    for l in range(L):   # the scores: what the softmax turns into Hugging Face's pattern
        scores = cache[f"blocks.{l}.attn.hook_scores"]
        torch.testing.assert_close(scores.softmax(-1), seen[f"blocks.{l}.attn.hook_pattern"], **TOL)
        assert bool(torch.isneginf(scores[..., 0, 1:]).all()) and bool(torch.isfinite(scores[..., -1, :]).all())
    for name, act in seen.items():
        torch.testing.assert_close(cache[name], act, **TOL, msg=name)
    for l, blk in enumerate(hf.transformer.h):       # each head's write: z_h @ its rows of c_proj
        w = blk.attn.c_proj.weight.view(H, DK, D)                  # Conv1D: (in, out)
        result = torch.stack([seen[f"blocks.{l}.attn.hook_z"][:, :, h] @ w[h] for h in range(H)], 2)
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_result"], result, **TOL)
        torch.testing.assert_close(result.sum(2) + blk.attn.c_proj.bias,
                                   seen[f"blocks.{l}.hook_attn_out"], **TOL)


def _set(positions=None, heads=None, axes=(1, 2)):
    """A patch for the hooks, written with plain indexing: from ``source``, copy each chosen
    position (of axis ``axes[0]``) of each chosen head (of axis ``axes[1]``)."""
    def make(source):
        def patch(act, name=None):
            out = act.clone()
            every = range(act.shape[axes[0]])
            chosen = every if positions is None else every[positions] if isinstance(positions, slice) \
                else positions
            for p in chosen:
                for h in [None] if heads is None else heads if isinstance(heads, list) else [heads]:
                    index = [slice(None)] * act.ndim
                    index[axes[0]] = p
                    if h is not None:
                        index[axes[1]] = h
                    out[tuple(index)] = source[tuple(index)]
            return out
        return patch
    return make


# (our name, our patch from the clean cache, the hooks' name, the hooks' patch from their clean run)
CASES = {
    "one head at three positions": (
        "blocks.0.attn.hook_z", lambda c: Patch(c, positions=[5, 6, 7], heads=1),
        "blocks.0.attn.hook_z", _set([5, 6, 7], 1)),
    "one head's write (result) at three positions": (
        "blocks.0.attn.hook_result", lambda c: Patch(c, positions=[5, 6, 7], heads=1),
        "blocks.0.attn.hook_z", _set([5, 6, 7], 1)),
    "two heads at a slice of positions": (
        "blocks.1.attn.hook_z", lambda c: Patch(c, positions=slice(4, 9), heads=[0, 3]),
        "blocks.1.attn.hook_z", _set(slice(4, 9), [0, 3])),
    "one position of the stream": (
        "blocks.1.hook_resid_pre", lambda c: Patch(c, positions=3),
        "blocks.1.hook_resid_pre", _set([3])),
    "the stream between the sub-layers at two positions": (
        "blocks.0.hook_resid_mid", lambda c: Patch(c, positions=[2, 9]),
        "blocks.0.hook_resid_mid", _set([2, 9])),
    "a whole attention layer": (
        "blocks.0.hook_attn_out", lambda c: c, "blocks.0.hook_attn_out", _set()),
    "a whole MLP layer": (
        "blocks.1.hook_mlp_out", lambda c: c, "blocks.1.hook_mlp_out", _set()),
    "one head's pattern at two query positions": (
        "blocks.1.attn.hook_pattern", lambda c: Patch(c, positions=[8, 10], heads=2),
        "blocks.1.attn.hook_pattern", _set([8, 10], 2, axes=(2, 1))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gpt_patches_equal_hugging_face_hooks(gpt2, monkeypatch, case):
    hf, ours = gpt2
    name, ours_patch, hf_name, hf_patch = CASES[case]
    clean, corrupt = _ids(2), _ids(3)
    sites = gpt2_sites(hf)
    _, hf_clean = hooked_run(hf, sites, lambda: hf(clean).logits, monkeypatch=monkeypatch)
    expected, _ = hooked_run(hf, sites, lambda: hf(corrupt).logits,
                             {hf_name: hf_patch(hf_clean[hf_name])}, monkeypatch=monkeypatch)
    with torch.no_grad():
        _, cache = run_with_cache(ours, clean)
        got = run_with_patch(ours, corrupt, {name: ours_patch(cache[name])})
        plain = ours(corrupt)
    torch.testing.assert_close(got, expected, **TOL)
    assert (got - plain).abs().max() > 1e-2                 # the patch changed the logits


def test_gpt_function_patch_equals_hugging_face_hooks(gpt2, monkeypatch):
    """Zero-ablating head 2 of layer 0, as a function of the activation."""
    hf, ours = gpt2
    idx = _ids(4)

    def ablate(z, name=None):
        z = z.clone()
        z[:, :, 2] = 0
        return z
    expected, _ = hooked_run(hf, gpt2_sites(hf), lambda: hf(idx).logits,
                             {"blocks.0.attn.hook_z": ablate}, monkeypatch=monkeypatch)
    with torch.no_grad():
        got = run_with_patch(ours, idx, {"blocks.0.attn.hook_z": ablate})
    torch.testing.assert_close(got, expected, **TOL)
    assert (got - ours(idx)).abs().max() > 1e-2


def test_patch_each_head_equals_hugging_face_hooks(gpt2, monkeypatch):
    hf, ours = gpt2
    clean, corrupt = _ids(5), _ids(6)
    _, hf_clean = hooked_run(hf, gpt2_sites(hf), lambda: hf(clean).logits, monkeypatch=monkeypatch)
    with torch.no_grad():
        _, cache = run_with_cache(ours, clean)
        got = patch_each_head(ours, corrupt, cache, lambda logits, _: logits[0, -1, 7],
                              positions=[10, 11])
    expected = torch.empty(L, H, dtype=torch.float64)
    for l in range(L):
        for h in range(H):
            name = f"blocks.{l}.attn.hook_z"
            logits, _ = hooked_run(hf, gpt2_sites(hf), lambda: hf(corrupt).logits,
                                   {name: _set([10, 11], h)(hf_clean[name])}, monkeypatch=monkeypatch)
            expected[l, h] = float(logits[0, -1, 7])
    torch.testing.assert_close(got, expected, **TOL)
    assert got.std() > 1e-3                                  # the heads differ
    with torch.no_grad():                                    # a metric of the patched run's cache
        z_norm = patch_each_head(ours, corrupt, cache, lambda _, c: c["blocks.1.attn.hook_z"].norm(),
                                 layers=[1])
        _, own = run_with_cache(ours, corrupt)
    assert z_norm.shape == (1, H)
    for h in range(H):          # layer 1's outputs in the corrupted run, head h's from the clean one
        expected = own["blocks.1.attn.hook_z"].clone()
        expected[:, :, h] = cache["blocks.1.attn.hook_z"][:, :, h]
        assert z_norm[0, h] == pytest.approx(float(expected.norm()), abs=1e-5)


def test_direct_logit_attribution_sums_to_hugging_face_logits(gpt2, monkeypatch):
    hf, ours = gpt2
    logits, seen, _, cache = _both(hf, ours, _ids(7), monkeypatch)
    tokens = _ids(8, shape=(2, N))                           # any tokens, not only the argmax
    with torch.no_grad():
        att = direct_logit_attribution(cache, ours, tokens)
    expected = logits.gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(att.values.sum(0), expected, **TOL)
    assert att.values.shape == (len(att.labels), 2, N)
    # each head's share, from Hugging Face's activations: the final norm with its scale frozen
    final = seen[f"blocks.{L - 1}.hook_resid_post"]
    sigma = torch.sqrt(final.var(-1, unbiased=False, keepdim=True) + hf.transformer.ln_f.eps)
    w_u = hf.lm_head.weight[tokens]                                           # (b, n, d)
    for l, blk in enumerate(hf.transformer.h):
        w = blk.attn.c_proj.weight.view(H, DK, D)
        for h in range(H):
            write = seen[f"blocks.{l}.attn.hook_z"][:, :, h] @ w[h]
            share = ((write - write.mean(-1, keepdim=True)) / sigma * hf.transformer.ln_f.weight
                     * w_u).sum(-1)
            torch.testing.assert_close(att.values[att.labels.index(f"L{l}H{h}")], share, **TOL)


@pytest.mark.parametrize("extra", [dict(norm="rmsnorm", mlp="swiglu", positional="rope", bias=False,
                                        n_kv_heads=2), dict(final_norm=False, positional="alibi")])
def test_direct_logit_attribution_sums_to_the_logits_in_other_layouts(extra):
    torch.manual_seed(0)
    model = _jitter(GPT(ModelConfig(vocab_size=V, n_ctx=16, d_model=D, n_layers=L, n_heads=H,
                                    **extra)).eval())
    idx = _ids(9)
    with torch.no_grad():
        logits, cache = run_with_cache(model, idx)
        att = direct_logit_attribution(cache, model, logits.argmax(-1))
    torch.testing.assert_close(att.values.sum(0), logits.max(-1).values, **TOL)
    assert ("L0 b_O" in att.labels) == model.config.bias
    assert ("norm_f bias" in att.labels) == (model.config.final_norm and model.config.bias
                                             and model.config.norm == "layernorm")


# --------------------------------------------------------------------------- BERT
def test_bert_cache_and_patches_equal_hugging_face_hooks(bert, monkeypatch):
    hf, ours = bert
    clean, corrupt = _ids(10, 37, (2, 9)), _ids(11, 37, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0                                                # a padded row
    sites = bert_sites(hf)
    hidden, hf_clean = hooked_run(hf, sites, lambda: hf(clean, attention_mask=mask).last_hidden_state,
                                  monkeypatch=monkeypatch)
    with torch.no_grad():
        out, cache = run_with_cache(ours, clean, attention_mask=mask)
    torch.testing.assert_close(out, hidden, **TOL)
    for name, act in hf_clean.items():
        torch.testing.assert_close(cache[name], act, **TOL, msg=name)
    patches = {"blocks.0.attn.hook_z": (lambda c: Patch(c, positions=[3, 4], heads=2), _set([3, 4], 2)),
               "blocks.1.hook_resid_pre": (lambda c: Patch(c, positions=5), _set([5])),
               "blocks.0.hook_mlp_out": (lambda c: c, _set()),
               "blocks.1.attn.hook_pattern": (lambda c: Patch(c, positions=2, heads=[1, 3]),
                                              _set([2], [1, 3], axes=(2, 1)))}
    for name, (ours_patch, hf_patch) in patches.items():
        expected, _ = hooked_run(hf, sites, lambda: hf(corrupt, attention_mask=mask).last_hidden_state,
                                 {name: hf_patch(hf_clean[name])}, monkeypatch=monkeypatch)
        with torch.no_grad():
            got = run_with_patch(ours, corrupt, {name: ours_patch(cache[name])}, attention_mask=mask)
            plain = ours(corrupt, mask).last
        torch.testing.assert_close(got, expected, **TOL, msg=name)
        assert (got - plain).abs().max() > 1e-2, name


# --------------------------------------------------------------------------- the model's own pass
@pytest.mark.parametrize("extra", [dict(), dict(positional="rope", norm="rmsnorm", mlp="swiglu",
                                                 n_kv_heads=2, bias=False),
                                   dict(positional="alibi", norm_first=False),
                                   dict(positional="sinusoidal", embedding_norm=True),
                                   dict(n_experts=4, top_k=2)])
@pytest.mark.parametrize("residual", [True, False])
def test_unpatched_runs_give_the_model_output_bit_for_bit(extra, residual):
    """A run that caches everything reads q, k, v and the pattern, so every layer attends
    explicitly: bit for bit the model built with ``fused=False``; a run without hooks is the
    model's default, fused pass, bit for bit."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=V, n_ctx=16, d_model=D, n_layers=L, n_heads=H, **extra),
                residual=residual).eval()
    idx = _ids(12)
    explicit = GPT(dataclasses.replace(model.config, fused=False), residual=residual).eval()
    explicit.load_state_dict(model.state_dict())
    with torch.no_grad():
        fused = model(idx)
        expected = explicit(idx)
        torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-5)
        out, cache = run_with_cache(model, idx)     # hooks on q, k, v, pattern: the explicit path
        assert torch.equal(out, expected) and torch.equal(run_with_patch(model, idx, {}), fused)
        assert torch.equal(cache[f"blocks.{L - 1}.hook_resid_post"],
                           explicit(idx, return_stream=True)[1].states[-1])


def test_runs_go_through_the_models_own_forward(monkeypatch):
    """One call of the model's forward per run, one of each block's and each attention's: the
    runs hold no copy of the block or of attention. A hook on q, k, v, the scores or the
    pattern takes that layer off the fused kernel; one on z, the result or the stream does not."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=V, n_ctx=16, d_model=D, n_layers=L, n_heads=H)).eval()
    calls = {"GPT": 0, "block": 0, "attention": 0, "fused kernel": 0}

    def counted(key, original):
        def call(*args, **kwargs):
            calls[key] += 1
            return original(*args, **kwargs)
        return call
    monkeypatch.setattr(GPT, "forward", counted("GPT", GPT.forward))
    monkeypatch.setattr(type(model.blocks[0]), "forward", counted("block", type(model.blocks[0]).forward))
    monkeypatch.setattr(MultiHeadAttention, "forward", counted("attention", MultiHeadAttention.forward))
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        counted("fused kernel", torch.nn.functional.scaled_dot_product_attention))
    idx = _ids(12)
    with torch.no_grad():
        _, cache = run_with_cache(model, idx)
        assert calls == {"GPT": 1, "block": L, "attention": L, "fused kernel": 0}
        run_with_patch(model, idx, {"blocks.0.attn.hook_z": cache["blocks.0.attn.hook_z"]})
        assert calls == {"GPT": 2, "block": 2 * L, "attention": 2 * L, "fused kernel": L}
        for what in ("q", "k", "v", "scores", "pattern"):
            before = calls["fused kernel"]
            run_with_cache(model, idx, names=[f"blocks.1.attn.hook_{what}"])
            assert calls["fused kernel"] == before + 1, what      # only layer 0 fused
    assert not any(m._forward_hooks for m in model.modules())  # nothing left behind


def test_names_filter_and_the_patch_function_receives_the_name():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=V, n_ctx=16, d_model=D, n_layers=L, n_heads=H)).eval()
    idx, seen = _ids(12), []

    def halve(act, name):
        seen.append(name)
        return act / 2
    with torch.no_grad():
        _, some = run_with_cache(model, idx, names=["blocks.1.hook_mlp_out"])
        _, by_fn = run_with_cache(model, idx, names=lambda name: name.endswith("hook_resid_post"))
        _, full = run_with_cache(model, idx, names=lambda name: "hook_attn" not in name and ".attn." not in name)
        _, patched = run_with_cache(model, idx, {"blocks.0.hook_mlp_out": halve},
                                    names=["blocks.0.hook_mlp_out", "blocks.0.hook_resid_post"])
    assert list(some) == ["blocks.1.hook_mlp_out"] and list(by_fn) == [f"blocks.{l}.hook_resid_post" for l in range(L)]
    assert seen == ["blocks.0.hook_mlp_out"]
    torch.testing.assert_close(patched["blocks.0.hook_mlp_out"], full["blocks.0.hook_mlp_out"] / 2, atol=0, rtol=0)
    torch.testing.assert_close(patched["blocks.0.hook_resid_post"],
                               full["blocks.0.hook_resid_mid"] + full["blocks.0.hook_mlp_out"] / 2, atol=0, rtol=0)


class _AttentionOnly(torch.nn.Module):
    """A model of one's own: attention layers adding to a stream, no blocks (as in Chapter 7)."""

    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(V, D)
        self.attn = torch.nn.ModuleList(MultiHeadAttention(D, H, causal=True) for _ in range(L))

    def forward(self, x):
        h = self.tok(x)
        for layer in self.attn:
            h = h + layer(h)
        return h


def test_a_model_of_ones_own_is_patched_by_the_names_of_its_layers():
    """Patching one head's z of a model that is not a GPT, against a hand-written hook on the
    input of W_O (where the heads sit side by side, d_k columns each)."""
    torch.manual_seed(0)
    model = _AttentionOnly().eval()
    clean, corrupt = _ids(12), _ids(13)
    with torch.no_grad():
        _, cache = run_with_cache(model, clean)
        got = run_with_patch(model, corrupt, {"attn.0.hook_z": Patch(cache["attn.0.hook_z"], positions=[3, 5], heads=1)})
        source = cache["attn.0.hook_z"].flatten(2)

        def swap(module, args):
            z = args[0].clone()
            z[:, [3, 5], DK:2 * DK] = source[:, [3, 5], DK:2 * DK]
            return (z,)
        handle = model.attn[0].out_proj.register_forward_pre_hook(swap)
        expected = model(corrupt)
        handle.remove()
    assert "attn.1.hook_pattern" in cache and "attn.0.hook_q" in cache
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert (got - model(corrupt)).abs().max() > 1e-3


def test_recovered_fraction():
    assert recovered_fraction(2.0, 4.0, 2.0) == 1 and recovered_fraction(2.0, 4.0, 4.0) == 0
    torch.testing.assert_close(recovered_fraction(torch.tensor([1.0, 0.0]), 3.0, 2.5),
                               torch.tensor([0.25, 1 / 6], dtype=torch.float64))


# --------------------------------------------------------------------------- errors
def test_errors_name_the_argument_the_expected_and_the_actual(gpt2, bert):
    _, gpt = gpt2
    idx = _ids(13)
    _, cache = run_with_cache(gpt, idx)
    z = cache["blocks.0.attn.hook_z"]
    cases = [
        (lambda: run_with_patch(gpt, idx, {"blocks.0.hook_z": z}),
         "patches: expected names of activation_names(model), such as 'blocks.0.attn.hook_z', "
         "got ['blocks.0.hook_z']"),
        (lambda: run_with_patch(gpt, idx, {"blocks.0.attn.hook_z": z[:1]}),
         "patches['blocks.0.attn.hook_z']: expected a tensor of shape (2, 12, 4, 8) and dtype "
         "torch.float32, got (1, 12, 4, 8) torch.float32"),
        (lambda: run_with_patch(gpt, idx, {"blocks.0.attn.hook_z": z.double()}),
         "patches['blocks.0.attn.hook_z']: expected a tensor of shape (2, 12, 4, 8) and dtype "
         "torch.float32, got (2, 12, 4, 8) torch.float64"),
        (lambda: run_with_patch(gpt, idx, {"blocks.0.attn.hook_z": Patch(z[:1], heads=0)}),
         "patches['blocks.0.attn.hook_z'].source: expected shape (2, 12, 4, 8), got (1, 12, 4, 8)"),
        (lambda: run_with_patch(gpt, idx, {"blocks.0.hook_mlp_out": Patch(z, heads=0)}),
         "patches['blocks.0.hook_mlp_out'].source: expected shape (2, 12, 32), got (2, 12, 4, 8)"),
        (lambda: run_with_patch(gpt, idx, {"blocks.0.hook_mlp_out": Patch(
            cache["blocks.0.hook_mlp_out"], heads=0)}),
         "patches['blocks.0.hook_mlp_out'].heads: expected None (blocks.0.hook_mlp_out has no head "
         "axis), got 0"),
        (lambda: run_with_patch(gpt, idx, {"blocks.0.attn.hook_z": Patch(z, positions=12)}),
         "patches['blocks.0.attn.hook_z'].positions: expected indices below 12 (an int, a list or "
         "a slice), got 12"),
        (lambda: run_with_patch(gpt, idx, {"blocks.0.attn.hook_z": Patch(z, heads=[4])}),
         "patches['blocks.0.attn.hook_z'].heads: expected indices below 4 (an int, a list or a "
         "slice), got [4]"),
        (lambda: run_with_patch(gpt, idx, {"blocks.0.attn.hook_z": 3.0}),
         "patches['blocks.0.attn.hook_z']: expected a tensor, a Patch or a function, got float"),
        (lambda: run_with_patch(gpt, idx, [("blocks.0.attn.hook_z", z)]),
         "patches: expected a dict, got list"),
        (lambda: run_with_cache(gpt, idx[0]), "idx: expected shape (batch, n), got (12,)"),
        (lambda: run_with_cache(gpt, idx, attention_mask=torch.ones_like(idx)),
         "attention_mask, token_type_ids: expected None for a GPT, got a tensor"),
        (lambda: run_with_cache(torch.nn.Linear(2, 2), idx),
         "model: expected a model with hook points (a GPT, a BertEncoder or one built from "
         "MultiHeadAttention layers), got Linear"),
        (lambda: run_with_cache(gpt, idx, names=["blocks.0.hook_z"]),
         "names: expected names of activation_names(model), got ['blocks.0.hook_z']"),
        (lambda: patch_each_head(gpt, idx, {}, float),
         "source: expected a cache with 'blocks.0.attn.hook_z' (from run_with_cache), got keys []"),
        (lambda: recovered_fraction(1.0, 1.0, 0.5),
         "clean, corrupted: expected metrics that differ (the fraction divides by clean − "
         "corrupted), got equal values"),
        (lambda: direct_logit_attribution(cache, gpt, idx[:, :5]),
         "token_ids: expected integer ids of shape (2, 12) (the cached batch), got (5,) "
         "torch.int64".replace("(5,)", "(2, 5)")),
        (lambda: direct_logit_attribution({}, gpt, idx),
         "cache: expected the cache of run_with_cache(model, …), missing "
         "['blocks.0.hook_resid_pre', 'blocks.1.hook_resid_post']"),
        (lambda: direct_logit_attribution(cache, bert[1], idx), "model: expected a GPT, got BertEncoder"),
        (lambda: direct_logit_attribution(cache, GPT(ModelConfig(vocab_size=V, n_ctx=16, d_model=D,
                                                                 n_layers=L, n_heads=H, norm_first=False)),
                                          idx),
         "model: expected a pre-norm GPT with residuals (the stream is then a sum of writes), got "
         "norm_first=False, residual=True"),
    ]
    for call, message in cases:
        assert error_message(call) == message
