"""Known-wrong solutions of Exercises 8 (format of ``wrong.py``)."""
from __future__ import annotations

_ROUTING = """
    indices = torch.tensor({indices})
    weights = torch.tensor({weights})
    """
_INDICES = "[[0, 2], [1, 2], [1, 0], [2, 1]]"
_WEIGHTS = "[[0.731, 0.269], [0.881, 0.119], [0.731, 0.269], [0.881, 0.119]]"

_BALANCE = """
    f = torch.tensor({f})
    P = torch.tensor({P})
    loss = {loss}
    kept = torch.tensor({kept})
    """
_RIGHT = dict(f="[0.25, 0.375, 0.375]", P="[0.248, 0.428, 0.323]", loss="1.032",
              kept="[[True, True], [True, False], [True, True], [True, False]]")

_CAPACITY = """
    T = x.shape[0]
    top, indices = torch.softmax(x @ W_g, dim=-1).topk(k, dim=-1)
    weights = top / top.sum(dim=-1, keepdim=True)
    weight_of, expert_of = weights{order}.reshape(-1), indices{order}.reshape(-1)
    token_of = {tokens}
    one_hot = F.one_hot(expert_of, len(experts))
    keep = {keep}
    y = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        chosen = {chosen}
        if chosen.any():
            tokens = token_of[chosen]
            y.index_add_(0, tokens, {weight} * expert(x[tokens]){zero})
    return y, {kept}
    """
_QUEUE = "(one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1 < capacity"
_RIGHT_CAPACITY = dict(order=".T", tokens="torch.arange(T).repeat(k)", keep=_QUEUE,
                       chosen="keep & (expert_of == e)", weight="weight_of[chosen, None]", zero="",
                       kept="keep.reshape(k, T).T")


def _capacity(**changes: str) -> str:
    return _CAPACITY.format(**dict(_RIGHT_CAPACITY, **changes))


_GRAD = """
    T, E = logits.shape
    p = torch.softmax(logits, dim=-1)
    f = torch.bincount(expert_index.reshape(-1), minlength=E).to(p.dtype) / {assignments}
    return {result}
    """
