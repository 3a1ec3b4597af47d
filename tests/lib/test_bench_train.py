"""scripts/bench_train.py compares like with like: its torch.nn model is the library's GPT at
nanoGPT's CPU Shakespeare-char size, weight for weight (Chapter 7's model; `make bench`)."""
import importlib.util

import torch

from repo_paths import REPO
from transformer_lib.block import TransformerBlock
from transformer_lib.counting import count_params
from transformer_lib.model import GPT

_spec = importlib.util.spec_from_file_location("bench_train", REPO / "scripts" / "bench_train.py")
bench_train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_train)


def test_the_torch_nn_model_is_the_library_gpt_at_nanogpts_size():
    c = bench_train.CONFIG
    torch.manual_seed(0)
    ref, ours = bench_train.TorchNNGPT(c).eval(), GPT(c).eval()
    # nanoGPT's count at this size: 12·L·d² in the blocks, token and position tables, 2L + 1 gains
    assert count_params(ref) == count_params(ours) == 12 * 4 * 128**2 + 65 * 128 + 64 * 128 + 9 * 128 == 804_096
    with torch.no_grad():
        ours.tok_emb.weight.copy_(ref.tok_emb.weight)
        ours.pos_emb.weight.copy_(ref.pos_emb.weight)
        ours.norm_f.weight.copy_(ref.norm_f.weight)
        for block, layer in zip(ours.blocks, ref.blocks):
            block.load_state_dict(TransformerBlock.from_torch(layer, causal=True).state_dict())
        x = torch.randint(0, c.vocab_size, (2, c.n_ctx), generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
