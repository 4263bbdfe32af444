"""Edits that start from a capture the caller holds (issue 18): ``intervene(model, cap, edits)`` and
``head_importance(model, cap, …)`` re-use the capture's tokens (no tokenizer call) and equal the result
from the text; another model's capture, or a generation's, is refused with what to do. And
``generate(tokenized=)`` reads the prompt's tokens as given, as ``capture(tokenized=)`` does."""

from __future__ import annotations

import pytest
import torch

import attnviz
from attnviz import edits
from attnviz.workflows.capture.inputs import tokenize
from attnviz.workflows.capture.models import IdsTokenizer
from attnviz.workflows.capture.provenance import weights_hash

TEXT = "11 5 7 9 13 21 8 30"
TARGET = "3 4 5 6 7 8"


class CountingTokenizer(IdsTokenizer):
    """IdsTokenizer that remembers every text it was asked to tokenize."""

    def __init__(self):
        self.texts: list[str] = []

    def __call__(self, text=None, text_target=None, **kwargs):
        self.texts.append(text if text is not None else text_target)
        return super().__call__(text, text_target, **kwargs)


def _same_attention(a: attnviz.Capture, b: attnviz.Capture) -> None:
    assert a.parts == b.parts and a.records.keys() == b.records.keys()
    for part, layer in a.records:
        assert torch.equal(a.attention(layer, part=part), b.attention(layer, part=part)), (part, layer)


@pytest.mark.parametrize(
    "family,part",
    [("llama", "decoder"), ("gpt2", "decoder"), ("bert", "encoder"), ("t5", "decoder"), ("bart", "cross")],
)
def test_an_intervention_from_a_capture_equals_the_one_from_its_text_and_tokenizes_nothing(family, part):
    model = attnviz.testing.tiny_model(family, attn_implementation="sdpa")
    kw = {"target": TARGET} if model.config.is_encoder_decoder else {}
    chosen = [edits.knockout(layer=1, head=0, query=5, key=[2, 3], part=part), edits.temperature(2.0, layer=0)]
    tok = CountingTokenizer()
    from_text = attnviz.intervene(model, TEXT, chosen, tok, **kw)
    cap = attnviz.capture(model, TEXT, tok, **kw)
    tok.texts.clear()
    from_capture = attnviz.intervene(model, cap, chosen, tok)
    assert tok.texts == []  # the capture's tokens (and its target's) were used as they are
    assert from_capture.capture_before is cap
    _same_attention(from_capture.capture_before, from_text.capture_before)
    _same_attention(from_capture.capture_after, from_text.capture_after)
    after, expected = from_capture.capture_after, from_text.capture_after
    assert (after.text, after.token_ids, after.words, after.target) == (
        expected.text,
        expected.token_ids,
        expected.words,
        expected.target,
    )
    assert after.model == expected.model and from_capture.edited_layers == from_text.edited_layers
    assert torch.equal(from_capture.similarity, from_text.similarity)
    if from_text.before is not None:
        assert torch.equal(from_capture.before.logprobs, from_text.before.logprobs)
        assert torch.equal(from_capture.after.logprobs, from_text.after.logprobs)
        assert from_capture.logprob([40, 41]) == from_text.logprob([40, 41])
    else:
        assert from_capture.before is None and from_capture.after is None


def test_a_capture_of_some_layers_or_read_back_from_its_file_is_a_before_too(tmp_path):
    model = attnviz.testing.tiny_model("llama")
    tok = CountingTokenizer()
    chosen = [edits.knockout(layer=1, key="7")]  # a word of the text: planned on the capture's own words
    from_text = attnviz.intervene(model, TEXT, chosen, tok)
    for cap in (
        attnviz.capture(model, TEXT, tok, layers=[0]),
        attnviz.load(attnviz.capture(model, TEXT, tok).save(tmp_path / "text.attnviz")),
    ):
        tok.texts.clear()
        out = attnviz.intervene(model, cap, chosen, tok)
        assert tok.texts == []
        assert torch.equal(out.after.logprobs, from_text.after.logprobs)
        _same_attention(out.capture_after, from_text.capture_after)


