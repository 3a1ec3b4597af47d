"""Known-wrong solutions of Exercises 7 (format of ``wrong.py``)."""
from __future__ import annotations

_MASKS = """
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    real_targets = torch.arange(n)[None, None, :] < tgt_lengths[:, None, None]
    real_sources = torch.arange(m)[None, None, :] < src_lengths[:, None, None]
    self_mask = {self_mask}
    cross_mask = {cross_mask}
    return self_mask, cross_mask
    """
_SELF = "(j <= i)[None] & real_targets"
_CROSS = "real_sources.expand(-1, n, -1)"

_INFLUENCE = """
    ids = torch.randint(0, vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    reach = torch.zeros(n, n, dtype=torch.bool)
    with torch.no_grad():
        base = model(ids)
        for s in range(n):
            changed = ids.clone()
            changed[0, {changed}] = (ids[0, {changed}] + 1) % vocab_size
            reach[:, s] = (model(changed) != base).any(dim=-1)[0]
    return {result}
    """

_STEP = """
    q, k, v = project(x_t[None])
    d_k = q.shape[-1] // n_heads
    K_cache = torch.cat([K_cache, k.view(n_kv_heads, 1, d_k)], dim=1)
    V_cache = torch.cat([V_cache, v.view(n_kv_heads, 1, d_k)], dim=1)
    heads = {heads}
    keys, values = K_cache[heads], V_cache[heads]
    scores = q.view(n_heads, 1, d_k) @ keys.transpose(1, 2) / {scale}
    return (torch.softmax(scores, dim=-1) @ values).reshape(-1), K_cache, V_cache
    """
_GROUPED = "torch.arange(n_heads) // (n_heads // n_kv_heads)"
_SQRT = "math.sqrt(d_k)"
_HISTORY = """
    if K_cache.shape[1] == 0:
        gqa_step.history = []
    gqa_step.history.append(x_t)
    q, k, v = project(torch.stack(gqa_step.history))       # every token so far, projected again
    t, d_k = len(gqa_step.history), q.shape[-1] // n_heads
    keys = k.view(t, n_kv_heads, d_k).transpose(0, 1)
    values = v.view(t, n_kv_heads, d_k).transpose(0, 1)
    heads = torch.arange(n_heads) // (n_heads // n_kv_heads)
    scores = q[-1].view(n_heads, 1, d_k) @ keys[heads].transpose(1, 2) / math.sqrt(d_k)
    z = (torch.softmax(scores, dim=-1) @ values[heads]).reshape(-1)
    return z, {caches}
    """

_FIND = """
    n_layers, n_heads = len(model.blocks), model.blocks[0].attn.n_heads
    fractions = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    with torch.no_grad():
        corrupted = metric(model(corrupted_ids))
        for layer in range(n_layers):
            attn = model.blocks[layer].attn
            d_k = attn.out_proj.in_features // n_heads
            seen = {{}}

            def record(module, args):
                seen["clean"] = args[0].clone()

            handle = attn.out_proj.register_forward_pre_hook(record)
            clean = metric(model(clean_ids))
            handle.remove()
            for head in range(n_heads):
                cols = {cols}
                rows = {rows}

                def swap(module, args, cols=cols, rows=rows):
                    z = args[0].clone()
                    z[:, rows, cols] = seen["clean"][:, rows, cols]
                    return (z,)

                handle = attn.out_proj.register_forward_pre_hook(swap)
                patched = metric(model({patched_input}))
                {remove}
                fractions[layer, head] = {result}
    return {best}, {table}
    """
_FOUND = dict(cols="slice(head * d_k, (head + 1) * d_k)", rows="positions", patched_input="corrupted_ids",
              remove="handle.remove()", result="(patched - corrupted) / (clean - corrupted)",
              best="divmod(int(fractions.argmax()), n_heads)", table="fractions")
