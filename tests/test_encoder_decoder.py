"""Encoder-decoder captures through the text path: target teacher-forced as with labels, parts,
labels, files, the command line — and tokenizers without offsets."""

import pytest
import torch

import attnviz
from attnviz.cli import main

SOURCE = "The cat sat on the mat because it was tired."
TARGET = "Le chat était assis parce qu'il était fatigué."


@pytest.fixture(scope="module")
def bart(bert_tokenizer):
    """A tiny random BART that reads MiniLM's WordPiece vocabulary: real text, real shifts."""
    model = attnviz.testing.tiny_model(
        "bart",
        attn_implementation="sdpa",
        vocab_size=bert_tokenizer.vocab_size,
        pad_token_id=0,
        decoder_start_token_id=102,
    )
    return model, bert_tokenizer


@pytest.fixture(scope="module")
def cap(bart):
    model, tok = bart
    return attnviz.capture(model, SOURCE, tok, target=TARGET)


def test_target_is_shifted_right_as_the_model_does_with_labels(bart, cap):
    model, tok = bart
    labels = tok(text_target=TARGET)["input_ids"]
    assert cap.target.token_ids == [102] + labels[:-1]  # decoder start, then the labels but the last
    assert cap.target_tokens[:4] == ["[SEP]", "[CLS]", "le", "chat"]
    assert cap.target.word_labels[:4] == ["[SEP]", "[CLS]", "Le", "chat"] and cap.target_text == TARGET
    eager = attnviz.testing.tiny_model(
        "bart", attn_implementation="eager", vocab_size=tok.vocab_size, pad_token_id=0, decoder_start_token_id=102
    )
    with torch.no_grad():
        out = eager(input_ids=torch.tensor([cap.token_ids]), labels=torch.tensor([labels]), output_attentions=True)
    for part, refs in (
        ("encoder", out.encoder_attentions),
        ("decoder", out.decoder_attentions),
        ("cross", out.cross_attentions),
    ):
        for layer, ref in enumerate(refs):
            torch.testing.assert_close(cap.attention(layer, part=part), ref[0], atol=2e-6, rtol=0)


def test_parts_shapes_and_labels(cap):
    n_src, n_tgt = cap.n_tokens, len(cap.target_tokens)
    assert cap.parts == ("encoder", "decoder", "cross")
    assert cap.attention(1, head=2, part="cross").shape == (n_tgt, n_src)
    decoder = cap.attention(1, part="decoder")
    assert decoder.shape == (4, n_tgt, n_tgt) and torch.triu(decoder, 1).abs().max() == 0  # causal
    assert cap.q(0, part="cross").shape == (4, n_tgt, 8) and cap.k(0, part="cross").shape == (4, n_src, 8)
    assert cap.sequences("cross") == (cap.target, cap.source)
    with pytest.raises(
        attnviz.InputError, match=r"this capture has the parts encoder, decoder, cross; say which with part="
    ):
        cap.attention(0)
    with pytest.raises(attnviz.InputError, match="no part 'middle' in this capture"):
        cap.attention(0, part="middle")
    words = cap.attention(0, 1, part="cross", words=True)
    assert words.shape == (len(cap.target_words), len(cap.words))
    torch.testing.assert_close(words.sum(-1), torch.ones(len(cap.target_words)), atol=1e-5, rtol=0)
    df = cap.to_pandas(layer=1, head=0, part="cross")
    row = df[(df.query_token == "chat") & (df.key_token == "cat")].iloc[0]
    assert row.weight == pytest.approx(cap.attention(1, 0, part="cross")[3, 2].item())
    assert set(cap.to_pandas(layer=0, head=0).part) == {"encoder", "decoder", "cross"}
    assert "encoder 2/2, decoder 2/2, cross 2/2" in repr(cap)


