"""What a head moves (Kobayashi et al. 2020): ``cap.moved`` and ``cap.value_norms`` against
a reference built by hand — the model's own eager weights, and ``f_h(x_j)`` obtained by running the
layer's own output projection module on head *h*'s slice alone — for every family in the support
table and every part (the GQA families' norms read each query head's own kv head); the self-check's
output-projection line, made to fail by a wrong head slice; words as the norm of summed vectors;
save/load and generation.
"""

from __future__ import annotations

import pytest
import torch

import attnviz
from attnviz.engine import projections
from attnviz.engine.projections import OutputProjection
from attnviz.errors import InputError, ValidationError
from attnviz.families import FAMILIES
from attnviz.workflows.capture.models import IdsTokenizer

EAGER = [f.tiny for f in FAMILIES if f.how != "refused" and "eager" in f.backends]

#: where each family's output projection sits, written out here (not read from attnviz's specs)
PROJECTION = {
    "bert": {"encoder": "encoder.layer.{}.attention.output.dense"},
    "roberta": {"encoder": "encoder.layer.{}.attention.output.dense"},
    "gpt2": {"decoder": "transformer.h.{}.attn.c_proj"},
    "openai-gpt": {"decoder": "transformer.h.{}.attn.c_proj"},
    "gpt_neo": {"decoder": "transformer.h.{}.attn.attention.out_proj"},
    "xglm": {"decoder": "model.layers.{}.self_attn.out_proj"},
    "bloom": {"decoder": "transformer.h.{}.self_attention.dense"},
    "falcon_alibi": {"decoder": "transformer.h.{}.self_attention.dense"},
    "mpt": {"decoder": "transformer.blocks.{}.attn.out_proj"},
    "albert": {"encoder": "encoder.albert_layer_groups.0.albert_layers.0.attention.dense"},  # one module, every layer
    **{f: {"encoder": "encoder.layer.{}.attention.output.dense"} for f in ("deberta", "deberta_v2")},
    "mpnet": {"encoder": "encoder.layer.{}.attention.attn.o"},
    **{f: {"decoder": "transformer.h.{}.self_attention.dense"} for f in ("falcon", "falcon_new")},
    "longt5": {
        "encoder": "encoder.block.{}.layer.0.LocalSelfAttention.o",
        "decoder": "decoder.block.{}.layer.0.SelfAttention.o",
        "cross": "decoder.block.{}.layer.1.EncDecAttention.o",
    },
    **{f: {"decoder": "model.layers.{}.self_attn.o_proj"} for f in ("llama", "qwen2", "mistral", "gpt_oss")},
    **{
        f: {
            "encoder": "model.encoder.layers.{}.self_attn.out_proj",
            "decoder": "model.decoder.layers.{}.self_attn.out_proj",
            "cross": "model.decoder.layers.{}.encoder_attn.out_proj",
        }
        for f in ("bart", "marian")
    },
    **{
        f: {
            "encoder": "encoder.block.{}.layer.0.SelfAttention.o",
            "decoder": "decoder.block.{}.layer.0.SelfAttention.o",
            "cross": "decoder.block.{}.layer.1.EncDecAttention.o",
        }
        for f in ("t5", "mt5", "umt5")
    },
}
HEADS = OutputProjection.__dict__["heads"]  # the property as attnviz has it, before a test breaks it
OWN_WEIGHTS = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}


