"""Counterfactual edits (attnviz.edits, attnviz.intervene, attnviz.head_importance) on tiny models,
against hand-computed results and against the model run with its own modules changed by hand."""

from __future__ import annotations

import pytest
import torch
from conftest import BLOOM_SLOW

import attnviz
from attnviz import edits
from attnviz.engine.listeners import listeners
from attnviz.engine.taps import installed_backends
from attnviz.errors import InputError, OutOfRangeError, UnsupportedModelError
from attnviz.workflows.capture.models import IdsTokenizer

TEXT = "11 5 7 9 13 21 8 30"
OTHER = "12 6 40 3 17 25 9 2"  # the same length, other tokens
TOK = IdsTokenizer()


def _run(family, edit_list, impl="sdpa", **kw):
    model = attnviz.testing.tiny_model(family, attn_implementation=impl)
    if model.config.is_encoder_decoder:
        kw.setdefault("target", "3 4 5 6 7 8")
    return model, attnviz.intervene(model, TEXT, edit_list, TOK, **kw)


def _by_hand(cap, layer, head, part, *, scale=None, temperature=1.0, causal=True):
    """softmax(Q·Kᵀ·scale / t) with the causal mask, from the captured Q and K (no attnviz SDPA)."""
    rec = cap.layer(layer, part)
    q = rec.q[head].float()
    k = rec.k[cap.kv_head_of(head, part)].float()
    scores = q @ k.T * (rec.scaling if scale is None else scale) / temperature
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1)


