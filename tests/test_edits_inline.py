"""Edits on the families that compute attention inline (GPT-Neo, XGLM, GPT-1, Bloom, MPT,
Falcon with ALiBi, with rotary embeddings and in its new decoder architecture), which attnviz reads through projection hooks: every edit kind, against softmax(…)
computed by hand from the captured Q, K and ALiBi bias, and against the model run with its own
output projection fed by hand.

The edited A·V reaches the model through a pre-hook on the output projection
(:mod:`attnviz.engine.hooks`); these tests check that it does (the prediction follows the
hand-made model), that the capture of the edited run holds the edited weights, that the no-edit
check runs through the same path, and that nothing is left on the model.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import BLOOM_SLOW

import attnviz
import attnviz.engine.editor as editor_module
from attnviz import edits
from attnviz.edits import LayerPlan, editing
from attnviz.engine.hooks import hooked_models
from attnviz.engine.listeners import listeners
from attnviz.errors import UnsupportedModelError
from attnviz.families import PROJECTION_SPECS
from attnviz.families.falcon import falcon_passes_alibi
from attnviz.workflows.capture.models import IdsTokenizer

TEXT = "11 5 7 9 13 21 8 30"
OTHER = "12 6 40 3 17 25 9 2"  # the same length, other tokens
TOK = IdsTokenizer()
INLINE = ["gpt_neo", "xglm", "openai-gpt", "bloom", "mpt", "falcon_alibi", "falcon", "falcon_new"]
_MODELS: dict[str, torch.nn.Module] = {}


def model_of(family: str) -> torch.nn.Module:
    if family not in _MODELS:
        _MODELS[family] = attnviz.testing.tiny_model(family, attn_implementation="eager")
    return _MODELS[family]


def out_projection(model: torch.nn.Module, layer: int) -> torch.nn.Module:
    """The output projection of ``layer``'s attention (its input is the model's A·V, heads concatenated)."""
    spec = PROJECTION_SPECS[model.config.model_type]
    blocks = [m for m in model.modules() if type(m).__name__ == spec.module]
    assert len(blocks) == 2
    return blocks[layer].get_submodule(spec.out)


def logits_with(model, layer: int, change) -> torch.Tensor:
    """The last position's log-probabilities with ``change(x)`` fed to ``layer``'s output projection."""
    handle = out_projection(model, layer).register_forward_pre_hook(lambda module, args: (change(args[0]),))
    try:
        with torch.no_grad():
            logits = model(torch.tensor([TOK(TEXT)["input_ids"]])).logits[0, -1]
    finally:
        handle.remove()
    return torch.log_softmax(logits.float(), -1)


def alibi_on_every_key(rec, head: int) -> torch.Tensor:
    """[1 | query, key]: what the model adds to head's scores besides Q·Kᵀ·scaling, for every key — the
    ALiBi bias, and for Falcon the ALiBi its mask carries a second time (checked to be a per-key term,
    so it is known for the keys the mask blocks too)."""
    total = torch.zeros(1, rec.n_keys)
    bias = rec.bias_part()
    if bias is not None:
        total = total + bias[head if bias.shape[0] > 1 else 0].float()
    mask = rec.mask_part()
    if mask is not None and mask.is_floating_point():
        m = mask[head if mask.shape[0] > 1 else 0].float()
        blocked = m <= torch.finfo(m.dtype).min / 2
        carried = m.masked_fill(blocked, 0)
        per_key = carried[-1:]  # the last query sees every key
        assert bool(carried.any()) and torch.equal(carried, per_key.expand_as(carried).masked_fill(blocked, 0))
        total = total + per_key
    return total


def by_hand(cap, layer, head, *, qk=None, scale=None, temperature=1.0, allowed=None) -> torch.Tensor:
    """softmax((Q·Kᵀ·scale + ALiBi) / t) over the allowed keys, from a capture (no attnviz SDPA).
    ``qk``: another capture whose Q and K to use (a layer after an edited one reads the edited run's)."""
    rec = cap.layer(layer)
    src = (qk or cap).layer(layer)
    q, k = src.q[head].float(), src.k[cap.kv_head_of(head)].float()
    scores = (q @ k.T * (rec.scaling if scale is None else scale) + alibi_on_every_key(rec, head)) / temperature
    allowed = cap.allowed(layer) if allowed is None else allowed
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)


