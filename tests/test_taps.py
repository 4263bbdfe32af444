"""The taps as shared global state: other models, other threads, nested taps, every family the
capture covers (and a refusal for the rest), every mask form, arguments the recorder does not
know, and a kernel that computes something else."""

import threading

import pytest
import torch
from conftest import BLOOM_SLOW
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import (
    AttentionMaskInterface,
    flash_attention_mask,
    flex_attention_mask,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import attnviz
from attnviz.attention import scaled_dot_product
from attnviz.engine.hooks import hooked_models
from attnviz.engine.listeners import listeners
from attnviz.engine.taps import installed_backends


# ---------------------------------------------------------------- an unrelated model meanwhile
def timesfm_eager():
    """A tiny TimesFM: its attention passes its own `simple_eager_attention_forward` as the default."""
    import transformers as tf

    config = tf.TimesFmConfig(
        patch_length=4,
        context_length=16,
        horizon_length=4,
        hidden_size=16,
        intermediate_size=32,
        head_dim=8,
        num_attention_heads=2,
        num_hidden_layers=1,
    )
    torch.manual_seed(0)
    return tf.TimesFmModelForPrediction._from_config(config, attn_implementation="eager").eval()


def while_capturing(model, kwargs, action):
    """Run ``action()`` in this thread while ``model`` is being captured (on eager) in another."""
    inside, done, errors = threading.Event(), threading.Event(), []

    def pause(module, args, output):
        inside.set()
        done.wait(timeout=30)

    handle = next(m for m in model.modules() if type(m).__name__.endswith("Layer")).register_forward_hook(pause)

    def work():
        try:
            attnviz.capture(model, **kwargs)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)
            inside.set()

    thread = threading.Thread(target=work)
    thread.start()
    try:
        assert inside.wait(timeout=30)
        assert installed_backends().get("eager") == 1  # the wrapper is in place right now
        return action()
    finally:
        done.set()
        thread.join()
        handle.remove()
        assert errors == []


def test_an_unrelated_model_in_another_thread_runs_its_own_eager_function():
    bert = attnviz.testing.tiny_model("bert", attn_implementation="eager")
    other = timesfm_eager()
    series = [torch.sin(torch.arange(16.0))]
    with torch.no_grad():
        expected = other(past_values=series).mean_predictions
        during = while_capturing(
            bert, {"input_ids": torch.arange(3, 12)[None]}, lambda: other(past_values=series).mean_predictions
        )
    torch.testing.assert_close(during, expected, atol=0, rtol=0)
    assert installed_backends() == {}


def test_the_eager_wrapper_calls_the_function_the_caller_passed():
    """A module whose file defines a differently named eager function (as TimesFM, Qwen3-VL's
    vision tower do) gets exactly that one while any capture holds the wrapper."""
    calls = []

    def my_eager(module, q, k, v, mask, scaling=None, **kwargs):
        calls.append(q.shape)
        w = torch.softmax(q @ k.transpose(-1, -2) * scaling, -1)
        return (w @ v).transpose(1, 2), w

    class Homemade(nn.Module):
        config = type("C", (), {"_attn_implementation": "eager"})()

        def forward(self, x):
            fn = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, my_eager)
            return fn(self, x, x, x, None, scaling=0.5)[0]

    x = torch.randn(1, 2, 5, 4)
    expected = Homemade()(x)
    bert = attnviz.testing.tiny_model("bert", attn_implementation="eager")
    got = while_capturing(bert, {"input_ids": torch.arange(3, 12)[None]}, lambda: Homemade()(x))
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert len(calls) == 2


# ---------------------------------------------------------------- nesting
def test_nested_taps_record_in_both():
    a, b = attnviz.testing.tiny_model("llama"), attnviz.testing.tiny_model("gpt2")
    ids = torch.arange(3, 10)[None]
    with torch.no_grad(), attnviz.tap(a) as outer:
        with attnviz.tap(b) as inner, attnviz.tap(a) as again:
            a(input_ids=ids)
            b(input_ids=ids)
        a(input_ids=ids)
    assert [(c.part, c.layer) for c in inner.calls] == [("decoder", 0), ("decoder", 1)]
    assert len(again.calls) == 2 and len(outer.calls) == 4
    assert installed_backends() == {}


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


