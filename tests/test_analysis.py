"""Analyses checked against independent computations on hand-made attention."""

import math

import numpy as np
import pytest
import torch

import attnviz
from attnviz import evaluate_probes
from attnviz.analysis import (
    detect_heads,
    head_stats,
    load_probes,
    propose_candidates,
    rank_heads,
    rollout,
    rollout_blocks,
    rollout_rows,
)
from attnviz.analysis.stats import pattern_matrix
from attnviz.data.capture import Capture, LayerRecord
from attnviz.data.words import words_from_offsets
from attnviz.views.plots import (
    coref_bars,
    head_map,
    probe_accuracy_map,
    rollout_figure,
)


def hand_capture(token_ids, targets, text=None, layers=1, causal=True):
    """A capture whose head 0 attends (equally) to ``targets[i]`` for query i — self when empty —
    and whose head 1 attends uniformly: Q and K are made so that softmax(QKᵀ) is exactly that."""
    n = len(token_ids)
    q = torch.zeros(2, n, n)
    for i in range(n):
        for j in targets[i] or [i]:
            q[0, i, j] = 60.0  # exp(-60) ≈ 1e-26: one-hot up to float precision
    k = torch.eye(n).expand(2, n, n).clone()
    v = torch.randn(2, n, 4)
    tokens = text.split(" ") if text else [f"t{t}" for t in token_ids]
    text = " ".join(tokens)
    offsets, pos = [], 0
    for t in tokens:
        offsets.append((pos, pos + len(t)))
        pos += len(t) + 1
    part = "decoder" if causal else "encoder"
    recs = {(part, layer): LayerRecord(f"l{layer}", q, k, v, None, None, 1.0, causal) for layer in range(layers)}
    meta = {
        "name": "hand",
        "parts": {part: {"n_layers": layers, "n_heads": 2, "n_kv_heads": 2, "d_head": n}},
        "d_model": 2 * n,
    }
    return Capture(text, tokens, list(token_ids), offsets, words_from_offsets(text, offsets, tokens), recs, meta)


def test_previous_token_head_scores_one():
    n = 8
    cap = hand_capture(range(10, 10 + n), [[i - 1] if i else [] for i in range(n)])
    df = detect_heads(cap, "previous_token")
    assert df.loc[df["head"] == 0, "score"].item() == pytest.approx(1.0, abs=1e-6)
    # the uniform head puts 1/(i+1) on the previous token of query i (causal): an independent sum
    expected = np.mean([1 / (i + 1) for i in range(1, n)])
    assert df.loc[df["head"] == 1, "score"].item() == pytest.approx(expected, abs=1e-6)
    assert df.rows.iloc[0] == n - 1


def test_induction_and_duplicate_patterns():
    ids = [5, 6, 7, 5, 6, 7]
    induction = pattern_matrix(hand_capture(ids, [[]] * 6), "induction")
    expected = torch.zeros(6, 6, dtype=torch.bool)
    expected[3, 1] = expected[4, 2] = expected[5, 3] = (
        True  # after "5 6 7 5" look at 6, after "… 6" at 7, after "… 7" at 5
    )
    assert torch.equal(induction, expected)
    duplicate = pattern_matrix(hand_capture(ids, [[]] * 6), "duplicate_token")
    assert duplicate.nonzero().tolist() == [[3, 0], [4, 1], [5, 2]]
    cap = hand_capture(ids, [torch.nonzero(induction[i]).flatten().tolist() for i in range(6)])
    scores = detect_heads(cap, "induction")
    assert scores.loc[scores["head"] == 0, "score"].item() == pytest.approx(1.0, abs=1e-6)
    custom = detect_heads(cap, induction.float())
    assert custom.score.tolist() == pytest.approx(scores.score.tolist())
    with pytest.raises(attnviz.InputError, match="unknown pattern 'diagonal'"):
        detect_heads(cap, "diagonal")


