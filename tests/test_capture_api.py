"""The Capture data model and capture()'s contract, on tiny models with a real tokenizer."""

import pytest
import torch

import attnviz

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def cap(tiny_bert_words):
    model, tok = tiny_bert_words
    return attnviz.capture(model, TEXT, tok)


def test_tokens_offsets_and_words(cap):
    assert cap.tokens[:3] == ["[CLS]", "the", "cat"] and cap.tokens[-1] == "[SEP]"
    assert cap.offsets[2] == (4, 7) and cap.text[4:7] == "cat"
    assert cap.word_labels == [
        "[CLS]",
        "The",
        "cat",
        "sat",
        "on",
        "the",
        "mat",
        "because",
        "it",
        "was",
        "tired",
        ".",
        "[SEP]",
    ]


def test_wordpiece_pieces_join_into_one_word(tiny_bert_words):
    model, tok = tiny_bert_words
    cap = attnviz.capture(model, "Unbelievably tired", tok)
    assert cap.tokens[1:6] == ["un", "##bel", "##ie", "##va", "##bly"]
    assert cap.word_labels == ["[CLS]", "Unbelievably", "tired", "[SEP]"]
    assert list(cap.words[1].tokens) == [1, 2, 3, 4, 5]


def test_attention_rows_sum_to_one_and_words_merge(cap):
    w = cap.attention(1)
    assert w.shape == (4, cap.n_tokens, cap.n_tokens)
    torch.testing.assert_close(w.sum(-1), torch.ones(4, cap.n_tokens))
    ww = cap.attention(1, head=2, words=True)
    assert ww.shape == (len(cap.words), len(cap.words))
    torch.testing.assert_close(ww.sum(-1), torch.ones(len(cap.words)))


def test_word_level_is_sum_to_and_mean_from(tiny_bert_words):
    model, tok = tiny_bert_words
    cap = attnviz.capture(model, "Unbelievably tired", tok)
    w = cap.attention(0, head=1)
    ww = cap.attention(0, head=1, words=True)
    # to the word "Unbelievably" (tokens 1..5) from "tired" (token 6): a sum over the pieces
    assert ww[2, 1] == pytest.approx(w[6, 1:6].sum().item(), abs=1e-6)
    # from "Unbelievably" to "tired": the mean over the five query pieces
    assert ww[1, 2] == pytest.approx(w[1:6, 6].mean().item(), abs=1e-6)


def test_toggles_of_the_seed(tiny):
    cap = attnviz.capture(tiny("llama"), input_ids=torch.randint(3, 120, (1, 10)))
    causal = cap.attention(0, head=0)
    assert torch.triu(causal, 1).abs().max() == 0
    free = cap.attention(0, head=0, causal=False)
    assert torch.triu(free, 1).abs().max() > 0
    sharp = cap.attention(0, head=0, scale=False)  # no ÷√d_k: scores 2.8× larger
    entropy = lambda a: -(a.clamp_min(1e-12).log() * a).sum(-1).mean()  # noqa: E731
    assert entropy(sharp) < entropy(causal)
    hot = cap.attention(0, head=0, temperature=100.0)
    assert entropy(hot) > entropy(causal)
    q, k = cap.q(0)[0], cap.k(0)[0]
    expected = torch.softmax((q @ k.T / 8**0.5).masked_fill(torch.ones(10, 10).triu(1).bool(), float("-inf")), -1)
    torch.testing.assert_close(causal, expected)
    torch.testing.assert_close(cap.scores(0, 0), q @ k.T / 8**0.5)


def test_text_batch_is_padded_and_each_capture_trimmed(tiny_bert_words):
    model, tok = tiny_bert_words
    caps = attnviz.capture(model, [TEXT, "Hello there"], tok)
    assert [c.n_tokens for c in caps] == [13, 4]
    alone = attnviz.capture(model, "Hello there", tok)
    torch.testing.assert_close(caps[1].attention(1), alone.attention(1), atol=1e-6, rtol=0)
    assert caps[1].validate().passed and caps[0].validate().passed


def test_to_pandas_is_tidy(cap):
    df = cap.to_pandas(layer=1, head=2)
    assert list(df.columns) == [
        "part",
        "layer",
        "head",
        "query_pos",
        "key_pos",
        "query_token",
        "key_token",
        "weight",
        "moved",
    ]
    assert set(df.part) == {"encoder"}
    assert len(df) == cap.n_tokens**2
    row = df[(df.query_pos == 8) & (df.key_pos == 2)].iloc[0]
    assert (row.query_token, row.key_token) == ("it", "cat")
    assert row.weight == pytest.approx(cap.attention(1, head=2)[8, 2].item())
    assert row.moved == pytest.approx(cap.moved(1, head=2)[8, 2].item())
    assert df.groupby("query_pos").weight.sum().round(5).eq(1).all()
    words = cap.to_pandas(layer=0, words=True)
    assert len(words) == 4 * len(cap.words) ** 2 and "cat" in set(words.key_token)


