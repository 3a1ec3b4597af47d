"""Known-wrong solutions of Exercises 10 (format of ``wrong.py``): the solution bodies substituted
(by grade_id), the checks that must catch them (and only those), a phrase of the first message."""
from __future__ import annotations

_CS = {"check_cross_section_attention"}
_PATCH = {"check_patchify"}
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
        "patchify: column-major patches": ({"patchify": """
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p)
    return x.permute(0, 4, 2, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)
"""}, _PATCH, "column-major"),
        "patchify: channel last inside a patch": ({"patchify": """
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // p) * (w // p), c * p * p)
"""}, _PATCH, "channel must come first"),
        "patchify: pixels column by column": ({"patchify": """
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 1, 5, 3).reshape(b, (h // p) * (w // p), c * p * p)
"""}, _PATCH, "column by column"),
        "patchify: a plain reshape": ({"patchify": """
    b, c, h, w = images.shape
    return images.reshape(b, c, (h // p) * (w // p), p * p).permute(0, 2, 1, 3).reshape(b, -1, c * p * p)
"""}, _PATCH, "p × p squares"),
        "patchify: one column per patch": ({"patchify": """
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p)
    return x.permute(0, 1, 3, 5, 2, 4).reshape(b, c * p * p, (h // p) * (w // p))
"""}, _PATCH, "one row per patch"),
        "patchify: F.unfold": ({"patchify": """
    return F.unfold(images, kernel_size=p, stride=p).transpose(1, 2)
"""}, _PATCH, "unfold"),
        "patchify: Tensor.unfold": ({"patchify": """
    b, c, h, w = images.shape
    x = images.unfold(2, p, p).unfold(3, p, p)          # (b, C, rows, cols, p, p)
    return x.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * p * p)
"""}, _PATCH, "unfold"),
        "patchify: the course library": ({"patchify": """
    from transformer_lib.vision import patchify as library_patchify
    return library_patchify(images, p)
"""}, _PATCH, "the course library"),
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