@pytest.mark.parametrize(
    "family,impl,part",
    [
        ("llama", "sdpa", "decoder"),
        ("llama", "eager", "decoder"),
        ("gpt2", "sdpa", "decoder"),
        ("bert", "sdpa", "encoder"),
        ("t5", "eager", "decoder"),  # (an encoder's knockout would change the decoder's input too)
        ("bart", "sdpa", "cross"),
        ("deberta_v2", "eager", "encoder"),  # its relative terms: a recorded bias the edit keeps
        ("deberta", "eager", "encoder"),  # v1: q_bias and v_bias added after its fused projection
        ("albert", "sdpa", "encoder"),  # layer 1 is the shared module's second call
        ("mpnet", "eager", "encoder"),  # its relative position bias, computed inline
        ("longt5", "eager", "encoder"),  # its local blocks: the projection hooks beside the interface
    ],
)
def test_knockout_zeroes_the_key_and_the_row_renormalises(family, impl, part):
    model, out = _run(family, [edits.knockout(layer=1, head=0, query=5, key=[2, 3], part=part)], impl)
    before = out.capture_before.attention(1, 0, part=part)
    after = out.capture_after.attention(1, 0, part=part)
    expected = before[5].clone()
    expected[[2, 3]] = 0
    expected /= expected.sum()
    assert after[5, [2, 3]].abs().max() == 0
    torch.testing.assert_close(after[5], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(after[:5], before[:5], atol=1e-6, rtol=0)  # other queries untouched
    torch.testing.assert_close(  # other heads untouched
        out.capture_after.attention(1, 1, part=part), out.capture_before.attention(1, 1, part=part), atol=1e-6, rtol=0
    )
    assert out.check_error <= 1e-5 and out.check_tolerance == 1e-4
    assert out.capture_after.model["edits"] == [f"knockout 5 ↛ 2/3 at L1·H0 ({part})"]


def test_knockout_with_a_sink_keeps_the_sinks_share():
    model, out = _run("gpt_oss", [edits.knockout(layer=0, head=1, key="7")], "eager")
    rec = out.capture_before.layer(0, "decoder")
    q, k = rec.q[1].float(), rec.k[out.capture_before.kv_head_of(1, "decoder")].float()
    allowed = out.capture_before.allowed(0)  # causal, and a sliding window in this layer
    scores = (q @ k.T * rec.scaling).masked_fill(~allowed, float("-inf"))
    scores[:, 2] = float("-inf")
    sink = rec.sinks[1].float().expand(8, 1)
    expected = torch.softmax(torch.cat([scores, sink], -1), -1)[:, :-1]
    torch.testing.assert_close(out.capture_after.attention(0, 1), expected, atol=1e-6, rtol=0)
    assert float(out.capture_after.attention(0, 1).sum(-1).max()) < 1  # the sink still takes its share


def test_the_seeds_toggles_act_on_the_model():
    model, out = _run("llama", [edits.no_scaling(layer=0), edits.temperature(2.0, layer=1, head=[0, 1])])
    cap = out.capture_before
    torch.testing.assert_close(
        out.capture_after.attention(0, 2), _by_hand(cap, 0, 2, "decoder", scale=1.0), atol=1e-6, rtol=0
    )
    # layer 1 reads what the edited layer 0 wrote: its Q and K are the edited run's
    scaling = cap.layer(1).scaling
    torch.testing.assert_close(
        out.capture_after.attention(1, 1),
        _by_hand(out.capture_after, 1, 1, "decoder", scale=scaling, temperature=2.0),
        atol=1e-6,
        rtol=0,
    )
    torch.testing.assert_close(
        out.capture_after.attention(1, 2),
        _by_hand(out.capture_after, 1, 2, "decoder", scale=scaling),
        atol=1e-6,
        rtol=0,
    )
    assert out.before.top_tokens(1) != [] and out.after.logprobs.shape == out.before.logprobs.shape
    assert abs(out.delta_logprob(out.before.top_tokens(1)[0].id)) > 0  # the edits reached the prediction

    _, unmasked = _run("llama", [edits.no_causal_mask(layer=0, head=3)])
    after = unmasked.capture_after.attention(0, 3)
    torch.testing.assert_close(
        after, _by_hand(unmasked.capture_before, 0, 3, "decoder", causal=False), atol=1e-6, rtol=0
    )
    assert float(after[0, 1:].sum()) > 0  # the first token now sees the text after it


def test_uniform_and_patch_replace_the_pattern():
    model, out = _run("llama", [edits.uniform(layer=0, head=1)])
    expected = torch.ones(8, 8).tril()
    torch.testing.assert_close(out.capture_after.attention(0, 1), expected / expected.sum(-1, keepdim=True))

    source = attnviz.capture(model, OTHER, TOK)
    patched = attnviz.intervene(model, TEXT, [edits.patch(source=source, layer=1, head=[0, 2])], TOK)
    for h in (0, 2):
        torch.testing.assert_close(patched.capture_after.attention(1, h), source.attention(1, h), atol=1e-6, rtol=0)
    torch.testing.assert_close(patched.capture_after.attention(1, 1), patched.capture_before.attention(1, 1))

    with pytest.raises(InputError, match="same length"):
        attnviz.intervene(model, TEXT + " 4", [edits.patch(source=source, layer=1, head=0)], TOK)
    other_model = attnviz.capture(attnviz.testing.tiny_model("gpt2"), OTHER, TOK)
    with pytest.raises(InputError, match="one model"):
        attnviz.intervene(model, TEXT, [edits.patch(source=other_model, layer=1, head=0)], TOK)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_zero_ablating_every_head_of_a_layer_removes_the_attention_blocks_output(family):
    model, out = _run(family, [edits.ablate(layer=1)])
    ids = torch.tensor([out.capture_before.token_ids])
    block = model.model.layers[1].self_attn.o_proj if family == "llama" else model.transformer.h[1].attn.c_proj
    handle = block.register_forward_pre_hook(lambda module, args: (torch.zeros_like(args[0]),))
    try:
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
    finally:
        handle.remove()
    torch.testing.assert_close(out.after.logprobs, torch.log_softmax(logits.float(), -1), atol=1e-5, rtol=0)
    assert out.check_error == 0.0  # ablation alone keeps the model's own kernel


def test_mean_ablation_replaces_a_heads_output_by_its_mean_over_the_text():
    model, out = _run("llama", [edits.ablate(layer=0, head=2, how="mean")])
    d = model.config.hidden_size // model.config.num_attention_heads

    def mean_head(module, args):
        x = args[0].clone()
        x[..., 2 * d : 3 * d] = x[..., 2 * d : 3 * d].mean(dim=1, keepdim=True)
        return (x,)

    handle = model.model.layers[0].self_attn.o_proj.register_forward_pre_hook(mean_head)
    try:
        with torch.no_grad():
            logits = model(torch.tensor([out.capture_before.token_ids])).logits[0, -1]
    finally:
        handle.remove()
    torch.testing.assert_close(out.after.logprobs, torch.log_softmax(logits.float(), -1), atol=1e-5, rtol=0)


def test_a_continuation_of_several_tokens_is_scored_whole():
    model, out = _run("llama", [edits.knockout(layer=0, key="5")])
    ids = torch.tensor([out.capture_before.token_ids + [40]])
    with torch.no_grad():
        logits = torch.log_softmax(model(ids).logits[0].float(), -1)
    expected = float(logits[7, 40] + logits[8, 41])
    before, after = out.logprob([40, 41])
    assert before == pytest.approx(expected, abs=1e-4)
    assert after != pytest.approx(before, abs=1e-6)
    assert out.delta_logprob([40, 41]) == pytest.approx(after - before)


def test_an_encoder_without_a_head_reports_its_hidden_states():
    model, out = _run("bert", [edits.ablate(layer=1)])
    assert out.before is None and out.similarity.shape == (8,)
    ids = torch.tensor([out.capture_before.token_ids])
    with torch.no_grad():
        plain = model(ids).last_hidden_state[0]
        handle = model.encoder.layer[1].attention.output.dense.register_forward_pre_hook(
            lambda module, args: (torch.zeros_like(args[0]),)
        )
        try:
            removed = model(ids).last_hidden_state[0]
        finally:
            handle.remove()
    expected = torch.nn.functional.cosine_similarity(removed, plain, dim=-1)
    torch.testing.assert_close(out.similarity, expected, atol=1e-6, rtol=0)
    assert float(expected.min()) < 1 - 1e-6  # the ablation reached the output (tiny random BERT: a small change)
    with pytest.raises(InputError, match="no language-model head"):
        out.delta_logprob(5)


def _hidden_with_heads_zeroed(model, ids, projection, heads, call):
    """The encoder's last hidden states' cosine with the plain ones when ``heads``' slices of
    ``projection``'s input are zeroed at its ``call``-th call (ALBERT's projection runs once per
    layer) — the ablation done by hand."""
    d = model.config.hidden_size // model.config.num_attention_heads
    calls = []

    def zero(module, args):
        calls.append(len(calls))
        if calls[-1] != call:
            return None
        x = args[0].clone()
        for head in heads:
            x[..., head * d : (head + 1) * d] = 0
        return (x,)

    with torch.no_grad():
        plain = model(ids).last_hidden_state[0]
        handle = projection.register_forward_pre_hook(zero)
        try:
            removed = model(ids).last_hidden_state[0]
        finally:
            handle.remove()
    return torch.nn.functional.cosine_similarity(removed, plain, dim=-1)


#: each family's layer-1 output projection, and which of its calls is layer 1's (ALBERT's runs every layer)
PROJECTIONS = {
    "deberta_v2": (lambda m: m.encoder.layer[1].attention.output.dense, 0),
    "mpnet": (lambda m: m.encoder.layer[1].attention.attn.o, 0),
    "albert": (lambda m: m.encoder.albert_layer_groups[0].albert_layers[0].attention.dense, 1),
}


@pytest.mark.parametrize("family", PROJECTIONS)
def test_ablating_a_head_of_the_newer_encoders_equals_zeroing_its_slice_by_hand(family):
    """An ablation follows the capture in the families with relative terms computed inline (DeBERTa,
    MPNet: the projection hooks) and with one module shared by every layer (ALBERT: layer 1 is its
    module's second call)."""
    model, out = _run(family, [edits.ablate(layer=1, head=[1, 2])], "eager")
    ids = torch.tensor([out.capture_before.token_ids])
    projection, call = PROJECTIONS[family]
    expected = _hidden_with_heads_zeroed(model, ids, projection(model), [1, 2], call=call)
    torch.testing.assert_close(out.similarity, expected, atol=1e-6, rtol=0)
    assert float(expected.min()) < 1 - 1e-6  # the ablation reached the output
    assert out.check_error == 0.0  # ablation alone keeps the model's own kernel


def test_bad_edits_are_refused_with_what_to_do():
    model = attnviz.testing.tiny_model("llama")
    for edit, error, words in [
        (edits.knockout(layer=9, key=1), OutOfRangeError, "layers 0..1"),
        (edits.knockout(layer=0, head=7, key=1), OutOfRangeError, "heads 0..3"),
        (edits.knockout(key="nope"), InputError, "no word or token 'nope'"),
        (edits.knockout(query=30, key=1), OutOfRangeError, "tokens 0..7"),
        (edits.ablate(part="encoder"), InputError, "no encoder attention"),
    ]:
        with pytest.raises(error, match=words):
            attnviz.intervene(model, TEXT, [edit], TOK)
    with pytest.raises(InputError, match="not causal"):
        attnviz.intervene(attnviz.testing.tiny_model("bert"), TEXT, [edits.no_causal_mask()], TOK)
    with pytest.raises(InputError, match="at least one edit"):
        attnviz.intervene(model, TEXT, [], TOK)
    with pytest.raises(InputError, match="'zero' or 'mean'"):
        edits.ablate(how="half")
    with pytest.raises(InputError, match="> 0"):
        edits.temperature(0)
    bloom = attnviz.testing.tiny_model("bloom", **BLOOM_SLOW)  # refused (inline edits: test_edits_inline.py)
    with pytest.raises(UnsupportedModelError, match="slow_but_exact=True bypasses"):
        attnviz.intervene(bloom, TEXT, [edits.ablate(layer=0)], TOK)
    assert installed_backends() == {} and listeners() == ()


def test_the_model_is_unmodified_afterwards_also_when_forward_raises():
    model = attnviz.testing.tiny_model("llama")
    ids = torch.tensor([[11, 5, 7, 9]])
    with torch.no_grad():
        reference = model(ids).logits
    attnviz.intervene(model, TEXT, [edits.uniform(layer=0), edits.ablate(layer=1, head=0)], TOK)
    assert installed_backends() == {} and listeners() == ()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, atol=0, rtol=0)

    def boom(module, args):
        raise RuntimeError("boom")

    handle = model.model.layers[1].register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            attnviz.intervene(model, TEXT, [edits.uniform(layer=0)], TOK)
    finally:
        handle.remove()
    assert installed_backends() == {} and listeners() == ()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, atol=0, rtol=0)


