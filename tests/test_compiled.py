"""Captures of torch.compile'd models and generation with a static cache, each compared with the
uncompiled model's own capture (q, k, v, the kernel's output, what each head moves) and its self-check.

Dynamo breaks its graph at attnviz's wrapper and hooks; the numbers must not change. A graph compiled
before the capture does not see attnviz's projection hooks (dynamo does not guard on module hooks):
that capture is refused, never returned empty."""

from __future__ import annotations

import pytest
import torch

import attnviz
from attnviz.errors import UnsupportedModelError
from attnviz.workflows.capture.models import IdsTokenizer


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Each test starts with nothing compiled: a graph an earlier test left (another model of the same code,
    whose object may even reuse a freed one's id) is not what this test is about, and the suite splits files
    across processes in any order."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


IDS = torch.randint(3, 120, (1, 10), generator=torch.Generator().manual_seed(0))
PROMPT = "11 5 7 9 13 21 34 55 89"

# (family, attention backend or None for a family hooked inline, how it is compiled, dynamo backend)
CASES = [
    ("gpt2", "sdpa", "model", "eager"),
    ("gpt2", "eager", "forward", "aot_eager"),
    ("llama", "sdpa", "method", "aot_eager"),
    ("llama", "eager", "model", "aot_eager"),
    ("bert", "sdpa", "forward", "aot_eager"),
    ("gpt_neo", None, "method", "aot_eager"),  # projection hooks, not the interface
    ("gpt2", "sdpa", "model", "inductor"),
]


def _tiny(family: str, backend: str | None):
    torch.manual_seed(0)
    return attnviz.testing.tiny_model(family, **({"attn_implementation": backend} if backend else {}))


def _compiled(model, how: str, backend: str):
    if how == "model":
        return torch.compile(model, backend=backend)
    if how == "method":
        model.compile(backend=backend)
    else:
        model.forward = torch.compile(model.forward, backend=backend)
    return model


def assert_same_capture(got, want, atol: float = 0.0) -> None:
    """Every layer's q, k, v, the kernel's own output and what each head moves, within ``atol``."""
    for part in want.parts:
        assert got.layer_indices(part) == want.layer_indices(part)
        for layer in want.layer_indices(part):
            a, b = got.layer(layer, part), want.layer(layer, part)
            for name in ("q", "k", "v", "out", "value_dots"):
                torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=atol, rtol=0, msg=name)


@pytest.mark.parametrize("family,backend,how,dynamo", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_a_compiled_models_capture_equals_the_uncompiled_capture(family, backend, how, dynamo):
    model = _tiny(family, backend)
    want = attnviz.capture(model, input_ids=IDS, check="full")  # the uncompiled reference, first
    with torch.no_grad():
        logits = model(input_ids=IDS).logits if family != "bert" else None
    compiled = _compiled(model, how, dynamo)
    got = attnviz.capture(compiled, input_ids=IDS, check="full")
    # inductor fuses and reorders float32 sums (measured: ≤ 1.1e-7); the other backends run the same kernels
    assert_same_capture(got, want, atol=1e-6 if dynamo == "inductor" else 0.0)
    assert got.validate().passed, str(got.validate())
    assert got.model["class"] == want.model["class"] == type(model).__name__  # not torch's OptimizedModule
    assert got.model["name"] == want.model["name"]
    again = attnviz.capture(compiled, input_ids=IDS, check="full")  # the compiled code, reused
    assert_same_capture(again, got)
    if logits is not None:  # the compiled model runs as before once the taps are gone
        with torch.no_grad():
            plain = compiled(input_ids=IDS).logits
        torch.testing.assert_close(plain, logits, atol=1e-6 if dynamo == "inductor" else 0.0, rtol=0)


@pytest.mark.parametrize("family,backend", [("gpt2", "sdpa"), ("llama", "eager")])
def test_a_model_compiled_and_run_before_the_capture_is_recompiled_with_the_wrapper(family, backend):
    """Transformers reads the attention function from its mapping at each call, and dynamo guards on
    that lookup: a graph compiled without the wrapper is recompiled once the wrapper is installed."""
    model = _tiny(family, backend)
    want = attnviz.capture(model, input_ids=IDS)
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad():  # the same arguments as the capture's forward: only the wrapper differs
        compiled(input_ids=IDS, attention_mask=torch.ones_like(IDS))
    assert_same_capture(attnviz.capture(compiled, input_ids=IDS), want)


def test_a_hooked_family_compiled_before_the_capture_is_refused_not_captured_empty():
    """GPT-Neo is read through hooks on its projections, and dynamo does not guard on module hooks:
    the graph compiled before the capture never calls them. attnviz says so, and after
    torch.compiler.reset() the same compiled model captures what the uncompiled one does."""
    torch.compiler.reset()  # no GPT-Neo code compiled by an earlier test, with hooks inside
    model = _tiny("gpt_neo", None)
    want = attnviz.capture(model, input_ids=IDS)
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad():
        compiled(input_ids=IDS, attention_mask=torch.ones_like(IDS))
    with pytest.raises(UnsupportedModelError, match=r"compiled with torch.compile .* torch.compiler.reset\(\)"):
        attnviz.capture(compiled, input_ids=IDS)
    torch.compiler.reset()
    assert_same_capture(attnviz.capture(compiled, input_ids=IDS), want)


def test_a_hooked_family_captured_then_run_compiled_then_captured_again():
    """Capture (compiling with the hooks inside), run the compiled model plainly with other ids, capture
    those ids: each capture equals the uncompiled model's."""
    model = _tiny("gpt_neo", None)
    other = IDS.flip(-1)
    want, want_other = attnviz.capture(model, input_ids=IDS), attnviz.capture(model, input_ids=other)
    compiled = torch.compile(model, backend="aot_eager")
    assert_same_capture(attnviz.capture(compiled, input_ids=IDS), want)
    with torch.no_grad():
        compiled(input_ids=other, attention_mask=torch.ones_like(other))
    assert_same_capture(attnviz.capture(compiled, input_ids=other), want_other)


@pytest.fixture(scope="module")
def dynamic_generation():
    return attnviz.generate(_tiny("llama", "sdpa"), PROMPT, IdsTokenizer(), max_new_tokens=6)


def _assert_same_generation(got, want) -> None:
    assert got.new_token_ids == want.new_token_ids
    assert got.capture.validate().passed
    # a static cache's kernel reads masked empty slots too: the sums round differently (measured ≤ 4.5e-8)
    assert_same_capture(got.capture, want.capture, atol=1e-6)


def test_generation_with_a_static_cache_equals_the_dynamic_cache(dynamic_generation):
    gen = attnviz.generate(
        _tiny("llama", "sdpa"), PROMPT, IdsTokenizer(), max_new_tokens=6, cache_implementation="static"
    )
    _assert_same_generation(gen, dynamic_generation)


def test_generation_compiled_by_transformers_with_a_static_cache_equals_the_dynamic_cache(dynamic_generation):
    """What transformers does on CUDA (a compiled decoding step over a static cache), forced on the CPU."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    config = CompileConfig(backend="aot_eager")
    config._compile_all_devices = True  # transformers compiles on CUDA only unless told
    graphs = counters["stats"]["unique_graphs"]
    gen = attnviz.generate(
        _tiny("llama", "sdpa"),
        PROMPT,
        IdsTokenizer(),
        max_new_tokens=6,
        cache_implementation="static",
        compile_config=config,
    )
    assert counters["stats"]["unique_graphs"] > graphs  # the decoding step did run compiled
    _assert_same_generation(gen, dynamic_generation)