# ---------------------------------------------------------------- every family the capture covers
@pytest.mark.parametrize("family", ["gpt_neo", "bloom"])
def test_tap_records_every_layer_of_an_inline_family_with_its_own_numbers(family):
    """The families that compute attention inline are tapped through their projections: every
    layer with Q, K, V and the model's own A·V, which softmax(Q·Kᵀ·scale + bias) · V reproduces."""
    model = attnviz.testing.tiny_model(family)
    ids = torch.arange(3, 12)[None]
    with torch.no_grad(), attnviz.tap(model) as rec:
        model(input_ids=ids)
    assert [(c.part, c.layer, c.backend) for c in rec.calls] == [
        ("decoder", 0, "projection hooks"),
        ("decoder", 1, "projection hooks"),
    ]
    for call in rec.calls:
        assert call.q is not None and call.k is not None and call.v is not None and call.out is not None
        assert call.q.shape[:3] == (1, 4, 9) and call.k.shape[-2] == call.v.shape[-2] == 9
        item = call.item(0)
        out, _ = scaled_dot_product(
            item["q"][None],
            item["k"][None],
            item["v"][None],
            scale=item["scale"],
            causal=item["causal"],
            mask=None if item["mask"] is None else item["mask"][None],
            bias=None if item["bias"] is None else item["bias"][None],
            window=item["window"],
        )
        torch.testing.assert_close(out[0], item["out"].float(), atol=1e-5, rtol=0)
    assert _hooks(model) == 0 and hooked_models() == 0 and listeners() == ()


def test_nested_taps_of_an_inline_family_share_one_set_of_hooks():
    model = attnviz.testing.tiny_model("xglm")
    ids = torch.arange(3, 10)[None]
    with torch.no_grad(), attnviz.tap(model) as outer:
        alone = _hooks(model)
        with attnviz.tap(model) as inner:
            assert _hooks(model) == alone and hooked_models() == 1
            model(input_ids=ids)
        model(input_ids=ids)
    assert len(inner.calls) == 2 and len(outer.calls) == 4
    assert _hooks(model) == 0 and hooked_models() == 0 and listeners() == ()


@pytest.mark.parametrize("family", ["gpt_neo", "llama"])
def test_hooks_wrappers_and_listeners_are_gone_after_an_exception(family):
    model = attnviz.testing.tiny_model(family)
    with pytest.raises(RuntimeError, match="inside"), torch.no_grad(), attnviz.tap(model):
        model(input_ids=torch.arange(3, 10)[None])
        raise RuntimeError("inside the block")
    assert _hooks(model) == 0 and hooked_models() == 0 and installed_backends() == {} and listeners() == ()


@pytest.mark.parametrize(
    ("family", "why"),
    [
        ("deberta", r"DeBERTa \(v1\) with talking_head=True mixes.*\. attnviz supports any model whose"),
        ("bloom", "Bloom with pretraining_tp > 1 and slow_but_exact=True bypasses its output projection"),
    ],
)
def test_tap_refuses_a_family_it_cannot_read_instead_of_recording_nothing(family, why):
    overrides = {"deberta": {"talking_head": True}, "bloom": BLOOM_SLOW}[family]
    model = attnviz.testing.tiny_model(family, **overrides)
    with pytest.raises(attnviz.UnsupportedModelError, match=why), attnviz.tap(model):
        pytest.fail("the block must not run")
    assert _hooks(model) == 0 and installed_backends() == {} and listeners() == ()


def test_tap_refuses_a_model_without_an_attention_implementation():
    with pytest.raises(
        attnviz.UnsupportedModelError, match=r"Linear has no config._attn_implementation: attnviz supports"
    ):
        with attnviz.tap(nn.Linear(4, 4)):
            pytest.fail("the block must not run")
    assert installed_backends() == {} and listeners() == ()


