"""Known-wrong solutions for the chapter 3 exercises, in the format of ``wrong.py``: the solution
bodies substituted (by grade_id), the checks that must catch each (and only those), and a phrase
the first failing message must contain."""
from __future__ import annotations

_STACK = """
A_star, W_V_star, b_V_star = As[0], W_Vs[0], {b0}
for A, W_V, b_V in zip(As[1:{end}], W_Vs[1:{end}], b_Vs[1:{end}]):
    A_star = {a}
    W_V_star = {w}
    b_V_star = {b}
return A_star, W_V_star, {out}
"""


def _stack(a: str = "A @ A_star", w: str = "W_V_star @ W_V", b: str = "b_V_star @ W_V + b_V", b0: str = "b_Vs[0]",
           end: str = "", out: str = "b_V_star") -> dict[str, str]:
    """The collapse of a stack with one step changed (the right one by default)."""
    return {"collapse#1": _STACK.format(a=a, w=w, b=b, b0=b0, end=end, out=out)}


WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "03_the_transformer_block": {
        "RMSNorm that subtracts the mean (LayerNorm without β)": ({"rms_norm": """
            centred = x - x.mean(dim=-1, keepdim=True)
            return gamma * centred / torch.sqrt((centred**2).mean(dim=-1, keepdim=True) + eps)
            """}, {"check_rms_norm"}, "RMSNorm does not subtract the mean"),
        "RMSNorm dividing by the standard deviation": ({"rms_norm": """
            var = x.var(dim=-1, unbiased=False, keepdim=True)
            return gamma * x / torch.sqrt(var + eps)
            """}, {"check_rms_norm"}, "over the raw values"),
        "RMSNorm with eps outside the square root": ({"rms_norm": """
            return gamma * x / (torch.sqrt((x * x).mean(dim=-1, keepdim=True)) + eps)
            """}, {"check_rms_norm"}, "ε belongs inside the square root"),
        "RMSNorm with the sum of squares": ({"rms_norm": """
            return gamma * x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)
            """}, {"check_rms_norm"}, "not the sum"),
        "RMSNorm without the square root": ({"rms_norm": """
            return gamma * x / ((x * x).mean(dim=-1, keepdim=True) + eps)
            """}, {"check_rms_norm"}, "the square root is missing"),
        "RMSNorm without gamma": ({"rms_norm": """
            return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)
            """}, {"check_rms_norm"}, "γ is missing"),
        "RMSNorm over the batch axis": ({"rms_norm": """
            return gamma * x / torch.sqrt((x * x).mean(dim=0, keepdim=True) + eps)
            """}, {"check_rms_norm"}, "first (batch) axis"),
        "RMSNorm over the sequence axis": ({"rms_norm": """
            return gamma * x / torch.sqrt((x * x).mean(dim=-2, keepdim=True) + eps)
            """}, {"check_rms_norm"}, "sequence axis"),
        "RMSNorm via torch's rms_norm": ({"rms_norm": """
            return F.rms_norm(x, x.shape[-1:], gamma, eps)
            """}, {"check_rms_norm"}, "rms_norm, which this exercise asks you to write"),
        "RMSNorm via torch.nn.RMSNorm": ({"rms_norm": """
            norm = torch.nn.RMSNorm(x.shape[-1], eps=eps, dtype=x.dtype)
            with torch.no_grad():
                norm.weight.copy_(gamma)
                return norm(x)
            """}, {"check_rms_norm"}, "rms_norm, which this exercise asks you to write"),
        "RMSNorm from the course library": ({"rms_norm": """
            from transformer_lib.block import RMSNorm
            norm = RMSNorm(x.shape[-1], eps=eps).to(x.dtype)
            with torch.no_grad():
                norm.weight.copy_(gamma)
                return norm(x)
            """}, {"check_rms_norm"}, "the course library"),
        "RMSNorm in half precision": ({"rms_norm": """
            h = x.half()
            return (gamma.half() * h / torch.sqrt((h * h).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
            """}, {"check_rms_norm"}, "differs"),
        "RMSNorm that ignores the eps it is given": ({"rms_norm": """
            return gamma * x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6)
            """}, {"check_rms_norm"}, "rms_norm differs"),
        "fold: γ scales the columns of W1": ({"fold_norm": """
            return W1 * gamma, beta @ W1 + b1
            """}, {"check_fold_norm"}, "γ scales the columns of W1 here"),
        "fold: W1 left unchanged": ({"fold_norm": """
            return W1, beta @ W1 + b1
            """}, {"check_fold_norm"}, "W1 is unchanged"),
        "fold: β left out": ({"fold_norm": """
            return gamma[:, None] * W1, b1
            """}, {"check_fold_norm"}, "b1 alone leaves β out"),
        "fold: b1 left out": ({"fold_norm": """
            return gamma[:, None] * W1, beta @ W1
            """}, {"check_fold_norm"}, "the MLP's own bias b1 is still there"),
        "fold: β added to b1 without crossing W1": ({"fold_norm": """
            return gamma[:, None] * W1, beta + b1
            """}, {"check_fold_norm"}, "not β + b1"),
        "fold: β scaled by γ": ({"fold_norm": """
            return gamma[:, None] * W1, (gamma * beta) @ W1 + b1
            """}, {"check_fold_norm"}, "β is not scaled by γ"),
        "value layer with the transposed weights": ({"collapse#0": """
            return A.T @ (Y @ W_V + b_V)
            """}, {"check_value_layer"}, "not Aᵀ"),
        "value layer without its bias": ({"collapse#0": """
            return A @ Y @ W_V
            """}, {"check_value_layer"}, "the value bias b_V is missing"),
        "collapse with the attention weights in the wrong order": (_stack(a="A_star @ A"), {"check_collapse_stack"},
                                                                   "multiplies the layers' weights in the wrong order"),
        "collapse with the value maps in the wrong order": (_stack(w="W_V @ W_V_star"), {"check_collapse_stack"},
                                                            "W_V1 comes first"),
        "collapse with the biases summed": (_stack(out="sum(b_Vs)"), {"check_collapse_stack"},
                                            "a plain sum of the biases leaves the later maps out"),
        "collapse keeping the last bias only": (_stack(out="b_Vs[-1]"), {"check_collapse_stack"},
                                                "only the last layer's bias"),
        "collapse with each bias through its own value map": (
            _stack(b0="b_Vs[0] @ W_Vs[0]", b="(b_V_star + b_V) @ W_V"), {"check_collapse_stack"},
            "does not pass through W_Vl itself"),
        "collapse hard-coded to three layers": (_stack(end="3"), {"check_collapse_stack"},
                                                "W_V_star has the wrong shape"),
    },
}