def test_head_stats_match_a_direct_computation():
    n = 6
    cap = hand_capture(range(n), [[0] if i else [] for i in range(n)], text="a b c , d e")
    df = head_stats(cap)
    a = cap.attention(0)  # [head, q, k]
    for head in range(2):
        row = df[df["head"] == head].iloc[0]
        assert row["first"] == pytest.approx(a[head, :, 0].mean().item(), abs=1e-6)
        assert row["self"] == pytest.approx(np.mean([a[head, i, i].item() for i in range(n)]), abs=1e-6)
        assert row["previous"] == pytest.approx(np.mean([a[head, i, i - 1].item() for i in range(1, n)]), abs=1e-6)
        assert row["punctuation"] == pytest.approx(a[head, :, 3].mean().item(), abs=1e-6)
        dist = np.mean([sum(a[head, i, j].item() * abs(i - j) for j in range(n)) for i in range(n)])
        assert row["distance"] == pytest.approx(dist, abs=1e-5)
        ent = np.mean([-sum(p * math.log(p) for p in a[head, i].tolist() if p > 0) for i in range(n)])
        assert row["entropy"] == pytest.approx(ent, abs=1e-5)
    first_head = df[df["head"] == 0].iloc[0]
    assert first_head["first"] == pytest.approx(1.0, abs=1e-6) and first_head["next"] == 0
    assert math.isnan(first_head["special"])


def test_rank_heads_with_sink_left_out_and_renormalised():
    # tokens: 0 = sink, 1 = cat, 2 = mat, 3 = it; head 0 of "it" puts 1/2 on the sink, 1/4 on cat and mat
    text = "<s> cat mat it"
    cap = hand_capture([0, 1, 2, 3], [[], [], [], [0, 0, 1, 2]], text=text)
    q = cap.layer(0).q.clone()
    q[0, 3] = torch.tensor([60 + math.log(2), 60.0, 60.0, -60.0])  # weights ∝ 2 : 1 : 1 : 0
    cap.layer(0).q = q
    cap.offsets[0] = (0, 0)  # a special token
    raw = rank_heads(cap, "it", ["cat", "mat"], exclude_sinks=False)
    assert raw.weight("cat", 0, 0) == pytest.approx(0.25, abs=1e-5)
    ranked = rank_heads(cap, "it", ["cat", "mat"])
    assert ranked.weight("cat", 0, 0) == pytest.approx(0.5, abs=1e-5)  # 0.25 / (1 - 0.5)
    assert ranked.excluded == ["<s>"] and "leaving out '<s>' and renormalising" in str(ranked)
    assert set(ranked.table.columns) == {
        "layer",
        "head",
        "cat",
        "mat",
        "preferred",
        "margin",
        "cat from others",
        "mat from others",
    }


def test_rank_heads_tells_a_pronoun_specific_head_from_a_habit():
    """Head 0: "it" looks at "cat", every other token at itself — specific. Head 1 spreads each row
    evenly — whatever "it" gives "cat", the other tokens after "cat" give it too (independently summed)."""
    text = "the cat sat on it"
    cap = hand_capture(range(5), [[], [], [], [], [1]], text=text)
    ranked = rank_heads(cap, "it", ["cat", "the"], exclude_sinks=False)
    specific = ranked.specific("cat")
    top = specific.iloc[0]
    assert (top["layer"], top["head"]) == (0, 0)
    assert top["cat"] == pytest.approx(1.0, abs=1e-6) and top["cat from others"] == pytest.approx(0.0, abs=1e-6)
    # head 1, causal and uniform: query i gives 1/(i+1) to cat; the others after cat are "sat" (2), "on" (3)
    habit = specific[specific["head"] == 1].iloc[0]
    assert habit["cat from others"] == pytest.approx((1 / 3 + 1 / 4) / 2, abs=1e-6)
    assert habit["cat"] == pytest.approx(1 / 5, abs=1e-6) and habit["lift"] < 0
    assert "the same head gives it 0.00 from the text's other tokens" in str(ranked)
    with pytest.raises(attnviz.InputError, match="not a candidate"):
        ranked.specific("dog")