def test_head_importance_equals_ablating_each_head_alone():
    model = attnviz.testing.tiny_model("llama")
    seen = []
    df = attnviz.head_importance(
        model, TEXT, 40, TOK, batch_size=3, progress=False, on_progress=lambda done, total: seen.append((done, total))
    )
    assert len(df) == 2 * 4 and list(df.columns) == ["layer", "head", "logprob", "logprob_drop"]
    assert seen[-1] == (8, 8) and len(seen) == 3  # 3 + 3 + 2 heads
    assert df["logprob_drop"].is_monotonic_decreasing
    for row in df.itertuples():
        alone = attnviz.intervene(model, TEXT, [edits.ablate(layer=row.layer, head=row.head)], TOK)
        assert row.logprob_drop == pytest.approx(-alone.delta_logprob(40), abs=1e-5)
    assert df.attrs["logprob"] == pytest.approx(alone.before.logprob(40), abs=1e-6)
    # a continuation of two tokens: the same as intervene's whole-continuation score
    two = attnviz.head_importance(model, TEXT, [40, 41], TOK, layers=[1], progress=False)
    assert len(two) == 4 and two.attrs["target_ids"] == [40, 41]
    for row in two.itertuples():
        alone = attnviz.intervene(model, TEXT, [edits.ablate(layer=1, head=row.head)], TOK)
        assert row.logprob_drop == pytest.approx(-alone.delta_logprob([40, 41]), abs=1e-5)
    with pytest.raises(InputError, match="no language-model head"):
        attnviz.head_importance(attnviz.testing.tiny_model("bert"), TEXT, 5, TOK, progress=False)