# the solution of the exercise before it asked for the head: the chapter's patch re-pointed at one given head
_ONE_HEAD = """
    layer, head = 0, 0
    attn = model.blocks[layer].attn
    width = attn.out_proj.in_features // attn.n_heads
    lo, hi = head * width, (head + 1) * width
    stored = []

    def run(ids, replace):
        def hook(module, args):
            heads_side_by_side = args[0]
            if not replace:
                stored.append(heads_side_by_side.detach().clone())
                return None
            new = heads_side_by_side.clone()
            new[:, positions, lo:hi] = stored[0][:, positions, lo:hi]
            return (new,)

        handle = attn.out_proj.register_forward_pre_hook(hook)
        try:
            with torch.no_grad():
                return metric(model(ids))
        finally:
            handle.remove()

    clean_value = run(clean_ids, replace=False)
    with torch.no_grad():
        corrupted_value = metric(model(corrupted_ids))
    patched_value = run(corrupted_ids, replace=True)
    return (patched_value - corrupted_value) / (clean_value - corrupted_value)
"""


def _find(**wrong: str) -> dict[str, str]:
    return {"find_head": _FIND.format(**{**_FOUND, **wrong})}


WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "07_causal_masking": {
        "masks: the decoder's padding not masked": ({"seq2seq_masks": _MASKS.format(
            self_mask="(j <= i)[None].expand(len(tgt_lengths), -1, -1)", cross_mask=_CROSS)},
            {"check_seq2seq_masks"}, "must be masked as keys"),
        "masks: a decoder self-attention that is not causal": ({"seq2seq_masks": _MASKS.format(
            self_mask="real_targets.expand(-1, n, -1)", cross_mask=_CROSS)},
            {"check_seq2seq_masks"}, "self-attention is causal"),
        "masks: padded queries masked instead of padded keys": ({"seq2seq_masks": _MASKS.format(
            self_mask="(j <= i)[None] & real_targets.transpose(1, 2)", cross_mask=_CROSS)},
            {"check_seq2seq_masks"}, "not the padded queries"),
        "masks: a causal cross-attention": ({"seq2seq_masks": _MASKS.format(
            self_mask=_SELF, cross_mask="real_sources & (torch.arange(m)[None, :] <= i)[None]")},
            {"check_seq2seq_masks"}, "cross-attention is not causal"),
        "masks: the source's padding not masked": ({"seq2seq_masks": _MASKS.format(
            self_mask=_SELF, cross_mask="torch.ones(len(src_lengths), n, m, dtype=torch.bool)")},
            {"check_seq2seq_masks"}, "source's padding must be masked"),
        "masks: the cross mask from the target lengths": ({"seq2seq_masks": _MASKS.format(
            self_mask=_SELF,
            cross_mask="(torch.arange(m)[None, None, :] < tgt_lengths[:, None, None]).expand(-1, n, -1)")},
            {"check_seq2seq_masks"}, "mask them with src_lengths"),
        "masks: the cross mask as (b, m, n)": ({"seq2seq_masks": _MASKS.format(
            self_mask=_SELF, cross_mask="real_sources.expand(-1, n, -1).transpose(1, 2)")},
            {"check_seq2seq_masks"}, "it is (b, m, n), transposed"),
        "masks: additive float masks": ({"seq2seq_masks": _MASKS.format(
            self_mask="torch.zeros(len(tgt_lengths), n, n).masked_fill(~((j <= i)[None] & real_targets), "
                      "float('-inf'))", cross_mask=_CROSS)}, {"check_seq2seq_masks"}, "boolean tensor"),
        "masks: True where attention is forbidden": ({"seq2seq_masks": _MASKS.format(
            self_mask=f"~({_SELF})", cross_mask=f"~{_CROSS}")}, {"check_seq2seq_masks"}, "complement"),
        "influence: only the last token changed": ({"influence": """
            ids = torch.randint(0, vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
            changed = ids.clone()
            changed[0, -1] = (ids[0, -1] + 1) % vocab_size
            reach = torch.ones(n, n, dtype=torch.bool).tril()
            with torch.no_grad():
                reach[:, -1] = (model(changed) != model(ids)).any(dim=-1)[0]
            return reach
            """}, {"check_influence"}, "misses a leak"),
        "influence: every token from s on changed at once": ({"influence": _INFLUENCE.format(
            changed="s:", result="reach")}, {"check_influence"}, "change one token at a time"),
        "influence: transposed": ({"influence": _INFLUENCE.format(changed="s", result="reach.T")},
                                  {"check_influence"}, "transposed"),
        "influence: the leaks only": ({"influence": _INFLUENCE.format(
            changed="s", result="reach.triu(1)")}, {"check_influence"}, "the causal ones too"),
        "influence: the token replaced by itself": ({"influence": _INFLUENCE.format(
            changed="s", result="reach").replace("(ids[0, s] + 1) % vocab_size", "ids[0, s]")},
            {"check_influence"}, "not even its own"),
        "influence: float ids": ({"influence": """
            with torch.no_grad():
                model(torch.rand(1, n) * vocab_size)
            return torch.ones(n, n, dtype=torch.bool).tril()
            """}, {"check_influence"}, "integer tensor"),
        "influence: a list of lists": ({"influence": _INFLUENCE.format(
            changed="s", result="reach.tolist()")}, {"check_influence"}, "boolean (n, n) tensor"),
        "gqa: recomputes every key and value from its own history": ({"gqa_step": _HISTORY.format(
            caches="keys, values")}, {"check_gqa_step"}, "recomputes the keys and values of every token"),
        "gqa: own history, zero-filled caches": ({"gqa_step": _HISTORY.format(
            caches="torch.zeros_like(keys), torch.zeros_like(values)")}, {"check_gqa_step"},
            "the caches must hold the keys"),
        "gqa: query head h reads key/value head h % n_kv": ({"gqa_step": _STEP.format(
            heads="torch.arange(n_heads) % n_kv_heads", scale=_SQRT)}, {"check_gqa_step"},
            "consecutive query heads share"),
        "gqa: no 1/sqrt(d_k)": ({"gqa_step": _STEP.format(heads=_GROUPED, scale="1.0")},
                                {"check_gqa_step"}, "√d_k"),
        "gqa: the new token not attended": ({"gqa_step": """
            q, k, v = project(x_t[None])
            d_k = q.shape[-1] // n_heads
            heads = torch.arange(n_heads) // (n_heads // n_kv_heads)
            if K_cache.shape[1] == 0:
                z = torch.zeros(n_heads * d_k, dtype=x_t.dtype)
            else:
                scores = q.view(n_heads, 1, d_k) @ K_cache[heads].transpose(1, 2) / math.sqrt(d_k)
                z = (torch.softmax(scores, dim=-1) @ V_cache[heads]).reshape(-1)
            return (z, torch.cat([K_cache, k.view(n_kv_heads, 1, d_k)], dim=1),
                    torch.cat([V_cache, v.view(n_kv_heads, 1, d_k)], dim=1))
            """}, {"check_gqa_step"}, "attend to itself"),
        "gqa: caches with the token axis first": ({"gqa_step": """
            q, k, v = project(x_t[None])
            d_k = q.shape[-1] // n_heads
            if K_cache.shape[1] == 0:
                K_cache, V_cache = K_cache.transpose(0, 1), V_cache.transpose(0, 1)
            K_cache = torch.cat([K_cache, k.view(1, n_kv_heads, d_k)], dim=0)
            V_cache = torch.cat([V_cache, v.view(1, n_kv_heads, d_k)], dim=0)
            heads = torch.arange(n_heads) // (n_heads // n_kv_heads)
            keys, values = K_cache.transpose(0, 1)[heads], V_cache.transpose(0, 1)[heads]
            scores = q.view(n_heads, 1, d_k) @ keys.transpose(1, 2) / math.sqrt(d_k)
            return (torch.softmax(scores, dim=-1) @ values).reshape(-1), K_cache, V_cache
            """}, {"check_gqa_step"}, "token axis first"),
        "gqa: caches that do not grow": ({"gqa_step": _STEP.format(heads=_GROUPED, scale=_SQRT).replace(
            "return (torch.softmax(scores, dim=-1) @ values).reshape(-1), K_cache, V_cache",
            "return (torch.softmax(scores, dim=-1) @ values).reshape(-1), K_cache[:, 1:], V_cache[:, 1:]")},
            {"check_gqa_step"}, "did you append the new key"),
        "gqa: torch's attention": ({"gqa_step": """
            q, k, v = project(x_t[None])
            d_k = q.shape[-1] // n_heads
            K_cache = torch.cat([K_cache, k.view(n_kv_heads, 1, d_k)], dim=1)
            V_cache = torch.cat([V_cache, v.view(n_kv_heads, 1, d_k)], dim=1)
            z = torch.nn.functional.scaled_dot_product_attention(q.view(n_heads, 1, d_k), K_cache, V_cache,
                                                                 enable_gqa=True)
            return z.reshape(-1), K_cache, V_cache
            """}, {"check_gqa_step"}, "scaled_dot_product_attention"),
        "gqa: projects the whole cache dimension at once": ({"gqa_step": """
            q, k, v = project(x_t)
            return q, K_cache, V_cache
            """}, {"check_gqa_step"}, "did you append the new key"),
        "find head: one given head patched (the copy that passed before)": ({"find_head": _ONE_HEAD},
                                                                             {"check_find_head"}, "must return a pair"),
        "find head: the next head's columns": (_find(cols="slice((head + 1) % n_heads * d_k, ((head + 1) % n_heads + 1) * d_k)"),
                                              {"check_find_head"}, "head h is the d_k columns"),
        "find head: the position before each one given": (_find(rows="[p - 1 for p in positions]"),
                                                         {"check_find_head"}, "one to the left"),
        "find head: the recovered fraction from the clean end": (_find(result="(clean - patched) / (clean - corrupted)"),
                                                                {"check_find_head"}, "measured from the wrong end"),
        "find head: every position": (_find(rows="slice(None)"), {"check_find_head"}, "patches every position"),
        "find head: every head of the layer": (_find(cols="slice(None)"), {"check_find_head"}, "patches every head"),
        "find head: the last hook left in place": (_find(
            remove="handle.remove() if (layer, head) != (n_layers - 1, n_heads - 1) else None"),
            {"check_find_head"}, "remove each hook"),
        "find head: the corrupted head run on the clean input": ({"find_head": _FIND.format(**{
            **_FOUND, "patched_input": "clean_ids"}).replace(
            "handle = attn.out_proj.register_forward_pre_hook(record)\n            clean = metric(model(clean_ids))",
            "handle = attn.out_proj.register_forward_pre_hook(record)\n            model(corrupted_ids)\n"
            "            handle.remove()\n            clean = metric(model(clean_ids))")},
            {"check_find_head"}, "runs the clean input with the corrupted run's head"),
        "find head: the largest fraction in size": (_find(best="divmod(int(fractions.abs().argmax()), n_heads)"),
                                                   {"check_find_head"}, "not the smallest nor the largest in size"),
        "find head: the smallest fraction": (_find(best="divmod(int(fractions.argmin()), n_heads)"),
                                            {"check_find_head"}, "not the smallest nor the largest in size"),
        "find head: the head as (head, layer)": (_find(best="divmod(int(fractions.argmax()), n_heads)[::-1]"),
                                                {"check_find_head"}, "blocks first"),
        "find head: the table indexed [head, layer]": (_find(table="fractions.T"), {"check_find_head"},
                                                      "indexed [layer, head]"),
    },
}