_CLOSED = "E / T * p * (f - (p * f).sum(dim=-1, keepdim=True))"
_LOSS = """
            def loss(z):
                f = torch.bincount(expert_index.reshape(-1), minlength=z.shape[1]).to(z.dtype) / expert_index.numel()
                return z.shape[1] * (f * torch.softmax(z, dim=-1).mean(0)).sum()
"""

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "08_mixture_of_experts": {
        "hand: the least probable experts": ({"hand_routing": _ROUTING.format(
            indices="[[1, 2], [0, 2], [0, 2], [0, 1]]", weights=_WEIGHTS)}, {"check_hand_routing"},
            "least probable experts"),
        "hand: experts from the least probable": ({"hand_routing": _ROUTING.format(
            indices="[[2, 0], [2, 1], [0, 1], [1, 2]]", weights=_WEIGHTS)}, {"check_hand_routing"},
            "from the most to the least"),
        "hand: weights not renormalised": ({"hand_routing": _ROUTING.format(
            indices=_INDICES, weights="[[0.665, 0.245], [0.844, 0.114], [0.665, 0.245], [0.844, 0.114]]")},
            {"check_hand_routing"}, "renormalise the two kept probabilities"),
        "hand: weights to 2 decimals": ({"hand_routing": _ROUTING.format(
            indices=_INDICES, weights="[[0.73, 0.27], [0.88, 0.12], [0.73, 0.27], [0.88, 0.12]]")},
            {"check_hand_routing"}, "to 3 decimals"),
        "hand: f over the tokens, not the assignments": ({"hand_balance": _BALANCE.format(
            **dict(_RIGHT, f="[0.5, 0.75, 0.75]"))}, {"check_hand_balance"}, "T·K = 8 assignments"),
        "hand: P from the top-2 weights": ({"hand_balance": _BALANCE.format(
            **dict(_RIGHT, P="[0.25, 0.433, 0.317]"))}, {"check_hand_balance"}, "not of the renormalised"),
        "hand: loss without the factor E": ({"hand_balance": _BALANCE.format(**dict(_RIGHT, loss="0.344"))},
                                            {"check_hand_balance"}, "factor E"),
        "hand: kept in token order": ({"hand_balance": _BALANCE.format(
            **dict(_RIGHT, kept="[[True, True], [True, True], [True, True], [False, False]]"))},
            {"check_hand_balance"}, "priority order"),
        "hand: nothing dropped": ({"hand_balance": _BALANCE.format(
            **dict(_RIGHT, kept="[[True, True]] * 4"))}, {"check_hand_balance"}, "at most 2 assignments"),
        "hand: kept as numbers": ({"hand_balance": _BALANCE.format(
            **dict(_RIGHT, kept="[[1, 1], [1, 0], [1, 1], [1, 0]]"))}, {"check_hand_balance"}, "boolean tensor"),
        "capacity: no capacity": ({"moe_capacity": _capacity(keep="torch.ones_like(expert_of, dtype=torch.bool)")},
                                  {"check_moe_capacity"}, "beyond the capacity must be dropped"),
        "capacity: each token's choices before the next token's": ({"moe_capacity": _capacity(
            order="", tokens="torch.arange(T).repeat_interleave(k)", kept="keep.reshape(T, k)")},
            {"check_moe_capacity"}, "every token's first choice"),
        "capacity: dropped assignments still added": ({"moe_capacity": _capacity(
            chosen="expert_of == e", zero=" * keep[chosen, None]")}, {"check_moe_capacity"}, "processed"),
        "capacity: dropped assignments added in full": ({"moe_capacity": _capacity(
            chosen="expert_of == e")}, {"check_moe_capacity"}, "a dropped assignment contributes nothing"),
        "capacity: weights renormalised after the drops": ({"moe_capacity": _capacity(
            weight="(weight_of * keep)[chosen, None] / "
                   "(weights * keep.reshape(k, T).T).sum(-1).repeat(k)[chosen, None]")},
            {"check_moe_capacity"}, "not renormalised after the drops"),
        "capacity: the chapter's loop, one token at a time": ({"moe_capacity": """
            top, indices = torch.softmax(x @ W_g, dim=-1).topk(k, dim=-1)
            weights = top / top.sum(dim=-1, keepdim=True)
            y, load = torch.zeros_like(x), [0] * len(experts)
            kept = torch.zeros(indices.shape, dtype=torch.bool)
            for j in range(k):
                for i in range(x.shape[0]):
                    e = int(indices[i, j])
                    if load[e] < capacity:
                        load[e] += 1
                        kept[i, j] = True
                        y[i] += weights[i, j] * experts[e](x[i:i + 1])[0]
            return y, kept
            """}, {"check_moe_capacity"}, "batch the dispatch"),
        "capacity: every expert on every token": ({"moe_capacity": _capacity(
            chosen="keep & (expert_of == e)", weight="1", zero="").replace(
            "            tokens = token_of[chosen]\n            y.index_add_(0, tokens, 1 * expert(x[tokens]))",
            "            dense = expert(x)\n            y.index_add_(0, token_of[chosen], weight_of[chosen, None] * "
            "dense[token_of[chosen]])")}, {"check_moe_capacity"}, "processed 10 rows"),
        "capacity: every expert on every token, then the call log rewritten": ({"moe_capacity": _capacity(
            chosen="keep & (expert_of == e)", weight="1", zero="").replace(
            "            tokens = token_of[chosen]\n            y.index_add_(0, tokens, 1 * expert(x[tokens]))",
            "            dense = expert(x)\n            y.index_add_(0, token_of[chosen], weight_of[chosen, None] * "
            "dense[token_of[chosen]])\n            try:\n                expert.calls[:] = [int(chosen.sum())]\n"
            "            except AttributeError:\n                pass")},
            {"check_moe_capacity"}, "processed 10 rows"),
        "capacity: kept as a (k, T) tensor": ({"moe_capacity": _capacity(kept="keep.reshape(k, T)")},
                                              {"check_moe_capacity"}, "boolean (T, k)"),
        "capacity: from the course library": ({"moe_capacity": """
            from transformer_lib.moe import MoELayer
            layer = MoELayer(x.shape[1], 2 * x.shape[1], len(experts), k)
            return layer(x)
            """}, {"check_moe_capacity"}, "the course library"),
        "grad: the gradient on the probabilities": ({"balancing_grad": _GRAD.format(
            assignments="expert_index.numel()", result="(E * f / T).expand(T, E)")}, {"check_balancing_grad"},
            "with respect to the probabilities"),
        "grad: f over the tokens": ({"balancing_grad": _GRAD.format(assignments="T", result=_CLOSED)},
                                    {"check_balancing_grad"}, "not T"),
        "grad: no 1/T": ({"balancing_grad": _GRAD.format(assignments="expert_index.numel()",
                                                         result=_CLOSED.replace("E / T", "E"))},
                         {"check_balancing_grad"}, "factor 1/T"),
        "grad: the sign flipped": ({"balancing_grad": _GRAD.format(assignments="expert_index.numel()",
                                                                   result="-" + _CLOSED)},
                                   {"check_balancing_grad"}, "the sign is flipped"),
        "grad: float32": ({"balancing_grad": _GRAD.format(assignments="expert_index.numel()",
                                                          result=f"({_CLOSED}).float()").replace(
            "p = torch.softmax(logits, dim=-1)", "p = torch.softmax(logits.float(), dim=-1)").replace(
            ".to(p.dtype)", ".float()")}, {"check_balancing_grad"}, "right only to about 1e-7"),
        "grad: backward": ({"balancing_grad": _LOSS + """            z = logits.clone().requires_grad_(True)
            loss(z).backward()
            return z.grad
            """}, {"check_balancing_grad"}, "backward"),
        "grad: torch.autograd.grad": ({"balancing_grad": _LOSS + """            z = logits.clone().requires_grad_(True)
            return torch.autograd.grad(loss(z), z)[0]
            """}, {"check_balancing_grad"}, "backward"),
        "grad: torch.func.jacfwd": ({"balancing_grad": _LOSS + """            return torch.func.jacfwd(loss)(logits)
            """}, {"check_balancing_grad"}, "dual"),
        "grad: central differences": ({"balancing_grad": _LOSS + """            h, grad = 1e-5, torch.zeros_like(logits)
            for i in range(logits.shape[0]):
                for j in range(logits.shape[1]):
                    step = torch.zeros_like(logits)
                    step[i, j] = h
                    grad[i, j] = (loss(logits + step) - loss(logits - step)) / (2 * h)
            return grad
            """}, {"check_balancing_grad"}, "right only to about 1e-7"),
        "grad: a complex step": ({"balancing_grad": _LOSS.replace(
            "torch.softmax(z, dim=-1)", "(z.exp() / z.exp().sum(-1, keepdim=True))") + """
            h, grad = 1e-30, torch.zeros_like(logits)
            for i in range(logits.shape[0]):
                for j in range(logits.shape[1]):
                    step = torch.zeros(logits.shape, dtype=torch.complex128)
                    step[i, j] = 1j * h
                    grad[i, j] = loss(logits + step).imag / h
            return grad
            """}, {"check_balancing_grad"}, "complex numbers"),
    },
}