# ---------------------------------------------------------------- arguments the recorder does not know
class Mystery(nn.Module):
    """A hand-written attention module that passes an extra tensor to the attention function."""

    def __init__(self):
        super().__init__()
        self.config = type("C", (), {"_attn_implementation": "sdpa", "model_type": "mystery"})()
        self.is_causal = False

    def forward(self, x, **extra):
        fn = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, None)
        return fn(self, x, x, x, None, scaling=0.5, **extra)[0]


class MysteryModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Mystery()])
        self.config = self.layers[0].config

    def forward(self, x, **extra):
        return self.layers[0](x, **extra)


def test_an_unknown_tensor_argument_refuses_the_capture():
    model = MysteryModel()
    x = torch.randn(1, 2, 5, 4)
    with torch.no_grad(), attnviz.tap(model) as rec:
        model(x, use_cache=True)  # known and inert: recorded
    assert len(rec.calls) == 1 and rec.calls[0].part == "encoder"
    with pytest.raises(
        attnviz.UnsupportedModelError,
        match=r"Mystery passes my_bias=<tensor \(1, 2, 5, 5\)> to its attention function; attnviz "
        r"does not know how 'my_bias' changes the attention",
    ):
        with torch.no_grad(), attnviz.tap(model):
            model(x, my_bias=torch.zeros(1, 2, 5, 5))
    assert installed_backends() == {}


# ---------------------------------------------------------------- every mask form
def _dense(mask, q, k, module, kwargs):
    b, _, n, _ = q.shape
    m = k.shape[-2]
    if mask is not None and not isinstance(mask, torch.Tensor):  # flex's BlockMask: evaluate its mask_mod
        bi, qi, ki = (
            torch.arange(s).view(*[-1 if d == i else 1 for d in range(4)]) for i, s in ((0, b), (2, n), (3, m))
        )
        return mask.mask_mod(bi, torch.zeros_like(bi), qi, ki)
    allowed = torch.ones(b, 1, n, m, dtype=torch.bool)
    if mask is not None:  # flash's 2-D padding mask
        allowed &= mask.bool()[:, None, None, :]
    i, j = torch.arange(n)[:, None] + m - n, torch.arange(m)[None]
    if kwargs.get("is_causal", module.is_causal):
        allowed &= j <= i
    if kwargs.get("sliding_window"):
        allowed &= (i - j) < kwargs["sliding_window"]
    return allowed


def _kernel(module, q, k, v, mask, scaling=None, dropout=0.0, **kwargs):
    """A stand-in for flash / flex kernels (which need a GPU): takes their mask forms, computes exactly."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=_dense(mask, q, k, module, kwargs), scale=scaling
    )
    return out.transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module")
def custom_backends():
    """Two registered backends with transformers' own flash (2-D padding) and flex (BlockMask) masks."""
    for name, mask_fn in (("padding_mask_kernel", flash_attention_mask), ("block_mask_kernel", flex_attention_mask)):
        AttentionInterface.register(name, _kernel)
        AttentionMaskInterface.register(name, mask_fn)
    yield ["padding_mask_kernel", "block_mask_kernel"]
    for name in ("padding_mask_kernel", "block_mask_kernel"):
        del AttentionInterface._global_mapping[name]
        del AttentionMaskInterface._global_mapping[name]


@pytest.mark.parametrize("family", ["llama", "mistral", "bert", "bart"])
def test_flash_and_flex_mask_forms_are_normalised(custom_backends, family):
    from test_families import padded, reference, texts

    from attnviz.workflows.capture.models import IdsTokenizer

    tok = IdsTokenizer()
    sources = texts([11, 7], seed=3)
    targets = texts([6, 4], seed=4) if family == "bart" else None
    for backend in custom_backends:
        model = attnviz.testing.tiny_model(family, attn_implementation=backend)
        with torch.no_grad(), attnviz.tap(model) as rec:
            ids, mask = padded([[int(t) for t in s.split()] for s in sources])
            model(input_ids=ids, attention_mask=mask, **({"decoder_input_ids": ids[:, :4]} if targets else {}))
        first = rec.calls[0]  # the kernel really got the 2-D padding mask, or a BlockMask
        assert (first.key_padding is not None) if backend == "padding_mask_kernel" else (first.mask is not None)
        caps = attnviz.capture(model, sources, tok, target=targets)
        expected = reference(family, caps)
        for b, cap in enumerate(caps):
            for part, refs in expected.items():
                n_q, n_k = cap.attention(0, part=part).shape[-2:]
                for layer, ref in enumerate(refs):
                    torch.testing.assert_close(
                        cap.attention(layer, part=part), ref[b, :, :n_q, :n_k], atol=2e-6, rtol=0
                    )