def test_save_load_round_trip_is_exact(cap, tmp_path):
    path = cap.save(tmp_path / "cat.attnviz")
    back = attnviz.load(path)
    assert back.text == cap.text and back.tokens == cap.tokens and back.words == cap.words
    assert back.offsets == cap.offsets and back.model == cap.model
    for key, rec in cap.records.items():
        for name in ("q", "k", "v", "out", "weight_error", "weight_scale", "value_dots", "projection_check"):
            assert torch.equal(getattr(back.records[key], name), getattr(rec, name))
        assert (back.records[key].scaling, back.records[key].causal) == (rec.scaling, rec.causal)
    assert torch.equal(back.attention(1), cap.attention(1))
    assert str(back.validate()) == str(cap.validate())


def test_a_capture_pickles_whole_with_its_parts(cap):
    """Capture is a dataclass over its parts (data.recompute.Recomputation, data.moved.WhatMoves): a pickle
    (what the dashboard's background jobs hand back) carries it whole, every method with it."""
    import pickle

    back = pickle.loads(pickle.dumps(cap))
    assert type(back) is attnviz.Capture and back.records.keys() == cap.records.keys()
    assert torch.equal(back.attention(1, 0, rows=[1, 2]), cap.attention(1, 0, rows=[1, 2]))
    assert torch.equal(back.moved(1, words=True), cap.moved(1, words=True))
    assert back._repr_html_() == cap._repr_html_()


def test_loading_a_broken_file_says_so(tmp_path):
    bad = tmp_path / "broken.attnviz"
    bad.write_bytes(b"not a capture")
    with pytest.raises(attnviz.CaptureFileError, match="is not an attnviz capture file"):
        attnviz.load(bad)
    with pytest.raises(attnviz.CaptureFileError, match="no capture file at"):
        attnviz.load(tmp_path / "missing.attnviz")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(attnviz.CaptureFileError, match="safetensors file but not an attnviz capture"):
        attnviz.load(tmp_path / "other.safetensors")


def test_validation_report_is_readable(cap):
    report = cap.validate()
    text = str(report)
    assert text.startswith("attnviz validation PASS:") and "max error" in text and "L" in text
    df = report.to_pandas()
    assert set(df.quantity) == {"output", "weights"} and len(df) == 2 * 2 * 4
    assert report.error_map("weights").shape == (2, 4)


def test_validation_detects_a_wrong_recomputation(cap):
    """A report that cannot fail proves nothing: corrupt the recorded scaling and it must fail."""
    from dataclasses import replace

    broken = replace(cap, records={key: replace(r, scaling=r.scaling * 1.5) for key, r in cap.records.items()})
    report = broken.validate()
    assert not report.passed and "FAIL" in str(report) and "heads over tolerance" in str(report)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_empty_text(tiny_bert_words, text):
    model, tok = tiny_bert_words
    with pytest.raises(attnviz.EmptyTextError, match="the text is empty or only whitespace; give at least one word"):
        attnviz.capture(model, text, tok)


def test_too_long_text_says_both_numbers_and_offers_truncation(tiny_bert_words):
    model, tok = tiny_bert_words
    long = "word " * 100
    with pytest.raises(attnviz.InputTooLongError) as err:
        attnviz.capture(model, long, tok)
    assert str(err.value) == (
        f"The text has 102 tokens; {model.config._name_or_path or 'BertModel'} accepts at most 64. "
        "Shorten the text or pass max_length=64 to truncate."
    )
    cap = attnviz.capture(model, long, tok, max_length=64)
    assert cap.n_tokens == 64


def test_wrong_types_layers_and_heads(tiny_bert_words, cap):
    model, tok = tiny_bert_words
    with pytest.raises(
        attnviz.ArgumentTypeError, match="text must be a string or a non-empty list of strings, got int"
    ):
        attnviz.capture(model, 42, tok)
    with pytest.raises(
        attnviz.ArgumentTypeError, match="model must be a name, a path or a transformers model, got int"
    ):
        attnviz.capture(3, "hi")
    with pytest.raises(attnviz.OutOfRangeError, match=r"layer 7 is out of range: this model has layers 0\.\.1"):
        attnviz.capture(model, TEXT, tok, layers=[7])
    with pytest.raises(attnviz.OutOfRangeError, match=r"head 4 is out of range: this model has heads 0\.\.3"):
        cap.attention(0, head=4)
    with pytest.raises(attnviz.OutOfRangeError, match=r"layer -1 is out of range"):
        cap.attention(-1)
    with pytest.raises(attnviz.ArgumentTypeError, match="layer must be an int, got str"):
        cap.attention("3")
    with pytest.raises(attnviz.InputError, match="temperature must be a number > 0"):
        cap.attention(0, temperature=0)
    with pytest.raises(attnviz.InputError, match="pass tokenizer= with a model object"):
        attnviz.capture(model, TEXT)
    with pytest.raises(attnviz.InputError, match=r"no word 'dog' in this text"):
        cap.word_index("dog")


