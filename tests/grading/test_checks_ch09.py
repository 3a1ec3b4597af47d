"""The references inside the chapter 9 checks agree with the library's closed forms, and the
checks fail on answers a wrong formula gives (Chapter 9)."""
from __future__ import annotations

import pytest

from transformer_lib.config import ModelConfig
from transformer_lib.counting import forward_flops, param_count
from transformer_lib.grading import checks
from transformer_lib.grading.judges import ch09_counting

SMALL = dict(checks.EXAMPLE_CONFIG, vocab_size=321, n_ctx=40, d_model=48, n_layers=2, n_heads=6,
             n_kv_heads=3, d_ff=100)
CONFIGS = [checks.EXAMPLE_CONFIG, SMALL, dict(SMALL, mlp="swiglu", norm="rmsnorm", bias=False),
           dict(SMALL, tied_embeddings=False, positional="rope", n_kv_heads=1),
           dict(SMALL, bias=False, norm="layernorm")]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_reference_model_counts_like_param_count(cfg):
    model = ch09_counting._reference_model(cfg)
    assert ch09_counting._count(model) == param_count(ModelConfig(**cfg))


@pytest.mark.parametrize("cfg", CONFIGS[1:])
def test_reference_flops_equal_forward_flops(cfg):
    for n in (5, 17):
        assert ch09_counting._reference_flops(cfg, n) == forward_flops(ModelConfig(**cfg), n)


def test_checks_reject_off_by_one_and_the_library():
    def library_count(cfg):
        return param_count(ModelConfig(**cfg))

    answer = library_count(SMALL)
    checks.check_param_count(lambda cfg: answer, SMALL)
    with pytest.raises(AssertionError, match="differs"):
        checks.check_param_count(lambda cfg: answer + 1, SMALL)
    with pytest.raises(AssertionError, match="course library"):
        checks.check_param_count(library_count, SMALL)
