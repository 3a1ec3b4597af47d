"""Mutation testing of transformer_lib: do the library's tests notice realistic bugs?

Each mutant below is one realistic single-line bug (a wrong sign, a dropped factor, a mask
OR-ed instead of AND-ed, a forgotten call). For each one the script copies the library and
its tests to a temporary directory, applies the change there (the working tree is never
touched), runs the library's test files with ``-x`` and records whether some test failed
(killed) or all passed (survived). It prints every survivor and the kill rate, and exits 1
if any mutant survived that is not listed in ``EQUIVALENT`` (a change that cannot alter
behaviour, with the reason).

    python scripts/mutants.py               # every mutant, 2 at a time
    python scripts/mutants.py -k moe -j 1   # the mutants of one module (substring of the id)
    python scripts/mutants.py --list        # ids and descriptions only

Run by ``make mutants``, never by ``make test`` (a full run takes minutes). It is the fast,
curated first stage: each bug here is one a person could plausibly write, described in words,
and kept even where mutmut's mechanical operators (the second stage, configured in
``pyproject.toml``) would not produce it: a dropped call, a swapped pair of arguments, a mask
from the wrong side. ``--no-baseline`` skips the unmutated run when the tests just passed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
LIB = "transformer_lib"

# The library's own tests (not the grading system's, not the notebooks).
TEST_FILES = [
    "tests/lib/test_attention.py", "tests/lib/test_multihead.py", "tests/lib/test_positional.py",
    "tests/lib/test_block.py", "tests/lib/test_embedding.py", "tests/lib/test_model.py",
    "tests/lib/test_moe.py", "tests/lib/test_moe_model.py", "tests/lib/test_counting.py", "tests/lib/test_data_train.py",
    "tests/lib/test_viz.py", "tests/lib/test_checks.py", "tests/lib/test_stream.py", "tests/lib/test_tiled.py",
    "tests/lib/test_reference_models.py", "tests/lib/test_induction_task.py", "tests/lib/test_loading.py",
    "tests/lib/test_tokenizer.py", "tests/lib/test_wordpiece.py",
]
# The test file that exercises each module most directly runs first, so most mutants die fast.
FIRST = {
    "attention": "tests/lib/test_attention.py", "multihead": "tests/lib/test_multihead.py",
    "positional": "tests/lib/test_positional.py", "block": "tests/lib/test_block.py",
    "embedding": "tests/lib/test_embedding.py", "model": "tests/lib/test_model.py",
    "moe": "tests/lib/test_moe.py", "counting": "tests/lib/test_counting.py",
    "data": "tests/lib/test_data_train.py", "train": "tests/lib/test_data_train.py",
    "viz": "tests/lib/test_viz.py", "config": "tests/lib/test_counting.py",
    "tiled": "tests/lib/test_tiled.py", "memory": "tests/lib/test_tiled.py",
    "stream": "tests/lib/test_stream.py", "loading": "tests/lib/test_loading.py",
    "bpe": "tests/lib/test_tokenizer.py", "tokenizer": "tests/lib/test_tokenizer.py", "wordpiece": "tests/lib/test_wordpiece.py",
}


class Mutant(NamedTuple):
    module: str  # file stem under transformer_lib/
    old: str     # text that occurs exactly once in the module
    new: str
    what: str


M = Mutant
MUTANTS: list[Mutant] = [
    # ---------------------------------------------------------------- attention
    M("attention", "m = x.amax(dim=dim, keepdim=True)", "m = x.amin(dim=dim, keepdim=True)",
      "softmax subtracts the minimum instead of the maximum"),
    M("attention", "m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))", "pass",
      "softmax: fully masked rows give nan"),
    M("attention", "scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale",
      "scale = 1.0 / q.shape[-1] if scale is None else scale", "scale 1/d_k instead of 1/sqrt(d_k)"),
    M("attention", "scores = scores + bias", "scores = scores - bias", "bias subtracted"),
    M("attention", "scores = scores.masked_fill(~mask, float(\"-inf\"))",
      "scores = scores.masked_fill(mask, float(\"-inf\"))", "mask convention inverted"),
    M("attention", "return j <= i + (m - n)", "return j <= i", "causal mask top-left aligned"),
    M("attention", "return j <= i + (m - n)", "return j < i + (m - n)", "causal mask hides the diagonal"),
    M("attention", "Y, A = scaled_dot_product_attention(H, H, X, scale=scale)",
      "Y, A = scaled_dot_product_attention(H, H, H, scale=scale)", "metric attention averages H, not X"),
    M("attention", "Y, A = scaled_dot_product_attention(X @ W_q, X @ W_k, X, scale=scale)",
      "Y, A = scaled_dot_product_attention(X @ W_k, X @ W_q, X, scale=scale)", "query/key swapped"),
    # ---------------------------------------------------------------- multihead
    M("multihead", "mask = cm if mask is None else mask & cm", "mask = cm if mask is None else mask | cm",
      "user mask OR-ed with the causal mask"),
    M("multihead", "mask = cm if mask is None else mask & cm", "mask = cm if mask is None else mask",
      "causal mask dropped when a user mask is given"),
    M("multihead", "bias = alibi_bias_at(q_pos, k_pos, self.n_heads, dtype=q.dtype)",
      "bias = alibi_bias_at(q_pos, k_pos, self.n_heads, symmetric=False, dtype=q.dtype)",
      "one-sided ALiBi in a non-causal layer"),
    M("multihead", "k = apply_rope(k, positions[:, None], self.rope_base)", "k = apply_rope(k, positions[:, None])",
      "RoPE base ignored"),
    M("multihead", "positions = torch.arange(offset, offset + n, device=q.device).expand(b, n)",
      "positions = torch.arange(n, device=q.device).expand(b, n)", "RoPE positions ignore the cache offset"),
    M("multihead", "k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)",
      "k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)", "GQA: heads tiled instead of grouped"),
    M("multihead", "return x.reshape(*lead, n, n_heads, d // n_heads).transpose(-3, -2)",
      "return x.reshape(*lead, n_heads, n, d // n_heads)", "split_heads without the transpose"),
    M("multihead", "lin.bias.copy_(m.in_proj_bias[i * d:(i + 1) * d])",
      "lin.bias.copy_(m.in_proj_bias[:d])", "from_torch copies the query bias everywhere"),
    # ---------------------------------------------------------------- positional
    M("positional", "p[:, 0::2] = torch.sin(angle)", "p[:, 0::2] = torch.cos(angle)", "sinusoidal sin/cos swapped"),
    M("positional", "theta = rope_angles(_positions(positions, x.shape[:-1], x.device), x.shape[-1], base)",
      "theta = rope_angles(_positions(positions, x.shape[:-1], x.device), x.shape[-1])",
      "apply_rope ignores base"),
    M("positional", "y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin", "y1, y2 = x1 * cos + x2 * sin, x2 * cos - x1 * sin",
      "RoPE rotates the wrong way"),
    M("positional", "return torch.cat([-x[..., half:], x[..., :half]], dim=-1)",
      "return torch.cat([x[..., half:], -x[..., :half]], dim=-1)", "rotate_half sign"),
    M("positional", "slopes = geometric(p) + geometric(2 * p)[0::2][: n_heads - p]",
      "slopes = geometric(p) + geometric(2 * p)[1::2][: n_heads - p]", "ALiBi slopes for non-power-of-two heads"),
    M("positional", "return [2.0 ** (-8.0 * i / h) for i in range(1, h + 1)]",
      "return [2.0 ** (-8.0 * i / h) for i in range(h)]", "ALiBi slopes start at 1"),
    M("positional", "i = torch.arange(n, device=device) + (m - n)",
      "i = torch.arange(n, device=device)", "ALiBi not bottom-right aligned"),
    # ---------------------------------------------------------------- block
    M("block", "h = h * torch.rsqrt((h * h).mean(dim=-1, keepdim=True) + self.eps)",
      "h = h / (torch.sqrt((h * h).mean(dim=-1, keepdim=True)) + self.eps)",
      "RMSNorm with eps outside the root"),
    M("block", "return F.layer_norm(x, (self.d,), self.weight, self.bias, self.eps)",
      "return F.layer_norm(x, (self.d,), self.weight, self.bias, 1e-5)", "LayerNorm ignores its eps"),
    M("block", "return F.layer_norm(x, (self.d,), self.weight, self.bias, self.eps)",
      "return F.layer_norm(x, (self.d,), None, self.bias, self.eps)", "LayerNorm without its gain"),
    M("block", "h = F.silu(h) * self.fc3(x)", "h = F.gelu(h) * self.fc3(x)", "SwiGLU with GELU"),
    M("block", "h = F.gelu(h, approximate=\"tanh\")", "h = F.gelu(h)", "gelu_tanh is exact GELU"),
    M("block", "out = skip(x1) + m", "out = skip(x) + m", "pre-norm: second residual from x"),
    M("block", "x1 = self.norm1(skip(x) + a)", "x1 = skip(x) + self.norm1(a)", "post-norm normalises the write only"),
    M("block", "self.attn = MultiHeadAttention(d_model, n_heads, bias=bias, causal=causal,",
      "self.attn = MultiHeadAttention(d_model, n_heads, bias=bias, causal=False,", "block ignores causal"),
    # ---------------------------------------------------------------- embedding
    M("embedding", "return torch.exp(-0.5 * (u / bandwidth) ** 2)", "return torch.exp(-(u / bandwidth) ** 2)",
      "Gaussian kernel without the 1/2"),
    M("embedding", "weights = torch.softmax(-0.5 * (diff / bandwidth) ** 2, dim=-1)",
      "weights = torch.softmax(-0.5 * (diff / bandwidth) ** 2, dim=0)", "Nadaraya-Watson normalised over queries"),
    M("embedding", "return self.weight.to(x.dtype) @ x", "return self.weight.to(x.dtype).T @ x",
      "FixedMixing uses the transpose"),
    # ---------------------------------------------------------------- model
    M("model", "return self.emb_norm(x)", "return x", "embedding norm built but never applied"),
    M("model", "x = x + self.pos_enc[positions]", "x = x + 0", "sinusoidal positions never added"),
    M("model", "rope_base=c.rope_base, alibi=c.positional == \"alibi\",", "rope_base=c.rope_base, alibi=False,",
      "positional='alibi' silently ignored"),
    M("model", "n_kv_heads=c.n_kv_heads, rope=c.positional == \"rope\",", "n_kv_heads=c.n_kv_heads, rope=False,",
      "positional='rope' silently ignored"),
    M("model", "nn.init.normal_(module.weight, 0.0, std / math.sqrt(2 * self.config.n_layers)",
      "nn.init.normal_(module.weight, 0.0, std", "GPT-2's 1/sqrt(2L) residual scaling missing"),
    M("model", "positions = torch.arange(t, t + n, device=idx.device).expand(idx.shape[0], n)",
      "positions = torch.arange(n, device=idx.device).expand(idx.shape[0], n)",
      "positions ignore the cache offset"),
    M("model", "logits = logits.masked_fill(logits < kth, float(\"-inf\"))",
      "logits = logits.masked_fill(logits <= kth, float(\"-inf\"))", "top-k keeps k-1 tokens"),
    M("model", "self.norm_f = _make_norm(c) if c.final_norm else nn.Identity()", "self.norm_f = nn.Identity()",
      "final norm never built"),
    M("model", "logits = logits / temperature", "logits = logits * temperature", "temperature multiplies"),
    # ---------------------------------------------------------------- moe
    M("moe", "return math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts)",
      "return int(self.capacity_factor * n_tokens * self.top_k / self.n_experts)", "capacity rounded down"),
    M("moe", "\"tokens_per_expert\": one_hot.sum(dim=0),", "\"tokens_per_expert\": (one_hot * keep[:, None]).sum(dim=0),",
      "tokens_per_expert counts only kept assignments"),
    M("moe", "activation=block_kwargs.get(\"activation\", \"gelu\"), bias=block_kwargs.get(\"bias\", True), return_aux=False,",
      "activation=\"gelu\", bias=block_kwargs.get(\"bias\", True), return_aux=False,",
      "moe_block ignores the block's activation for its experts"),
    M("moe", "weights = top / top.sum(dim=-1, keepdim=True)", "weights = top", "top-k weights not renormalised"),
    M("moe", "expert_of = indices.T.reshape(-1)                                      # (k·T,)",
      "expert_of = indices.reshape(-1)", "assignment order token-major (wrong experts)"),
    M("moe", "f = counts / index.numel()", "f = counts / index.shape[0]", "balancing loss divides by T, not T·k"),
    M("moe", "return n_experts * (f * p).sum()", "return (f * p).sum()", "balancing loss without the factor E"),
    M("moe", "\"active\": router + self.top_k * per_expert,", "\"active\": self.top_k * per_expert,",
      "active parameters without the router"),
    # ---------------------------------------------------------------- counting
    M("counting", "return 2 * config.n_layers * n * config.kv_dim", "return config.n_layers * n * config.kv_dim",
      "KV cache without the factor 2"),
    M("counting", "return 2 * config.n_layers * n * config.kv_dim", "return 2 * config.n_layers * n * config.d_model",
      "KV cache with d_model instead of the grouped KV width"),
    M("counting", "\"attention_scores\": L * 2 * 2 * n * n * d,", "\"attention_scores\": L * 2 * n * n * d,",
      "attention FLOPs count one of QK^T and AV"),
    M("counting", "biases = (k - 1) * c.d_ff + c.d_model if c.bias else 0", "biases = k * c.d_ff if c.bias else 0",
      "MLP bias count"),
    M("counting", "n_norms = 2 * L + int(c.final_norm) + int(c.embedding_norm)", "n_norms = 2 * L + int(c.final_norm)",
      "embedding norm not counted"),
    M("counting", "\"positional\": c.n_ctx * d if c.positional == \"learned\" else 0,", "\"positional\": c.n_ctx * d,",
      "positions counted for every scheme"),
    # ---------------------------------------------------------------- data and training
    M("data", "start = torch.randint(0, ids.shape[0] - block, (batch,), generator=gen)",
      "start = torch.randint(0, ids.shape[0] - block + 1, (batch,), generator=gen)", "batch start off by one (past the end)"),
    M("data", "start = torch.randint(0, ids.shape[0] - block, (batch,), generator=gen)",
      "start = torch.randint(1, ids.shape[0] - block, (batch,), generator=gen)", "batch start never 0"),
    M("data", "targets[:, : m + 1] = IGNORE_INDEX", "targets[:, :m] = IGNORE_INDEX", "induction supervises the SEP->r0 step"),
    M("data", "torch.where(k < m, k, k - m)))", "torch.where(k < m, k, k - n)))", "induction gap fillers misplaced"),
    M("data", "start = max_gap - gap", "start = gap", "induction prefix and gap swapped"),
    M("data", "return _source_then_answer(s, s.flip(1))", "return _source_then_answer(s, s)", "reverse copies"),
    M("data", "return float(-(p * p.log()).sum())", "return float(-(p * p.log2()).sum())", "unigram loss in bits"),
    M("train", "loss_fn = loss_fn or cross_entropy_loss", "loss_fn = cross_entropy_loss", "train ignores a custom loss"),
    M("train", "nn.utils.clip_grad_norm_(params, grad_clip)", "pass", "train ignores grad_clip"),
    M("train", "total += float(cross_entropy_loss(logits, targets)) * count",
      "total += float(cross_entropy_loss(logits, targets)); count = 1.0", "evaluate_loss averages batch means"),
    M("train", "    model.eval()\n", "    pass\n", "evaluate_loss never switches to eval mode"),
    M("train", "opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)",
      "opt = torch.optim.AdamW(params, lr=lr, foreach=True)", "train ignores weight_decay"),
    # ---------------------------------------------------------------- viz
    M("viz", "return \"black\" if relative_luminance(rgba) > 0.179 else \"white\"",
      "return \"black\" if relative_luminance(rgba) > 0.5 else \"white\"", "annotation colour threshold"),
    # ---------------------------------------------------------------- more (appended: ids above stay stable)
    M("attention", "q, k, v = self.W_q(x), self.W_k(context), self.W_v(context)",
      "q, k, v = self.W_q(x), self.W_k(context), self.W_v(x)", "cross-attention values from x"),
    M("multihead", "return x.transpose(-3, -2).reshape(*lead, n, h * d_k)", "return x.reshape(*lead, n, h * d_k)",
      "merge_heads without the transpose"),
    M("multihead", "k = torch.cat([cache[\"k\"], k], dim=-2)", "k = torch.cat([k, cache[\"k\"]], dim=-2)",
      "new keys prepended to the cache"),
    M("multihead", "new.out_proj.bias.copy_(m.out_proj.bias)", "pass", "from_torch drops the output bias"),
    M("positional", "p[:, 1::2] = torch.cos(angle[:, : d // 2])", "p[:, 1::2] = torch.sin(angle[:, : d // 2])",
      "sinusoidal odd columns use sin"),
    M("positional", "if positions > self.n_ctx:", "if positions >= self.n_ctx:", "learned positions reject n = n_ctx"),
    M("positional", "emb = torch.cat([theta, theta], dim=-1)", "emb = theta.repeat_interleave(2, dim=-1)",
      "rope_cos_sin in the interleaved layout"),
    M("block", "self.norm1 = make_norm(norm, d_model, norm_eps, bias)", "self.norm1 = make_norm(norm, d_model, 1e-5, bias)",
      "block ignores norm_eps in its first norm"),
    M("model", "next_id = self._sample(logits[:, -1], temperature, top_k, generator)",
      "next_id = self._sample(logits[:, 0], temperature, top_k, generator)", "generate samples from the first position"),
    M("moe", "probs = F.softmax(self.gate(x.reshape(-1, self.d_model)), dim=-1)",
      "probs = F.softmax(self.gate(x.reshape(-1, self.d_model)), dim=0)", "router softmax over tokens"),
    M("moe", "slot = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1",
      "slot = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1)", "capacity slots counted from 1"),
    M("moe", "p = router_probs.mean(dim=0)", "p = router_probs.max(dim=0).values", "balancing loss with max probability"),
    M("data", "chars = sorted(set(text_or_alphabet))", "chars = list(dict.fromkeys(text_or_alphabet))",
      "tokenizer ids in order of appearance"),
    M("data", "targets[:, :n] = IGNORE_INDEX                                   # the source itself is random",
      "targets[:, :n - 1] = IGNORE_INDEX", "copy task supervises the last source token"),
    M("train", "    model.train(was_training)\n    return losses", "    return losses",
      "train leaves an eval model in train mode"),
    M("attention", "d_v = d_k if d_v is None else d_v", "d_v = d_model if d_v is None else d_v",
      "SelfAttention's d_v defaults to d_model"),
    M("block", "x1 = skip(x) + a", "x1 = skip(x) - a", "pre-norm subtracts the attention write"),
    M("config", "object.__setattr__(self, \"d_ff\", 4 * self.d_model)",
      "object.__setattr__(self, \"d_ff\", 2 * self.d_model)", "config's d_ff defaults to 2d"),
    M("config", "return self.n_kv_heads * self.d_head", "return self.n_heads * self.d_head",
      "kv_dim ignores the KV heads"),
    M("counting", "\"embedding\": (c.vocab_size + c.n_token_types) * d,", "\"embedding\": c.vocab_size * d,",
      "token-type embeddings not counted"),
    M("counting", "\"other\": d * d + (d if c.bias else 0) if c.pooler else 0,", "\"other\": d * d if c.pooler else 0,",
      "pooler bias not counted"),
    M("counting", "\"unembedding\": 2 * n * d * c.vocab_size if c.lm_head else 0,",
      "\"unembedding\": n * d * c.vocab_size if c.lm_head else 0,", "unembedding FLOPs without the factor 2"),
    M("data", "tokens = torch.rand(batch, vocab_size - 1, generator=gen).argsort(dim=1)[:, :m] + 1",
      "tokens = torch.rand(batch, vocab_size - 1, generator=gen).argsort(dim=1)[:, :m]", "distinct induction draws SEP"),
    M("model", "kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]",
      "kth = torch.topk(logits, top_k, dim=-1).values[:, :1]", "top-k keeps only the best token"),
    M("model", "logits = self(idx[:, -n_ctx:], cache=cache)", "logits = self(idx[:, -n_ctx + 1:], cache=cache)",
      "prefill drops a token of the window"),
    M("moe", "\"kept\": keep.reshape(self.top_k, n_tokens).T,", "\"kept\": keep.reshape(n_tokens, self.top_k),",
      "kept reshaped token-major"),
    M("moe", "return {\"total\": router + self.n_experts * per_expert,", "return {\"total\": self.n_experts * per_expert,",
      "total parameters without the router"),
    M("positional", "angle = pos / base ** (two_k / d)                                      # (n, ceil(d/2))",
      "angle = pos / base ** (two_k / (d - 1))", "sinusoidal exponent over d - 1"),
    M("positional", "symmetric: bool = True,\n    dtype: torch.dtype = torch.float32,\n    device",
      "symmetric: bool = False,\n    dtype: torch.dtype = torch.float32,\n    device", "ALiBi one-sided by default"),
    M("train", "return output[0] if isinstance(output, (tuple, list)) else output",
      "return output[-1] if isinstance(output, (tuple, list)) else output", "tuple outputs: last element as logits"),
    M("viz", "c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)",
      "c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.2)", "luminance gamma 2.2"),
    M("viz", "vmin = min(0.0, float(finite.min())) if (share_scale and finite.size) else None",
      "vmin = float(finite.min()) if (share_scale and finite.size) else None", "head grid colour scale not from 0"),
    M("block", "h = F.relu(h)", "h = F.gelu(h)", "relu MLP uses GELU"),
    M("multihead", "unbatched = x.ndim == 2", "unbatched = False", "unbatched input keeps a batch dim"),
    M("moe", "return torch.stack([m.last_aux[\"load_balancing_loss\"] for m in layers]).mean()",
      "return torch.stack([m.last_aux[\"load_balancing_loss\"] for m in layers]).sum()",
      "model balancing loss sums the layers"),
    M("counting", "experts = (c.top_k if active else c.n_experts) if c.moe else 1",
      "experts = c.n_experts if c.moe else 1", "active count keeps every expert"),
    M("counting", "parts[\"router\"] = L * c.n_experts * d", "parts[\"router\"] = L * c.top_k * d",
      "router counted for K experts"),
    M("counting", "\"mlp\": L * 2 * n * (c.top_k if c.moe else 1) * _mlp_matrices(c) * d * c.d_ff,",
      "\"mlp\": L * 2 * n * (c.n_experts if c.moe else 1) * _mlp_matrices(c) * d * c.d_ff,",
      "MoE FLOPs grow with E"),
    M("model", "writes = name.endswith((\"attn.out_proj\", \".fc2\"))",
      "writes = name.endswith((\"attn.out_proj\", \"mlp.fc2\"))",
      "expert down-projections miss the residual scaling"),
    M("model", "    if c.moe:\n        return moe_block(", "    if False:\n        return moe_block(",
      "GPT ignores n_experts"),
    # ---------------------------------------------------------------- tiled, memory, stream, loading
    M("tiled", "rescale = torch.exp(run_max - safe)", "rescale = torch.ones_like(run_max)",
      "online softmax never rescales the running sums"),
    M("tiled", "run_sum = run_sum * rescale + p.sum(dim=-1, keepdim=True)",
      "run_sum = run_sum + p.sum(dim=-1, keepdim=True)", "running sum not rescaled when the maximum grows"),
    M("tiled", "if causal and j1 - 1 > i0 + offset:", "if causal and j1 - 2 > i0 + offset:",
      "causal tile mask skipped when only the tile's last key lies ahead"),
    M("tiled", "last = min(m, i1 + offset) if causal else m", "last = min(m, i1 + offset - 1) if causal else m",
      "causal loop stops one key early"),
    M("tiled", "rule = j <= i + offset", "rule = j <= i", "tile mask ignores the offset (m > n)"),
    M("memory", "if key not in self.live:", "if True:", "a storage viewed twice is charged twice"),
    M("memory", "entry[1] -= 1", "entry[1] -= 2", "a view's release frees the storage early"),
    M("memory", "peak -= t.untyped_storage().nbytes()", "pass", "exclude_output ignored"),
    M("stream", "site = block.norm2 if block.norm_first else block.mlp", "site = block.norm2",
      "post-norm middle state read from norm2's input"),
    M("stream", "return model.lm_head(model.norm_f(state))", "return model.lm_head(state)",
      "logit lens skips the final norm"),
    M("stream", "return float(grad.norm() / g.norm())", "return float(grad.norm())",
      "input gradient norm not relative to the output gradient"),
    M("loading", "out[f\"{b}attn.{name}_proj.weight\"] = (key + \"weight\", wp.t())",
      "out[f\"{b}attn.{name}_proj.weight\"] = (key + \"weight\", wp)", "GPT-2 Conv1D weights not transposed"),
    M("loading", "for ours, theirs in ((\"norm1\", \"ln_1\"), (\"norm2\", \"ln_2\")):",
      "for ours, theirs in ((\"norm1\", \"ln_2\"), (\"norm2\", \"ln_1\")):", "GPT-2 layer norms swapped"),
    M("loading", "(\"mlp.fc1\", \"mlp.gate_proj\"), (\"mlp.fc3\", \"mlp.up_proj\"),",
      "(\"mlp.fc1\", \"mlp.up_proj\"), (\"mlp.fc3\", \"mlp.gate_proj\"),", "LLaMA gate and up swapped"),
    M("loading", "extra = sorted(k for k in sd if k not in used and not k.endswith(\"rotary_emb.inv_freq\"))",
      "extra = sorted(k for k in sd if k not in used)", "LLaMA loader rejects the stored inv_freq buffer"),
]

# Survivors that cannot change behaviour, keyed by description, with the reason.
EQUIVALENT: dict[str, str] = {}


def mutant_id(i: int, m: Mutant) -> str:
    return f"{i:02d}-{m.module}"


def apply(root: Path, m: Mutant) -> None:
    path = root / LIB / f"{m.module}.py"
    text = path.read_text()
    count = text.count(m.old)
    if count != 1:
        raise SystemExit(f"mutant {m.what!r}: expected its text once in {path.name}, found it {count} times")
    path.write_text(text.replace(m.old, m.new))


def run_one(i: int, m: Mutant | None, timeout: float) -> tuple[str, float]:
    """Copy, mutate (``m=None``: the unmutated baseline), test; return 'killed', 'survived' or
    'timeout' and the seconds taken."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        root = Path(tmp)
        shutil.copytree(REPO / LIB, root / LIB, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
        if m is None:
            m = Mutant("baseline", "", "", "no mutation")
        else:
            apply(root, m)
        first = FIRST.get(m.module)
        stages = ([[first]] if first else []) + [[f for f in TEST_FILES if f != first]]
        env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1"}
        t0 = time.monotonic()
        for files in stages:  # the module's own tests first: most mutants die there in seconds
            cmd = [sys.executable, "-m", "pytest", "-x", "-q", "--no-header", "-p", "no:cacheprovider", *files]
            try:
                r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                                   timeout=max(1.0, timeout - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                return "timeout", time.monotonic() - t0
            if r.returncode not in (0, 1):
                sys.stderr.write(f"[{mutant_id(i, m)}] pytest exit {r.returncode}:\n{r.stdout[-2000:]}\n")
            if r.returncode != 0:
                return "killed", time.monotonic() - t0
        return "survived", time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", action="append", default=[],
                    help="only mutants whose id or description contains this text (repeatable: any of them)")
    ap.add_argument("--skip", action="append", default=[],
                    help="leave out mutants whose id or description contains this text (repeatable)")
    ap.add_argument("-j", type=int, default=2, help="mutants tested in parallel (default 2)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutant (a timeout counts as killed)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the unmutated run (only when the tests were just seen to pass)")
    args = ap.parse_args()
    chosen = [(i, m) for i, m in enumerate(MUTANTS)
              if (not args.k or any(k in mutant_id(i, m) or k in m.what for k in args.k))
              and not any(k in mutant_id(i, m) or k in m.what for k in args.skip)]
    if args.list:
        for i, m in chosen:
            print(f"{mutant_id(i, m)}  {m.what}")
        return 0
    for i, m in chosen:  # fail early on a stale mutant, before any test runs
        text = (REPO / LIB / f"{m.module}.py").read_text()
        if text.count(m.old) != 1:
            raise SystemExit(f"{mutant_id(i, m)} {m.what!r}: its text is not in {m.module}.py exactly once")
    status, secs = ("survived", 0.0) if args.no_baseline else run_one(-1, None, args.timeout)
    print(f"baseline       {status:8s} {secs:6.1f}s  unmutated library", flush=True)
    if status != "survived":  # the tests must pass before mutants mean anything
        raise SystemExit("the library's tests fail (or time out) without any mutation: fix them first")
    results: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:
        futures = {pool.submit(run_one, i, m, args.timeout): (i, m) for i, m in chosen}
        for fut in as_completed(futures):
            i, m = futures[fut]
            status, secs = fut.result()
            results[mutant_id(i, m)] = status
            print(f"{mutant_id(i, m):14s} {status:8s} {secs:6.1f}s  {m.what}", flush=True)
    survivors = [(i, m) for i, m in chosen if results[mutant_id(i, m)] == "survived"]
    killed = len(chosen) - len(survivors)
    print(f"\n{killed}/{len(chosen)} mutants killed ({100 * killed / max(1, len(chosen)):.0f}%)")
    unexplained = [(i, m) for i, m in survivors if m.what not in EQUIVALENT]
    for i, m in survivors:
        why = EQUIVALENT.get(m.what, "NOT EXPLAINED: add a test that kills it")
        print(f"  survived {mutant_id(i, m)}: {m.what} -- {why}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