def test_head_importance_from_a_capture_equals_the_one_from_its_text():
    model = attnviz.testing.tiny_model("llama")
    tok = CountingTokenizer()
    from_text = attnviz.head_importance(model, TEXT, [40, 41], tok, batch_size=3, progress=False)
    cap = attnviz.capture(model, TEXT, tok)
    tok.texts.clear()
    from_capture = attnviz.head_importance(model, cap, [40, 41], tok, batch_size=3, progress=False)
    assert tok.texts == []
    assert from_capture.equals(from_text) and from_capture.attrs == from_text.attrs
    t5 = attnviz.testing.tiny_model("t5")
    seq2seq = attnviz.capture(t5, TEXT, tok, target=TARGET)
    expected = attnviz.head_importance(t5, TEXT, 9, tok, decoder_text=TARGET, progress=False)
    assert attnviz.head_importance(t5, seq2seq, 9, tok, progress=False).equals(expected)


def test_a_capture_of_another_model_or_of_a_generation_is_refused_with_what_to_do():
    tok = IdsTokenizer()
    model = attnviz.testing.tiny_model("llama")
    cap = attnviz.capture(model, TEXT, tok)
    knock = [edits.knockout(layer=1, key=2)]
    fix = "pass the model that made the capture (in the dtype it ran in), or the text, to capture it with this one"
    other = attnviz.testing.tiny_model("llama", seed=1)
    theirs = cap.model["provenance"]["weights_sha256"][:16]
    hashes = f"the capture's weights are sha256 {theirs}…, this model's {weights_hash(other)[:16]}…"
    with pytest.raises(attnviz.CaptureMismatchError) as err:  # the same architecture, other weights
        attnviz.intervene(other, cap, knock, tok)
    assert str(err.value).startswith(
        "this capture was not made by this model from these tokens: at decoder layer 1 this model computes "
        "other numbers (max |Δ| "
    ) and str(err.value).endswith(f"tolerance 1e-04; captured by 'LlamaForCausalLM' in float32); {hashes}; {fix}")
    with pytest.raises(attnviz.CaptureMismatchError) as err:
        attnviz.head_importance(attnviz.testing.tiny_model("gpt2"), cap, 5, tok, progress=False)
    assert str(err.value) == (
        "this capture was made by 'LlamaForCausalLM' (LlamaForCausalLM, llama), not by this GPT2LMHeadModel "
        f"(gpt2); {fix}: head_importance(model, cap.text, …)"
    )
    half = attnviz.testing.tiny_model("llama").to(torch.bfloat16)
    hashes = f"the capture's weights are sha256 {theirs}…, this model's {weights_hash(half)[:16]}…"
    with pytest.raises(attnviz.CaptureMismatchError) as err:
        attnviz.intervene(half, cap, knock, tok)
    assert str(err.value) == f"this capture's dtype (float32) is not this model's (bfloat16); {hashes}; {fix}"
    generation = attnviz.generate(model, TEXT, tok, max_new_tokens=2).capture
    with pytest.raises(attnviz.CaptureMismatchError) as err:
        attnviz.intervene(model, generation, knock, tok)
    assert str(err.value) == (
        "this capture is of a generation (its rows were computed one step at a time, with a KV cache); intervene "
        "runs one forward of a text. Capture the prompt with its continuation, attnviz.capture(model, "
        "gen.capture.text), and pass that capture (or the text)"
    )
    assert isinstance(err.value, attnviz.InputError)
    with pytest.raises(attnviz.InputError) as err:
        attnviz.intervene(model, cap, knock, tok, add_bos=True)
    assert str(err.value) == (
        "add_bos= reads a text, but intervene was given a capture, whose tokens are fixed (its target and BOS "
        "included); leave add_bos out, or pass the text"
    )
    with pytest.raises(attnviz.ArgumentTypeError, match="text must be a string or an attnviz.Capture, got list"):
        attnviz.intervene(model, [TEXT], knock, tok)


def test_generate_reads_the_prompts_tokens_as_given():
    model = attnviz.testing.tiny_model("llama")
    tok = CountingTokenizer()
    expected = attnviz.generate(model, TEXT, tok, max_new_tokens=4)
    encoded = tokenize(tok, [TEXT], None, None, "llama", False, what="prompt")
    tok.texts.clear()
    given = attnviz.generate(model, TEXT, tok, max_new_tokens=4, tokenized=encoded)
    assert tok.texts == []
    assert torch.equal(given.ids, expected.ids) and given.text == expected.text
    _same_attention(given.capture, expected.capture)
    with pytest.raises(attnviz.InputError, match="tokenized holds 2 texts for 1; give one per prompt"):
        attnviz.generate(model, TEXT, tok, tokenized=encoded * 2)
    long = [(list(range(3, 203)), [(0, 0)] * 200, ["x"] * 200)]
    with pytest.raises(attnviz.InputTooLongError, match="The prompt has 200 tokens; LlamaForCausalLM accepts at most"):
        attnviz.generate(model, TEXT, tok, tokenized=long)