def test_rank_heads_on_a_real_model_names_the_preferred_candidate(tiny_bert_words):
    model, tok = tiny_bert_words
    cap = attnviz.capture(model, "The cat sat on the mat because it was tired.", tok)
    ranking = rank_heads(cap, "it", ["cat", "mat"])
    row = ranking.table.iloc[0]
    assert row["preferred"] == ("cat" if row["cat"] > row["mat"] else "mat")
    assert row["margin"] == pytest.approx(abs(row["cat"] - row["mat"]))
    assert list(ranking.for_candidate("mat")["mat"]) == sorted(ranking.table["mat"], reverse=True)
    assert [c.text for c in propose_candidates(cap, "it")] == ["cat", "sat", "mat"]
    with pytest.raises(attnviz.InputError, match="'dog' is not in the text"):
        rank_heads(cap, "it", ["dog"])


def test_cjk_spans_are_found_inside_words(tiny_bert_words):
    model, tok = tiny_bert_words
    cap = attnviz.capture(model, "我家的小猫很可爱，它很好动。", tok)
    ranking = rank_heads(cap, "它", ["小猫", "我家"])
    assert ranking.pronoun.text == "它" and [c.text for c in ranking.candidates] == ["小猫", "我家"]


def test_rollout_matches_a_direct_product():
    cap = hand_capture(range(5), [[i - 1] if i else [] for i in range(5)], layers=3)
    flow = rollout(cap)
    a = cap.attention(0).mean(0).numpy()
    step = 0.5 * np.eye(5) + 0.5 * a
    step = step / step.sum(-1, keepdims=True)
    np.testing.assert_allclose(flow[-1].numpy(), step @ step @ step, atol=1e-6)
    np.testing.assert_allclose(flow[-1].sum(-1).numpy(), np.ones(5), atol=1e-6)
    with pytest.raises(attnviz.InputError, match="rollout needs every layer"):
        rollout(attnviz.capture(attnviz.testing.tiny_model("gpt2"), input_ids=torch.arange(3, 8)[None], layers=[1]))


def test_shipped_probe_sets_are_well_formed():
    en, zh = load_probes("en"), load_probes("zh")
    assert len(en) >= 40 and len(zh) >= 20
    # Winograd pairs: the same candidates, the answer flips
    pairs = {}
    for p in en:
        pairs.setdefault(p.candidates, set()).add(p.gold)
    assert all(len(golds) == 2 for golds in pairs.values())
    assert all(p.pronoun in {"它", "他", "她"} for p in zh)


