"""Bad input meets a clear AttnvizError that says what to do — in the library and on the command line."""

import subprocess
import sys

import pytest
import torch

import attnviz
from attnviz import figures
from attnviz.cli import main


@pytest.fixture(scope="module")
def bart():
    return attnviz.testing.tiny_model("bart")


def test_ids_the_model_cannot_read(bart):
    llama = attnviz.testing.tiny_model("llama")
    with pytest.raises(attnviz.EmptyTextError, match=r"input_ids has shape \(1, 0\): give at least one token"):
        attnviz.capture(llama, input_ids=torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(attnviz.EmptyTextError, match=r"decoder_input_ids has shape \(1, 0\)"):
        attnviz.capture(bart, input_ids=torch.tensor([[5, 6]]), decoder_input_ids=torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(attnviz.InputError, match="input_ids holds the id 500, outside this model's vocabulary of 128"):
        attnviz.capture(llama, input_ids=torch.tensor([[5, 500]]))
    with pytest.raises(attnviz.InputError, match="decoder input holds the id 999"):
        attnviz.capture(bart, input_ids=torch.tensor([[5, 6]]), decoder_input_ids=torch.tensor([[2, 999]]))
    with pytest.raises(attnviz.InputError, match=r"layers=\[\] would capture nothing"):
        attnviz.capture(llama, input_ids=torch.tensor([[5, 6]]), layers=[])


def test_max_length_shorter_than_the_special_tokens(tiny_bert_words):
    model, tok = tiny_bert_words
    with pytest.raises(attnviz.InputError, match="max_length must be a whole number ≥ 1, got 0"):
        attnviz.capture(model, "The cat sat.", tok, max_length=0)
    with pytest.raises(
        attnviz.InputError, match="max_length=1 is shorter than the 6 tokens the tokenizer keeps for the text"
    ):
        attnviz.capture(model, "The cat sat.", tok, max_length=1)
    assert attnviz.capture(model, "The cat sat.", tok, max_length=3).tokens == ["[CLS]", "the", "[SEP]"]


def test_a_decoder_without_a_start_token_is_refused():
    model = attnviz.testing.tiny_model("bart", decoder_start_token_id=None)
    for kwargs in ({}, {"decoder_input_ids": None}):
        with pytest.raises(attnviz.InputError, match="names no decoder_start_token_id"):
            attnviz.capture(model, input_ids=torch.tensor([[5, 6, 7]]), **kwargs)
    cap = attnviz.capture(model, input_ids=torch.tensor([[5, 6, 7]]), decoder_input_ids=torch.tensor([[2, 9]]))
    assert cap.target.token_ids == [2, 9]


def test_cross_attention_has_no_causal_switch_and_figures_check_ranges(bart):
    cap = attnviz.capture(bart, input_ids=torch.tensor([[5, 6, 7, 8]]), decoder_input_ids=torch.tensor([[2, 9]]))
    with pytest.raises(attnviz.InputError, match="cross-attention has no causal mask"):
        cap.attention(0, 1, part="cross", causal=True)
    assert cap.attention(0, 1, part="cross", causal=False).shape == (2, 4)
    with pytest.raises(attnviz.OutOfRangeError, match=r"query 9 is out of range: 0\.\.1"):
        figures.head_view(cap, 0, part="cross", query=9)
    with pytest.raises(attnviz.OutOfRangeError, match=r"head 99 is out of range: this model has heads 0\.\.3"):
        figures.validation_comparison(cap, 0, 99, part="cross")


def test_tiny_models_take_their_familys_backend():
    assert attnviz.testing.tiny_model("bloom").config._attn_implementation == "eager"  # bloom has no sdpa path
    assert attnviz.testing.tiny_model("llama").config._attn_implementation == "sdpa"
    with pytest.raises(attnviz.UnsupportedModelError, match="cannot build bloom with attn_implementation='sdpa'"):
        attnviz.testing.tiny_model("bloom", attn_implementation="sdpa")


@pytest.mark.parametrize("family", ["bloom", "mpt", "gpt_neo", "falcon_alibi", "llama", "gpt2"])
def test_a_one_token_decoder_is_still_a_decoder(family):
    assert attnviz.capture(attnviz.testing.tiny_model(family), input_ids=torch.tensor([[5]])).parts == ("decoder",)


def test_check_off_skips_the_eager_weight_comparison_too():
    model = attnviz.testing.tiny_model("llama", attn_implementation="eager")
    ids = torch.randint(3, 120, (1, 20))
    off = attnviz.capture(model, input_ids=ids, check="off")
    assert off.layer(0).weight_error is None and off.layer(0).weights is None
    assert {r["quantity"] for r in off.validate().rows} == {"output"}
    assert attnviz.capture(model, input_ids=ids).layer(0).weight_error is not None


def test_the_report_gives_advice_that_can_be_followed():
    inline = attnviz.capture(attnviz.testing.tiny_model("bloom"), input_ids=torch.tensor([[5, 6, 7]])).validate()
    assert "computes attention inline, so only its A·V output can be compared" in str(inline)
    sdpa = attnviz.capture(attnviz.testing.tiny_model("llama"), input_ids=torch.tensor([[5, 6, 7]])).validate()
    assert "load with attn_implementation='eager' to compare them too" in str(sdpa)


def test_figures_and_cost_are_there_after_import_attnviz_alone():
    code = (
        "import sys, attnviz; assert 'plotly' not in sys.modules and 'dash' not in sys.modules; "
        "print(attnviz.figures.heatmap.__name__, attnviz.analysis.cost_tables.__name__, attnviz.analysis.rollout.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["heatmap", "cost_tables", "rollout"]


def test_byte_tokenizers_without_offsets_get_their_characters_back():
    from transformers import ByT5Tokenizer

    tok = ByT5Tokenizer()
    cap = attnviz.capture(attnviz.testing.tiny_model("t5", vocab_size=len(tok)), "café 小猫", tok, target="小猫 ok")
    assert cap.offsets[:6] == [(0, 1), (1, 2), (2, 3), (3, 4), (3, 4), (4, 5)]  # é is two bytes, one character
    assert cap.word_labels == ["café", " ", "小猫", "</s>"]
    assert cap.target.word_labels == ["<pad>", "小猫", " ", "ok"]


# ---------------------------------------------------------------- the command line: exit codes
def test_cli_usage_and_input_errors_exit_2_in_one_line(tmp_path, capsys, tiny_bert_words):
    model, tok = tiny_bert_words
    folder = tmp_path / "tiny-bert"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    capsys.readouterr()
    cases = [
        (["validate"], "attnviz validate: give MODEL TEXT, or --capture FILE"),
        (["capture", str(folder), "The cat.", "-o", str(tmp_path / "nowhere" / "x.attnviz")], "does not exist"),
        (
            ["capture", str(folder), "The cat.", "-o", str(tmp_path / "x.txt")],
            "a capture is one safetensors file, not text",
        ),
        (
            ["generate", str(folder), "The cat.", "-o", str(tmp_path / "x.CSV")],
            f"name it {str(tmp_path / 'x.attnviz')!r}",
        ),
        (["validate", str(folder), "The cat.", "-o", str(tmp_path / "nowhere" / "e.csv")], "does not exist"),
        (["capture", str(folder), "The cat.", "--attn-implementation", "flash_attention_2"], "could not load"),
    ]
    if not torch.cuda.is_available():
        cases.append((["capture", str(folder), "The cat.", "--device", "cuda"], "CUDA is not available here"))
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (argv, err)
    assert main(["capture", str(folder), "The cat."]) == 0


def test_more_library_inputs_that_used_to_surface_raw(tiny_bert_words):
    model, tok = tiny_bert_words
    cap = attnviz.capture(model, "The cat sat.", tok)
    with pytest.raises(attnviz.InputError, match="temperature must be a number > 0, got nan"):
        cap.attention(0, temperature=float("nan"))
    with pytest.raises(attnviz.ArgumentTypeError, match="tokenizer must be a transformers tokenizer, got str"):
        attnviz.capture(model, "The cat sat.", "bert-base-uncased")


def test_cli_exit_1_means_validation_failed(tiny_bert_words, tmp_path, capsys):
    from dataclasses import replace

    model, tok = tiny_bert_words
    cap = attnviz.capture(model, "The cat sat on the mat.", tok)
    tampered = replace(cap, records={key: replace(r, scaling=r.scaling * 2) for key, r in cap.records.items()})
    path = tampered.save(tmp_path / "tampered.attnviz")
    assert main(["validate", "--capture", str(path)]) == 1
    assert "attnviz validation FAIL" in capsys.readouterr().out
    assert main(["validate", "--capture", str(cap.save(tmp_path / "fine.attnviz"))]) == 0
