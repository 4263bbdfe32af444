"""Capture on every family and backend, against the model's own eager weights and outputs."""

import threading

import pytest
import torch
from conftest import BACKENDS, FAMILIES

import attnviz
from attnviz.engine.taps import installed_backends


def hook_snapshot(model):
    return [(dict(m._forward_hooks), dict(m._forward_pre_hooks)) for m in model.modules()]


def capture_with_a_failing_layer(model, layer_module, ids):
    """Capture while ``layer_module`` raises in forward; the error must come through unchanged."""

    def boom(module, args, output):
        raise RuntimeError("forward failed")

    handle = layer_module.register_forward_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="forward failed"):
            attnviz.capture(model, input_ids=ids[:1])
    finally:
        handle.remove()


def capture_concurrently(model, inputs, rounds=5):
    """Capture each input from its own thread, ``rounds`` times; every result must equal the
    capture made alone. Returns the errors seen."""
    expected = [attnviz.capture(model, input_ids=x).attention(1) for x in inputs]
    errors = []
    barrier = threading.Barrier(len(inputs))

    def worker(i):
        try:
            barrier.wait()
            for _ in range(rounds):
                assert torch.equal(attnviz.capture(model, input_ids=inputs[i]).attention(1), expected[i])
        except Exception as err:  # noqa: BLE001 - reported by the caller
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_validation_passes_within_1e5(tiny, ids, family, backend):
    cap = attnviz.capture(tiny(family, backend), input_ids=ids[:1])
    report = cap.validate()
    assert report.passed, str(report)
    quantities = {r["quantity"] for r in report.rows}
    assert quantities == ({"output", "weights"} if backend == "eager" else {"output"})
    assert max(r["max_abs_error"] for r in report.rows) <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_sdpa_capture_matches_eager_output_attentions(tiny, ids, family):
    """An sdpa model gets the same attention maps as the eager model's output_attentions."""
    eager, sdpa = tiny(family, "eager"), tiny(family, "sdpa")
    with torch.no_grad():
        reference = eager(input_ids=ids[:1], output_attentions=True).attentions
    cap = attnviz.capture(sdpa, input_ids=ids[:1])
    assert cap.model["backend"] == "sdpa"
    assert len(reference) == cap.n_layers
    for layer, ref in enumerate(reference):
        torch.testing.assert_close(cap.attention(layer), ref[0], atol=1e-5, rtol=0)


def test_input_ids_rows_are_taken_as_given():
    model = attnviz.testing.tiny_model("llama")
    a = torch.tensor([[5, 6, 7, 8, 9, 10]])
    b = torch.tensor([[5, 6, 7]])
    alone = attnviz.capture(model, input_ids=b)
    assert alone.n_tokens == 3 and alone.layer(0).mask is None and alone.layer(0).causal
    both = attnviz.capture(model, input_ids=torch.cat([a, torch.tensor([[5, 6, 7, 0, 0, 0]])]))
    assert both[1].n_tokens == 6  # input_ids rows are taken as given (no mask to trim by)
    assert both[0].validate().passed


def test_gqa_shapes(tiny, ids):
    cap = attnviz.capture(tiny("llama"), input_ids=ids[:1])
    assert cap.q(0).shape == (4, 12, 8) and cap.k(0).shape == (2, 12, 8) and cap.v(0).shape == (2, 12, 8)
    assert (cap.n_heads, cap.n_kv_heads, cap.d_head) == (4, 2, 8)
    assert [cap.kv_head_of(h) for h in range(4)] == [0, 0, 1, 1]


def test_mistral_sliding_window_is_captured(tiny, ids):
    cap = attnviz.capture(tiny("mistral", "eager"), input_ids=ids[:1])
    assert cap.layer(0).window == 4 and cap.layer(0).causal
    w = cap.attention(0, head=0)
    assert w[8, :5].abs().max() == 0 and w[8, 5:9].sum() == pytest.approx(1.0, abs=1e-5)
    assert cap.validate().passed


def test_gpt2_layer_scaling_quirks(ids):
    model = attnviz.testing.tiny_model("gpt2", attn_implementation="eager", scale_attn_by_inverse_layer_idx=True)
    cap = attnviz.capture(model, input_ids=ids[:1])
    assert cap.layer(0).scaling == pytest.approx(8**-0.5)
    assert cap.layer(1).scaling == pytest.approx(8**-0.5 / 2)
    assert cap.validate().passed
    unscaled = attnviz.testing.tiny_model("gpt2", attn_implementation="sdpa", scale_attn_weights=False)
    cap = attnviz.capture(unscaled, input_ids=ids[:1])
    assert cap.layer(0).scaling == 1.0 and cap.validate().passed