def test_without_a_target_the_decoder_reads_its_start_token(bart):
    model, tok = bart
    cap = attnviz.capture(model, SOURCE, tok)
    assert cap.target_tokens == ["[SEP]"] and cap.attention(0, part="cross").shape == (4, 1, cap.n_tokens)
    exact = attnviz.capture(model, SOURCE, tok, decoder_input_ids=torch.tensor([[102, 101, 2474]]))
    assert exact.target.token_ids == [102, 101, 2474]
    with pytest.raises(attnviz.InputError, match="pass either target or decoder_input_ids, not both"):
        attnviz.capture(model, SOURCE, tok, target=TARGET, decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(attnviz.InputError, match="2 targets for 1 texts"):
        attnviz.capture(model, [SOURCE], tok, target=[TARGET, TARGET])
    gpt2 = attnviz.testing.tiny_model("gpt2", vocab_size=tok.vocab_size)
    with pytest.raises(attnviz.InputError, match="is not an encoder-decoder model: it reads one text"):
        attnviz.capture(gpt2, SOURCE, tok, target=TARGET)


def test_layers_are_real_indices_in_every_part(bart):
    model, tok = bart
    cap = attnviz.capture(model, SOURCE, tok, target=TARGET, layers=[1])
    assert {p: cap.layer_indices(p) for p in cap.parts} == {"encoder": [1], "decoder": [1], "cross": [1]}
    with pytest.raises(attnviz.OutOfRangeError, match=r"layer 0 \(cross\) was not captured \(captured: \[1\]\)"):
        cap.attention(0, part="cross")
    report = cap.validate()
    assert report.passed and set(report.to_pandas().part) == {"encoder", "decoder", "cross"}
    assert "encoder 1, decoder 1, cross 1 layers × 4 heads" in str(report)


def test_analyses_read_one_self_attention_part(cap):
    from attnviz.analysis import head_stats, rank_heads, rollout

    decoder = cap.select("decoder")
    assert decoder.parts == ("decoder",) and decoder.tokens == cap.target_tokens and decoder.text == TARGET
    ranking = rank_heads(cap, "il", ["chat"], part="decoder")
    assert ranking.table.shape[0] == 2 * 4
    assert set(head_stats(cap, part="encoder").layer) == {0, 1}
    assert rollout(cap, part="encoder").shape == (2, cap.n_tokens, cap.n_tokens)
    with pytest.raises(attnviz.InputError, match="cross-attention reads the target over the source"):
        cap.select("cross")


def test_save_and_load_keep_parts_target_and_shared_tensors(tmp_path):
    model = attnviz.testing.tiny_model("t5")
    cap = attnviz.capture(model, input_ids=torch.randint(3, 120, (1, 30)), decoder_input_ids=torch.arange(3, 13)[None])
    back = attnviz.load(cap.save(tmp_path / "t5.attnviz"))
    assert back.parts == cap.parts and back.target.token_ids == cap.target.token_ids
    assert back.layer(1, "encoder").relative_bias is back.layer(0, "encoder").relative_bias  # written once
    for part in cap.parts:
        torch.testing.assert_close(back.attention(1, part=part), cap.attention(1, part=part), atol=1e-6, rtol=0)
    assert str(back.validate()) == str(cap.validate())
    with pytest.raises(attnviz.CaptureFileError, match="the folder .* does not exist"):
        cap.save(tmp_path / "missing" / "t5.attnviz")


def test_files_of_format_1_still_load(tmp_path):
    import json

    from safetensors.torch import save_file

    q = torch.randn(2, 3, 4)
    meta = {
        "format": "attnviz-capture",
        "version": 1,
        "text": "a b c",
        "tokens": ["a", "b", "c"],
        "token_ids": [1, 2, 3],
        "offsets": [[0, 1], [2, 3], [4, 5]],
        "words": [["a", 0, 1, 0, 1], ["b", 2, 3, 1, 2], ["c", 4, 5, 2, 3]],
        "model": {"name": "old", "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "d_head": 4, "backend": "sdpa"},
        "layers": {"0": {"name": "h.0.attn", "scaling": 0.5, "causal": True, "window": None, "softcap": None}},
    }
    save_file(
        {"layers.0.q": q, "layers.0.k": q.clone(), "layers.0.v": q.clone()},
        str(tmp_path / "old.attnviz"),
        metadata={"attnviz": json.dumps(meta)},
    )
    old = attnviz.load(tmp_path / "old.attnviz")
    assert old.parts == ("decoder",) and old.n_heads == 2
    assert old.attention(0, 1).shape == (3, 3) and old.attention(0, 1)[0, 1] == 0


def test_cli_target_part_and_exit_codes(bart, tmp_path, capsys):
    model, tok = bart
    folder = tmp_path / "tiny-bart"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    out = tmp_path / "bart.attnviz"
    assert (
        main(
            [
                "capture",
                str(folder),
                SOURCE,
                "--target",
                TARGET,
                "--query",
                "chat",
                "--part",
                "cross",
                "--layer",
                "1",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "target words: [SEP] | [CLS] | Le | chat" in printed
    assert "attention from 'chat' in layer 1 (cross), per head" in printed and "H3: " in printed
    assert attnviz.load(out).parts == ("encoder", "decoder", "cross")
    assert main(["validate", "--capture", str(out)]) == 0
    assert "attnviz validation PASS" in capsys.readouterr().out


def test_a_slow_tokenizer_gets_offsets_rebuilt_from_its_tokens(tiny_bert_words):
    from transformers import BertTokenizerLegacy

    from attnviz.workflows.capture.models import embedded_source

    model, fast = tiny_bert_words
    folder, _ = embedded_source("minilm")
    slow = BertTokenizerLegacy.from_pretrained(str(folder))
    text = "Unbelievably, the café was 小猫 [weird] it's ok."
    cap = attnviz.capture(model, text, slow)
    reference = attnviz.capture(model, text, fast)
    assert cap.tokens == reference.tokens and cap.offsets == reference.offsets
    assert cap.word_labels == reference.word_labels
    assert [w.text for w in cap.words if w.char_end > w.char_start][:3] == ["Unbelievably", ",", "the"]
