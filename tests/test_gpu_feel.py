"""What a GPU would feel of a capture, proved on the CPU (bench/launches.py counts it).

On a GPU the host queues kernels and goes on; a sync (``.item()``, ``.tolist()``, a blocking copy to
the host) makes it wait for all of them, and each kernel launch costs the host microseconds. So: no
sync inside the forward beyond the plain forward's own, at most 4 launches per attention call inside
it, and a default capture adds at most a quarter of the plain forward's launches in all. The batched
check after the forward must give the per-layer path's numbers.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

import attnviz
from attnviz.data.validate import SAMPLE_ROWS, validate
from attnviz.engine.projections import output_projection
from attnviz.engine.taps import Recorder
from attnviz.workflows.capture import device_check

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("launches", ROOT / "bench" / "launches.py")
assert _spec is not None and _spec.loader is not None
launches = importlib.util.module_from_spec(_spec)
sys.modules["launches"] = launches  # dataclasses look their module up while the class is made
_spec.loader.exec_module(launches)


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    model = launches.gpt2()  # GPT-2 small's shape, 12 layers, sdpa
    ids = torch.randint(0, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    return model, ids


def _plain(model, ids):
    def run():  # the last position's logits, as capture() asks for them
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False, logits_to_keep=1)

    return launches.count(model, run)


def test_a_default_capture_waits_for_nothing_inside_the_forward_and_launches_a_quarter_of_it(gpt2):
    model, ids = gpt2
    plain = _plain(model, ids)
    captured = launches.count(model, lambda: attnviz.capture(model, input_ids=ids))
    calls = model.config.n_layer
    assert captured.forwards == plain.forwards == 1
    assert captured.inside.n_syncs <= plain.inside.n_syncs, (captured.inside.syncs, plain.inside.syncs)
    added_inside = captured.inside.n_launches - plain.inside.n_launches
    assert added_inside <= 4 * calls, captured.inside.launches - plain.inside.launches
    added = added_inside + captured.outside.n_launches
    assert added <= 0.25 * plain.inside.n_launches, (added, plain.inside.n_launches, captured.outside.launches)
    # after the forward: the inputs' upload and the one transfer of what the check measured
    assert captured.outside.n_syncs <= 3, (captured.outside.syncs, captured.outside.uploads)


def test_the_counter_sees_a_sync_put_back_inside_a_tap(gpt2, monkeypatch):
    """The guard above can fail: a tap that copies each call to the host as it comes (what attnviz did
    before) is 4 blocking copies per attention call inside the forward."""
    model, ids = gpt2
    plain = _plain(model, ids)

    def eager_copy(self, call):
        for name in ("q", "k", "v", "out"):
            setattr(call, name, getattr(call, name).to("cpu"))
        self.calls.append(call)

    monkeypatch.setattr(Recorder, "keep", eager_copy)
    captured = launches.count(model, lambda: attnviz.capture(model, input_ids=ids))
    assert captured.inside.n_syncs - plain.inside.n_syncs == 4 * model.config.n_layer


def test_no_tensor_of_n_squared_elements_beyond_the_models_own_at_2048_tokens():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=2048)).eval()
    n = 2048
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(1))

    def big(run) -> int:
        found = []

        class Watch(launches.Counter):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                result = func(*args, **(kwargs or {}))
                for t in launches._tensors(result):
                    if t.numel() >= n * n:
                        found.append(launches._name(func))
                return result

        with Watch():
            run()
        return len(found)

    def plain():
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

    assert big(lambda: attnviz.capture(model, input_ids=ids)) <= big(plain)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert", "qwen2", "mistral"])
def test_the_batched_check_gives_the_per_layer_paths_numbers(family, monkeypatch):
    """Each head's error, value dots and projection check as the per-layer path computes them (the
    layers stacked as on a GPU: on the CPU each layer is checked alone)."""
    monkeypatch.setattr(device_check, "STACK_CPU", True)
    model = attnviz.testing.tiny_model(family)
    ids = torch.randint(3, 100, (1, 50), generator=torch.Generator().manual_seed(2))
    cap = attnviz.capture(model, input_ids=ids)
    again = validate(cap, rows=SAMPLE_ROWS).to_pandas()  # the per-layer path, on the same records
    dots = {key: rec.value_dots for key, rec in cap.records.items()}
    for rec in cap.records.values():
        rec.value_dots = None  # made again below, batched
    found, rest = device_check.groups(cap)
    assert not rest and len(found) == 1 and len(found[0].layers) == len(cap.records)  # one batch of every layer
    batched = device_check.check_captures(model, [cap], None, "sample")[0]
    assert batched is not None
    ours = batched.to_pandas()
    assert list(ours[["part", "layer", "head", "quantity", "rows"]].itertuples(index=False)) == list(
        again[["part", "layer", "head", "quantity", "rows"]].itertuples(index=False)
    )
    assert (ours.max_abs_error - again.max_abs_error).abs().max() <= 1e-6
    assert (ours.tolerance - again.tolerance).abs().max() <= 1e-9
    for key, rec in cap.records.items():
        torch.testing.assert_close(rec.value_dots, dots[key], rtol=0, atol=0)  # the capture's own, batched too
        projection = output_projection(model, rec.name, rec.q.shape[0], rec.v.shape[-1])
        assert projection is not None and rec.value_dots is not None
        width = rec.value_dots.shape[-1]
        torch.testing.assert_close(rec.value_dots, projection.value_dots(rec.v, width), rtol=1e-5, atol=1e-6)
        assert rec.projection_check is not None and rec.projection_check[0] <= 1e-5 * rec.projection_check[1]


def test_on_the_cpu_each_layer_is_checked_alone_with_no_copy_of_its_tensors():
    """The CPU stacks nothing: a launch costs it nothing, a stacking copy 3 % of GPT-2's forward at 1,024 tokens."""
    cap = attnviz.capture(attnviz.testing.tiny_model("llama"), input_ids=torch.randint(3, 100, (1, 20)), check="off")
    for rec in cap.records.values():
        rec.value_dots = None  # as the pipeline groups them: before what is moved is filled
    found, rest = device_check.groups(cap)
    assert not rest and [len(g.layers) for g in found] == [1] * len(cap.records)
    assert all(g.q.untyped_storage().data_ptr() == g.first.q.untyped_storage().data_ptr() for g in found)
