"""attnviz.generate: every step of a cached generation, checked against the model's own generate,
a single prefill of the whole sequence and the model's own eager weights."""

from __future__ import annotations

import pytest
import torch
from test_families import reference

import attnviz
from attnviz.cli import main
from attnviz.engine import taps
from attnviz.engine.interface import installed_backends
from attnviz.workflows.capture.models import IdsTokenizer

PROMPT = "11 5 7 9 13 21 34 55 89"  # 9 tokens: longer than Mistral's and gpt-oss's sliding window of 4
N_NEW = 7

CASES = [
    ("gpt2", "sdpa", {}),
    ("gpt2", "eager", {}),
    ("llama", "sdpa", {}),
    ("llama", "eager", {}),
    ("llama", "sdpa", {"cache_implementation": "static"}),
    ("llama", "sdpa", {"do_sample": True, "top_k": 0, "seed": 7}),
    ("qwen2", "sdpa", {}),
    ("mistral", "eager", {}),  # sliding-window cache: the kernel sees only the last 4 positions
    ("mistral", "sdpa", {}),
    ("gpt_oss", "eager", {}),  # sliding layers and learned sinks
    ("bart", "sdpa", {"min_new_tokens": N_NEW}),
    ("bart", "eager", {"min_new_tokens": N_NEW}),
    ("marian", "sdpa", {}),
    ("t5", "sdpa", {}),  # the decoder's relative position bias, one row per step
    ("t5", "eager", {}),
    ("longt5", "eager", {}),  # its encoder's local blocks through projection hooks, once; its decoder's steps
]


def _plain(model, prompt_ids, kwargs):
    """model.generate as a user calls it, with the same arguments."""
    kwargs = dict(kwargs)
    seed = kwargs.pop("seed", None)
    if seed is not None:
        torch.manual_seed(seed)
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, **kwargs)
    return out[0].tolist()


@pytest.mark.parametrize(
    "family,backend,kwargs", CASES, ids=[f"{f}-{b}-{'-'.join(k) or 'greedy'}" for f, b, k in CASES]
)
def test_generation_equals_plain_generate_a_prefill_and_the_eager_weights(family, backend, kwargs):
    model = attnviz.testing.tiny_model(family, attn_implementation=backend)
    tok = IdsTokenizer()
    gen = attnviz.generate(model, PROMPT, tok, max_new_tokens=N_NEW, check="full", **kwargs)
    cap = gen.capture
    prompt_ids = [int(t) for t in PROMPT.split()]
    encoder_decoder = model.config.is_encoder_decoder

    # the tokens are those of the model's own generate
    plain = _plain(model, prompt_ids, kwargs)
    assert gen.ids.tolist() == plain
    assert gen.prompt_length == (1 if encoder_decoder else len(prompt_ids))
    assert gen.new_token_ids == plain[gen.prompt_length :] and len(gen) == N_NEW
    assert gen.steps == [gen.prompt_length] + [1] * N_NEW  # the prefill, then one query per step (and the last token)
    assert gen.text == "".join(f" {i}" for i in gen.new_token_ids)
    assert cap.parts == (("encoder", "decoder", "cross") if encoder_decoder else ("decoder",))

    # each row equals a single prefill capture of the whole sequence …
    if encoder_decoder:
        prefill = attnviz.capture(model, PROMPT, tok, decoder_input_ids=gen.ids[None], check="full")
    else:
        prefill = attnviz.capture(model, " ".join(map(str, plain)), tok, check="full")
    # … and the model's own eager weights on it (an independent reference)
    expected = reference(family, [prefill])
    for part, refs in expected.items():
        for layer, ref in enumerate(refs):
            ours = cap.attention(layer, part=part)
            torch.testing.assert_close(ours, prefill.attention(layer, part=part), atol=2e-6, rtol=0)
            torch.testing.assert_close(ours, ref[0], atol=2e-6, rtol=0)
    # storage: the generation keeps what the prefill keeps (O(n·d)), not one copy per step
    assert abs(cap.nbytes / prefill.nbytes - 1) <= 0.05, (cap.nbytes, prefill.nbytes)
    report = cap.validate()
    assert report.passed, str(report)
    assert not installed_backends()


