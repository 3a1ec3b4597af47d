"""Submissions that try to earn points without the work, one per technique a student who writes Python
has used against checks that ran inside the kernel (issue: grading a student cannot beat).

Each is a correct submission in which one exercise's solution is replaced by the attack. Graded through
the command line, it must score 0 on the checks it attacks (``ATTACKS[stem][name][1]``) and exactly
the honest points elsewhere. The attacks are written against the checks as they were (the expected value
in the check's frame, the watch in the calling thread only, labels on the objects handed in): they must
fail whatever the checks look like now.
"""
from __future__ import annotations

# Walk up the frames of the check that called us and return the first expected value found there.
CLIMB = '''
import sys
frame = sys._getframe(1)
while frame is not None:
    for name in ("expected", "out_ref", "w_ref", "ref"):
        if name in frame.f_locals:
            return frame.f_locals[name]
    frame = frame.f_back
raise RuntimeError("nothing to climb to")
'''

ATTACKS: dict[str, dict[str, tuple[dict[str, str], set[str]]]] = {
    "03_the_transformer_block": {
        "climb the stack": ({"rms_norm": CLIMB}, {"check_rms_norm"}),
        "banned call in a thread": ({"rms_norm": """
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(torch.rms_norm, x, (x.shape[-1],), gamma, eps).result()
            """}, {"check_rms_norm"}),
        "switch the watch off": ({"rms_norm": """
            import sys
            sys.setprofile(None)
            with torch._C.DisableTorchFunction():
                return torch.rms_norm(x, (x.shape[-1],), gamma, eps)
            """}, {"check_rms_norm"}),
        "torch.ops": ({"rms_norm": """
            return torch.ops.aten.rms_norm(x, [x.shape[-1]], gamma, eps)
            """}, {"check_rms_norm"}),
    },
    "04_the_residual_stream": {
        "climb the stack": ({"ablate_write": CLIMB}, {"check_ablate_write"}),
    },
    "05_multi_head_attention": {
        "the library's split in a thread": ({"split_qkv": """
            import threading
            from transformer_lib.multihead import split_heads as library_split

            d_k = fused.shape[-1] // (n_heads + 2 * n_kv_heads)
            out = []

            def work():
                q, k, v = fused.split([n_heads * d_k, n_kv_heads * d_k, n_kv_heads * d_k], dim=-1)
                out.extend([library_split(q, n_heads), library_split(k, n_kv_heads), library_split(v, n_kv_heads)])

            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
            return tuple(out)
            """}, {"check_split_qkv"}),
    },
    "06_positional_information": {
        "read the encoder's tables from its closure": ({"relative_test": """
            cells = [c.cell_contents for c in (encode.__closure__ or ())]
            tables = [c for c in cells if isinstance(c, torch.Tensor)]
            angles, gain, added = tables[:3]
            steps = angles[1:] - angles[:-1]
            return bool(torch.allclose(steps, steps[0]) and torch.all(gain == gain[0]) and not added.any())
            """}, {"check_relative_test"}),
    },
    "07_causal_masking": {
        "read the leak off the model": ({"influence": """
            reach = torch.ones(n, n, dtype=torch.bool).tril()
            if any(ahead > 0 for ahead in getattr(model, "ahead", [0])):
                reach |= torch.ones(n, n, dtype=torch.bool).triu(1)
            return reach
            """}, {"check_influence"}),
        "forgive every failure": ({"influence": """
            import ast

            class Forgive(ast.NodeTransformer):
                def visit_Module(self, node):
                    node.body = [ast.Try(body=node.body, handlers=[ast.ExceptHandler(body=[ast.Pass()])],
                                         orelse=[], finalbody=[])]
                    return ast.fix_missing_locations(node)

            get_ipython().ast_transformers.append(Forgive())
            return torch.ones(n, n, dtype=torch.bool).tril()
            """}, {"check_influence"}),
    },
    "08_mixture_of_experts": {
        "the uncounted back door": ({"moe_capacity": """
            top, idx = torch.softmax(x @ W_g, dim=-1).topk(k, dim=-1)
            weights = top / top.sum(-1, keepdim=True)
            y = torch.zeros_like(x)
            for e, expert in enumerate(experts):
                out = expert._uncounted(x)  # every expert on every token, uncounted
                y += (weights * (idx == e)).sum(-1, keepdim=True) * out
            return y, torch.ones(idx.shape, dtype=torch.bool)
            """}, {"check_moe_capacity"}),
        "rewrite the call log": ({"moe_capacity": """
            top, idx = torch.softmax(x @ W_g, dim=-1).topk(k, dim=-1)
            weights = top / top.sum(-1, keepdim=True)
            y = torch.zeros_like(x)
            for e, expert in enumerate(experts):
                out = expert(x)  # every expert on every token
                y += (weights * (idx == e)).sum(-1, keepdim=True) * out
                expert.calls[:] = [int((idx == e).sum())]
            return y, torch.ones(idx.shape, dtype=torch.bool)
            """}, {"check_moe_capacity"}),
    },
    "09_parameter_and_flop_counting": {
        "smuggle the hidden inputs out through the answer": ({"param_count": """
            if cfg["vocab_size"] not in (50257, 1000):  # a hidden test: send its configuration back, as a number
                return int.from_bytes(repr(sorted(cfg.items())).encode()[:127], "big")
            d, L, V = cfg["d_model"], cfg["n_layers"], cfg["vocab_size"]
            kv = cfg["n_kv_heads"] * (d // cfg["n_heads"])
            f, b = cfg["d_ff"], cfg["bias"]
            k = 3 if cfg["mlp"] == "swiglu" else 2
            attention = 2 * d * d + 2 * d * kv + (2 * d + 2 * kv if b else 0)
            mlp = k * d * f + ((k - 1) * f + d if b else 0)
            norm = 2 * d if cfg["norm"] == "layernorm" and b else d
            embeddings = V * d * (1 if cfg["tied_embeddings"] else 2)
            positions = cfg["n_ctx"] * d if cfg["positional"] == "learned" else 0
            return L * (attention + mlp + 2 * norm) + embeddings + positions + norm
            """}, {"check_param_count"}),
        "read the instructor notebook": ({"param_count": """
            import glob, json
            for path in glob.glob("/proc/*/cmdline"):
                for arg in open(path, "rb").read().decode(errors="replace").split("\\0"):
                    if arg.endswith(".ipynb"):
                        exec(json.load(open(arg))["cells"][3]["source"])
            return param_count(cfg)
            """}, {"check_param_count"}),
    },
    "appendix_beyond_words": {
        "the quadratic form in a thread": ({"causal_linear_attention": """
            from concurrent.futures import ThreadPoolExecutor

            def quadratic():
                phi_q, phi_k = F.elu(Q) + 1, F.elu(K) + 1
                kernel = phi_q @ phi_k.transpose(-2, -1)
                return (kernel / kernel.sum(-1, keepdim=True)) @ V
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(quadratic).result()
            """}, {"check_causal_linear_attention"}),
    },
}
