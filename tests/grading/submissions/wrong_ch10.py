"""Known-wrong solutions of Exercises 10 (format of ``wrong.py``): the solution bodies substituted
(by grade_id), the checks that must catch them (and only those), a phrase of the first message."""
from __future__ import annotations

_CS = {"check_cross_section_attention"}
_CS_BODY = """
    Q, K, V = X_t @ W_Q, X_r @ W_K, X_r @ W_V
    itself = {itself}
    A = torch.softmax((Q @ K.T / {scale}).masked_fill(itself, float("-inf")), dim={dim}).nan_to_num(0.0)
    return {z}, A
"""
_ITSELF = "ids_t[:, None] == ids_r[None, :]"
_SQRT_K = "math.sqrt(K.shape[-1])"
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
_TOKEN_BODY = """
    b, L = patches.shape[:2]
    embedded = patches @ W_E + {places}
    cls_rows = cls.expand(b, 1, -1)
    return torch.cat({order}, dim=1)
"""
_CAUSAL = {"check_causal_linear_attention"}
_RUNNING = """
    feat_q, feat_k = {phi_q}, {phi_k}
    outer = feat_k.unsqueeze(-1) * V.unsqueeze(-2)
    running = {prefix}
    running_norm = {norm}
    top = (feat_q.unsqueeze(-1) * running).sum(dim=-2)
    bottom = (feat_q * running_norm).sum(dim=-1, keepdim=True)
    return {divide}
"""


