"""Known-wrong solutions of the chapter 5 exercises, in the format of ``wrong.py`` (merged there)."""
from __future__ import annotations

import textwrap

_GQA_LOOP = """
d_k = W_Q.shape[1] // n_heads
group = n_heads // n_kv_heads
outputs, weights = [], []
for i in range(n_heads):
    j = {j}
    q_cols, kv_cols = slice(i * d_k, (i + 1) * d_k), slice(j * d_k, (j + 1) * d_k)
    Z_i, A_i = attention(X @ W_Q[:, q_cols], X @ W_K[:, kv_cols], X @ W_V[:, kv_cols])
    outputs.append(Z_i)
    weights.append(A_i)
return {out}, torch.stack(weights, dim=-3)
"""


_GQA_MHA = """
d, group = X.shape[-1], n_heads // n_kv_heads
d_k = d // n_heads
W_K_all = W_K.reshape(d, n_kv_heads, d_k).repeat_interleave(group, dim=1).reshape(d, d)
W_V_all = W_V.reshape(d, n_kv_heads, d_k).repeat_interleave(group, dim=1).reshape(d, d)
layer = torch.nn.MultiheadAttention(d, n_heads, bias=False, batch_first=True, dtype=X.dtype)
with torch.no_grad():
    layer.in_proj_weight.copy_(torch.cat([W_Q.T, W_K_all.T, W_V_all.T]))
    layer.out_proj.weight.copy_(W_O.T)
batch = X.reshape(-1, *X.shape[-2:])
out, weights = layer(batch, batch, batch, average_attn_weights=False)
n = X.shape[-2]
return out.reshape(X.shape), weights.reshape(*X.shape[:-2], n_heads, n, n)
"""


def _gqa(j: str = "i // group", out: str = "torch.cat(outputs, dim=-1) @ W_O") -> str:
    return _GQA_LOOP.format(j=j, out=out)


_CONTEXT = """
            per = {numbers} * {kv} * (d // h) * {size}
            filled = n_layers * window * per
            if {inside}:
                return {first}
            return window + {rest}
            """
_CONTEXT_RIGHT = dict(numbers="2", kv="n_kv", size="bytes_per_number", inside="budget_bytes < filled",
                      first="budget_bytes {div} (n_layers * per)", rest="(budget_bytes - filled) {div} (n_global * per)")


def _context(div: str = "//", **wrong: str) -> dict[str, str]:
    """5.3b's longest_context with one part written another way."""
    parts = {**_CONTEXT_RIGHT, **wrong}
    return {"gqa_counts#1": _CONTEXT.format(**{k: v.replace("{div}", div) for k, v in parts.items()})}


WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "05_multi_head_attention": {
        "split copies the heads with torch.stack of slices": ({"split_qkv": """
            *lead, n, width = fused.shape
            d_k = width // (n_heads + 2 * n_kv_heads)
            blocks = [fused[..., i * d_k:(i + 1) * d_k] for i in range(n_heads + 2 * n_kv_heads)]
            every_head = torch.stack(blocks, dim=-3)
            return (every_head[..., :n_heads, :, :], every_head[..., n_heads:n_heads + n_kv_heads, :, :],
                    every_head[..., n_heads + n_kv_heads:, :, :])
            """}, {"check_split_qkv"}, "are copies of the numbers, not a view of fused"),
        "split made contiguous": ({"split_qkv": """
            *lead, n, width = fused.shape
            d_k = width // (n_heads + 2 * n_kv_heads)
            every_head = fused.reshape(*lead, n, n_heads + 2 * n_kv_heads, d_k).transpose(-3, -2).contiguous()
            return (every_head[..., :n_heads, :, :], every_head[..., n_heads:n_heads + n_kv_heads, :, :],
                    every_head[..., n_heads + n_kv_heads:, :, :])
            """}, {"check_split_qkv"}, "torch.stack, torch.cat, clone and contiguous copy memory"),
        "split reshaped straight to (heads, n, d_k), no transpose": ({"split_qkv": """
            *lead, n, width = fused.shape
            d_k = width // (n_heads + 2 * n_kv_heads)
            q, k, v = fused.split([n_heads * d_k, n_kv_heads * d_k, n_kv_heads * d_k], dim=-1)
            return (q.reshape(*lead, n_heads, n, d_k), k.reshape(*lead, n_kv_heads, n, d_k),
                    v.reshape(*lead, n_kv_heads, n, d_k))
            """}, {"check_split_qkv"}, "reshaped straight to"),
        "split into (n, heads, d_k), the transpose forgotten": ({"split_qkv": """
            *lead, n, width = fused.shape
            d_k = width // (n_heads + 2 * n_kv_heads)
            every_head = fused.reshape(*lead, n, n_heads + 2 * n_kv_heads, d_k)
            return (every_head[..., :n_heads, :], every_head[..., n_heads:n_heads + n_kv_heads, :],
                    every_head[..., n_heads + n_kv_heads:, :])
            """}, {"check_split_qkv"}, "head axis comes before the token axis"),
        "split with keys and values swapped": ({"split_qkv": """
            *lead, n, width = fused.shape
            d_k = width // (n_heads + 2 * n_kv_heads)
            every_head = fused.reshape(*lead, n, n_heads + 2 * n_kv_heads, d_k).transpose(-3, -2)
            return (every_head[..., :n_heads, :, :], every_head[..., n_heads + n_kv_heads:, :, :],
                    every_head[..., n_heads:n_heads + n_kv_heads, :, :])
            """}, {"check_split_qkv"}, "k and v are swapped"),
        "split with as many key heads as query heads": ({"split_qkv": """
            *lead, n, width = fused.shape
            d_k = width // (n_heads + 2 * n_kv_heads)
            every_head = fused.reshape(*lead, n, n_heads + 2 * n_kv_heads, d_k).transpose(-3, -2)
            return (every_head[..., :n_heads, :, :], every_head[..., n_heads:2 * n_heads, :, :],
                    every_head[..., 2 * n_heads:, :, :])
            """}, {"check_split_qkv"}, "but only g = 2 key heads"),
        "split hard-coded to the visible four query heads": ({"split_qkv": """
            *lead, n, width = fused.shape
            d_k = width // (n_heads + 2 * n_kv_heads)
            every_head = fused.reshape(*lead, n, n_heads + 2 * n_kv_heads, d_k).transpose(-3, -2)
            return every_head[..., :4, :, :], every_head[..., 4:6, :, :], every_head[..., 6:, :, :]
            """}, {"check_split_qkv"}, "q has the wrong shape"),
        "split with the course library's split_heads": ({"split_qkv": """
            from transformer_lib.multihead import split_heads as library_split
            d_k = fused.shape[-1] // (n_heads + 2 * n_kv_heads)
            q, k, v = fused.split([n_heads * d_k, n_kv_heads * d_k, n_kv_heads * d_k], dim=-1)
            return library_split(q, n_heads), library_split(k, n_kv_heads), library_split(v, n_kv_heads)
            """}, {"check_split_qkv"}, "the course library (multihead.split_heads)"),
        "GQA cycles through the key heads (i mod g)": ({"gqa_attention": _gqa(j="i % n_kv_heads")},
                                                       {"check_gqa_attention"}, "cycles through the key heads"),
        "GQA with every query head on key head 0": ({"gqa_attention": _gqa(j="0")},
                                                    {"check_gqa_attention"}, "weights differ"),
        "GQA heads scaled by sqrt(d)": ({"gqa_attention": """
            d, d_k = X.shape[-1], W_Q.shape[1] // n_heads
            outputs, weights = [], []
            for i in range(n_heads):
                j = i // (n_heads // n_kv_heads)
                q = X @ W_Q[:, i * d_k:(i + 1) * d_k]
                k, v = X @ W_K[:, j * d_k:(j + 1) * d_k], X @ W_V[:, j * d_k:(j + 1) * d_k]
                A_i = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)
                outputs.append(A_i @ v)
                weights.append(A_i)
            return torch.cat(outputs, dim=-1) @ W_O, torch.stack(weights, dim=-3)
            """}, {"check_gqa_attention"}, "not by √d"),
        "GQA without W_O": ({"gqa_attention": _gqa(out="torch.cat(outputs, dim=-1)")},
                            {"check_gqa_attention"}, "missing W_O"),
        "GQA returning one pattern per key/value head": ({"gqa_attention": """
            d_k = W_Q.shape[1] // n_heads
            group = n_heads // n_kv_heads
            outputs, weights = [], []
            for i in range(n_heads):
                j = i // group
                Z_i, A_i = attention(X @ W_Q[:, i * d_k:(i + 1) * d_k], X @ W_K[:, j * d_k:(j + 1) * d_k],
                                     X @ W_V[:, j * d_k:(j + 1) * d_k])
                outputs.append(Z_i)
                if i % group == 0:
                    weights.append(A_i)
            return torch.cat(outputs, dim=-1) @ W_O, torch.stack(weights, dim=-3)
            """}, {"check_gqa_attention"}, "one per key/value head"),
        "GQA through nn.MultiheadAttention with the key/value weights repeated": ({"gqa_attention": _GQA_MHA},
                                                                                  {"check_gqa_attention"},
                                                                                  "multi_head_attention_forward"),
        "GQA through nn.MultiheadAttention, torch function modes switched off": ({"gqa_attention": (
            "d, group = X.shape[-1], n_heads // n_kv_heads\nd_k = d // n_heads\nwith torch._C.DisableTorchFunction():\n"
            + textwrap.indent(_GQA_MHA.split("d_k = d // n_heads\n", 1)[1], "    "))},
            {"check_gqa_attention"}, "multi_head_attention_forward"),
        "GQA through F.scaled_dot_product_attention(enable_gqa=True)": ({"gqa_attention": """
            *lead, n, d = X.shape
            d_k = d // n_heads
            q = (X @ W_Q).reshape(*lead, n, n_heads, d_k).transpose(-3, -2)
            k, v = ((X @ W).reshape(*lead, n, n_kv_heads, d_k).transpose(-3, -2) for W in (W_K, W_V))
            Z = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            group = n_heads // n_kv_heads
            A = torch.softmax(q @ k.repeat_interleave(group, dim=-3).transpose(-2, -1) / math.sqrt(d_k), -1)
            return Z.transpose(-3, -2).reshape(*lead, n, d) @ W_O, A
            """}, {"check_gqa_attention"}, "scaled_dot_product_attention"),
        "GQA from the course library": ({"gqa_attention": """
            from transformer_lib.multihead import MultiHeadAttention
            layer = MultiHeadAttention(X.shape[-1], n_heads, bias=False, n_kv_heads=n_kv_heads).to(X.dtype)
            with torch.no_grad():
                for lin, W in zip((layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj), (W_Q, W_K, W_V, W_O)):
                    lin.weight.copy_(W.T)
                return layer(X, return_weights=True)
            """}, {"check_gqa_attention"}, "the course library"),
        "GQA FLOPs counted as multi-head attention": ({"gqa_counts#0": """
            return 8 * n * d * d + 4 * n * n * d
            """}, {"check_gqa_flops"}, "that is multi-head attention"),
        "GQA FLOPs as multiply-adds": ({"gqa_counts#0": """
            d_k = d // h
            return 2 * n * d * d + 2 * n * d * n_kv * d_k + 2 * n * n * d
            """}, {"check_gqa_flops"}, "a multiply-add is 2 FLOPs"),
        "GQA FLOPs with scores for the key/value heads only": ({"gqa_counts#0": """
            d_k = d // h
            return 4 * n * d * d + 4 * n * d * n_kv * d_k + 4 * n * n * n_kv * d_k
            """}, {"check_gqa_flops"}, "every one of the h query heads"),
        "GQA FLOPs without the output projection": ({"gqa_counts#0": """
            d_k = d // h
            return 2 * n * d * d + 4 * n * d * n_kv * d_k + 4 * n * n * d
            """}, {"check_gqa_flops"}, "leaves out the output projection"),
        "GQA FLOPs hard-coded to the visible answer": ({"gqa_counts#0": """
            return 240_518_168_576
            """}, {"check_gqa_flops"}, "gqa_flops(100, 512, 8, 2): not right"),
        "GQA FLOPs measured by running a layer on the meta device": ({"gqa_counts#0": """
            from torch.utils.flop_counter import FlopCounterMode
            with torch.device("meta"), FlopCounterMode(display=False) as counter:
                X, d_k = torch.empty(n, d), d // h
                q = (X @ torch.empty(d, d)).reshape(n, h, d_k).transpose(0, 1)
                k, v = ((X @ torch.empty(d, n_kv * d_k)).reshape(n, n_kv, d_k).transpose(0, 1) for _ in "kv")
                k, v = k.repeat_interleave(h // n_kv, 0), v.repeat_interleave(h // n_kv, 0)
                z = torch.softmax(q @ k.transpose(-2, -1), -1) @ v
                z.transpose(0, 1).reshape(n, d) @ torch.empty(d, d)
            return counter.get_total_flops()
            """}, {"check_gqa_flops"}, "calls torch ("),
        "longest context: the one division of chapter 5's cache size (the copy that passed before)": (
            {"gqa_counts#1": """
            per_token = 2 * n_layers * n_kv * (d // h) * bytes_per_number
            return budget_bytes // per_token
            """}, {"check_longest_context"}, "keeps the last window tokens only"),
        "longest context without the values": (_context(numbers="1"), {"check_longest_context"}, "keys and values"),
        "longest context of a multi-head cache": (_context(kv="h"), {"check_longest_context"},
                                                  "only g key/value heads are cached"),
        "longest context with one byte a number": (_context(size="1"), {"check_longest_context"},
                                                   "the budget is in bytes"),
        "longest context with nothing cached in the sliding-window layers": ({"gqa_counts#1": """
            return budget_bytes // (n_global * 2 * n_kv * (d // h) * bytes_per_number)
            """}, {"check_longest_context"}, "still caches its last window tokens"),
        "longest context past the window even when the budget runs out inside it": (
            _context(inside="False"), {"check_longest_context"}, "before the window fills"),
        "longest context not rounded down": (_context(div="/"), {"check_longest_context"}, "must be a whole number"),
        "longest context rounded up": (_context(first="-(-budget_bytes // (n_layers * per))",
                                                rest="-(-(budget_bytes - filled) // (n_global * per))"),
                                       {"check_longest_context"}, "round down"),
        "longest context as a torch tensor": (_context(first="torch.tensor(budget_bytes) // (n_layers * per)"),
                                              {"check_longest_context"}, "calls torch (tensor)"),
    },
}
