"""Known-wrong solutions of Exercises 9 (format of ``wrong.py``): the solution bodies substituted
(by grade_id), the checks that must catch them (and only those), a phrase of the first message."""
from __future__ import annotations

_SHAPES = """
    d, L, V = cfg["d_model"], cfg["n_layers"], cfg["vocab_size"]
    kv = cfg["n_kv_heads"] * (d // cfg["n_heads"])
    f, b = cfg["d_ff"], cfg["bias"]
    k = 3 if cfg["mlp"] == "swiglu" else 2
    norm = 2 * d if cfg["norm"] == "layernorm" and b else d
    positions = cfg["n_ctx"] * d if cfg["positional"] == "learned" else 0
    embeddings = V * d * (1 if cfg["tied_embeddings"] else 2)
"""


def _count(attention: str, mlp: str, norm: str = "norm", embeddings: str = "embeddings") -> str:
    return _SHAPES + f"""
    block = {attention} + {mlp} + 2 * {norm}
    return L * block + {embeddings} + positions + {norm}
"""


_ATTENTION = "(2 * d * d + 2 * d * kv + (2 * d + 2 * kv if b else 0))"
_MOE = """
    d, L, V = cfg["d_model"], cfg["n_layers"], cfg["vocab_size"]
    kv = cfg["n_kv_heads"] * (d // cfg["n_heads"])
    k = 3 if cfg["mlp"] == "swiglu" else 2
    router = 2 * d * n_experts
    return L * (2 * (2 * d * d + 2 * d * kv) + 4 * n * d + {experts} * 2 * k * d * cfg["d_ff"] + router) + 2 * d * V
"""
_DECODE = """
    d, L = cfg["d_model"], cfg["n_layers"]
    kv = cfg["n_kv_heads"] * (d // cfg["n_heads"])
    k = 3 if cfg["mlp"] == "swiglu" else 2
    weights = L * (2 * d * d + 2 * d * kv + k * d * cfg["d_ff"]) + d * cfg["vocab_size"]
    flops = 2 * weights + 4 * L * n * d
    gain = flops - ratio * {cache}
    if gain <= 0:
        return None
    return max(1, -(-ratio * 2 * weights // gain))
"""
_CACHE = "2 * 2 * L * n * kv"
_MLP = "(k * d * f + ((k - 1) * f + d if b else 0))"

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "09_parameter_and_flop_counting": {
        "params: the model built with torch.nn and measured": ({"param_count": """
    import torch
    from torch import nn

    d, f, b = cfg["d_model"], cfg["d_ff"], cfg["bias"]
    kv = cfg["n_kv_heads"] * (d // cfg["n_heads"])
    with torch.device("meta"):
        def norm():
            return nn.RMSNorm(d) if cfg["norm"] == "rmsnorm" else nn.LayerNorm(d, bias=b)
        def block():
            mlp = [nn.Linear(d, f, bias=b) for _ in range(3 if cfg["mlp"] == "swiglu" else 2)]
            mlp[-1] = nn.Linear(f, d, bias=b)
            return nn.ModuleList([norm(), nn.Linear(d, d, bias=b), nn.Linear(d, kv, bias=b),
                                  nn.Linear(d, kv, bias=b), nn.Linear(d, d, bias=b), norm(), *mlp])
        model = nn.ModuleDict({"tok": nn.Embedding(cfg["vocab_size"], d), "norm_f": norm(),
                               "blocks": nn.ModuleList(block() for _ in range(cfg["n_layers"])),
                               "head": nn.Linear(d, cfg["vocab_size"], bias=False)})
        if cfg["positional"] == "learned":
            model["pos"] = nn.Embedding(cfg["n_ctx"], d)
    if cfg["tied_embeddings"]:
        model["head"].weight = model["tok"].weight
    return sum(p.numel() for p in model.parameters())
"""}, {"check_param_count"}, "builds the model"),
        "params: biases forgotten": ({"param_count": _count(
            "(2 * d * d + 2 * d * kv)", "k * d * f")}, {"check_param_count"}, "biases"),
        "params: norms forgotten": ({"param_count": _SHAPES + """
    block = 2 * d * d + 2 * d * kv + (2 * d + 2 * kv if b else 0) + k * d * f + ((k - 1) * f + d if b else 0)
    return L * block + embeddings + positions
"""}, {"check_param_count"}, "left out the norms"),
        "params: tied embedding counted twice": ({"param_count": _count(
            _ATTENTION, _MLP, embeddings="2 * V * d")}, {"check_param_count"}, "count it once"),
        "params: 12 L d^2 + V d": ({"param_count": """
    return 12 * cfg["n_layers"] * cfg["d_model"] ** 2 + cfg["vocab_size"] * cfg["d_model"]
"""}, {"check_param_count"}, "approximation"),
        "params: SwiGLU with two matrices": ({"param_count": _count(
            _ATTENTION, "(2 * d * f + (f + d if b else 0))")}, {"check_param_count"}, "three d × d_ff"),
        "params: GQA ignored (K, V as d x d)": ({"param_count": _count(
            "(4 * d * d + (4 * d if b else 0))", _MLP)}, {"check_param_count"}, "grouped-query"),
        "params: hard-coded GPT-2 small": ({"param_count": """
    return 124_439_808
"""}, {"check_param_count"}, "differs from the number of parameters"),
        "params: from the course library": ({"param_count": """
    from transformer_lib.config import ModelConfig
    from transformer_lib.counting import param_count as library_count
    return library_count(ModelConfig(**cfg))
"""}, {"check_param_count"}, "the course library"),
        "params: the check's own reference model": ({"param_count": """
    from transformer_lib.grading.judges import ch09_counting
    return sum(p.numel() for p in ch09_counting._reference_model(cfg).parameters())
"""}, {"check_param_count"}, "builds the model"),
        "moe flops: every expert counted": ({"moe_flops": _MOE.format(experts="n_experts")},
                                            {"check_moe_flops"}, "only the top_k = 2 chosen experts"),
        "moe flops: one expert per token": ({"moe_flops": _MOE.format(experts="1")},
                                            {"check_moe_flops"}, "not one"),
        "moe flops: the router forgotten": ({"moe_flops": _MOE.format(experts="top_k").replace(
            "router = 2 * d * n_experts", "router = 0")}, {"check_moe_flops"}, "the router is a product"),
        "moe flops: SwiGLU experts with two matrices": ({"moe_flops": _MOE.format(experts="top_k").replace(
            'k = 3 if cfg["mlp"] == "swiglu" else 2', "k = 2")}, {"check_moe_flops"}, "three d × d_ff"),
        "moe flops: attention matmuls forgotten": ({"moe_flops": _MOE.format(experts="top_k").replace(
            " + 4 * n * d", "")}, {"check_moe_flops"}, "left out the attention matmuls"),
        "moe flops: the whole sequence": ({"moe_flops": _MOE.format(experts="top_k").replace(
            "return L *", "return n * L *").replace("+ 2 * d * V", "+ n * 2 * d * V")},
            {"check_moe_flops"}, "per token"),
        "moe flops: the model built and measured": ({"moe_flops": """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    d, f = cfg["d_model"], cfg["d_ff"]
    with FlopCounterMode(display=False) as counter:
        x = torch.zeros(n, d)
        up, down = torch.nn.Linear(d, f, bias=False), torch.nn.Linear(f, d, bias=False)
        down(up(x))
    return counter.get_total_flops() * top_k * cfg["n_layers"] / n
"""}, {"check_moe_flops"}, "builds the model"),
        "moe flops: from the course library": ({"moe_flops": """
    from transformer_lib.config import ModelConfig
    from transformer_lib.counting import flops_per_token
    return flops_per_token(ModelConfig(**cfg, n_experts=n_experts, top_k=top_k), n)
"""}, {"check_moe_flops"}, "the course library"),
        "decode: the cache bytes left out": ({"decode_batch": _DECODE.format(cache="0")},
                                             {"check_decode_batch"}, "each sequence reads its own KV cache"),
        "decode: attention FLOPs left out": ({"decode_batch": _DECODE.format(cache=_CACHE).replace(
            " + 4 * L * n * d", "")}, {"check_decode_batch"}, "also does the attention FLOPs"),
        "decode: 4-byte numbers": ({"decode_batch": _DECODE.format(cache=_CACHE).replace(
            "2 * 2 * L * n * kv", "4 * 2 * L * n * kv").replace("ratio * 2 * weights", "ratio * 4 * weights")},
            {"check_decode_batch"}, "2 bytes, not 4"),
        "decode: the cache without grouped-query attention": ({"decode_batch": _DECODE.format(
            cache="2 * 2 * L * n * d")}, {"check_decode_batch"},
            "decode_batch(cfg, n, ratio): with grouped-query attention"),
        "decode: rounded down": ({"decode_batch": _DECODE.format(cache=_CACHE).replace(
            "-(-ratio * 2 * weights // gain)", "ratio * 2 * weights // gain")}, {"check_decode_batch"}, "round up"),
        "decode: a batch is always found": ({"decode_batch": _DECODE.format(cache=_CACHE).replace(
            "return None", "gain = 1")}, {"check_decode_batch"},
            "decode_batch(cfg, n, ratio): no batch reaches"),
        "decode: the visible answer": ({"decode_batch": """
    return 8
"""}, {"check_decode_batch"}, "decode_batch(cfg, n, ratio)"),
    },
}
