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
    from transformer_lib.grading.checks import ch09_counting
    return sum(p.numel() for p in ch09_counting._reference_model(cfg).parameters())
"""}, {"check_param_count"}, "builds the model"),
        "flops: attention matmuls forgotten": ({"flops_per_token": """
    d, L, V = cfg["d_model"], cfg["n_layers"], cfg["vocab_size"]
    kv = cfg["n_kv_heads"] * (d // cfg["n_heads"])
    k = 3 if cfg["mlp"] == "swiglu" else 2
    return L * 2 * (2 * d * d + 2 * d * kv + k * d * cfg["d_ff"]) + 2 * d * V
"""}, {"check_flops_per_token"}, "left out the attention matmuls"),
        "flops: 6N training cost": ({"flops_per_token": """
    d, L, V = cfg["d_model"], cfg["n_layers"], cfg["vocab_size"]
    kv = cfg["n_kv_heads"] * (d // cfg["n_heads"])
    k = 3 if cfg["mlp"] == "swiglu" else 2
    return 3 * (L * (2 * (2 * d * d + 2 * d * kv + k * d * cfg["d_ff"]) + 4 * n * d) + 2 * d * V)
"""}, {"check_flops_per_token"}, "training cost"),
        "flops: the whole sequence, not per token": ({"flops_per_token": """
    d, L, V = cfg["d_model"], cfg["n_layers"], cfg["vocab_size"]
    kv = cfg["n_kv_heads"] * (d // cfg["n_heads"])
    k = 3 if cfg["mlp"] == "swiglu" else 2
    return n * (L * (2 * (2 * d * d + 2 * d * kv + k * d * cfg["d_ff"]) + 4 * n * d) + 2 * d * V)
"""}, {"check_flops_per_token"}, "per token"),
        "crossover: n = d": ({"crossover_n": """
    return float(cfg["d_model"])
"""}, {"check_crossover_n"}, "rule of thumb"),
        "crossover: always 6 d": ({"crossover_n": """
    return 6.0 * cfg["d_model"]
"""}, {"check_crossover_n"}, "·d holds for d_ff"),
        "crossover: against the MLP alone": ({"crossover_n": """
    k = 3 if cfg["mlp"] == "swiglu" else 2
    return 2 * k * cfg["d_model"] * cfg["d_ff"] / (4 * cfg["d_model"])
"""}, {"check_crossover_n"}, "crossover_n"),
    },
}
