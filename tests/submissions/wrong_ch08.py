"""Known-wrong solutions of Exercises 8 (format of ``wrong.py``)."""
from __future__ import annotations

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "08_mixture_of_experts": {
        "routing to the k smallest probabilities": ({"top_k_routing": """
            probs = torch.softmax(logits, dim=-1)
            top, indices = probs.topk(k, dim=-1, largest=False)
            return top / top.sum(dim=-1, keepdim=True), indices
            """}, {"check_top_k_routing", "check_moe_forward"}, "least* probable"),
        "top-k weights not renormalised": ({"top_k_routing": """
            probs = torch.softmax(logits, dim=-1)
            return probs.topk(k, dim=-1)
            """}, {"check_top_k_routing", "check_moe_forward"}, "not renormalised"),
        "softmax over the token axis": ({"top_k_routing": """
            probs = torch.softmax(logits, dim=0)
            top, indices = probs.topk(k, dim=-1)
            return top / top.sum(dim=-1, keepdim=True), indices
            """}, {"check_top_k_routing", "check_moe_forward"}, "token axis"),
        "experts in ascending order of probability": ({"top_k_routing": """
            probs = torch.softmax(logits, dim=-1)
            top, indices = probs.topk(k, dim=-1)
            top, indices = top.flip(-1), indices.flip(-1)
            return top / top.sum(dim=-1, keepdim=True), indices
            """}, {"check_top_k_routing"}, "most to the least probable"),
        "routing by the largest logits without a softmax": ({"top_k_routing": """
            top, indices = logits.topk(k, dim=-1)
            return top / top.sum(dim=-1, keepdim=True), indices
            """}, {"check_top_k_routing", "check_moe_forward"}, "renormalised top-k softmax"),
        "forward that overwrites instead of adding": ({"moe_forward": """
            weights, indices = top_k_routing(x @ W_g, k)
            y = torch.zeros_like(x)
            for e, expert in enumerate(experts):
                token, slot = torch.where(indices == e)
                y[token] = weights[token, slot, None] * expert(x[token])
            return y
            """}, {"check_moe_forward"}, "do not assign it"),
        "forward with the raw probabilities as weights": ({"moe_forward": """
            probs = torch.softmax(x @ W_g, dim=-1)
            top, indices = probs.topk(k, dim=-1)
            y = torch.zeros_like(x)
            for e, expert in enumerate(experts):
                token, slot = torch.where(indices == e)
                y.index_add_(0, token, top[token, slot, None] * expert(x[token]))
            return y
            """}, {"check_moe_forward"}, "raw top-k probabilities"),
        "forward with a per-token loop": ({"moe_forward": """
            weights, indices = top_k_routing(x @ W_g, k)
            y = torch.zeros_like(x)
            for i in range(x.shape[0]):
                for j in range(k):
                    y[i] += weights[i, j] * experts[int(indices[i, j])](x[i:i + 1])[0]
            return y
            """}, {"check_moe_forward"}, "batch the dispatch"),
        "forward that runs every expert on every token": ({"moe_forward": """
            weights, indices = top_k_routing(x @ W_g, k)
            dense = torch.zeros(x.shape[0], len(experts), dtype=x.dtype)
            dense.scatter_(1, indices, weights)
            return sum(dense[:, e, None] * expert(x) for e, expert in enumerate(experts))
            """}, {"check_moe_forward"}, "only on its own tokens"),
        "forward with the weights of the wrong slot": ({"moe_forward": """
            weights, indices = top_k_routing(x @ W_g, k)
            y = torch.zeros_like(x)
            for e, expert in enumerate(experts):
                token, slot = torch.where(indices == e)
                y.index_add_(0, token, weights[token, 0, None] * expert(x[token]))
            return y
            """}, {"check_moe_forward"}, "renormalised weights (atol"),
        "balancing loss divided by T instead of T·k": ({"balancing_loss": """
            counts = torch.bincount(expert_index.reshape(-1), minlength=n_experts).to(router_probs.dtype)
            return n_experts * (counts / expert_index.shape[0] * router_probs.mean(0)).sum()
            """}, {"check_balancing_loss"}, "T·k"),
        "balancing loss without the factor E": ({"balancing_loss": """
            counts = torch.bincount(expert_index.reshape(-1), minlength=n_experts).to(router_probs.dtype)
            return (counts / expert_index.numel() * router_probs.mean(0)).sum()
            """}, {"check_balancing_loss"}, "factor E"),
        "balancing loss with probabilities for f": ({"balancing_loss": """
            P = router_probs.mean(0)
            return n_experts * (P * P).sum()
            """}, {"check_balancing_loss"}, "soft version"),
        "balancing loss detached from the router": ({"balancing_loss": """
            counts = torch.bincount(expert_index.reshape(-1), minlength=n_experts).to(router_probs.dtype)
            P = router_probs.detach().mean(0)
            return n_experts * (counts / expert_index.numel() * P).sum()
            """}, {"check_balancing_loss"}, "no gradient"),
        "balancing loss as a float": ({"balancing_loss": """
            counts = torch.bincount(expert_index.reshape(-1), minlength=n_experts).to(router_probs.dtype)
            return float(n_experts * (counts / expert_index.numel() * router_probs.mean(0)).sum())
            """}, {"check_balancing_loss"}, "one-element torch.Tensor"),
        "balancing loss hard-coded to 1": ({"balancing_loss": """
            return torch.ones((), dtype=router_probs.dtype, requires_grad=True)
            """}, {"check_balancing_loss"}, "differs from E"),
    },
}
