"""Known-wrong solutions of Exercises 7 (format of ``wrong.py``)."""
from __future__ import annotations

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "07_causal_masking": {
        "mask is the upper triangle": ({"causal_mask#0": """
            return torch.ones(n, n, dtype=torch.bool).triu()
            """}, {"check_causal_mask", "check_causal_weights"}, "upper triangle"),
        "mask excludes the diagonal": ({"causal_mask#0": """
            return torch.ones(n, n, dtype=torch.bool).tril(-1)
            """}, {"check_causal_mask", "check_causal_weights"}, "diagonal is excluded"),
        "mask with the boolean convention flipped": ({"causal_mask#0": """
            return torch.ones(n, n, dtype=torch.bool).triu(1)
            """}, {"check_causal_mask", "check_causal_weights"}, "convention is flipped"),
        "mask as an additive float mask": ({"causal_mask#0": """
            return torch.full((n, n), float("-inf")).triu(1)
            """, "causal_mask#1": """
            return torch.softmax(S + causal_mask(S.shape[-1]), dim=-1)
            """}, {"check_causal_mask"}, "boolean tensor"),
        "mask applied after the softmax": ({"causal_mask#1": """
            return torch.softmax(S, dim=-1) * causal_mask(S.shape[-1])
            """}, {"check_causal_weights"}, "after the softmax"),
        "mask with a large negative number": ({"causal_mask#1": """
            return torch.softmax(S.masked_fill(~causal_mask(S.shape[-1]), -30.0), dim=-1)
            """}, {"check_causal_weights"}, "exactly 0"),
        "leakage test compares every position": ({"leakage_test": """
            x = torch.randint(0, vocab_size, (2, n))
            y = x.clone()
            y[:, -1] = (y[:, -1] + 1) % vocab_size
            with torch.no_grad():
                return not torch.equal(model(x), model(y))
            """}, {"check_leakage_test"}, "reports a leak in a correct causal model"),
        "leakage test only changes the last token at t = 0": ({"leakage_test": """
            x = torch.randint(0, vocab_size, (2, n))
            y = x.clone()
            y[:, -1] = (y[:, -1] + 1) % vocab_size
            with torch.no_grad():
                return not torch.equal(model(x)[:, 0], model(y)[:, 0])
            """}, {"check_leakage_test"}, "misses a leaking model"),
        "leakage test that always says no": ({"leakage_test": """
            return False
            """}, {"check_leakage_test"}, "misses a leaking model"),
        "cached step without the new token": ({"cached_step": """
            q, k, v = x_t @ W_Q, x_t @ W_K, x_t @ W_V
            if K_cache.shape[0] == 0:
                z = torch.zeros(W_V.shape[1], dtype=x_t.dtype)
            else:
                z = torch.softmax(K_cache @ q / math.sqrt(q.shape[-1]), dim=-1) @ V_cache
            return z, torch.cat([K_cache, k[None]]), torch.cat([V_cache, v[None]])
            """}, {"check_cached_step"}, "attend to itself"),
        "cached step that does not grow the cache": ({"cached_step": """
            q, k, v = x_t @ W_Q, x_t @ W_K, x_t @ W_V
            K_all, V_all = torch.cat([K_cache, k[None]]), torch.cat([V_cache, v[None]])
            z = torch.softmax(K_all @ q / math.sqrt(q.shape[-1]), dim=-1) @ V_all
            return z, K_cache, V_cache
            """}, {"check_cached_step"}, "append the new key"),
        "cached step without 1/sqrt(d_k)": ({"cached_step": """
            q, k, v = x_t @ W_Q, x_t @ W_K, x_t @ W_V
            K_cache, V_cache = torch.cat([K_cache, k[None]]), torch.cat([V_cache, v[None]])
            return torch.softmax(K_cache @ q, dim=-1) @ V_cache, K_cache, V_cache
            """}, {"check_cached_step"}, "√d_k"),
        "cached step with torch's attention": ({"cached_step": """
            q, k, v = x_t @ W_Q, x_t @ W_K, x_t @ W_V
            K_cache, V_cache = torch.cat([K_cache, k[None]]), torch.cat([V_cache, v[None]])
            z = torch.nn.functional.scaled_dot_product_attention(q[None], K_cache, V_cache)[0]
            return z, K_cache, V_cache
            """}, {"check_cached_step"}, "scaled_dot_product_attention"),
        "leakage test with float ids": ({"leakage_test": """
            x = torch.rand(2, n) * vocab_size
            with torch.no_grad():
                return not torch.equal(model(x)[:, 0], model(x.flip(-1))[:, 0])
            """}, {"check_leakage_test"}, "integer tensor"),
        "cached step that puts the new key and value first": ({"cached_step": """
            q, k, v = x_t @ W_Q, x_t @ W_K, x_t @ W_V
            K_cache, V_cache = torch.cat([k[None], K_cache]), torch.cat([v[None], V_cache])
            z = torch.softmax(K_cache @ q / math.sqrt(q.shape[-1]), dim=-1) @ V_cache
            return z, K_cache, V_cache
            """}, {"check_cached_step"}, "one row per token in order"),
    },
}
