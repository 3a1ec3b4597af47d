"""Known-wrong solutions of the chapter 4 exercises, in the format of ``wrong.py``."""
from __future__ import annotations

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "04_the_residual_stream": {
        "norm after the addition (post-norm)": ({"pre_norm_block": """
            x1 = norm1(x + attn(x))
            return norm2(x1 + mlp(x1))
            """}, {"check_pre_norm_block"}, "post-norm"),
        "residual around the norm": ({"pre_norm_block": """
            h = norm1(x)
            x1 = h + attn(h)
            h2 = norm2(x1)
            return h2 + mlp(h2)
            """}, {"check_pre_norm_block"}, "around the norm"),
        "missing second residual": ({"pre_norm_block": """
            x1 = x + attn(norm1(x))
            return mlp(norm2(x1))
            """}, {"check_pre_norm_block"}, "second residual is missing"),
        "same norm for both sub-layers": ({"pre_norm_block": """
            x1 = x + attn(norm1(x))
            return x1 + mlp(norm1(x1))
            """}, {"check_pre_norm_block"}, "norm1 is used twice"),
        "writes are the stream's states": ({"stream_writes": """
            x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[-1]))
            x0, states = x, []
            for block in model.blocks:
                x = x + block.attn(block.norm1(x))
                states.append(x)
                x = x + block.mlp(block.norm2(x))
                states.append(x)
            return x0, states
            """}, {"check_stream_writes"}, "not what the sub-layer wrote"),
        "embedding without positions": ({"stream_writes": """
            x = model.tok_emb(idx)
            x0, writes = x, []
            for block in model.blocks:
                for norm, sub in ((block.norm1, block.attn), (block.norm2, block.mlp)):
                    w = sub(norm(x))
                    writes.append(w)
                    x = x + w
            return x0, writes
            """}, {"check_stream_writes"}, "position embeddings"),
        "sub-layers read the stream without its norm": ({"stream_writes": """
            x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[-1]))
            x0, writes = x, []
            for block in model.blocks:
                for sub in (block.attn, block.mlp):
                    w = sub(x)
                    writes.append(w)
                    x = x + w
            return x0, writes
            """}, {"check_stream_writes"}, "without its norm"),
        "only the attention writes": ({"stream_writes": """
            x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[-1]))
            x0, writes = x, []
            for block in model.blocks:
                w = block.attn(block.norm1(x))
                writes.append(w)
                x = x + w + block.mlp(block.norm2(x + w))
            return x0, writes
            """}, {"check_stream_writes"}, "only the attention writes"),
        "blocks hard-coded to the visible three": ({"stream_writes": """
            x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[-1]))
            x0, writes = x, []
            for block in list(model.blocks)[:3]:
                for norm, sub in ((block.norm1, block.attn), (block.norm2, block.mlp)):
                    w = sub(norm(x))
                    writes.append(w)
                    x = x + w
            return x0, writes
            """}, {"check_stream_writes"}, "a hidden test (other inputs) fails: expected # writes"),
        "shrinking sub-layer: zero (the identity layer)": ({"shrinking_sublayer": """
            return torch.zeros(d, d, dtype=torch.float64)
            """}, {"check_shrinking_sublayer"}, "eigenvalue"),
        "shrinking sub-layer: -2 I, too large": ({"shrinking_sublayer": """
            return -2 * torch.eye(d, dtype=torch.float64)
            """}, {"check_shrinking_sublayer"}, "> 1"),
        "shrinking sub-layer: hard-coded for d = 6": ({"shrinking_sublayer": """
            return -torch.eye(6, dtype=torch.float64)
            """}, {"check_shrinking_sublayer"}, "a hidden test (other inputs) fails: W has the wrong shape"),
    },
}
