"""Probe sets scored in padded batches (issue #21): every head's pick equals what the model's own eager
weights give for that probe run alone, the batch size changes nothing, and what cannot be scored is named."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import attnviz
from attnviz.analysis import load_probes, rank_heads
from attnviz.analysis.probes import Probe
from attnviz.workflows.corpus import probing
from attnviz.workflows.corpus.corpus import MAX_PADDING

PROBES = [  # lengths differ: several batches, padded
    ("The cat sat on the mat because it was tired.", "it", ["cat", "mat"], "cat"),
    ("The dog saw the bird because it was loud.", "it", ["dog", "bird"], "bird"),
    (
        "A small girl gave the old man her umbrella because he was wet and it was raining hard.",
        "he",
        ["girl", "man"],
        "man",
    ),
    ("Tom thanked Bill because he had helped.", "he", ["Tom", "Bill"], "Bill"),
    ("The trophy would not fit in the brown suitcase because it was too big.", "it", ["trophy", "suitcase"], "trophy"),
    ("Anna told Maria that she had won.", "she", ["Anna", "Maria"], "Anna"),
    (
        "The lawyer asked the witness a question, but he was reluctant to repeat it.",
        "he",
        ["lawyer", "witness"],
        "witness",
    ),
]


def _probes() -> list[Probe]:
    return [Probe(text, pronoun, tuple(c), gold, id=f"p{i}") for i, (text, pronoun, c, gold) in enumerate(PROBES)]


def _eager_picks(model, tok, probe: Probe, bos: bool) -> np.ndarray:
    """[layer, head]: the candidate each head prefers, from the model's own eager weights for this probe
    alone — tokens found by the tokenizer's own offsets, sinks (first and special tokens) left out and each
    row renormalised, the pronoun's rows averaged, each candidate's tokens summed."""
    enc = tok(probe.text, return_offsets_mapping=True, return_special_tokens_mask=True)
    ids, offsets, special = enc["input_ids"], enc["offset_mapping"], enc["special_tokens_mask"]
    if bos:
        ids, offsets, special = [tok.bos_token_id] + ids, [(0, 0)] + offsets, [1] + special
    (ps, pe), places = probe.locate()

    def tokens(start: int, end: int) -> list[int]:
        return [i for i, (s, e) in enumerate(offsets) if s < end and e > start and e > s]

    pronoun = tokens(ps, pe)
    sinks = sorted(({0} | {i for i, m in enumerate(special) if m}) - set(pronoun))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    picks = []
    for a in out.attentions:  # [1, head, q, k]
        rows = a[0][:, pronoun, :].clone()
        rows[..., sinks] = 0
        rows = rows / rows.sum(-1, keepdim=True)
        mean = rows.mean(1)  # [head, key]
        weights = torch.stack([mean[:, [t for t in tokens(s, e) if t not in sinks]].sum(-1) for s, e in places], -1)
        picks.append(weights.argmax(-1).numpy())
    return np.stack(picks)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_batched_picks_are_the_models_own_eager_picks_for_each_probe_alone(
    family, tiny, bert_tokenizer, smol_tokenizer
):
    tok = bert_tokenizer if family == "bert" else smol_tokenizer
    model = tiny(family, "eager", vocab_size=len(tok))
    probes = _probes()
    result = attnviz.evaluate_probes(model, probes, tok, batch_size=3, add_bos=True, progress=False)
    assert result.per_probe.id.tolist() == [p.id for p in probes]  # the set's order, not the batches'
    assert result.picks.shape == (len(probes), model.config.num_hidden_layers, model.config.num_attention_heads)
    bos = family == "llama"  # add_bos: SmolLM2's tokenizer adds none itself; BERT's [CLS] is first already
    for i, probe in enumerate(probes):
        np.testing.assert_array_equal(result.picks[i], _eager_picks(model, tok, probe, bos), err_msg=probe.id)
    gold = np.array([list(p.candidates).index(p.gold) for p in probes])
    np.testing.assert_array_equal(result.gold, gold)
    hits = (result.picks == gold[:, None, None]).sum(0)
    for row in result.accuracy.itertuples(index=False):
        assert row.correct == hits[row.layer, row.head] and row.accuracy == pytest.approx(row.correct / len(probes))


def test_the_batch_size_changes_no_pick_and_each_pick_is_rank_heads_on_the_probes_own_capture(
    tiny, smol_tokenizer, monkeypatch
):
    model = tiny("llama", vocab_size=len(smol_tokenizer))  # sdpa: the kernel that runs in practice
    probes = _probes() * 3
    probes = [Probe(p.text, p.pronoun, p.candidates, p.gold, id=f"{p.id}-{i}") for i, p in enumerate(probes)]
    one = attnviz.evaluate_probes(model, probes, smol_tokenizer, batch_size=1, add_bos=True, progress=False)
    calls, padding = [], []
    original = probing.ProbeRun.score

    def counted(self, batch):
        lengths = [len(self.encoded[b][0]) for b in batch]
        calls.append(len(lengths))
        padding.append(1 - sum(lengths) / (max(lengths) * len(lengths)))
        return original(self, batch)

    monkeypatch.setattr(probing.ProbeRun, "score", counted)
    batched = attnviz.evaluate_probes(model, probes, smol_tokenizer, batch_size=8, add_bos=True, progress=False)
    assert sum(calls) == len(probes) and 1 < max(calls) <= 8 and len(calls) < len(probes) / 2
    assert max(padding) <= MAX_PADDING  # cut by length as corpus_stats cuts: little padding
    np.testing.assert_array_equal(batched.picks, one.picks)
    pd.testing.assert_frame_equal(batched.accuracy, one.accuracy)
    pd.testing.assert_frame_equal(batched.per_probe, one.per_probe)  # best_head_weight within float tolerance
    # the other path: each probe captured alone, its heads ranked by rank_heads (a capture's own weights)
    for i, probe in enumerate(probes[:7]):
        cap = attnviz.capture(model, probe.text, smol_tokenizer, add_bos=True)
        (ps, pe), places = probe.locate()
        ranking = rank_heads(cap, (ps, pe), places)
        names = ranking.names
        for row in ranking.table.itertuples(index=False):
            assert names.index(row.preferred) == batched.picks[i, row.layer, row.head], (probe.id, row)


def test_the_default_batch_holds_many_short_probes_and_few_long_ones(tiny, smol_tokenizer, monkeypatch):
    """By default 64 probes go through one forward, but never more than BATCH_TOKENS padded tokens (a
    longer probe alone): short probes share the layers' fixed cost, long ones stay one batch's size."""
    model = tiny("llama", vocab_size=len(smol_tokenizer), max_position_embeddings=512)
    first = _probes()[0]  # one length: padding cuts nothing, only the batch size does
    short = [Probe(first.text, first.pronoun, first.candidates, first.gold, id=f"s{i}") for i in range(70)]
    filler = "and the cat sat on the mat again " * 12  # ~100 tokens
    long = [
        Probe(
            f"The cat {filler * (1 + i % 3)}saw the dog because it was tired.", "it", ("cat", "dog"), "cat", id=f"l{i}"
        )
        for i in range(30)
    ]
    monkeypatch.setattr(probing, "BATCH_TOKENS", 1024)  # the cap's rule at a size this test can reach
    sizes: list[tuple[int, int]] = []
    original = probing.ProbeRun.score

    def counted(self, batch):
        lengths = [len(self.encoded[b][0]) for b in batch]
        sizes.append((len(lengths), max(lengths) * len(lengths)))
        return original(self, batch)

    monkeypatch.setattr(probing.ProbeRun, "score", counted)
    result = attnviz.evaluate_probes(model, short + long, smol_tokenizer, add_bos=True, progress=False)
    assert sum(n for n, _ in sizes) == len(short) + len(long) and not result.skipped
    assert max(n for n, _ in sizes) == probing.BATCH_SIZE == 64  # the short ones, 64 at a time
    assert all(tokens <= 1024 or n == 1 for n, tokens in sizes)  # the long ones: within the cap
    assert any(n > 1 and tokens > 512 for n, tokens in sizes)  # and still several at a time


def test_the_command_lines_probe_batch_is_the_librarys():
    from attnviz.cli import build_parser

    args = build_parser().parse_args(["probes", "tiny-llama", "en"])
    assert args.batch_size == probing.BATCH_SIZE


def test_what_cannot_be_scored_is_named_and_the_rest_is_scored(tiny, smol_tokenizer):
    model = tiny("llama", vocab_size=len(smol_tokenizer), max_position_embeddings=24)
    probes = _probes()[:2] + [
        Probe("The cat saw it, then a dog came.", "it", ("cat", "dog"), "cat", id="later"),
        Probe(
            "The cat " + "sat and sat " * 12 + "on the mat because it was tired.",
            "it",
            ("cat", "mat"),
            "cat",
            id="long",
        ),
    ]
    result = attnviz.evaluate_probes(model, probes, smol_tokenizer, batch_size=4, add_bos=True, progress=False)
    assert result.per_probe.id.tolist() == ["p0", "p1"]
    reasons = dict(line.split(": ", 1) for line in result.skipped)
    assert set(reasons) == {"later", "long"}
    assert "'dog' comes after 'it': in a causal decoder" in reasons["later"]
    assert "accepts at most 24" in reasons["long"]
    assert "skipped 2" in str(result)
    with pytest.raises(attnviz.InputError, match=r"no probe could be scored \(1 left out\): later: 'dog' come"):
        attnviz.evaluate_probes(model, probes[2:3], smol_tokenizer, add_bos=True, progress=False)
    with pytest.raises(attnviz.InputError, match="batch_size must be a whole number ≥ 1, got 0"):
        attnviz.evaluate_probes(model, probes, smol_tokenizer, batch_size=0, add_bos=True, progress=False)
    for name, value, unit, default in (
        ("checkpoint_every_probes", 0, "probes", "100"),
        ("checkpoint_every_probes", -5, "probes", "100"),
        ("checkpoint_every_seconds", 0.0, "seconds", "60"),
    ):
        with pytest.raises(attnviz.InputError) as refused:
            attnviz.evaluate_probes(model, probes, smol_tokenizer, add_bos=True, progress=False, **{name: value})
        assert str(refused.value) == (
            f"{name} must be a number > 0, got {value!r}: pass how many {unit} may pass between two checkpoints "
            f"(default: {default}), or checkpoint=None for none"
        )


def test_a_line_that_is_no_probe_is_reported_by_its_line_number(tiny, smol_tokenizer, tmp_path):
    """A line of a JSONL file the reader could not read has no id: the skipped report says "line 3: …",
    not a bare "3: …" that a reader could not tell from an id."""
    model = tiny("llama", vocab_size=len(smol_tokenizer))
    text, pronoun, candidates, gold = PROBES[0]
    good = json.dumps({"text": text, "pronoun": pronoun, "candidates": candidates, "gold": gold})
    path = tmp_path / "mixed.jsonl"
    path.write_text(f"{good}\n{good}\nnot json\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="1 unusable"):
        probes = load_probes(path)
    result = attnviz.evaluate_probes(model, probes, smol_tokenizer, add_bos=True, progress=False)
    assert len(result.skipped) == 1 and result.skipped[0].startswith("line 3: not JSON ("), result.skipped
    assert result.skipped[0].endswith(" (when loading)")


def test_a_word_the_tokenizer_reads_as_unknown_is_refused_not_scored(tiny_bert_words):
    """MiniLM's WordPiece vocabulary has no 它: its weight would be [UNK]'s, not the pronoun's."""
    model, tok = tiny_bert_words
    probes = [
        Probe("我家的小猫很可爱，它很好动。", "它", ("小猫", "我家"), "小猫", id="zh"),
        Probe("The cat sat on the mat because it was tired.", "it", ("cat", "mat"), "cat", id="en"),
    ]
    assert tok.unk_token_id in tok("它")["input_ids"]  # the premise: the tokenizer cannot read it
    result = attnviz.evaluate_probes(model, probes, tok, add_bos=True, progress=False)
    assert result.per_probe.id.tolist() == ["en"]
    assert result.skipped == [
        "zh: the tokenizer reads '它' as its unknown token only: a head's weight on it would be the weight of "
        "that token, not of the word; use a model whose vocabulary has it"
    ]