def test_gpt2_reorder_and_upcast_under_eager_is_unsupported(ids):
    model = attnviz.testing.tiny_model("gpt2", attn_implementation="eager", reorder_and_upcast_attn=True)
    with pytest.raises(
        attnviz.UnsupportedModelError,
        match="ran no attention that attnviz could tap .* GPT-2 with reorder_and_upcast_attn under eager bypasses the interface",
    ):
        attnviz.capture(model, input_ids=ids[:1])
    assert installed_backends() == {}


def test_layers_subset_records_only_those(tiny, ids):
    cap = attnviz.capture(tiny("gpt2"), input_ids=ids[:1], layers=[1])
    assert cap.layer_indices() == [1] and cap.n_layers == 2
    with pytest.raises(attnviz.OutOfRangeError, match=r"layer 0 was not captured \(captured: \[1\]\)"):
        cap.attention(0)


def test_outputs_identical_with_and_without_capture(tiny, ids):
    model = tiny("llama")
    with torch.no_grad():
        before = model(input_ids=ids).logits
        with attnviz.tap(model) as rec:
            during = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert len(rec.calls) == 2
    assert torch.equal(before, during) and torch.equal(before, after)


def test_no_hook_or_setting_survives_an_exception(tiny, ids):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = tiny("bert", "eager")
    mapping_before = dict(ALL_ATTENTION_FUNCTIONS.items())
    impl_before = model.config._attn_implementation
    hooks_before = hook_snapshot(model)
    capture_with_a_failing_layer(model, model.encoder.layer[1], ids)
    assert installed_backends() == {}
    assert dict(ALL_ATTENTION_FUNCTIONS.items()) == mapping_before and "eager" not in ALL_ATTENTION_FUNCTIONS
    assert model.config._attn_implementation == impl_before
    assert hook_snapshot(model) == hooks_before


def test_concurrent_captures_on_one_model_never_mix(tiny):
    model = tiny("llama")
    assert capture_concurrently(model, [torch.randint(3, 120, (1, 6 + i)) for i in range(4)]) == []
    assert installed_backends() == {}


def test_a_plain_forward_in_another_thread_during_capture_is_not_recorded(tiny, ids):
    model = tiny("gpt2")
    with attnviz.tap(model) as rec:
        t = threading.Thread(target=lambda: model(input_ids=ids))
        t.start()
        t.join()
    assert rec.calls == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_half_precision_on_cpu_is_validated_in_float32(ids, dtype, backend):
    model = attnviz.testing.tiny_model("llama", attn_implementation=backend).to(dtype)
    cap = attnviz.capture(model, input_ids=ids[:1])
    assert cap.q(0).dtype == dtype and cap.attention(0).dtype == torch.float32
    report = cap.validate()
    assert report.dtype == str(dtype).removeprefix("torch.") and report.atol > 1e-5
    assert report.passed, str(report)


# ---------------------------------------------------------------- families without the AttentionInterface
PROJECTION_FAMILIES = ["gpt_neo", "xglm", "openai-gpt"]


@pytest.mark.parametrize("family", PROJECTION_FAMILIES)
def test_projection_hook_families_match_output_attentions(ids, family):
    model = attnviz.testing.tiny_model(family, attn_implementation="eager")
    with torch.no_grad():
        reference = model(input_ids=ids[:1], output_attentions=True).attentions
    cap = attnviz.capture(model, input_ids=ids[:1])
    assert cap.model["backend"] == "projection hooks" and cap.n_layers == len(reference)
    for layer, ref in enumerate(reference):
        torch.testing.assert_close(cap.attention(layer), ref[0], atol=1e-5, rtol=0)
    report = cap.validate()
    assert report.passed and {r["quantity"] for r in report.rows} == {"output"}, str(report)


def test_gpt_neo_local_layers_keep_their_window(ids):
    cap = attnviz.capture(attnviz.testing.tiny_model("gpt_neo", attn_implementation="eager"), input_ids=ids[:1])
    assert (cap.layer(0).window, cap.layer(1).window) == (None, 4)  # global, then local
    assert cap.layer(0).scaling == 1.0  # GPT-Neo does not scale its scores
    w = cap.attention(1, head=0)
    assert w[9, :6].abs().max() == 0 and w[9, 6:10].sum() == pytest.approx(1.0, abs=1e-5)


def test_projection_hooks_are_removed_also_after_an_exception(ids):
    model = attnviz.testing.tiny_model("xglm", attn_implementation="eager")
    hooks_before = hook_snapshot(model)
    capture_with_a_failing_layer(model, model.model.layers[1], ids)
    assert hook_snapshot(model) == hooks_before
    with torch.no_grad():
        attnviz.capture(model, input_ids=ids[:1])  # and it still captures afterwards


def test_projection_hooks_record_only_their_own_thread():
    model = attnviz.testing.tiny_model("openai-gpt", attn_implementation="eager")
    assert capture_concurrently(model, [torch.randint(3, 120, (1, 5 + i)) for i in range(3)], rounds=4) == []
    assert hook_snapshot(model) == hook_snapshot(attnviz.testing.tiny_model("openai-gpt", attn_implementation="eager"))
