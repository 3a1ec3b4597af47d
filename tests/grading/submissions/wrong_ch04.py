"""Known-wrong solutions of the chapter 4 exercises, in the format of ``wrong.py``."""
from __future__ import annotations

_HAND = """
product = {product}
order_sums = {orders}
bound = {bound}
layers_to_vanish = {layers}
"""


def _hand(product: str = "0.84", orders: str = "[0.2, -0.33, -0.05, 0.02]", bound: str = "2.78",
          layers: str = "10") -> dict[str, str]:
    return {"hand_expansion": _HAND.format(product=product, orders=orders, bound=bound, layers=layers)}


_ABLATE = """
x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[-1]))
sublayers = [(norm, sub) for block in model.blocks
             for norm, sub in ((block.norm1, block.attn), (block.norm2, block.mlp))]
for position, (norm, sub) in enumerate(sublayers):
    if {keep}:
        x = x + sub(norm(x))
return model.lm_head(model.norm_f(x))
"""

_ORDERS = """
d = Js[0].shape[0]
orders = [torch.eye(d, dtype=Js[0].dtype)] + [torch.zeros(d, d, dtype=Js[0].dtype) for _ in Js]
for J in Js:
    orders = [orders[0]] + [orders[r] + {step} for r in range(1, len(orders))]
return {result}
"""

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "04_the_residual_stream": {
        "hand: the product without residuals": (_hand(product="0.02"), {"check_hand_expansion"},
                                                "the stack without residuals"),
        "hand: running totals instead of order sums": (_hand(orders="[1.2, 0.87, 0.82, 0.84]"),
                                                       {"check_hand_expansion"}, "running totals"),
        "hand: each pair counted twice": (_hand(orders="[0.2, -0.66, -0.3, 0.48]"), {"check_hand_expansion"},
                                          "each subset of layers counts once"),
        "hand: one order sum miscomputed": (_hand(orders="[0.2, -0.33, 0.05, 0.02]"), {"check_hand_expansion"},
                                            "wrong entries (1 of 4), your values: order 3 = 0.05"),
        "hand: the bound from the signed product": (_hand(bound="-0.16"), {"check_hand_expansion"},
                                                    "not the signed product minus 1"),
        "hand: the looser exponential bound": (_hand(bound="3.953"), {"check_hand_expansion"},
                                               "the looser bound"),
        "hand: one layer short": (_hand(layers="9"), {"check_hand_expansion"}, "one layer short"),
        "hand: order sums as a string": (_hand(orders="'0.2, -0.33, -0.05, 0.02'"), {"check_hand_expansion"},
                                         "order_sums: expected a tensor (or numbers)"),
        "ablation removes only the write's direct effect": ({"ablate_write": """
            x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[-1]))
            writes = []
            for block in model.blocks:
                for norm, sub in ((block.norm1, block.attn), (block.norm2, block.mlp)):
                    writes.append(sub(norm(x)))
                    x = x + writes[-1]
            return model.lm_head(model.norm_f(x - writes[k]))
            """}, {"check_ablate_write"}, "only the write's direct effect was removed"),
        "ablation of the whole block": ({"ablate_write": _ABLATE.format(keep="position // 2 != k // 2")},
                                        {"check_ablate_write"}, "that removes the whole block"),
        "ablation of the next write (k counted from 1)": ({"ablate_write": _ABLATE.format(keep="position != k + 1")},
                                                          {"check_ablate_write"}, "writes count from 0"),
        "ablation that removes nothing": ({"ablate_write": _ABLATE.format(keep="True")}, {"check_ablate_write"},
                                          "write k was not removed"),
        "ablation returning the stream, not the logits": ({"ablate_write": """
            x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[-1]))
            for position, block in enumerate(model.blocks):
                if 2 * position != k:
                    x = x + block.attn(block.norm1(x))
                if 2 * position + 1 != k:
                    x = x + block.mlp(block.norm2(x))
            return model.norm_f(x)
            """}, {"check_ablate_write"}, "returns the stream's last state"),
        "ablation without the position embedding": ({"ablate_write": """
            x = model.tok_emb(idx)
            for position, block in enumerate(model.blocks):
                if 2 * position != k:
                    x = x + block.attn(block.norm1(x))
                if 2 * position + 1 != k:
                    x = x + block.mlp(block.norm2(x))
            return model.lm_head(model.norm_f(x))
            """}, {"check_ablate_write"}, "the logits differ from the model run with write k removed"),
        "ablation hard-coded to the visible three blocks": ({"ablate_write": """
            x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[-1]))
            for position, block in enumerate(list(model.blocks)[:3]):
                if 2 * position != k:
                    x = x + block.attn(block.norm1(x))
                if 2 * position + 1 != k:
                    x = x + block.mlp(block.norm2(x))
            return model.lm_head(model.norm_f(x))
            """}, {"check_ablate_write"}, "that removes the whole block"),
        "orders with the later layers on the right": ({"expansion_orders": _ORDERS.format(
            step="orders[r - 1] @ J", result="torch.stack(orders)")}, {"check_expansion_orders"},
            "later layers stand on the left"),
        "orders without order 0": ({"expansion_orders": _ORDERS.format(
            step="J @ orders[r - 1]", result="torch.stack(orders[1:])")}, {"check_expansion_orders"},
            "there are L + 1"),
        "orders as running totals": ({"expansion_orders": _ORDERS.format(
            step="J @ orders[r - 1]", result="torch.stack(orders).cumsum(dim=0)")}, {"check_expansion_orders"},
            "running totals"),
        "orders as a plain product, r times the same layer": ({"expansion_orders": """
            d = Js[0].shape[0]
            total = sum(Js)
            orders = [torch.eye(d, dtype=Js[0].dtype)]
            for _ in Js:
                orders.append(total @ orders[-1])
            return torch.stack(orders)
            """}, {"check_expansion_orders"}, "do not add up to the product"),
    },
}
