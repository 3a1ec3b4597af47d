"""Known-wrong solutions of Exercises 10 (format of ``wrong.py``): the solution bodies substituted
(by grade_id), the checks that must catch them (and only those), a phrase of the first message."""
from __future__ import annotations

_CS = {"check_cross_section_attention"}
_SLIDING = {"check_sliding_window"}
_WINDOWS = """
    n, width = Q.shape[-2], 2 * w + 1
    keys = F.pad(K, (0, 0, w, w)).unfold(-2, width, 1)
    values = F.pad(V, (0, 0, w, w)).unfold(-2, width, 1)
    scores = (Q.unsqueeze(-1) * keys).sum(-2) / {scale}
    position = torch.arange(n)[:, None] + torch.arange(-w, w + 1)
    inside = {inside}
    weights = torch.softmax(scores.masked_fill(~inside, float("-inf")), dim=-1)
    return (values * weights.unsqueeze(-2)).sum(-1)
"""
_SQRT = "math.sqrt(Q.shape[-1])"
_INSIDE = "(position >= 0) & (position < n)"
_TOKENS = {"check_vit_tokens"}
_LINEAR = {"check_linear_attention"}

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "appendix_beyond_words": {
        "cross-section: keys and values from the targets": ({"cross_section_attention": """
    Q, K, V = X_t @ W_Q, X_t @ W_K, X_t @ W_V
    A = torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=-1)
    return A @ V, A
"""}, _CS, "reference firms X_r"),
        "cross-section: queries from the reference firms": ({"cross_section_attention": """
    Q, K, V = X_r @ W_Q, X_t @ W_K, X_t @ W_V
    A = torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=-1)
    return A @ V, A
"""}, _CS, "one row per reference firm"),
        "cross-section: no 1/sqrt(d_k)": ({"cross_section_attention": """
    Q, K, V = X_t @ W_Q, X_r @ W_K, X_r @ W_V
    A = torch.softmax(Q @ K.T, dim=-1)
    return A @ V, A
"""}, _CS, "√d_k"),
        "cross-section: softmax over the targets": ({"cross_section_attention": """
    Q, K, V = X_t @ W_Q, X_r @ W_K, X_r @ W_V
    A = torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=0)
    return A @ V, A
"""}, _CS, "columns of A sum to 1"),
        "cross-section: values are the raw features": ({"cross_section_attention": """
    Q, K = X_t @ W_Q, X_r @ W_K
    A = torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=-1)
    return A @ X_r, A
"""}, _CS, "the values are X_r W_V"),
        "cross-section: torch's fused attention": ({"cross_section_attention": """
    Q, K, V = X_t @ W_Q, X_r @ W_K, X_r @ W_V
    A = torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=-1)
    return F.scaled_dot_product_attention(Q, K, V), A
"""}, _CS, "scaled_dot_product_attention"),
        "cross-section: the course library": ({"cross_section_attention": """
    from transformer_lib.attention import scaled_dot_product_attention
    return scaled_dot_product_attention(X_t @ W_Q, X_r @ W_K, X_r @ W_V)
"""}, _CS, "the course library"),
        "tokens: [CLS] at the end": ({"vit_tokens": """
    embedded = patches @ W_E
    return torch.cat([embedded, cls.expand(patches.shape[0], 1, -1)], dim=1) + pos
"""}, _TOKENS, "[CLS] is at the end"),
        "tokens: positions added before [CLS]": ({"vit_tokens": """
    L = patches.shape[1]
    embedded = patches @ W_E + pos[:L]
    return torch.cat([cls.expand(patches.shape[0], 1, -1), embedded], dim=1)
"""}, _TOKENS, "positions were added before"),
        "tokens: [CLS] without a position": ({"vit_tokens": """
    embedded = patches @ W_E + pos[1:]
    return torch.cat([cls.expand(patches.shape[0], 1, -1), embedded], dim=1)
"""}, _TOKENS, "[CLS] got no position"),
        "tokens: no [CLS]": ({"vit_tokens": """
    return patches @ W_E + pos[1:]
"""}, _TOKENS, "no [CLS] token"),
        "sliding: the band mask on the full score matrix": ({"sliding_window": """
    i = torch.arange(Q.shape[-2])
    band = (i[:, None] - i[None, :]).abs() <= w
    scores = (Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])).masked_fill(~band, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V
"""}, _SLIDING, "n × n score matrix that a sliding window avoids"),
        "sliding: every query against every key, elementwise": ({"sliding_window": """
    i = torch.arange(Q.shape[-2])
    band = (i[:, None] - i[None, :]).abs() <= w
    scores = (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-1) / math.sqrt(Q.shape[-1])
    return torch.softmax(scores.masked_fill(~band, float("-inf")), dim=-1) @ V
"""}, _SLIDING, "builds a tensor of shape"),
        "sliding: a loop over the queries, each against every key": ({"sliding_window": """
    n = Q.shape[-2]
    rows = []
    for i in range(n):
        s = (Q[..., i:i + 1, :] @ K.transpose(-2, -1)) / math.sqrt(Q.shape[-1])   # (…, 1, n)
        far = (torch.arange(n) - i).abs() > w
        rows.append(torch.softmax(s.masked_fill(far, float("-inf")), dim=-1) @ V)
    return torch.cat(rows, dim=-2)
"""}, _SLIDING, "O(n·m) work"),
        "sliding: a one-sided window": ({"sliding_window": _WINDOWS.format(
            scale=_SQRT, inside=_INSIDE + " & (position <= torch.arange(n)[:, None])")}, _SLIDING, "two-sided"),
        "sliding: distance w left out": ({"sliding_window": _WINDOWS.format(
            scale=_SQRT, inside=_INSIDE + " & ((position - torch.arange(n)[:, None]).abs() < w)")},
            _SLIDING, "distance exactly w"),
        "sliding: the padding scored as zero keys": ({"sliding_window": _WINDOWS.format(
            scale=_SQRT, inside="position == position")}, _SLIDING, "not the score 0 of a zero key"),
        "sliding: no 1/sqrt(d_k)": ({"sliding_window": _WINDOWS.format(scale="1.0", inside=_INSIDE)},
                                    _SLIDING, "√d_k"),
        "sliding: torch's fused attention with a band mask": ({"sliding_window": """
    i = torch.arange(Q.shape[-2])
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=(i[:, None] - i[None, :]).abs() <= w)
"""}, _SLIDING, "scaled_dot_product_attention"),
        "sliding: from the course library": ({"sliding_window": """
    from transformer_lib.efficient import sliding_window_attention
    return sliding_window_attention(Q, K, V, w)
"""}, _SLIDING, "the course library"),
        "linear: the quadratic form": ({"linear_attention": """
    kernel = (F.elu(Q) + 1) @ (F.elu(K) + 1).transpose(-2, -1)
    return kernel / kernel.sum(-1, keepdim=True) @ V
"""}, _LINEAR, "n × m matrix"),
        "linear: broadcast products instead of a matmul": ({"linear_attention": """
    phi_q, phi_k = F.elu(Q) + 1, F.elu(K) + 1
    kernel = (phi_q.unsqueeze(-2) * phi_k.unsqueeze(-3)).sum(-1)
    return kernel / kernel.sum(-1, keepdim=True) @ V
"""}, _LINEAR, "n × m matrix"),
        "linear: elu without + 1": ({"linear_attention": """
    phi_q, phi_k = F.elu(Q), F.elu(K)
    return (phi_q @ (phi_k.transpose(-2, -1) @ V)) / (phi_q @ phi_k.sum(-2).unsqueeze(-1))
"""}, _LINEAR, "+ 1"),
        "linear: relu features": ({"linear_attention": """
    phi_q, phi_k = F.relu(Q), F.relu(K)
    return (phi_q @ (phi_k.transpose(-2, -1) @ V)) / (phi_q @ phi_k.sum(-2).unsqueeze(-1))
"""}, _LINEAR, "not relu"),
        "linear: no normaliser": ({"linear_attention": """
    phi_q, phi_k = F.elu(Q) + 1, F.elu(K) + 1
    return phi_q @ (phi_k.transpose(-2, -1) @ V)
"""}, _LINEAR, "normaliser"),
        "linear: normalised over the queries": ({"linear_attention": """
    phi_q, phi_k = F.elu(Q) + 1, F.elu(K) + 1
    col = phi_k @ phi_q.sum(-2).unsqueeze(-1)                   # (…, m, 1): Σ_i φ(q_i)·φ(k_j)
    return phi_q @ ((phi_k / col).transpose(-2, -1) @ V)
"""}, _LINEAR, "not over the queries"),
        "linear: softmax attention": ({"linear_attention": """
    return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V
"""}, _LINEAR, "softmax"),
        "linear: a loop over the queries": ({"linear_attention": """
    phi_q, phi_k = F.elu(Q) + 1, F.elu(K) + 1
    rows = []
    for i in range(Q.shape[-2]):
        w = (phi_k * phi_q[..., i:i + 1, :]).sum(-1)                # (…, m): this query against every key
        rows.append((w / w.sum(-1, keepdim=True)).unsqueeze(-2) @ V)
    return torch.cat(rows, dim=-2)
"""}, _LINEAR, "O(n·m) work"),
        "linear: a loop over the queries, one matmul each": ({"linear_attention": """
    phi_q, phi_k = F.elu(Q) + 1, F.elu(K) + 1
    rows = []
    for i in range(Q.shape[-2]):
        w = phi_q[..., i:i + 1, :] @ phi_k.transpose(-2, -1)        # (…, 1, m): this query against every key
        rows.append((w @ V) / w.sum(-1, keepdim=True))
    return torch.cat(rows, dim=-2)
"""}, _LINEAR, "O(n·m) work"),
        "linear: a three-operand einsum (contracts through φ(Q)φ(K)ᵀ)": ({"linear_attention": """
    phi_q, phi_k = F.elu(Q) + 1, F.elu(K) + 1
    numerator = torch.einsum("...nd,...md,...mv->...nv", phi_q, phi_k, V)
    return numerator / (phi_q @ phi_k.sum(dim=-2).unsqueeze(-1))
"""}, _LINEAR, "O(n·m) work"),
        "linear: computed in numpy": ({"linear_attention": """
    import numpy as np
    q, k, v = Q.numpy(), K.numpy(), V.numpy()
    pq, pk = np.where(q > 0, q + 1, np.exp(q)), np.where(k > 0, k + 1, np.exp(k))
    kernel = pq @ np.swapaxes(pk, -1, -2)
    return torch.from_numpy(kernel / kernel.sum(-1, keepdims=True) @ v)
"""}, _LINEAR, "leaves torch"),
    },
}