def test_figures_of_an_intervention_and_of_head_importance():
    from attnviz import figures

    model, out = _run("llama", [edits.uniform(layer=0)])
    fig = figures.prediction_bars(out, k=3, continuation=[40, 41])
    assert [t.name for t in fig.data] == ["before", "after"] and 3 <= len(fig.data[0].y) <= 6
    assert fig.data[0].x[0] == pytest.approx(out.before.top_tokens(1)[0].probability)
    b, a = out.logprob([40, 41])
    assert f"(Δ {a - b:+.2f})" in fig.layout.title.text
    _, encoder = _run("bert", [edits.ablate(layer=1)])
    assert list(figures.prediction_bars(encoder).data[0].x) == pytest.approx(encoder.similarity.tolist())

    df = attnviz.head_importance(model, TEXT, 40, TOK, progress=False)
    grid = figures.importance_map(df).data[0].z
    top = df.iloc[0]
    assert grid[int(top["layer"])][int(top["head"])] == pytest.approx(top["logprob_drop"])
    with pytest.raises(InputError, match="head_importance"):
        figures.importance_map(df.drop(columns="logprob_drop"))


def test_an_interventions_title_lists_one_kind_of_edit_once():
    """Five knockouts' own texts ran past the figure's edge; one kind is listed once, with its places."""
    from attnviz.views.reports import edits_title

    knocks = [edits.knockout(layer=layer, head=head, query=[5], key=[2]) for layer, head in [(1, 0), (0, 3), (1, 2)]]
    assert edits_title(knocks) == "knockout 5 ↛ 2 at L1·H0, L0·H3, L1·H2"
    assert (
        edits_title([*knocks, edits.uniform(layer=0)])
        == "knockout 5 ↛ 2 at L1·H0, L0·H3, L1·H2; uniform attention at L0·every head"
    )
    many = [edits.ablate(layer=0, head=h) for h in range(9)]
    assert edits_title(many) == "zero-ablate at L0·H0, L0·H1, L0·H2, L0·H3, L0·H4, L0·H5, … (9 in all)"
    _, out = _run("llama", knocks)
    assert figures_title(out) == "knockout 5 ↛ 2 at L1·H0, L0·H3, L1·H2"


def figures_title(out) -> str:
    from attnviz import figures

    return figures.prediction_bars(out, k=3).layout.title.text
