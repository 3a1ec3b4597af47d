"""Known-wrong solutions for the chapter 3 exercises, in the format of ``wrong.py``: the solution
bodies substituted (by grade_id), the checks that must catch each (and only those), and a phrase
the first failing message must contain."""
from __future__ import annotations

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "03_the_transformer_block": {
        "LayerNorm statistics over the batch axis": ({"layer_norm": """
            mu = x.mean(dim=0, keepdim=True)
            var = ((x - mu) ** 2).mean(dim=0, keepdim=True)
            return gamma * (x - mu) / torch.sqrt(var + eps) + beta
            """}, {"check_layer_norm"}, "batch/first axis"),
        "LayerNorm statistics over the sequence axis": ({"layer_norm": """
            mu = x.mean(dim=-2, keepdim=True)
            var = ((x - mu) ** 2).mean(dim=-2, keepdim=True)
            return gamma * (x - mu) / torch.sqrt(var + eps) + beta
            """}, {"check_layer_norm"}, "sequence axis"),
        "LayerNorm with the unbiased variance": ({"layer_norm": """
            mu = x.mean(dim=-1, keepdim=True)
            var = x.var(dim=-1, keepdim=True)
            return gamma * (x - mu) / torch.sqrt(var + eps) + beta
            """}, {"check_layer_norm"}, "biased one"),
        "LayerNorm with eps outside the square root": ({"layer_norm": """
            mu = x.mean(dim=-1, keepdim=True)
            std = x.std(dim=-1, unbiased=False, keepdim=True)
            return gamma * (x - mu) / (std + eps) + beta
            """}, {"check_layer_norm"}, "inside the square root"),
        "LayerNorm without gamma and beta": ({"layer_norm": """
            mu = x.mean(dim=-1, keepdim=True)
            var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
            return (x - mu) / torch.sqrt(var + eps)
            """}, {"check_layer_norm"}, "γ and β are missing"),
        "LayerNorm without beta": ({"layer_norm": """
            mu = x.mean(dim=-1, keepdim=True)
            var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
            return gamma * (x - mu) / torch.sqrt(var + eps)
            """}, {"check_layer_norm"}, "β is missing"),
        "LayerNorm via torch's layer_norm": ({"layer_norm": """
            return F.layer_norm(x, x.shape[-1:], gamma, beta, eps)
            """}, {"check_layer_norm"}, "layer_norm, which this exercise asks you to write"),
        "LayerNorm from the course library": ({"layer_norm": """
            from transformer_lib.block import LayerNorm
            ln = LayerNorm(x.shape[-1], eps=eps).to(x.dtype)
            with torch.no_grad():
                ln.weight.copy_(gamma)
                ln.bias.copy_(beta)
                return ln(x)
            """}, {"check_layer_norm"}, "the course library"),
        "LayerNorm in half precision": ({"layer_norm": """
            h = x.half()
            mu = h.mean(dim=-1, keepdim=True)
            var = ((h - mu) ** 2).mean(dim=-1, keepdim=True)
            return (gamma.half() * (h - mu) / torch.sqrt(var + eps) + beta.half()).to(x.dtype)
            """}, {"check_layer_norm"}, "differs"),
        "LayerNorm that ignores the eps it is given": ({"layer_norm": """
            mu = x.mean(dim=-1, keepdim=True)
            var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
            return gamma * (x - mu) / torch.sqrt(var + 1e-5) + beta
            """}, {"check_layer_norm"}, "a hidden test (other inputs) fails: layer_norm differs"),
        "MLP without the activation": ({"mlp": """
            return (X @ W1 + b1) @ W2 + b2
            """}, {"check_mlp"}, "no activation"),
        "MLP with the activation after the second layer": ({"mlp": """
            act = torch.relu if activation == "relu" else F.gelu
            return act((X @ W1 + b1) @ W2 + b2)
            """}, {"check_mlp"}, "not after the second"),
        "MLP with the activation after both layers": ({"mlp": """
            act = torch.relu if activation == "relu" else F.gelu
            return act(act(X @ W1 + b1) @ W2 + b2)
            """}, {"check_mlp"}, "applied twice"),
        "MLP with the tanh approximation of GELU": ({"mlp": """
            H = X @ W1 + b1
            H = torch.relu(H) if activation == "relu" else F.gelu(H, approximate="tanh")
            return H @ W2 + b2
            """}, {"check_mlp"}, "tanh"),
        "MLP that always uses ReLU": ({"mlp": """
            return torch.relu(X @ W1 + b1) @ W2 + b2
            """}, {"check_mlp"}, "asked for 'gelu'"),
        "MLP that mixes tokens through a wrong reshape": ({"mlp": """
            flat = X.reshape(X.shape[-1], -1).T
            H = flat @ W1 + b1
            H = torch.relu(H) if activation == "relu" else F.gelu(H)
            return (H @ W2 + b2).T.reshape(X.shape)
            """}, {"check_mlp"}, "depends on the other tokens"),
        "value layer with the transposed weights": ({"collapse#0": """
            return A.T @ Y @ W_V
            """}, {"check_value_layer"}, "not Aᵀ"),
        "collapse with the attention matrices in the wrong order": ({"collapse#1": """
            return A1 @ A2, W_V1 @ W_V2
            """}, {"check_collapse"}, "wrong order"),
        "collapse with the value maps in the wrong order": ({"collapse#1": """
            return A2 @ A1, W_V2 @ W_V1
            """}, {"check_collapse"}, "W_V1 comes first"),
        "collapse by multiplying entry by entry": ({"collapse#1": """
            return A2 * A1, W_V1 * W_V2
            """}, {"check_collapse"}, "not entry by entry"),
        "collapse hard-coded to the visible example": ({"collapse#1": """
            g = torch.Generator().manual_seed(60)
            B1 = torch.softmax(2 * torch.randn(5, 5, generator=g, dtype=torch.float64), dim=-1)
            g = torch.Generator().manual_seed(61)
            B2 = torch.softmax(2 * torch.randn(5, 5, generator=g, dtype=torch.float64), dim=-1)
            g = torch.Generator().manual_seed(62)
            V1 = torch.randn(4, 4, generator=g, dtype=torch.float64)
            g = torch.Generator().manual_seed(63)
            V2 = torch.randn(4, 4, generator=g, dtype=torch.float64)
            return B2 @ B1, V1 @ V2
            """}, {"check_collapse"}, "a hidden test (other inputs) fails"),
    },
}