@pytest.mark.parametrize("family", INLINE)
def test_knockout_zeroes_the_key_and_the_row_renormalises(family):
    out = attnviz.intervene(model_of(family), TEXT, [edits.knockout(layer=1, head=0, query=5, key=[2, 3])], TOK)
    before, after = out.capture_before, out.capture_after
    allowed = before.allowed(1)
    allowed[5, [2, 3]] = False
    expected = by_hand(before, 1, 0, allowed=allowed)
    assert after.attention(1, 0)[5, [2, 3]].abs().max() == 0
    torch.testing.assert_close(after.attention(1, 0), expected, atol=1e-6, rtol=0)
    renormalised = before.attention(1, 0)[5].clone()
    renormalised[[2, 3]] = 0
    torch.testing.assert_close(after.attention(1, 0)[5], renormalised / renormalised.sum(), atol=1e-6, rtol=0)
    torch.testing.assert_close(after.attention(1, 0)[:5], before.attention(1, 0)[:5], atol=1e-6, rtol=0)
    torch.testing.assert_close(after.attention(1, 1), before.attention(1, 1), atol=1e-6, rtol=0)
    assert out.check_error <= 1e-4 and out.edited_layers == [("decoder", 1)]
    assert after.validate(rows=None).passed  # the recorders saw the call as it ran, edited


@pytest.mark.parametrize("family", INLINE)
def test_the_scaling_temperature_and_causal_switches_equal_softmax_by_hand(family):
    model = model_of(family)
    out = attnviz.intervene(
        model,
        TEXT,
        [edits.no_scaling(layer=0, head=[0, 1, 2]), edits.scale(0.5, layer=0, head=3), edits.temperature(2.0, layer=1)],
        TOK,
    )
    before, after = out.capture_before, out.capture_after
    for head, factor in [(2, 1.0), (3, 0.5)]:
        torch.testing.assert_close(after.attention(0, head), by_hand(before, 0, head, scale=factor), atol=1e-6, rtol=0)
    # layer 1 reads what the edited layer 0 wrote: its Q and K are the edited run's, its ALiBi the same
    torch.testing.assert_close(
        after.attention(1, 1), by_hand(before, 1, 1, qk=after, temperature=2.0), atol=1e-6, rtol=0
    )
    assert (after.attention(1, 1) - by_hand(before, 1, 1, qk=after)).abs().max() > 2e-4  # the temperature mattered

    layer = 1 if family == "gpt_neo" else 0  # GPT-Neo's layer 1 is local: its window stays, the later keys open
    unmasked = attnviz.intervene(model, TEXT, [edits.no_causal_mask(layer=layer, head=3)], TOK)
    allowed = unmasked.capture_before.allowed(layer) | torch.ones(8, 8, dtype=torch.bool).triu(1)
    got = unmasked.capture_after.attention(layer, 3)
    torch.testing.assert_close(got, by_hand(unmasked.capture_before, layer, 3, allowed=allowed), atol=1e-6, rtol=0)
    assert float(got[0, 1:].sum()) > 0.5  # the first token now sees the text after it
    torch.testing.assert_close(unmasked.capture_after.attention(layer, 2), unmasked.capture_before.attention(layer, 2))
    if family == "gpt_neo":
        assert float(got[7, :4].sum()) == 0  # beyond the window: still blocked


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_falcon_multi_query_on_either_backend_opens_its_causal_mask_with_its_own_alibi(impl):
    """Falcon's sdpa path carries ALiBi once, in its mask; before transformers 5.25 eager adds it to
    the scores as well (from 5.25 it too has it in the mask only, recorded as the bias). The keys
    no_causal_mask opens get what that backend adds to every key; one key/value head (multi-query)."""
    model = attnviz.testing.tiny_model("falcon_alibi", attn_implementation=impl, multi_query=True)
    out = attnviz.intervene(model, TEXT, [edits.no_causal_mask(layer=0, head=1)], TOK)
    before = out.capture_before
    folded = impl == "sdpa" and falcon_passes_alibi()  # < 5.25's sdpa: ALiBi left in the recorded mask
    assert before.info("decoder")["n_kv_heads"] == 1 and (before.layer(0).bias is None) == folded
    allowed = torch.ones(8, 8, dtype=torch.bool)
    torch.testing.assert_close(
        out.capture_after.attention(0, 1), by_hand(before, 0, 1, allowed=allowed), atol=1e-6, rtol=0
    )
    assert out.check_error <= 1e-4


@pytest.mark.parametrize("family", INLINE)
def test_uniform_and_patch_replace_the_pattern(family):
    model = model_of(family)
    out = attnviz.intervene(model, TEXT, [edits.uniform(layer=0, head=1)], TOK)
    allowed = out.capture_before.allowed(0).float()
    torch.testing.assert_close(out.capture_after.attention(0, 1), allowed / allowed.sum(-1, keepdim=True))
    source = attnviz.capture(model, OTHER, TOK)
    patched = attnviz.intervene(model, TEXT, [edits.patch(source=source, layer=1, head=[0, 2])], TOK)
    for h in (0, 2):
        torch.testing.assert_close(patched.capture_after.attention(1, h), source.attention(1, h), atol=1e-6, rtol=0)
    torch.testing.assert_close(patched.capture_after.attention(1, 1), patched.capture_before.attention(1, 1))


