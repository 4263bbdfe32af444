"""``on_progress(done, total)`` of :func:`attnviz.capture` and :func:`attnviz.generate`: the library's own
progress (what the dashboard's progress bar reads), counted as the taps record each attention call —
in order, every call of the forward, and a callback that raises stops the run with the taps removed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import attnviz
from attnviz.engine.hooks import hooked_models
from attnviz.engine.listeners import listeners
from attnviz.engine.taps import installed_backends


def _no_taps_left(model) -> bool:
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return hooks == 0 and hooked_models() == 0 and listeners() == () and installed_backends() == {}


IDS = torch.arange(3, 12)[None]


@pytest.mark.parametrize("family", ["gpt2", "gpt_neo"])  # through the AttentionInterface, and the projection hooks
def test_capture_reports_each_recorded_call_in_order(family):
    model = attnviz.tiny_model(family)
    seen: list[tuple[int, int]] = []
    cap = attnviz.capture(model, input_ids=IDS, on_progress=lambda done, total: seen.append((done, total)))
    n = model.config.num_hidden_layers
    assert seen == [(i, n) for i in range(1, n + 1)]
    assert isinstance(cap, attnviz.Capture) and cap.layer_indices() == list(range(n))


def test_an_encoder_decoder_counts_its_cross_attention_and_layers_asked_for_count_every_call():
    model = attnviz.tiny_model("bart")
    seen: list[tuple[int, int]] = []
    attnviz.capture(model, input_ids=IDS, layers=[0], on_progress=lambda *a: seen.append(a))
    total = model.config.encoder_layers + 2 * model.config.decoder_layers  # self and cross in each decoder layer
    assert seen == [(i, total) for i in range(1, total + 1)]


def test_a_callback_that_raises_stops_the_capture_with_the_taps_removed():
    model = attnviz.tiny_model("gpt2")
    seen = []

    def cancel(done: int, total: int) -> None:
        seen.append(done)
        raise KeyboardInterrupt("cancelled")  # what a cancelled job does

    with pytest.raises(KeyboardInterrupt, match="cancelled"):
        attnviz.capture(model, input_ids=IDS, on_progress=cancel)
    assert seen == [1] and _no_taps_left(model)  # stopped at the first call, nothing left in the model


def test_generate_reports_every_step(long_llama):
    model, tokenizer = long_llama
    seen: list[tuple[int, int]] = []
    gen = attnviz.generate(model, "The cat sat", tokenizer, max_new_tokens=3, on_progress=lambda *a: seen.append(a))
    layers = model.config.num_hidden_layers
    forwards = len(gen.new_tokens) + 1  # the prompt's, one per new token but the last, and the one reading the last
    assert [done for done, _ in seen] == list(range(1, layers * forwards + 1))
    assert {total for _, total in seen} == {layers * 4} and _no_taps_left(model)


def test_a_capture_with_a_picture_refuses_on_progress():
    model = attnviz.tiny_model("vit")
    picture = np.zeros((32, 32, 3), dtype=np.uint8)
    with pytest.raises(attnviz.ArgumentTypeError) as err:
        attnviz.capture(model, picture, attnviz.tiny_processor("vit"), on_progress=lambda *a: None)
    assert str(err.value) == "on_progress= follows a text's capture; a capture with a picture does not take it"


def test_on_progress_makes_the_host_wait_for_nothing_more_inside_the_forward():
    """docs/architecture.md: nothing a tap does inside the forward makes the host wait. The count is Python:
    the same syncs and launches inside the forward with the callback as without (bench/launches.py counts)."""
    spec = importlib.util.spec_from_file_location("launches", Path(__file__).parent.parent / "bench" / "launches.py")
    assert spec is not None and spec.loader is not None
    launches = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("launches", launches)  # dataclasses look their module up while the class is made
    spec.loader.exec_module(launches)
    torch.manual_seed(0)
    model = launches.gpt2()
    ids = torch.randint(0, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    seen: list[int] = []
    quiet = launches.count(model, lambda: attnviz.capture(model, input_ids=ids))
    counted = launches.count(
        model, lambda: attnviz.capture(model, input_ids=ids, on_progress=lambda d, t: seen.append(d))
    )
    n = model.config.n_layer
    assert seen and seen == list(range(1, n + 1)) * (len(seen) // n)  # the counter may run it more than once
    assert counted.inside.n_syncs == quiet.inside.n_syncs and counted.inside.n_launches == quiet.inside.n_launches


def test_intervene_reports_each_forward_it_runs():
    """intervene's on_progress: the text as it is, the recomputation's check when an edit reweights (a
    head ablated keeps the kernel and needs none), the edited capture — what "Apply to the model" shows."""
    from attnviz import edits

    model = attnviz.testing.tiny_model("llama")
    cap = attnviz.capture(model, input_ids=IDS)
    seen: list[tuple[int, int]] = []
    out = attnviz.intervene(model, cap, [edits.ablate(layer=0, head=1)], on_progress=lambda *a: seen.append(a))
    assert seen == [(1, 2), (2, 2)] and out.capture_after.model["edits"]
    seen.clear()
    attnviz.intervene(model, cap, [edits.knockout(layer=1, head=0, key=2)], on_progress=lambda *a: seen.append(a))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert _no_taps_left(model)