def by_hand(model, path: str, v: torch.Tensor, n_heads: int) -> torch.Tensor:  # [head, key, hidden]
    """f_h(x_j): the model's own projection module run on head h's slice alone (the rest zero), its
    bias taken off; head h reads kv head h // (n_heads / n_kv_heads)."""
    module = model.get_submodule(path)
    kv, n, d = v.shape
    out = []
    with torch.no_grad():
        zero = module(torch.zeros(1, n, n_heads * d))[0]
        for h in range(n_heads):
            x = torch.zeros(1, n, n_heads * d)
            x[0, :, h * d : (h + 1) * d] = v[h // (n_heads // kv)].float()
            out.append(module(x)[0] - zero)
    return torch.stack(out)


def test_every_family_in_the_table_has_a_reference_here():
    assert set(EAGER) == set(PROJECTION)


@pytest.mark.parametrize("family", EAGER)
def test_contributions_are_the_models_weights_times_the_norm_of_its_own_projection_of_v(family):
    torch.manual_seed(0)
    model = attnviz.testing.tiny_model(family, attn_implementation="eager")
    ids = torch.randint(3, 100, (1, 9))
    kwargs = {"decoder_input_ids": torch.randint(3, 100, (1, 6))} if model.config.is_encoder_decoder else {}
    cap = attnviz.capture(model, input_ids=ids, **kwargs)
    with torch.no_grad():
        own = model(input_ids=ids, **kwargs, output_attentions=True)
    report = cap.validate()
    assert {(r["part"], r["layer"]) for r in report.projection} == set(cap.records)
    assert all(r["passed"] for r in report.projection)
    for part in cap.parts:
        weights = getattr(own, OWN_WEIGHTS[part]) if model.config.is_encoder_decoder else own.attentions
        for layer in cap.layer_indices(part):
            f = by_hand(model, PROJECTION[family][part].format(layer), cap.v(layer, part), cap.info(part)["n_heads"])
            norms = f.norm(dim=-1)
            torch.testing.assert_close(cap.value_norms(layer, part=part), norms, rtol=1e-4, atol=1e-6)
            alpha = weights[layer][0].float()
            if alpha.shape != norms[:, None, :].expand(-1, cap.layer(layer, part).n_queries, -1).shape:
                # LongT5's local attention returns its weights in blocks: tests/test_families.py proves
                # attnviz's map equal to them block by block, so the map stands in for them here
                alpha = cap.attention(layer, part=part)
            expected = alpha * norms[:, None, :]
            torch.testing.assert_close(cap.moved(layer, part=part), expected, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(cap.moved(layer, 1, part=part), expected[1], rtol=1e-4, atol=1e-6)


def test_the_toggles_reweight_and_the_norms_stay():
    model = attnviz.testing.tiny_model("llama")
    cap = attnviz.capture(model, input_ids=torch.arange(3, 14)[None])
    norms = cap.value_norms(1)
    for kwargs in ({"causal": False}, {"scale": False}, {"temperature": 2.0}):
        torch.testing.assert_close(cap.moved(1, **kwargs), cap.attention(1, **kwargs) * norms[:, None, :])


def test_words_get_the_norm_of_the_summed_vectors_not_the_sum_of_norms(tiny_bert_words):
    model, tokenizer = tiny_bert_words
    cap = attnviz.capture(model, "Tokenization of unbelievably long words happens.", tokenizer)
    assert any(len(w.tokens) > 2 for w in cap.words)
    layer, part = 1, "encoder"
    f = by_hand(model, PROJECTION["bert"][part].format(layer), cap.v(layer), cap.n_heads)  # [h, n, hidden]
    alpha = cap.attention(layer)
    expected = torch.zeros(cap.n_heads, len(cap.words), len(cap.words))
    for i, qw in enumerate(cap.words):
        beta = alpha[:, list(qw.tokens)].mean(1)  # [h, n]: the query word's mean weight on each token
        for j, kw in enumerate(cap.words):
            summed = (beta[:, list(kw.tokens), None] * f[:, list(kw.tokens)]).sum(1)
            expected[:, i, j] = summed.norm(dim=-1)
    got = cap.moved(layer, words=True)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    sum_of_norms = cap.to_words(cap.moved(layer))
    assert not torch.allclose(got, sum_of_norms, rtol=1e-3)  # the two definitions differ on multi-token words
    assert bool((got <= sum_of_norms + 1e-6).all())  # the triangle inequality
    torch.testing.assert_close(cap.moved(layer, 2, words=True), expected[2], rtol=1e-4, atol=1e-6)


def test_to_pandas_has_the_moved_column_and_the_capture_file_keeps_it(tmp_path):
    cap = attnviz.capture(attnviz.testing.tiny_model("gpt2"), input_ids=torch.arange(3, 10)[None])
    df = cap.to_pandas(layer=0)
    c = cap.moved(0)
    torch.testing.assert_close(torch.tensor(df.moved.to_numpy()), c.reshape(-1))
    back = attnviz.load(cap.save(tmp_path / "c.attnviz"))
    torch.testing.assert_close(back.moved(0), c)
    assert back.validate().projection == cap.validate().projection


def test_a_generation_proves_every_generated_row_against_the_projection():
    cap = attnviz.generate(
        attnviz.testing.tiny_model("llama"), "5 6 7 8 9 10 11", IdsTokenizer(), max_new_tokens=5
    ).capture
    rows = {r["rows"] for r in cap.validate().projection}
    assert rows == {cap.n_tokens}  # 7 prompt rows (all of a short prompt) and 5 generated, one per step
    torch.testing.assert_close(cap.moved(1), cap.attention(1) * cap.value_norms(1)[:, None, :])


@pytest.mark.parametrize(
    "break_it",
    [
        pytest.param(lambda self: HEADS.fget(self).flip(0), id="heads-in-reverse-order"),
        pytest.param(lambda self: HEADS.fget(self).roll(1, dims=-1), id="slice-off-by-one-column"),
    ],
)
def test_a_wrong_head_slice_fails_the_capture(monkeypatch, break_it):
    model = attnviz.testing.tiny_model("llama")
    monkeypatch.setattr(OutputProjection, "heads", property(break_it))
    with pytest.raises(ValidationError, match="output projection") as info:
        attnviz.capture(model, input_ids=torch.arange(3, 14)[None])
    assert not info.value.report.passed and all(not r["passed"] for r in info.value.report.projection)


def test_a_layer_without_a_readable_projection_says_so_and_the_weights_still_show(monkeypatch):
    monkeypatch.setattr(projections, "OUTPUT_PROJECTIONS", ())
    cap = attnviz.capture(attnviz.testing.tiny_model("gpt2"), input_ids=torch.arange(3, 10)[None])
    assert cap.validate().passed and cap.validate().projection == []
    with pytest.raises(InputError, match="no output projection"):
        cap.moved(0)
    assert cap.to_pandas(layer=0).moved.isna().all()
    assert cap.attention(0).shape == (4, 7, 7)