# ---------------------------------------------------------------- never silently wrong
def _liar(module, q, k, v, mask, scaling=None, dropout=0.0, **kwargs):
    """A kernel that ignores the scaling it is given: what it returns is not what it was asked."""
    return ALL_ATTENTION_FUNCTIONS["sdpa"](module, q, k, v, mask, scaling=1.0, **kwargs)


def test_a_kernel_that_computes_something_else_raises_validation_error_with_the_capture():
    AttentionInterface.register("liar", _liar)
    try:
        model = attnviz.testing.tiny_model("llama", attn_implementation="liar")
        ids = torch.randint(3, 120, (1, 40))
        with pytest.raises(attnviz.ValidationError, match="could not reproduce what the model computed") as err:
            attnviz.capture(model, input_ids=ids)
        assert not err.value.report.passed and err.value.report.sample
        assert isinstance(err.value.capture, attnviz.Capture) and err.value.capture.n_tokens == 40
        cap = attnviz.capture(model, input_ids=ids, check="off")  # the user's way out, on purpose
        assert not cap.validate().passed
    finally:
        del AttentionInterface._global_mapping["liar"]
    with pytest.raises(attnviz.InputError, match="check must be one of sample, full, off"):
        attnviz.capture(model, input_ids=ids, check="some")


def test_the_sample_check_compares_first_last_and_spread_rows():
    from attnviz.data.validate import sample_rows

    rows = sample_rows(1000)
    assert rows[0] == 0 and rows[-1] == 999 and len(rows) == 34
    assert sample_rows(5).tolist() == [0, 1, 2, 3, 4]
    cap = attnviz.capture(attnviz.testing.tiny_model("llama"), input_ids=torch.randint(3, 120, (1, 60)))
    assert cap.model["check"] == "sample" and cap.model["check_error"] < 1
    report = cap.validate(rows=8)
    assert report.sample and set(report.to_pandas().rows) == {10}


def test_chunked_full_validation_equals_one_chunk():
    from attnviz.data.validate import record_errors

    cap = attnviz.capture(
        attnviz.testing.tiny_model("mistral", max_position_embeddings=256), input_ids=torch.randint(3, 120, (1, 200))
    )
    rec = cap.layer(1)
    import attnviz.attention as attention

    whole = record_errors(rec)["output"][0]
    original = attention.query_chunks
    attention.query_chunks = lambda n_q, n_k, n_h, budget=0: original(n_q, n_k, n_h, budget=4 * 200 * 7)  # 7-row chunks
    try:
        chunked = record_errors(rec)["output"][0]
    finally:
        attention.query_chunks = original
    torch.testing.assert_close(chunked, whole, atol=1e-7, rtol=0)
    assert bool((whole < 1e-5).all())


# ---------------------------------------------------------------- memory
def test_eager_keeps_errors_not_weights_and_costs_what_sdpa_costs():
    ids = torch.randint(3, 120, (1, 1024))
    sizes = {}
    for backend in ("eager", "sdpa"):
        model = attnviz.testing.tiny_model("llama", attn_implementation=backend, max_position_embeddings=1100)
        cap = attnviz.capture(model, input_ids=ids)
        sizes[backend] = cap.nbytes
    assert sizes["eager"] <= 1.05 * sizes["sdpa"], sizes
    kept = attnviz.capture(
        attnviz.testing.tiny_model("llama", attn_implementation="eager", max_position_embeddings=1100),
        input_ids=ids,
        keep_weights=True,
    )
    assert kept.nbytes > 10 * sizes["sdpa"] and kept.layer(0).weights.shape == (4, 1024, 1024)
    report = kept.validate()
    assert "weights" in set(report.to_pandas().quantity) and report.passed