def _running(phi: str = "F.elu({}) + 1", prefix: str = "outer.cumsum(dim=-3)", norm: str = "feat_k.cumsum(dim=-2)",
             divide: str = "top / bottom") -> str:
    """The running-sum solution with its feature map (``phi``, with ``{}`` for the input), prefix sums
    or division replaced."""
    return _RUNNING.format(phi_q=phi.format("Q"), phi_k=phi.format("K"), prefix=prefix, norm=norm, divide=divide)

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
        "cross-section: every firm a peer, its own too (the copy that passed before)": ({"cross_section_attention": """
    Q, K, V = X_t @ W_Q, X_r @ W_K, X_r @ W_V
    A = torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=-1)
    return A @ V, A
"""}, _CS, "never its own peer"),
        "cross-section: the own firm left out by position (the appendix's diagonal)": ({"cross_section_attention":
            _CS_BODY.format(itself="torch.eye(len(ids_t), len(ids_r), dtype=torch.bool)", scale=_SQRT_K, dim=-1,
                            z="A @ V")}, _CS, "wherever it stands"),
        "cross-section: the own firm's weight zeroed after the softmax": ({"cross_section_attention": """
    Q, K, V = X_t @ W_Q, X_r @ W_K, X_r @ W_V
    A = torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=-1)
    A = A.masked_fill(ids_t[:, None] == ids_r[None, :], 0.0)
    return A @ V, A
"""}, _CS, "before the softmax"),
        "cross-section: a target with no other firm gets a row of nan": ({"cross_section_attention": """
    Q, K, V = X_t @ W_Q, X_r @ W_K, X_r @ W_V
    scores = (Q @ K.T / math.sqrt(K.shape[-1])).masked_fill(ids_t[:, None] == ids_r[None, :], float("-inf"))
    A = torch.softmax(scores, dim=-1)
    return A @ V, A
"""}, _CS, "no peers"),
        "cross-section: no 1/sqrt(d_k)": ({"cross_section_attention": _CS_BODY.format(
            itself=_ITSELF, scale="1.0", dim=-1, z="A @ V")}, _CS, "√d_k"),
        "cross-section: softmax over the targets": ({"cross_section_attention": _CS_BODY.format(
            itself=_ITSELF, scale=_SQRT_K, dim=0, z="A @ V")}, _CS, "columns of A sum to 1"),
        "cross-section: values are the raw features": ({"cross_section_attention": _CS_BODY.format(
            itself=_ITSELF, scale=_SQRT_K, dim=-1, z="A @ X_r")}, _CS, "the values are X_r W_V"),
        "cross-section: torch's fused attention": ({"cross_section_attention": _CS_BODY.format(
            itself=_ITSELF, scale=_SQRT_K, dim=-1,
            z="F.scaled_dot_product_attention(Q, K, V, attn_mask=~itself)")}, _CS, "scaled_dot_product_attention"),
        "cross-section: the course library": ({"cross_section_attention": """
    from transformer_lib.attention import scaled_dot_product_attention
    return scaled_dot_product_attention(X_t @ W_Q, X_r @ W_K, X_r @ W_V)
"""}, _CS, "the course library"),
        "tokens: positions of a grid the size of the images' (the copy that passed before)": ({"vit_tokens": """
    embedded = patches @ W_E
    cls_rows = cls.expand(patches.shape[0], 1, -1)
    return torch.cat([cls_rows, embedded], dim=1) + pos
"""}, _TOKENS, "do not broadcast"),
        "tokens: the first L vectors of the flattened grid": ({"vit_tokens": _TOKEN_BODY.format(
            places="pos.reshape(-1, pos.shape[-1])[:L]", order="[cls_rows, embedded]")}, _TOKENS,
            "first L vectors of the flattened grid"),
        "tokens: the patches read column by column": ({"vit_tokens": _TOKEN_BODY.format(
            places="pos[:L // cols, :cols].transpose(0, 1).reshape(L, -1)", order="[cls_rows, embedded]")},
            _TOKENS, "row-major order"),
        "tokens: cols taken for the number of rows": ({"vit_tokens": _TOKEN_BODY.format(
            places="pos[:cols, :L // cols].reshape(L, -1)", order="[cls_rows, embedded]")}, _TOKENS,
            "cols is the number of patches in a row"),
        "tokens: [CLS] given the position of the first place": ({"vit_tokens": _TOKEN_BODY.format(
            places="pos[:L // cols, :cols].reshape(L, -1)", order="[cls_rows + pos[0, 0], embedded]")}, _TOKENS,
            "[CLS] got a position"),
        "tokens: [CLS] at the end": ({"vit_tokens": _TOKEN_BODY.format(
            places="pos[:L // cols, :cols].reshape(L, -1)", order="[embedded, cls_rows]")}, _TOKENS,
            "[CLS] is at the end"),
        "tokens: no [CLS]": ({"vit_tokens": """
    L = patches.shape[1]
    return patches @ W_E + pos[:L // cols, :cols].reshape(L, -1)
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
        "causal: the appendix's linear attention, every key for every query (the copy that passed before)": (
            {"causal_linear_attention": """
    phi_q, phi_k = F.elu(Q) + 1, F.elu(K) + 1
    kv = phi_k.transpose(-2, -1) @ V
    normaliser = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)
    return (phi_q @ kv) / normaliser
"""}, _CAUSAL, "only the keys j ≤ i"),
        "causal: the course library's linear attention": ({"causal_linear_attention": """
    from transformer_lib.efficient import linear_attention
    return linear_attention(Q, K, V)
"""}, _CAUSAL, "the course library"),
        "causal: the masked quadratic form": ({"causal_linear_attention": """
    kernel = (F.elu(Q) + 1) @ (F.elu(K) + 1).transpose(-2, -1)
    kernel = kernel.tril()
    return kernel / kernel.sum(-1, keepdim=True) @ V
"""}, _CAUSAL, "n × n matrix"),
        "causal: a loop over the positions, each summing its prefix anew": ({"causal_linear_attention": """
    phi_q, phi_k = F.elu(Q) + 1, F.elu(K) + 1
    rows = []
    for i in range(Q.shape[-2]):
        kv = phi_k[..., :i + 1, :].transpose(-2, -1) @ V[..., :i + 1, :]      # (…, d_k, d_v), from scratch
        norm = phi_k[..., :i + 1, :].sum(-2)
        q = phi_q[..., i, :]
        rows.append((q.unsqueeze(-2) @ kv).squeeze(-2) / (q * norm).sum(-1, keepdim=True))
    return torch.stack(rows, dim=-2)
"""}, _CAUSAL, "O(n·m) work"),
        "causal: the keys before i only, j < i": ({"causal_linear_attention": _running(
            prefix="outer.cumsum(dim=-3) - outer", norm="feat_k.cumsum(dim=-2) - feat_k")}, _CAUSAL,
            "include key i itself"),
        "causal: the keys after i": ({"causal_linear_attention": _running(
            prefix="outer.flip(-3).cumsum(dim=-3).flip(-3)", norm="feat_k.flip(-2).cumsum(dim=-2).flip(-2)")},
            _CAUSAL, "not the ones after"),
        "causal: the normaliser over every key": ({"causal_linear_attention": _running(
            norm="feat_k.sum(dim=-2, keepdim=True)")}, _CAUSAL, "same keys as the numerator"),
        "causal: no normaliser": ({"causal_linear_attention": _running(divide="top")}, _CAUSAL,
                                  "divide by the normaliser"),
        "causal: elu without + 1": ({"causal_linear_attention": _running(phi="F.elu({})")}, _CAUSAL, "+ 1"),
        "causal: relu features": ({"causal_linear_attention": _running(phi="F.relu({})")}, _CAUSAL, "relu"),
        "causal: the running sums along the first axis (unbatched only)": ({"causal_linear_attention": _running(
            prefix="outer.cumsum(dim=0)", norm="feat_k.cumsum(dim=0)")}, _CAUSAL, "the leading dimensions are a batch"),
        "causal: softmax attention": ({"causal_linear_attention": """
    n = Q.shape[-2]
    scores = (Q @ K.transpose(-2, -1)).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores / math.sqrt(Q.shape[-1]), dim=-1) @ V
"""}, _CAUSAL, "softmax"),
        "causal: computed in numpy": ({"causal_linear_attention": """
    import numpy as np
    q, k, v = Q.numpy(), K.numpy(), V.numpy()
    pq, pk = np.where(q > 0, q + 1, np.exp(q)), np.where(k > 0, k + 1, np.exp(k))
    kernel = np.tril(pq @ np.swapaxes(pk, -1, -2))
    return torch.from_numpy(kernel / kernel.sum(-1, keepdims=True) @ v)
"""}, _CAUSAL, "leaves torch"),
    },
}