def test_a_recomputation_that_misses_the_kernel_stops_the_probe_set(tiny, smol_tokenizer, monkeypatch):
    """The probes read weights attnviz recomputed: checked against the kernel's own output, as a capture's."""
    from attnviz.workflows.corpus import batched

    model = tiny("llama", vocab_size=len(smol_tokenizer))
    original = batched.reduce_layer

    def off_scale(call, *args):
        call.scaling *= 1.01
        return original(call, *args)

    monkeypatch.setattr(batched, "reduce_layer", off_scale)
    with pytest.raises(attnviz.ValidationError, match="could not reproduce"):
        attnviz.evaluate_probes(model, _probes(), smol_tokenizer, add_bos=True, progress=False)


def test_chinese_from_a_cluewsc_file_end_to_end(tiny, smol_tokenizer, tmp_path):
    """CLUEWSC's character offsets pick which 它 is meant; the evaluator scores that one (jieba words)."""
    import json

    from attnviz.analysis import load_probes

    text = "小猫看见了老鼠，它跑开了，后来它又回来了。"
    first = text.index("它")
    rows = [
        {
            "target": {"span1_index": text.index(c), "span1_text": c, "span2_index": first, "span2_text": "它"},
            "idx": 0,
            "label": label,
            "text": text,
        }
        for c, label in (("小猫", "false"), ("老鼠", "true"))
    ]
    path = tmp_path / "dev.json"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    probes = load_probes(path, format="cluewsc")
    model = tiny("llama", "eager", vocab_size=len(smol_tokenizer))
    result = attnviz.evaluate_probes(model, probes, smol_tokenizer, add_bos=True, progress=False)
    row = result.per_probe.iloc[0]
    assert (row.pronoun_start, row.gold) == (first, "老鼠") and first < text.rindex("它")
    np.testing.assert_array_equal(result.picks[0], _eager_picks(model, smol_tokenizer, probes[0], bos=True))