def test_training_mode_is_refused(tiny_bert_words):
    model, tok = tiny_bert_words
    model.train()
    try:
        with pytest.raises(attnviz.ModelInTrainingModeError, match=r"in training mode.*Call model.eval\(\) first"):
            attnviz.capture(model, TEXT, tok)
    finally:
        model.eval()


def test_unknown_model_name_says_what_to_do():
    with pytest.raises(
        attnviz.ModelNotFoundError, match="could not load model 'no-such/model-xyz': it is not an embedded alias"
    ):
        attnviz.capture("no-such/model-xyz", "hello")


@pytest.mark.parametrize("name", ["", "   "])
def test_a_blank_model_name_is_said_as_blank_not_as_a_folder(name):
    with pytest.raises(attnviz.ModelNotFoundError, match=r"no model named .*: give an embedded alias \(minilm"):
        attnviz.load_model(name)


def test_unsupported_model_names_what_is_supported():
    class NotTransformers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

    with pytest.raises(attnviz.UnsupportedModelError, match="has no .config; attnviz captures transformers models"):
        attnviz.capture(NotTransformers().eval(), input_ids=torch.ones(1, 3, dtype=torch.long))


def test_device_and_dtype_with_a_model_object_are_explained(tiny):
    with pytest.raises(attnviz.InputError, match="the model is in torch.float32 but dtype='float16' was given"):
        attnviz.capture(tiny("gpt2"), input_ids=torch.ones(1, 3, dtype=torch.long), dtype="float16")


def test_a_local_folder_loads_through_from_pretrained(tiny_bert_words, tmp_path):
    model, tok = tiny_bert_words
    model.save_pretrained(tmp_path / "tiny-bert")
    tok.save_pretrained(tmp_path / "tiny-bert")
    cap = attnviz.capture(str(tmp_path / "tiny-bert"), TEXT, layers=[1])
    assert cap.model["model_type"] == "bert" and cap.tokens[2] == "cat"
    torch.testing.assert_close(cap.attention(1), attnviz.capture(model, TEXT, tok).attention(1))
    (tmp_path / "empty").mkdir()
    with pytest.raises(attnviz.ModelNotFoundError, match="could not load a transformers model from the folder"):
        attnviz.load_model(str(tmp_path / "empty"))


def _message(run) -> tuple[type, str]:
    with pytest.raises(attnviz.AttnvizError) as err:
        run()
    return type(err.value), str(err.value)


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"layers": [7]}, "layer 7 is out of range: this model has layers 0..1"),
        ({"check": "most"}, "check must be one of sample, full, off, got 'most'"),
        ({"tokenizer": None}, "pass tokenizer= with a model object"),
        ({"train": True}, "is in training mode"),
    ],
    ids=["layer", "check", "tokenizer", "training"],
)
def test_every_workflow_refuses_the_same_bad_input_with_the_same_message(bad, expected):
    """capture, generate and intervene run one pipeline: the same bad input is refused in each with
    one message, written once (a layer out of range, a check that does not exist, a model object
    without its tokenizer, a model in training mode)."""
    from attnviz import edits
    from attnviz.workflows.capture.models import IdsTokenizer

    model = attnviz.testing.tiny_model("llama")
    bad = dict(bad)
    if bad.pop("train", False):
        model.train()
    given = {"tokenizer": bad.pop("tokenizer", IdsTokenizer())} | bad
    layers = given.pop("layers", None)
    runs = {
        "capture": lambda: attnviz.capture(model, "5 7 9", layers=layers, **given),
        "generate": lambda: attnviz.generate(model, "5 7 9", max_new_tokens=2, layers=layers, **given),
    }
    if layers is None:  # intervene edits the layers its edits name
        runs["intervene"] = lambda: attnviz.intervene(model, "5 7 9", edits.ablate(layer=0, head=0), **given)
    messages = {name: _message(run) for name, run in runs.items()}
    assert len(set(messages.values())) == 1, messages
    assert expected in next(iter(messages.values()))[1]
    model.eval()


def test_the_record_data_model_imports_nothing_of_the_engine():
    """LayerRecord is data: turning the taps' calls into records is the pipeline's
    (attnviz.workflows.capture.call_records), so attnviz.data.records imports no engine module."""
    import ast
    from pathlib import Path

    import attnviz.data.records as records

    tree = ast.parse(Path(records.__file__).read_text(encoding="utf-8"))
    imported = [
        ("." * node.level) + (node.module or "") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ] + [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert not [m for m in imported if "engine" in m or "workflows" in m], imported