def test_every_generated_row_is_proved_against_the_kernel_of_its_step(monkeypatch):
    """Forget Mistral's sliding window while recording: the prompt's sample could pass, but the
    generated rows beyond the window cannot, and generate refuses instead of showing them."""
    original = taps.Recorder.add

    def forgetful(self, *args, **kwargs):
        kwargs["sliding_window"] = None
        kwargs["window"] = None
        return original(self, *args, **kwargs)

    model = attnviz.testing.tiny_model("mistral", attn_implementation="eager")
    monkeypatch.setattr(taps.Recorder, "add", forgetful)
    with pytest.raises(attnviz.ValidationError) as err:
        attnviz.generate(model, PROMPT, IdsTokenizer(), max_new_tokens=3)
    failed = err.value.report.to_pandas().query("not passed")
    assert set(failed["part"]) == {"decoder"} and len(failed) > 0
    monkeypatch.undo()
    assert attnviz.generate(model, PROMPT, IdsTokenizer(), max_new_tokens=3).capture.validate().passed


def test_a_generated_row_is_the_one_computed_at_its_step():
    """The row of new token i is recorded when the model reads it: change its stored key after the
    fact and that step's output no longer matches (validation sees every step)."""
    gen = attnviz.generate(attnviz.testing.tiny_model("llama"), PROMPT, IdsTokenizer(), max_new_tokens=4)
    rec = gen.capture.layer(1)
    pos = gen.prompt_length + 2
    rec.k[:, pos] += 1.0
    report = gen.capture.validate()
    bad = report.to_pandas().query("not passed")
    assert not report.passed and set(bad["layer"]) == {1}


def test_step_api_rows_top_keys_and_the_row_that_chose_the_token():
    model = attnviz.testing.tiny_model("gpt2")
    gen = attnviz.generate(model, PROMPT, IdsTokenizer(), max_new_tokens=5)
    cap = gen.capture
    step = gen.step(2)
    assert step.index == 2 and step.position == gen.prompt_length + 2
    assert step.token == gen.new_tokens[2] and step.token_id == gen.new_token_ids[2]
    assert step.weights.shape == (2, 4, step.position + 1) and step.keys == cap.tokens[: step.position + 1]
    torch.testing.assert_close(step.weights[1, 3], cap.attention(1, 3)[step.position, : step.position + 1])
    torch.testing.assert_close(step.chosen_by[0], cap.attention(0)[:, step.position - 1, : step.position + 1])
    top = step.top(2, layer=1, head=3)
    row = cap.attention(1, 3)[step.position]
    assert [p for p, _, _ in top] == row.topk(2).indices.tolist()
    assert gen.step(-1).index == 4
    with pytest.raises(attnviz.InputError, match="5 new tokens"):
        gen.step(5)
    with pytest.raises(attnviz.InputError, match="layer 7"):
        step.top(layer=7)
    df = gen.to_pandas()
    assert list(df["token"]) == gen.new_tokens and list(df["position"]) == list(range(9, 14))
    assert "attends to" in repr(step) and "9 prompt tokens + 5 new" in repr(gen)


def test_a_saved_generation_loads_back_as_a_generation(tmp_path):
    gen = attnviz.generate(attnviz.testing.tiny_model("qwen2"), PROMPT, IdsTokenizer(), max_new_tokens=3)
    path = gen.save(tmp_path / "gen.attnviz")
    again = attnviz.Generation.of(attnviz.load(path))
    assert again.new_token_ids == gen.new_token_ids and again.prompt_length == gen.prompt_length
    assert again.steps == gen.steps and again.text == gen.text
    torch.testing.assert_close(again.step(1).weights, gen.step(1).weights)
    plain = attnviz.capture(attnviz.testing.tiny_model("qwen2"), PROMPT, IdsTokenizer())
    with pytest.raises(attnviz.InputError, match="not of a generation"):
        attnviz.Generation.of(plain)


