"""capture(keep=...): what a long capture keeps of each layer is chosen; the maps stay the model's."""

from __future__ import annotations

import pytest
import torch

import attnviz
from attnviz.data.capture import RECORD_TENSORS


@pytest.fixture(scope="module")
def llama():
    return attnviz.testing.tiny_model("llama")


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 100, (1, 40), generator=torch.Generator().manual_seed(3))


def _bytes(cap) -> int:
    return sum(
        t.numel() * t.element_size()
        for rec in cap.records.values()
        for name in RECORD_TENSORS
        if isinstance(t := getattr(rec, name), torch.Tensor)
    )


def test_a_capture_keeps_per_token_and_layer_what_the_guide_says(llama, ids):
    """q (heads·d), k and v (kv_heads·d each), out (heads·d) in the model's dtype, value dots heads·w float32."""
    cap = attnviz.capture(llama, input_ids=ids)
    rec = cap.layer(0)
    heads, n, d = rec.q.shape
    kv = rec.k.shape[0]
    width = rec.value_dots.shape[-1]
    per_token_layer = (heads * d + 2 * kv * d + heads * rec.out.shape[-1]) * rec.q.element_size() + heads * width * 4
    assert _bytes(cap) == per_token_layer * n * len(cap.records) + sum(
        rec.projection_check.numel() * 4 for rec in cap.records.values()
    )


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert", "t5"])
def test_a_lean_capture_shows_the_same_maps_in_less_memory(family):
    model = attnviz.testing.tiny_model(family)
    ids = torch.randint(3, 100, (1, 30), generator=torch.Generator().manual_seed(4))
    kwargs = {"decoder_input_ids": ids[:, :12]} if model.config.is_encoder_decoder else {}
    full = attnviz.capture(model, input_ids=ids, **kwargs)
    lean = attnviz.capture(model, input_ids=ids, keep=("q", "k"), **kwargs)
    assert lean.model["kept"] == ["q", "k"] and full.model["kept"] == ["q", "k", "v", "out", "norms"]
    assert lean.model["check_error"] == pytest.approx(full.model["check_error"], rel=1e-6, abs=1e-12)  # checked first
    for part in full.parts:
        for layer in full.layer_indices(part):
            torch.testing.assert_close(
                lean.attention(layer, part=part), full.attention(layer, part=part), rtol=0, atol=0
            )
            rec = lean.layer(layer, part)
            assert rec.out is None and rec.value_dots is None and rec.v.shape[-1] == 0
    dropped = sum(
        t.numel() * t.element_size() for rec in full.records.values() for t in (rec.v, rec.out, rec.value_dots)
    )
    assert _bytes(lean) == _bytes(full) - dropped
    assert lean.nbytes <= full.nbytes - dropped  # freed: nothing kept views V's or out's storage


def test_what_was_not_kept_is_refused_by_name_and_a_file_keeps_the_choice(llama, ids, tmp_path):
    lean = attnviz.capture(llama, input_ids=ids, keep=["q", "k", "v", "norms"])
    assert lean.moved(1).shape == (4, 40, 40)  # norms kept: moved is there
    with pytest.raises(attnviz.InputError, match=r"kept q, k, v, norms .*Capture again keeping v and out"):
        lean.validate()
    bare = attnviz.capture(llama, input_ids=ids, keep="q,k")  # a string as the command line writes it
    with pytest.raises(
        attnviz.InputError, match=r"layer 0: it was captured without them \(capture\(\.\.\., keep=\) or --keep"
    ):
        bare.moved(0)
    path = bare.save(tmp_path / "bare.attnviz")
    back = attnviz.load(path)
    assert back.model["kept"] == ["q", "k"]
    torch.testing.assert_close(back.attention(1), bare.attention(1), rtol=0, atol=0)


@pytest.mark.parametrize(
    "keep, message",
    [
        (("q", "v"), "keep= leaves out k: every map is recomputed from the queries and keys"),
        ("v", "keep= leaves out q and k"),
        (("q", "k", "weights"), "keep= names weights; a capture keeps q, k, v, out, norms"),
        (3, "keep= takes names among q, k, v, out, norms"),
    ],
)
def test_a_keep_that_cannot_show_a_map_is_refused_before_the_forward(llama, ids, keep, message, monkeypatch):
    ran = []
    monkeypatch.setattr(type(llama), "forward", lambda *a, **k: ran.append(1))
    with pytest.raises((attnviz.InputError, attnviz.ArgumentTypeError), match=message):
        attnviz.capture(llama, input_ids=ids, keep=keep)
    assert not ran


def test_the_command_line_keeps_what_keep_names_and_refuses_the_rest_before_the_weights(tmp_path, capsys, monkeypatch):
    from attnviz.cli import main

    path = tmp_path / "lean.attnviz"
    assert main(["capture", "minilm", "The cat sat on the mat.", "--keep", "q, k", "-o", str(path)]) == 0
    lean = attnviz.load(path)
    assert lean.model["kept"] == ["q", "k"] and lean.layer(0).out is None

    def refuse(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before --keep was checked")

    monkeypatch.setattr("attnviz.workflows.capture.pipeline.load_model", refuse)
    capsys.readouterr()
    assert main(["capture", "minilm", "The cat sat.", "--keep", "q,v"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--keep leaves out k: every map is recomputed from the queries and keys" in err


def test_what_is_let_go_is_freed_when_queries_and_keys_share_its_storage():
    """One layer of GPT-2 is no stack: its q, k and v are views of one fused projection's output, so a lean
    capture copies q and k rather than keep that output (V's third of it) alive."""
    model = attnviz.testing.tiny_model("gpt2")
    ids = torch.randint(3, 100, (1, 30), generator=torch.Generator().manual_seed(5))
    full = attnviz.capture(model, input_ids=ids, layers=[1])
    assert full.layer(1).q.untyped_storage().data_ptr() == full.layer(1).v.untyped_storage().data_ptr()
    lean = attnviz.capture(model, input_ids=ids, layers=[1], keep=("q", "k"))
    rec = lean.layer(1)
    assert lean.nbytes == sum(t.numel() * t.element_size() for t in (rec.q, rec.k, rec.projection_check))