def test_bad_probe_files_report_every_bad_line_at_once(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = '{"text": "a b it", "pronoun": "it", "candidates": ["a", "b"], "gold": "a"}'
    bad.write_text(
        '{"text": "a", "pronoun": "it", "candidates": ["x", "y"], "gold": "z"}\n'
        f"{good}\nnot json\n"
        '{"text": "a b it", "pronoun": "it", "candidates": ["a"], "gold": "a"}\n'
        '{"text": "a b it", "pronoun": "it", "gold": "a"}\n',
        encoding="utf-8",
    )
    with pytest.raises(attnviz.InputError) as err:
        load_probes(bad, strict=True)
    message = str(err.value)
    assert message.startswith(
        "attnviz bad.jsonl: 1 probe from 5 lines; 4 unusable (1× gold not a candidate, 1× not JSON, "
        "1× fewer than 2 candidates, 1× missing field) — see .problems. Nothing was scored: strict=True refuses "
        "any unusable probe — line 1 (bad-1): "
    )
    assert "gold 'z' is not one of the candidates ['x', 'y']" in message and "line 3: not JSON" in message
    assert (
        "line 4 (bad-4): needs at least 2 candidates" in message
        and "line 5 (bad-5): a probe needs candidates" in message
    )
    # without strict: the usable probe is kept, every other one is reported (and warned of), none silently
    with pytest.warns(UserWarning, match=r"1 probe from 5 lines; 4 unusable"):
        probes = load_probes(bad)
    assert [p.text for p in probes] == ["a b it"] and probes.problems["row"].tolist() == [1, 3, 4, 5]
    bad.write_text(good + "\n", encoding="utf-8")
    assert len(load_probes(bad)) == 1


def test_probes_given_as_objects_are_checked_too(tiny_bert_words):
    from attnviz.analysis import Probe

    model, tok = tiny_bert_words
    with pytest.raises(attnviz.InputError, match=r"probe 'The cat\.': gold 'dog' is not one of the candidates"):
        Probe("The cat.", "it", ("cat", "mat"), "dog")
    with pytest.raises(attnviz.ArgumentTypeError, match="probes must be a probe set's name .* got 42"):
        evaluate_probes(model, 42, tok)
    with pytest.raises(
        attnviz.InputError, match=r"1 bad probe\(s\), nothing was scored — probes\[1\]: a probe needs gold"
    ):
        evaluate_probes(
            model,
            [
                {"text": "a b it", "pronoun": "it", "candidates": ["a", "b"], "gold": "a"},
                {"text": "a b it", "pronoun": "it", "candidates": ["a", "b"]},
            ],
            tok,
        )


def test_a_candidate_after_the_pronoun_in_a_decoder_is_refused():
    cap = hand_capture(range(10, 16), [[]] * 6, text="the cat saw it a dog")
    with pytest.raises(attnviz.InputError, match="'dog' comes after 'it': in a causal decoder the pronoun cannot"):
        rank_heads(cap, "it", ["cat", "dog"])
    encoder = hand_capture(range(10, 16), [[]] * 6, text="the cat saw it a dog", causal=False)
    assert rank_heads(encoder, "it", ["cat", "dog"]).table.shape[0] == 2


def test_evaluate_probes_counts_correct_heads(tiny_bert_words, tmp_path):
    model, tok = tiny_bert_words
    probes = tmp_path / "p.jsonl"
    probes.write_text(
        '{"text": "The cat sat on the mat because it was tired.", "pronoun": "it", "candidates": ["cat", "mat"], "gold": "cat"}\n'
        '{"text": "The dog saw the bird because it was loud.", "pronoun": "it", "candidates": ["dog", "bird"], "gold": "bird"}\n',
        encoding="utf-8",
    )
    result = evaluate_probes(model, str(probes), tok, progress=False)
    manual = {}
    for text, gold, cands in (
        ("The cat sat on the mat because it was tired.", "cat", ["cat", "mat"]),
        ("The dog saw the bird because it was loud.", "bird", ["dog", "bird"]),
    ):
        r = rank_heads(attnviz.capture(model, text, tok), "it", cands)
        for row in r.table.itertuples(index=False):
            manual[(row.layer, row.head)] = manual.get((row.layer, row.head), 0) + (row.preferred == gold)
    for row in result.accuracy.itertuples(index=False):
        assert row.correct == manual[(row.layer, row.head)] and row.accuracy == row.correct / 2
    assert result.baselines == {"nearest": 0.5, "first": 0.5}
    assert "2 probes on" in str(result)
    fig = probe_accuracy_map(result)
    np.testing.assert_allclose(np.array(fig.data[0].z, dtype=float), result.accuracy_map().numpy())


def test_analysis_figures_hold_the_numbers(tiny_bert_words):
    model, tok = tiny_bert_words
    cap = attnviz.capture(model, "The cat sat on the mat because it was tired.", tok)
    stats = head_stats(cap)
    fig = head_map(stats, "previous")
    assert np.array(fig.data[0].z)[1, 2] == pytest.approx(
        stats[(stats.layer == 1) & (stats["head"] == 2)].previous.item()
    )
    ranking = rank_heads(cap, "it", ["cat", "mat"])
    bars = coref_bars(ranking, top=3)
    assert [t.name for t in bars.data] == ["cat", "cat, from the other tokens", "mat", "mat, from the other tokens"]
    assert list(bars.data[1].y) == pytest.approx(ranking.table["cat from others"].head(3).round(4).tolist())
    assert list(bars.data[0].y) == pytest.approx(ranking.table.cat.head(3).round(4).tolist())
    flow = rollout(cap)
    np.testing.assert_allclose(np.array(rollout_figure(cap, flow).data[0].z, dtype=float), flow[-1].numpy(), atol=1e-5)
    assert "not an attribution" in rollout_figure(cap, flow, query=8).layout.title.text


@pytest.mark.slow
def test_real_models_coreference_and_probes(smollm2):
    model, tok = smollm2
    cap = attnviz.capture(model, "我家的小猫很可爱，它很好动。", tok, add_bos=True)
    ranking = rank_heads(cap, "它", ["小猫", "我家"])
    assert ranking.excluded == ["<|im_start|>"]
    assert ranking.weight("小猫", 15, 3) > 0.5 and ranking.for_candidate("小猫").iloc[0]["小猫"] > 0.55
    result = evaluate_probes(model, "zh", tok, progress=False)
    assert len(result.per_probe) == 25 and result.accuracy.accuracy.between(0, 1).all()
    assert result.baselines["nearest"] == pytest.approx(17 / 25)


def test_rollout_figure_at_length_thins_labels_and_keeps_the_sink_off_the_colour_scale():
    model = attnviz.testing.tiny_model("llama", max_position_embeddings=512)
    cap = attnviz.capture(model, input_ids=torch.randint(3, 120, (1, 300), generator=torch.Generator().manual_seed(1)))
    flow = rollout(cap)
    fig = rollout_figure(cap, flow)
    heat = fig.data[0]
    assert len(fig.layout.xaxis.tickvals) <= 60 and len(heat.x) == 300 and heat.x[7].startswith("7:")
    last = flow[-1]
    outside = last[:, 1:].flatten()
    assert heat.zmax == pytest.approx(float(torch.quantile(outside, 0.99)), rel=1e-5)
    assert heat.zmax < float(last[:, 0].max())  # the sink column is off the scale, not the scale itself
    assert "99th percentile" in fig.layout.title.text and f"('{cap.token_labels[0]}')" in fig.layout.title.text
    bars = rollout_figure(cap, flow, query=299)
    assert len(bars.layout.xaxis.tickvals) <= 60 and list(bars.data[0].y) == pytest.approx(last[299].numpy(), abs=1e-5)


def test_rollout_figure_of_a_long_text_is_pooled_to_at_most_512_cells():
    from attnviz.views.plots import rollout_figure

    model = attnviz.testing.tiny_model("llama", max_position_embeddings=1200)
    cap = attnviz.capture(model, input_ids=torch.randint(3, 100, (1, 1100)), check="off")
    flow = rollout(cap)
    fig = rollout_figure(cap, flow)
    z = fig.data[0].z
    assert len(z) == 367 and len(z[0]) == 367  # blocks of 3 tokens
    assert z[0][0] == pytest.approx(float(flow[-1, :3, :3].mean()), abs=1e-5)
    assert "block of 3×3 tokens" in fig.layout.title.text
    assert len(fig.to_json()) < 2_000_000
    # the same heatmap from the block means alone (what the dashboard computes past 512 tokens)
    from_blocks = rollout_figure(cap, rollout_blocks(cap, 3)).data[0]
    torch.testing.assert_close(torch.tensor(from_blocks.z), torch.tensor(fig.data[0].z), atol=2e-5, rtol=0)
    assert from_blocks.zmax == pytest.approx(fig.data[0].zmax, rel=1e-4) and from_blocks.x == fig.data[0].x


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_rollout_rows_and_blocks_equal_the_full_rollout(family):
    """Right to left through the layers (layers·m·n²): rows, row mixes and block means of the final
    layer's rollout equal what the n×n products give — a last block shorter than the others included."""
    model = attnviz.testing.tiny_model(family)
    cap = attnviz.capture(model, input_ids=torch.randint(3, 90, (1, 37), generator=torch.Generator().manual_seed(2)))
    last = rollout(cap)[-1]
    torch.testing.assert_close(rollout_rows(cap, [0, 17, 36]), last[[0, 17, 36]], atol=1e-6, rtol=1e-5)
    mix = torch.rand(4, 37, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(rollout_rows(cap, mix), mix @ last, atol=1e-6, rtol=1e-5)
    expected = torch.nn.functional.avg_pool2d(last[None], 8, ceil_mode=True)[0]  # 5 blocks, the last of 5 tokens
    torch.testing.assert_close(rollout_blocks(cap, 8), expected, atol=1e-6, rtol=1e-5)
    assert rollout_blocks(cap, 8)[-1, -1] == pytest.approx(float(last[32:, 32:].mean()), abs=1e-6)
    torch.testing.assert_close(
        rollout_rows(cap, [5], head_fusion="max"), rollout(cap, head_fusion="max")[-1, [5]], atol=1e-6, rtol=1e-5
    )
    with pytest.raises(attnviz.InputError, match="rows must lie in 0..36"):
        rollout_rows(cap, [37])
    with pytest.raises(attnviz.InputError, match="block must be a whole number"):
        rollout_blocks(cap, 0)


def _head_stats_from_full_maps(cap: Capture) -> dict[str, torch.Tensor]:
    """The head_stats columns ([layer, head]) computed directly from every head's whole n×n map."""
    from attnviz.analysis.stats import text_positions

    n = cap.n_tokens
    special, punct = text_positions(cap.text, cap.offsets)
    pos = torch.arange(n, dtype=torch.float64)
    dist = (pos[:, None] - pos[None, :]).abs()
    out: dict[str, list] = {}
    for layer in cap.layer_indices():
        a = cap.attention(layer).double()  # [head, q, k]
        values = {
            "first": a[:, :, 0].mean(-1),
            "special": a[:, :, special].sum(-1).mean(-1)
            if special
            else torch.full((a.shape[0],), math.nan, dtype=torch.float64),
            "punctuation": a[:, :, punct].sum(-1).mean(-1),
            "self": a.diagonal(dim1=-2, dim2=-1).mean(-1),
            "previous": a.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1),
            "next": a.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1),
            "distance": (a * dist).sum(-1).mean(-1),
            "entropy": -torch.special.xlogy(a, a).sum(-1).mean(-1),
        }
        for name in ("previous_token", "duplicate_token", "induction"):
            mask = pattern_matrix(cap, name).double()
            scored = mask.sum(-1) > 0
            values[name] = (a * mask).sum(-1)[:, scored].sum(-1) / max(int(scored.sum()), 1)
        for name, v in values.items():
            out.setdefault(name, []).append(v)
    return {name: torch.stack(v) for name, v in out.items()}


