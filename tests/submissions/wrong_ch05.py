"""Known-wrong solutions of the chapter 5 exercises, in the format of ``wrong.py`` (merged there)."""
from __future__ import annotations

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "05_multi_head_attention": {
        "split reshaped straight to (h, n, d_k), no transpose": ({"split_merge#0": """
            *lead, n, d = x.shape
            return x.reshape(*lead, n_heads, n, d // n_heads)
            """}, {"check_split_heads"}, "without the transpose"),
        "split into (n, h, d_k), the transpose forgotten": ({"split_merge#0": """
            *lead, n, d = x.shape
            return x.reshape(*lead, n, n_heads, d // n_heads)
            """}, {"check_split_heads"}, "head axis comes before the token axis"),
        "split takes every h-th column": ({"split_merge#0": """
            *lead, n, d = x.shape
            return x.reshape(*lead, n, d // n_heads, n_heads).movedim(-1, -3)
            """}, {"check_split_heads"}, "every h-th column"),
        "split from the course library": ({"split_merge#0": """
            from transformer_lib.multihead import split_heads as library_split_heads
            return library_split_heads(x, n_heads)
            """}, {"check_split_heads"}, "the course library (multihead.split_heads)"),
        "merge reshaped without transposing back": ({"split_merge#1": """
            *lead, h, n, d_k = x.shape
            return x.reshape(*lead, n, h * d_k)
            """}, {"check_merge_heads"}, "merged in the wrong order: reshaping"),
        "merge interleaves the heads": ({"split_merge#1": """
            *lead, h, n, d_k = x.shape
            return x.movedim(-3, -1).reshape(*lead, n, h * d_k)
            """}, {"check_merge_heads"}, "interleaved"),
        "heads scaled by sqrt(d) instead of sqrt(d_k)": ({"multi_head_attention": """
            d = X.shape[-1]
            d_k = d // n_heads
            heads, weights = [], []
            for i in range(n_heads):
                cols = slice(i * d_k, (i + 1) * d_k)
                A_i = torch.softmax(X @ W_Q[:, cols] @ (X @ W_K[:, cols]).transpose(-2, -1) / math.sqrt(d), -1)
                heads.append(A_i @ X @ W_V[:, cols])
                weights.append(A_i)
            return torch.cat(heads, dim=-1) @ W_O, torch.stack(weights, dim=-3)
            """}, {"check_multi_head_attention"}, "not by √d"),
        "multi-head attention without W_O": ({"multi_head_attention": """
            d_k = X.shape[-1] // n_heads
            heads, weights = [], []
            for i in range(n_heads):
                cols = slice(i * d_k, (i + 1) * d_k)
                Z_i, A_i = attention(X @ W_Q[:, cols], X @ W_K[:, cols], X @ W_V[:, cols])
                heads.append(Z_i)
                weights.append(A_i)
            return torch.cat(heads, dim=-1), torch.stack(weights, dim=-3)
            """}, {"check_multi_head_attention"}, "missing W_O"),
        "multi-head attention splitting without the transpose": ({"multi_head_attention": """
            *lead, n, d = X.shape
            q, k, v = (M.reshape(*lead, n_heads, n, d // n_heads) for M in (X @ W_Q, X @ W_K, X @ W_V))
            Z, A = attention(q, k, v)
            return Z.transpose(-3, -2).reshape(*lead, n, d) @ W_O, A
            """}, {"check_multi_head_attention"}, "mix tokens"),
        "multi-head attention returning averaged weights": ({"multi_head_attention": """
            d_k = X.shape[-1] // n_heads
            heads, weights = [], []
            for i in range(n_heads):
                cols = slice(i * d_k, (i + 1) * d_k)
                Z_i, A_i = attention(X @ W_Q[:, cols], X @ W_K[:, cols], X @ W_V[:, cols])
                heads.append(Z_i)
                weights.append(A_i)
            return torch.cat(heads, dim=-1) @ W_O, torch.stack(weights, dim=-3).mean(dim=-3)
            """}, {"check_multi_head_attention"}, "not their average"),
        "multi-head attention through nn.MultiheadAttention": ({"multi_head_attention": """
            layer = torch.nn.MultiheadAttention(X.shape[-1], n_heads, bias=False, batch_first=True,
                                                dtype=X.dtype)
            with torch.no_grad():
                layer.in_proj_weight.copy_(torch.cat([W_Q.T, W_K.T, W_V.T]))
                layer.out_proj.weight.copy_(W_O.T)
            return layer(X, X, X, average_attn_weights=False)
            """}, {"check_multi_head_attention"}, "multi_head_attention_forward"),
        "multi-head attention through nn.MultiheadAttention, torch function modes switched off": (
            {"multi_head_attention": """
            with torch._C.DisableTorchFunction():
                layer = torch.nn.MultiheadAttention(X.shape[-1], n_heads, bias=False, batch_first=True,
                                                    dtype=X.dtype)
                with torch.no_grad():
                    layer.in_proj_weight.copy_(torch.cat([W_Q.T, W_K.T, W_V.T]))
                    layer.out_proj.weight.copy_(W_O.T)
                return layer(X, X, X, average_attn_weights=False)
            """}, {"check_multi_head_attention"}, "multi_head_attention_forward"),
        "multi-head attention through F.scaled_dot_product_attention": ({"multi_head_attention": """
            *lead, n, d = X.shape
            q, k, v = (M.reshape(*lead, n, n_heads, d // n_heads).transpose(-3, -2)
                       for M in (X @ W_Q, X @ W_K, X @ W_V))
            Z = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            A = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // n_heads), -1)
            return Z.transpose(-3, -2).reshape(*lead, n, d) @ W_O, A
            """}, {"check_multi_head_attention"}, "scaled_dot_product_attention"),
        "multi-head attention from the course library": ({"multi_head_attention": """
            from transformer_lib.multihead import MultiHeadAttention
            layer = MultiHeadAttention(X.shape[-1], n_heads, bias=False).to(X.dtype)
            with torch.no_grad():
                for lin, W in zip((layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj), (W_Q, W_K, W_V, W_O)):
                    lin.weight.copy_(W.T)
                return layer(X, return_weights=True)
            """}, {"check_multi_head_attention"}, "the course library"),
        "a head counted at full width": ({"param_counts#0": """
            return 3 * d * d
            """}, {"check_params_per_head"}, "full-width head"),
        "h full-width heads": ({"param_counts#1": """
            return h * 4 * d * d
            """}, {"check_mha_params"}, "whatever h is"),
        "W_O left out": ({"param_counts#1": """
            return 3 * d * d
            """}, {"check_mha_params"}, "leaves out W_O"),
        "mha_params hard-coded to the visible answer": ({"param_counts#1": """
            return 1_048_576
            """}, {"check_mha_params"}, "a hidden test (other inputs) fails: mha_params(#, #)"),
        "mha_params by building a layer": ({"param_counts#1": """
            return sum(p.numel() for p in torch.nn.MultiheadAttention(d, h, bias=False).parameters())
            """}, {"check_mha_params"}, "calls torch (empty)"),
        "mha_params by building a layer, torch function modes switched off": ({"param_counts#1": """
            with torch._C.DisableTorchFunction():
                return sum(p.numel() for p in torch.nn.MultiheadAttention(d, h, bias=False).parameters())
            """}, {"check_mha_params"}, "calls torch (a layer's parameters)"),
        "GQA counted as MHA": ({"param_counts#2": """
            return 4 * d * d
            """}, {"check_gqa_params"}, "that is multi-head attention"),
        "GQA with the group size for n_kv": ({"param_counts#2": """
            return 2 * d * d + 2 * d * (h // n_kv) * (d // h)
            """}, {"check_gqa_params"}, "not the group size"),
        "mha_params as a torch tensor": ({"param_counts#1": """
            return torch.tensor(4 * d * d)
            """}, {"check_mha_params"}, "calls torch (tensor)"),
    },
}