@pytest.mark.parametrize("family", INLINE)
def test_ablation_equals_the_output_projection_fed_by_hand(family):
    model = model_of(family)
    out = attnviz.intervene(model, TEXT, [edits.ablate(layer=1)], TOK)
    zeroed = logits_with(model, 1, torch.zeros_like)
    torch.testing.assert_close(out.after.logprobs, zeroed, atol=1e-5, rtol=0)
    assert (out.after.logprobs - out.before.logprobs).abs().max() > 1e-4  # the ablation reached the prediction
    assert out.check_error == 0.0  # ablation alone keeps the model's own A·V
    assert out.capture_after.validate(rows=None).passed  # the recorders saw the A·V before the ablation

    d = model.config.hidden_size // 4  # 4 heads

    def mean_head(x):
        x = x.clone()
        x[..., 2 * d : 3 * d] = x[..., 2 * d : 3 * d].mean(dim=1, keepdim=True)
        return x

    mean = attnviz.intervene(model, TEXT, [edits.ablate(layer=0, head=2, how="mean")], TOK)
    torch.testing.assert_close(mean.after.logprobs, logits_with(model, 0, mean_head), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", INLINE)
def test_reweighted_attention_reaches_the_prediction(family):
    """The edited A·V is what the output projection gets: a knockout in head 0 and uniform attention
    in head 1 of the last layer predict what the model predicts fed A·V made by hand from those weights."""
    model = model_of(family)
    plan = [edits.knockout(layer=1, head=0, query=7, key=[5, 6]), edits.uniform(layer=1, head=1)]
    out = attnviz.intervene(model, TEXT, plan, TOK)
    before = out.capture_before
    knocked = before.allowed(1)
    knocked[7, [5, 6]] = False
    uniform = before.allowed(1).float()
    weights = [
        by_hand(before, 1, 0, allowed=knocked),
        uniform / uniform.sum(-1, keepdim=True),
        *(before.attention(1, h) for h in (2, 3)),
    ]
    rec = before.layer(1)
    by_hand_av = torch.cat([w @ rec.v[before.kv_head_of(h)].float() for h, w in enumerate(weights)], dim=-1)
    expected = logits_with(model, 1, lambda x: by_hand_av[None].to(x.dtype))
    torch.testing.assert_close(out.after.logprobs, expected, atol=1e-5, rtol=0)
    assert (out.after.logprobs - out.before.logprobs).abs().max() > 1e-5  # the edits moved the prediction


@pytest.mark.parametrize("family", INLINE)
def test_the_no_edit_check_runs_through_the_projection_hooks(family, monkeypatch):
    """intervene's check replaces the output projections' input with attnviz's A·V (no edit) and the
    logits stay within 1e-4; the spy proves the check went through that path for every edited layer."""
    model = model_of(family)
    calls: list[tuple[bool, int]] = []
    real = editor_module.edited_attention

    def spy(read, p):
        calls.append((p.recompute, read["q"].shape[1]))
        return real(read, p)

    monkeypatch.setattr(editor_module, "edited_attention", spy)
    out = attnviz.intervene(model, TEXT, [edits.knockout(key=[1])], TOK)
    assert out.check_error <= 1e-4 and out.check_tolerance == 1e-4
    assert calls.count((True, 4)) == 2 and calls.count((False, 4)) == 2  # both layers: checked, then edited

    ids = torch.tensor([TOK(TEXT)["input_ids"]])
    with torch.no_grad():
        plain = model(ids).logits
        with editing(model, {("decoder", layer): LayerPlan(4, recompute=True) for layer in (0, 1)}) as editor:
            same = model(ids).logits
    assert editor.ran == {("decoder", 0), ("decoder", 1)}
    assert float((same - plain).abs().max()) <= 1e-4


@pytest.mark.parametrize("tap_first", [True, False])
def test_a_capture_records_the_edited_call_whichever_was_entered_first(tap_first):
    """One dispatch per call: the editor computes it and says what the recorder sees, in whichever
    order the tap and the editing block were entered (no hook order involved)."""
    model = model_of("mpt")
    plans = {("decoder", 1): LayerPlan(4, knock=[((0,), [5], [2, 3])])}
    ids = torch.tensor([TOK(TEXT)["input_ids"]])
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        if tap_first:
            recorder = stack.enter_context(attnviz.tap(model))
            stack.enter_context(editing(model, plans))
        else:
            stack.enter_context(editing(model, plans))
            recorder = stack.enter_context(attnviz.tap(model))
        model(ids)
        assert hooked_models() == 1  # one set of hooks serves the tap and the editor
    call = next(c for c in recorder.calls if c.layer == 1)
    assert call.scaling == 0.0 and call.mask is not None and call.bias is not None  # the edited call, as log A
    assert not bool(call.mask[0, 0, 5, 2]) and bool(call.mask[0, 1, 5, 2])  # head 0's key 2 is knocked out
    assert _hooks(model) == 0 and hooked_models() == 0 and listeners() == ()


def test_editors_nest_and_the_innermost_owner_runs_the_call():
    """Inside two editing blocks on one model the inner editor's plan runs (the outer's not); on
    leaving the inner block the outer's runs again."""
    model = model_of("bloom")
    ids = torch.tensor([TOK(TEXT)["input_ids"]])
    zero = {("decoder", 0): LayerPlan(4, ablate={(None, h): "zero" for h in range(4)})}
    uniform = {("decoder", 1): LayerPlan(4, replace={h: "uniform" for h in range(4)})}
    with torch.no_grad():
        with editing(model, zero) as outer:
            alone = model(ids).logits
            outer.ran.clear()
            with editing(model, uniform) as inner:
                nested = model(ids).logits
            assert outer.ran == set() and inner.ran == {("decoder", 1)}
            torch.testing.assert_close(model(ids).logits, alone, atol=0, rtol=0)
            assert outer.ran == {("decoder", 0)}
        with editing(model, uniform):
            torch.testing.assert_close(model(ids).logits, nested, atol=0, rtol=0)
    assert _hooks(model) == 0 and listeners() == ()


def test_head_importance_on_an_inline_family_equals_ablating_each_head_alone():
    model = model_of("bloom")
    df = attnviz.head_importance(model, TEXT, 40, TOK, batch_size=3, progress=False)
    assert len(df) == 8
    for row in df.itertuples():
        alone = attnviz.intervene(model, TEXT, [edits.ablate(layer=row.layer, head=row.head)], TOK)
        assert row.logprob_drop == pytest.approx(-alone.delta_logprob(40), abs=1e-5)


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("family", INLINE)
def test_the_model_is_unmodified_afterwards_also_when_forward_raises(family):
    model = model_of(family)
    ids = torch.tensor([[11, 5, 7, 9]])
    assert _hooks(model) == 0
    with torch.no_grad():
        reference = model(ids).logits
    attnviz.intervene(model, TEXT, [edits.uniform(layer=0), edits.ablate(layer=1, head=0)], TOK)
    assert _hooks(model) == 0 and listeners() == ()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, atol=0, rtol=0)

    def boom(module, args):
        raise RuntimeError("boom")

    handle = out_projection(model, 1).register_forward_pre_hook(boom)  # after layer 0's edit ran
    try:
        with pytest.raises(RuntimeError, match="boom"):
            attnviz.intervene(model, TEXT, [edits.uniform(layer=0), edits.knockout(layer=1, key=2)], TOK)
    finally:
        handle.remove()
    with pytest.raises(RuntimeError, match="inside"), editing(model, {("decoder", 0): LayerPlan(4, recompute=True)}):
        raise RuntimeError("inside the block")
    assert _hooks(model) == 0 and listeners() == ()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, atol=0, rtol=0)


def test_an_edit_outside_its_context_changes_nothing():
    """The hooks act only in the context that holds the editor: the same model run meanwhile in
    another thread, without it, computes its own attention."""
    import threading

    model = model_of("bloom")
    ids = torch.tensor([TOK(TEXT)["input_ids"]])
    with torch.no_grad():
        reference = model(ids).logits
        result = {}
        with editing(model, {("decoder", 0): LayerPlan(4, ablate={(None, h): "zero" for h in range(4)})}):
            thread = threading.Thread(target=lambda: result.setdefault("logits", model(ids).logits))
            thread.start()
            thread.join()
            edited = model(ids).logits
    torch.testing.assert_close(result["logits"], reference, atol=0, rtol=0)
    assert (edited - reference).abs().max() > 1e-4


def test_a_configuration_the_hooks_cannot_read_is_refused_with_why():
    bloom = attnviz.testing.tiny_model("bloom", attn_implementation="eager", **BLOOM_SLOW)
    with pytest.raises(UnsupportedModelError, match="slow_but_exact=True bypasses its output projection"):
        with editing(bloom, {}):
            pass
    assert listeners() == ()