@pytest.mark.parametrize("family", ["bert", "llama", "mistral"])
def test_head_stats_over_chunks_of_rows_equal_the_full_maps(family, monkeypatch, bert_tokenizer, smol_tokenizer):
    """head_stats reduces a few query rows at a time (and, under a causal or window mask, only the keys
    those rows may see): forced into chunks of 3 rows, it still equals the sums over the whole maps —
    an encoder with [CLS]/[SEP], a causal decoder, a sliding window of 4."""
    from attnviz.data import records

    tok = bert_tokenizer if family == "bert" else smol_tokenizer
    model = attnviz.testing.tiny_model(family, attn_implementation="eager", vocab_size=len(tok))
    text = "The cat sat on the mat, because the cat, it said, was tired. The cat sat on the mat."
    cap = attnviz.capture(model, text, tok)
    chunked = records.attention_output

    def three_rows(q, k, v, **kwargs):
        return chunked(q, k, v, **{**kwargs, "budget": 3 * q.shape[0] * k.shape[-2]})

    monkeypatch.setattr(records, "attention_output", three_rows)
    df = head_stats(cap)
    expected = _head_stats_from_full_maps(cap)
    for name, values in expected.items():
        got = torch.tensor(df.pivot(index="layer", columns="head", values=name).to_numpy())
        torch.testing.assert_close(
            got, values, atol=1e-6, rtol=1e-6, equal_nan=True, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_rollout_figure_in_words_merges_as_the_other_views_do(minilm):
    """The reviewer's *Units: words* left Rollout in byte pieces; in words a word's flow to a word is summed
    over its pieces and from a word averaged over its pieces (rows still sum to 1), the query a word."""
    model, tok = minilm
    cap = attnviz.capture(model, "Unbelievably, the hippopotamus slept.", tok)
    words = cap.words
    assert any(w.token_stop - w.token_start > 1 for w in words)  # a word of several pieces
    last = rollout(cap)[-1].double()
    mine = torch.zeros(len(words), len(words), dtype=torch.float64)  # by hand, word by word
    for i, wq in enumerate(words):
        for j, wk in enumerate(words):
            mine[i, j] = last[wq.token_start : wq.token_stop, wk.token_start : wk.token_stop].sum(1).mean()
    fig = rollout_figure(cap, rollout(cap), words=True)
    heat = fig.data[0]
    assert len(heat.x) == len(words) and heat.x[1] == f"1:{cap.word_labels[1]}"
    np.testing.assert_allclose(np.array(heat.z, dtype=float), mine.numpy(), atol=1e-5)
    np.testing.assert_allclose(mine.sum(1).numpy(), 1.0, atol=1e-6)
    hippo = next(i for i, w in enumerate(words) if w.text == "hippopotamus")
    bars = rollout_figure(cap, rollout(cap), query=hippo, words=True)
    np.testing.assert_allclose(np.array(bars.data[0].y, dtype=float), mine[hippo].numpy(), atol=1e-5)
    assert "'hippopotamus'" in bars.layout.title.text
    # the word's own row given alone (what the page computes for a long text) draws the same bars
    pieces = last[words[hippo].token_start : words[hippo].token_stop].mean(0).float()
    alone = rollout_figure(cap, pieces, query=hippo, words=True)
    np.testing.assert_allclose(np.array(alone.data[0].y, dtype=float), mine[hippo].numpy(), atol=1e-5)


def test_rollout_figure_keeps_three_digits_of_tiny_flows():
    """On a 30-layer decoder the cells outside the sink are ~1e-5: rounded to 5 decimals they were 0 or 1e-5
    (the map drew that rounding) and the title said the scale ended at 0.000."""
    cap = attnviz.capture(attnviz.testing.tiny_model("llama"), input_ids=torch.arange(3, 23)[None])
    flow = rollout(cap)[-1]
    tiny = flow * 1e-4
    tiny[:, 0] += 1 - tiny.sum(1)  # nearly all of the flow on the sink, as there
    fig = rollout_figure(cap, tiny)
    z = np.array(fig.data[0].z, dtype=float)
    outside = tiny[:, 1:].numpy()
    np.testing.assert_allclose(z[:, 1:], outside, rtol=2e-3, atol=1e-12)
    assert f"{fig.data[0].zmax:.3g}" in fig.layout.title.text and "0.000;" not in fig.layout.title.text


def test_a_candidate_on_the_sink_is_said_with_the_way_out_in_both_spellings():
    """The library's add_bos=True and the command line's --add-bos, in the note the CLI prints too."""
    cap = hand_capture(range(5), [[], [], [], [], [1]], text="the cat sat on it")
    ranked = rank_heads(cap, "it", ["the", "cat"])
    assert "'the' holds the sink token" in str(ranked)
    assert "prepend a BOS (add_bos=True, --add-bos on the command line)" in str(ranked)
