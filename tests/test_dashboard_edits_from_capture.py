"""Edits start from the page's capture (issue 18): "Apply to the model" in the AttentionLab runs
``attnviz.intervene`` on the capture the page already holds — the text is not tokenized or captured
again — and its "before" is that capture's prediction."""

from __future__ import annotations

import json

import pytest
from attnviz.dashboard import create_app
from attnviz.dashboard.ids import EID, ID
from test_dashboard_server import _post

import attnviz
from attnviz import figures

TEXT = "My cat is cute, and it loves to play."


def test_apply_to_the_model_starts_from_the_pages_capture(model_folder, smol_tokenizer, monkeypatch, tmp_path):
    tiny = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer), max_position_embeddings=64)
    folder = model_folder("tiny-llama", tiny, smol_tokenizer)
    app = create_app({folder: "tiny Llama"}, default_model=folder)
    run = next(key for key in app.callback_map if f"{ID.store}.data" in key)
    store = _post(app, run, {ID.run: 1}, {ID.text: TEXT, ID.model: folder, ID.bos: []})[ID.store]["data"]
    assert set(store) == {"key", "model", "bos"}, store

    # "Apply to the model" is a background job, a fork of the server: what it tokenizes or captures is
    # written to a file, which the fork shares
    calls = tmp_path / "calls.txt"
    tokenizer = attnviz.load_model(folder)[1]
    original_call, original_capture = type(tokenizer).__call__, attnviz.capture

    def tokenize(self, *args, **kwargs):
        with calls.open("a") as log:
            log.write(f"tokenized {args[:1]}\n")
        return original_call(self, *args, **kwargs)

    def capture(*args, **kwargs):
        with calls.open("a") as log:
            log.write(f"captured {args[1:2]}\n")
        return original_capture(*args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", tokenize)
    monkeypatch.setattr(attnviz, "capture", capture)
    apply = next(key for key in app.callback_map if f"{EID.lab_result}.children" in key)
    state = {
        ID.store: store,
        ID.layer: 1,
        ID.head: 0,
        ID.words: "tokens",
        ID.lab_query: 8,
        ID.lab_switches: ["scale"],  # in every layer and head: the causal mask off, ×10 temperature, two keys out
        ID.lab_temperature: 1,
        EID.lab_scope: "all",
        EID.lab_knock: [2, 3],
    }
    response = _post(app, apply, {EID.lab_apply: 1}, state)
    result = json.dumps(response[EID.lab_result]["children"], ensure_ascii=False)
    assert "no causal mask at every layer·every head" in result and "knockout to ↛ is/cute" in result, result
    assert not calls.exists()  # the before is the page's capture: nothing tokenized or captured

    # the page's bars are the intervention on the text, before and after
    edits = attnviz.edits
    chosen = [edits.no_causal_mask(), edits.temperature(10.0), edits.knockout(query=8, key=[2, 3])]
    expected = attnviz.intervene(folder, TEXT, chosen, add_bos=store["bos"])
    page = response[EID.lab_predictions]["figure"]["data"]
    bars = {trace["name"]: (trace["y"], trace["x"]) for trace in page}
    for trace in figures.prediction_bars(expected, 5).data:
        assert bars[trace.name][0] == list(trace.y), trace.name
        assert bars[trace.name][1] == pytest.approx(list(trace.x), rel=1e-6), trace.name
    assert bars["before"][1] != pytest.approx(bars["after"][1], rel=1e-3)  # the edit moved the prediction


def test_a_generation_run_tokenizes_the_prompt_once(model_folder, smol_tokenizer, tmp_path, tokenizer_calls):
    """The Run of a generation counts the prompt's tokens for the page's limit, and attnviz.generate reads
    those tokens (tokenized=): the prompt is tokenized once, BOS included."""
    from attnviz.dashboard.captures import Captures

    tiny = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer), max_position_embeddings=64)
    folder = model_folder("tiny-llama", tiny, smol_tokenizer)
    tokenizer = attnviz.load_model(folder)[1]
    calls = tokenizer_calls(tokenizer)
    captures = Captures({folder: "tiny Llama"}, folder=tmp_path)
    request = captures.request(folder, TEXT, bos=True, new_tokens=3)
    cap = captures.run(request)
    assert calls == [TEXT]
    assert request.n_tokens == len(cap.token_ids) == len(request.encoded[0]) + 3
    assert cap.token_ids[: len(request.encoded[0])] == request.encoded[0]