def test_layers_subset():
    gen = attnviz.generate(attnviz.testing.tiny_model("llama"), PROMPT, IdsTokenizer(), max_new_tokens=3, layers=[1])
    assert gen.capture.layer_indices() == [1] and gen.step(0).layers == [1]
    assert gen.capture.info()["n_layers"] == 2


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(prompt=""), attnviz.InputError, "prompt is empty"),
        (dict(prompt="   "), attnviz.InputError, "prompt is empty"),
        (dict(prompt=["1 2", "3 4"]), attnviz.ArgumentTypeError, "one string"),
        (dict(max_new_tokens=0), attnviz.InputError, "max_new_tokens"),
        (dict(max_new_tokens=1.5), attnviz.InputError, "max_new_tokens"),
        (dict(max_new_tokens=60), attnviz.InputTooLongError, "at most 55 new tokens"),
        (dict(num_beams=2), attnviz.InputError, "beam search"),
        (dict(num_return_sequences=2), attnviz.InputError, "one sequence"),
        (dict(use_cache=False), attnviz.InputError, "cached generation"),
        (dict(do_smaple=True), attnviz.InputError, "did you mean 'do_sample'"),
        (dict(attention_mask=None), attnviz.InputError, "set by attnviz.generate"),
        (dict(check="some"), attnviz.InputError, "check must be"),
        (dict(seed="x"), attnviz.ArgumentTypeError, "seed"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, error, match):
    model = attnviz.testing.tiny_model("llama")  # 64 positions: 9 prompt tokens leave room for 55
    args = {"prompt": PROMPT, "max_new_tokens": 3, **kwargs}
    with pytest.raises(error, match=match):
        attnviz.generate(model, args.pop("prompt"), IdsTokenizer(), **args)
    assert not installed_backends()


def test_models_that_cannot_generate_are_refused():
    with pytest.raises(attnviz.UnsupportedModelError, match="cannot generate"):
        attnviz.generate(attnviz.testing.tiny_model("bert"), PROMPT, IdsTokenizer(), max_new_tokens=2)
    with pytest.raises(attnviz.UnsupportedModelError, match="attention interface"):
        attnviz.generate(attnviz.testing.tiny_model("gpt_neo"), PROMPT, IdsTokenizer(), max_new_tokens=2)
    with pytest.raises(attnviz.InputError, match="tokenizer="):
        attnviz.generate(attnviz.testing.tiny_model("gpt2"), PROMPT, max_new_tokens=2)


def test_the_taps_are_gone_when_generate_raises(monkeypatch):
    model = attnviz.testing.tiny_model("llama")

    def broken(*args, **kwargs):
        raise RuntimeError("the model failed mid-generation")

    monkeypatch.setattr(model, "generate", broken)
    with pytest.raises(RuntimeError, match="mid-generation"):
        attnviz.generate(model, PROMPT, IdsTokenizer(), max_new_tokens=2)
    assert not installed_backends()


# ---------------------------------------------------------------- the real models and the command line
@pytest.mark.slow
def test_smollm2_generation_is_its_own_greedy_text_and_checks_out(smollm2):
    model, tok = smollm2
    prompt = "The cat sat on the mat because"
    gen = attnviz.generate(model, prompt, tok, max_new_tokens=8)
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert gen.ids.tolist() == plain[0].tolist()
    assert gen.text == tok.decode(plain[0, ids.shape[1] :], skip_special_tokens=True)
    assert gen.capture.text == prompt + gen.text
    spans = [gen.capture.text[a:b].strip() for a, b in gen.capture.offsets[gen.prompt_length :]]
    assert spans == [tok.decode([i]).strip() for i in gen.new_token_ids]
    report = gen.capture.validate(rows=torch.arange(gen.prompt_length, len(gen.ids)))
    assert report.passed, str(report)
    prefill = attnviz.capture(model, tokenizer=tok, input_ids=gen.ids[None], layers=[0, 17, 29])
    for layer in (0, 17, 29):
        torch.testing.assert_close(gen.capture.attention(layer), prefill.attention(layer), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_cli_generate_prints_the_continuation_and_saves_a_generation(tmp_path, capsys):
    out = tmp_path / "gen.attnviz"
    code = main(["generate", "smollm2", "The cat sat on the mat because", "--max-new-tokens", "4", "--steps"])
    printed = capsys.readouterr()
    assert code == 0 and printed.out.startswith("The cat sat on the mat because")
    assert "4 new tokens after 7" in printed.err and "layer 29" in printed.out
    code = main(["generate", "smollm2", "The cat", "--max-new-tokens", "2", "-o", str(out)])
    assert code == 0 and len(attnviz.Generation.of(attnviz.load(out))) == 2
    assert main(["generate", "minilm", "The cat", "--max-new-tokens", "2"]) == 2
    assert "cannot generate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # the parser's (tests/test_cli_errors.py)
        main(["generate", "smollm2", "The cat", "--max-new-tokens", "0"])
    assert stop.value.code == 2
    capsys.readouterr()
    assert main(["generate", "smollm2", "The cat", "--temperature", "0.5"]) == 2
    assert "--sample" in capsys.readouterr().err


def test_a_plain_tap_around_generate_numbers_each_modules_steps():
    """attnviz.tap() stays the low-level view: every call, each with its module's layer and step."""
    model = attnviz.testing.tiny_model("llama")
    with torch.no_grad(), attnviz.tap(model, layers={1}) as rec:
        model.generate(torch.tensor([[5, 6, 7, 8, 9]]), max_new_tokens=3, pad_token_id=0)
    kept = [c for c in rec.calls if c.q is not None]
    assert [(c.layer, c.step, c.q.shape[-2]) for c in kept] == [(1, 0, 5), (1, 1, 1), (1, 2, 1)]
    assert [(c.layer, c.step) for c in rec.calls if c.q is None] == [(0, 0), (0, 1), (0, 2)]


def test_each_step_keeps_its_own_rows_not_the_cache_it_was_cut_from(monkeypatch):
    """The cache grows a new tensor every step; a kept view of it would hold every step's whole cache
    (O(steps·n·d) while generating). Every kept key and value row owns storage of its own size."""
    from attnviz.workflows.step_recorder import StepRecorder

    seen = []
    original = StepRecorder.assembled

    def spy(self):
        seen.extend(t for s in self.streams.values() for t in s.k + s.v)
        return original(self)

    monkeypatch.setattr(StepRecorder, "assembled", spy)
    attnviz.generate(attnviz.testing.tiny_model("gpt2"), PROMPT, IdsTokenizer(), max_new_tokens=5)
    assert len(seen) == 2 * 2 * 6  # layers × (k, v) × (prefill + 5 steps)
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in seen)


def test_a_wordpiece_continuation_keeps_its_space_and_labels_are_clean(bert_tokenizer):
    """WordPiece drops the leading space when it decodes the new tokens alone; the capture's text
    must still read "because pioneering", not "becausepioneering", and every word appear once."""
    model = attnviz.testing.tiny_model("llama", vocab_size=bert_tokenizer.vocab_size)
    prompt = "The cat sat on the mat because"
    gen = attnviz.generate(model, prompt, bert_tokenizer, max_new_tokens=4, min_new_tokens=4)
    assert gen.capture.text == prompt + gen.text and gen.text.startswith(" ")
    assert gen.text.strip() == bert_tokenizer.decode(gen.new_token_ids, skip_special_tokens=True)
    spans = [(w.char_start, w.char_end) for w in gen.capture.words if w.char_end > w.char_start]
    assert len(spans) == len(set(spans))  # no word twice (special tokens cover no text)
    step = gen.step(0)
    assert step.token == gen.capture.token_labels[gen.prompt_length] and not step.token.startswith("##")
    assert step.keys == gen.capture.token_labels[: step.position + 1]


def test_blank_tokens_get_visible_labels():
    seq = attnviz.TokenSequence("a\n\nb c", ["a", "ĊĊ", "b", "Ġc"], [1, 2, 3, 4], [(0, 1), (1, 3), (3, 4), (4, 6)], [])
    assert seq.token_labels == ["a", "↵↵", "b", "c"]
