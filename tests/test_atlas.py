"""The head atlas: its scores against independent computations — on hand-made attention (a head that
is exactly previous-token, one positional at offset -2, one on the rarest token), and on the captured
maps of tiny random models, the repeated random sequences included — its errors, its CLI, its figure."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import attnviz
from attnviz.analysis import head_atlas
from attnviz.analysis.atlas import OFFSETS, ROLES, AtlasSums, atlas_table
from attnviz.analysis.head_tally import EXAMPLES, HeadTally
from attnviz.analysis.probe_result import ProbeResult
from attnviz.cli import main
from attnviz.errors import InputError
from attnviz.workflows.capture.models import IdsTokenizer
from attnviz.workflows.corpus.atlas import random_repeats

N = 20  # tokens of the hand-made text
IDS = [5, 6, 7, 8, 9, 10, 12, 13, 14, 15, 5, 6, 7, 8, 11, 9, 10, 12, 13, 14]  # 11 (position 14) is the rarest
RAREST = 14


def _hand_made() -> torch.Tensor:  # [1, 3, N, N]: 0.9 on one key per row, 0.1 spread over the others
    targets = [
        [max(i - 1, 0) for i in range(N)],  # head 0: exactly the previous token (row 0: itself)
        [i - 2 if i >= 2 else i + 2 for i in range(N)],  # head 1: offset -2 (rows 0, 1: +2)
        [RAREST] * N,  # head 2: the rarest token of the text
    ]
    a = torch.full((1, 3, N, N), 0.1 / (N - 1), dtype=torch.float32)
    for h, keys in enumerate(targets):
        a[0, h, torch.arange(N), torch.tensor(keys)] = 0.9
    return a


def _corpus_counts() -> torch.Tensor:
    counts = torch.zeros(32, dtype=torch.float64)
    for i in IDS:
        counts[i] += 1
    counts[torch.tensor(IDS)] += 10  # the rest of a corpus: every token of the text 10 more times but 11
    counts[11] = 1
    return counts


def _tally_of(a: torch.Tensor) -> HeadTally:
    tally = HeadTally([0], 3, _corpus_counts(), {"the text": 7})
    tally.batch(torch.tensor([IDS]), ["the text"])
    visible = torch.ones(1, N, N, dtype=torch.bool)  # an encoder: every row sees every key
    entropy = -(a * a.log()).sum(-1)
    pairs = torch.zeros(3, 0, dtype=torch.long)
    tally.take("encoder", 0, a, 0, visible, torch.zeros(1, N), pairs, torch.zeros(0, dtype=torch.long), {}, entropy)
    tally.flush()
    return tally


def _stats_of(a: torch.Tensor) -> pd.DataFrame:  # corpus_stats' columns, computed directly from the map
    m = a[0].double().numpy()
    i = np.arange(N)
    return pd.DataFrame(
        {
            "layer": 0,
            "head": range(3),
            "previous": [m[h, i[1:], i[1:] - 1].mean() for h in range(3)],
            "next": [m[h, i[:-1], i[:-1] + 1].mean() for h in range(3)],
            "first": [m[h, :, 0].mean() for h in range(3)],
            "special": float("nan"),
            "entropy": [-(m[h] * np.log(m[h])).sum(-1).mean() for h in range(3)],
            "duplicate_token": 0.0,
        }
    )


def test_the_tally_counts_where_each_rows_maximum_falls_as_numpy_does():
    a = _hand_made()
    tally = _tally_of(a)
    m = a[0].numpy()
    counts = _corpus_counts().numpy()
    top = m.argmax(-1)  # [head, row]
    offset = top - np.arange(N)[None]
    for h in range(3):
        expected = np.zeros(2 * OFFSETS + 2)
        for o in offset[h]:
            expected[o + OFFSETS if abs(o) <= OFFSETS else -1] += 1
        np.testing.assert_array_equal(tally.offsets[0, h].numpy(), expected)
    ids = np.array(IDS)
    hits = (counts[ids[top]] == counts[ids].min()).sum(-1)
    np.testing.assert_array_equal(tally.rare[0].numpy(), hits)
    assert tally.rows.tolist() == [N] and tally.log_keys.item() == pytest.approx(N * np.log(N))
    assert list(hits) == [1, 1, N]  # rows 15 and 16 of heads 0 and 1 land on the rarest; head 2 always


def test_a_row_whose_keys_tie_for_the_rarest_token_is_left_out_of_the_rare_word_role():
    """Voita's rare-word head points at *the* least frequent token: a row whose keys hold two different
    tokens of the lowest corpus count has none to point at, so it is not a rare-word row (a maximum on
    either would be a hit by chance); a token repeated at two keys is still one token."""
    a = _hand_made()  # head 2: every row's maximum on position 14 (token 11)
    counts = _corpus_counts()
    counts[13] = 1  # token 13 (positions 8 and 18) now ties with token 11 at the lowest count
    tally = HeadTally([0], 3, counts, {"the text": 7})
    tally.batch(torch.tensor([IDS]), ["the text"])
    visible = torch.ones(1, N, N, dtype=torch.bool)
    pairs = torch.zeros(3, 0, dtype=torch.long)
    entropy = -(a * a.log()).sum(-1)
    tally.take("encoder", 0, a, 0, visible, torch.zeros(1, N), pairs, torch.zeros(0, dtype=torch.long), {}, entropy)
    tally.flush()
    assert tally.rare_rows.tolist() == [0] and tally.rare[0].tolist() == [0, 0, 0]  # every row sees the tie
    # causal: rows 1-6 see only tokens of count 12 (a tie), rows 7-13 see token 13 alone at count 1, from
    # row 14 on tokens 11 and 13 tie at 1 — seven rows have one rarest token, as numpy counts them too
    causal = torch.ones(N, N, dtype=torch.bool).tril()[None]
    tally = HeadTally([0], 3, counts, {"the text": 7})
    tally.batch(torch.tensor([IDS]), ["the text"])
    tally.take("decoder", 0, a, 0, causal, torch.zeros(1, N), pairs, torch.zeros(0, dtype=torch.long), {}, entropy)
    tally.flush()
    ids, c = np.array(IDS), counts.numpy()
    single = [len(set(ids[: i + 1][c[ids[: i + 1]] == c[ids[: i + 1]].min()].tolist())) == 1 for i in range(1, N)]
    assert tally.rare_rows.item() == sum(single) == 7


def test_the_atlas_names_a_previous_token_a_positional_and_a_rare_word_head():
    a = _hand_made()
    tally = _tally_of(a)
    sums = AtlasSums(
        part="encoder",
        layers=[0],
        n_heads=3,
        offsets=tally.offsets.numpy(),
        rare=tally.rare.numpy(),
        rows=tally.rows.numpy(),
        log_keys=tally.log_keys.numpy(),
        tokens=N,
        examples={
            name: np.concatenate([tally.best[:, k, :, None].numpy(), tally.where[:, k].numpy()], -1)
            for k, name in enumerate(EXAMPLES)
        },
        offset_examples=np.concatenate([tally.offset_best[..., None].numpy(), tally.offset_where.numpy()], -1),
    )
    df = atlas_table(_stats_of(a), sums)
    prev, pos, rare = (df.iloc[h] for h in range(3))
    assert prev.previous_token == pytest.approx(0.9) and prev.positional == pytest.approx(19 / 20)
    assert prev.roles.split(", ") == ["previous_token", "positional"] and prev.positional_offset == -1
    assert pos.positional == pytest.approx(18 / 20) and pos.positional_offset == -2  # 90 %: at the threshold
    assert pos.roles == "positional"  # its previous-token mass is 0.1/19
    assert rare.rare_word == 1.0 and rare.roles == "rare_word" and rare.rare_word_position in range(N)
    assert rare.rare_word_text == 7  # the text's number in the corpus
    assert prev.previous_token_text == 7 and prev.previous_token_position == 1  # the first row where it fires
    assert pos.positional_position == 2  # the first row of offset -2
    entropy = -(a[0] * a[0].log()).sum(-1).mean(-1).double().numpy() / np.log(N)
    np.testing.assert_allclose(df.broad.to_numpy(), entropy, rtol=1e-6)
    assert not df.roles.str.contains("sink").any() and (df.sink_threshold == 0.3).all()
    assert df.sink_source.iloc[0].startswith("Gu et al. 2024")
    assert "no numeric threshold" in df.rare_word_source.iloc[0]  # Voita et al. give none: said so


def _sharpened(family: str, **overrides):
    """A tiny random model whose queries are scaled up: attention far from uniform, so each row's
    maximum is clear of float rounding."""
    model = attnviz.testing.tiny_model(family, attn_implementation="eager", **overrides)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "query.weight")):
                p.mul_(6.0)
    return model


def _texts(count: int, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 30, (count,), generator=g).tolist()
    return [" ".join(str(i) for i in torch.randint(3, 60, (n,), generator=g).tolist()) for n in lengths]


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_atlas_scores_equal_numpy_over_the_captured_maps(family):
    model, tok = _sharpened(family), IdsTokenizer()
    texts = _texts(14)
    df = head_atlas(model, texts, tokenizer=tok, batch_size=4, random_sequences=6, random_length=12, progress=False)
    causal = family == "llama"
    caps = [attnviz.capture(model, t, tok) for t in texts]
    counts = np.bincount([i for t in texts for i in map(int, t.split())], minlength=200)
    layers, heads = caps[0].layer_indices(), caps[0].n_heads
    for layer in layers:
        offsets = np.zeros((heads, 2 * OFFSETS + 2))
        rare = np.zeros(heads)
        previous, first, entropy = np.zeros(heads), np.zeros(heads), np.zeros(heads)
        rows = rare_rows = log_keys = prev_rows = tokens = 0
        for cap in caps:
            m = cap.attention(layer).double().numpy()  # [head, q, k]
            ids = np.array(cap.token_ids)
            n = len(ids)
            seen = np.arange(1, n + 1) if causal else np.full(n, n)
            lowest = np.minimum.accumulate(counts[ids]) if causal else np.full(n, counts[ids].min())
            top = m.argmax(-1)  # [head, row]
            for i in np.flatnonzero(seen >= 2):
                keys = ids[: seen[i]] if causal else ids
                single = len(set(keys[counts[keys] == lowest[i]].tolist())) == 1  # one rarest token, no tie
                rare_rows += single
                for h in range(heads):
                    o = top[h, i] - i
                    offsets[h, o + OFFSETS if abs(o) <= OFFSETS else -1] += 1
                    rare[h] += single and counts[ids[top[h, i]]] == lowest[i]
            rows += int((seen >= 2).sum())
            log_keys += np.log(seen).sum()
            previous += m[:, np.arange(1, n), np.arange(n - 1)].sum(-1)
            prev_rows += n - 1
            first += m[:, :, 0].sum(-1)
            entropy += -(m * np.log(np.clip(m, 1e-45, None))).sum((-1, -2))
            tokens += n
        got = df[df.layer == layer].sort_values("head")
        share = offsets[:, :-1] / rows
        np.testing.assert_allclose(got.positional.to_numpy(), share.max(-1), atol=1e-12)
        np.testing.assert_array_equal(got.positional_offset.to_numpy(), share.argmax(-1) - OFFSETS)
        assert 0 < rare_rows < rows  # rows with one rarest token and rows with a tie, both
        np.testing.assert_allclose(got.rare_word.to_numpy(), rare / rare_rows, atol=1e-12)
        np.testing.assert_allclose(got.previous_token.to_numpy(), previous / prev_rows, atol=1e-6)
        np.testing.assert_allclose(got.sink.to_numpy(), first / tokens, atol=1e-6)
        np.testing.assert_allclose(got.broad.to_numpy(), (entropy / tokens) / (log_keys / tokens), atol=1e-5)
    # induction: mean attention from each token of a second copy to the token after its earlier copy
    for k, (ids, _, _) in enumerate(random_repeats(tok, model.config.vocab_size, 6, 12, seed=0)):
        assert ids[:12] == ids[12:] and len(set(ids[:12])) == 12 and k < 6
    expected = np.zeros((len(layers), heads))
    for ids, _, _ in random_repeats(tok, model.config.vocab_size, 6, 12, seed=0):
        cap = attnviz.capture(model, " ".join(map(str, ids)), tok)
        for li, layer in enumerate(layers):
            m = cap.attention(layer).double().numpy()
            expected[li] += m[:, 12 + np.arange(12), np.arange(12) + 1].sum(-1)
    np.testing.assert_allclose(df.induction.to_numpy().reshape(len(layers), heads), expected / (6 * 12), atol=1e-6)
    assert df.attrs["texts"] == 14 and df.attrs["seed"] == 0


def test_the_random_sequences_are_two_copies_of_distinct_ordinary_tokens_given_by_the_seed(bert_tokenizer):
    made = random_repeats(bert_tokenizer, 500, 3, 10, seed=4)
    assert (
        made == random_repeats(bert_tokenizer, 500, 3, 10, seed=4) != random_repeats(bert_tokenizer, 500, 3, 10, seed=5)
    )
    for ids, spans, _ in made:
        assert ids[0] == bert_tokenizer.cls_token_id and ids[-1] == bert_tokenizer.sep_token_id  # as the tokenizer adds
        body = ids[1:-1]
        assert body[:10] == body[10:] and len(set(body[:10])) == 10
        assert not set(body) & set(bert_tokenizer.all_special_ids) and max(body) < 500
        assert spans[0] == spans[-1] == (0, 0)  # special tokens cover no text


def test_an_induction_score_over_the_threshold_is_met_and_names_its_random_sequence():
    a = _hand_made()
    tally = _tally_of(a)
    sums = AtlasSums(
        "encoder", [0], 3, tally.offsets.numpy(), tally.rare.numpy(), tally.rows.numpy(), tally.log_keys.numpy(), N
    )
    examples = np.array([[[0.8, 2, 17], [0.2, 0, 5], [0.51, 1, 30]]])  # [layer, head, (value, sequence, position)]
    df = atlas_table(
        _stats_of(a),
        sums,
        induction=np.array([[0.8, 0.2, 0.5]]),
        induction_examples=examples,
        describe_random=lambda k, p: f"random sequence {k}, token {p}",
    )
    assert ["induction" in roles for roles in df.roles] == [True, False, False]  # 0.5 is not more than half
    assert df.induction_example.tolist() == ["random sequence 2, token 17", "", ""]
    assert df.induction_position.tolist() == [17, -1, -1]


def test_coreference_is_met_by_the_heads_whose_accuracy_beats_chance_after_holm():
    a = _hand_made()
    tally = _tally_of(a)
    sums = AtlasSums(
        "encoder", [0], 3, tally.offsets.numpy(), tally.rare.numpy(), tally.rows.numpy(), tally.log_keys.numpy(), N
    )
    probes = 40
    picks = np.zeros((probes, 1, 3), dtype=np.int16)
    gold = np.zeros(probes, dtype=np.int16)
    picks[:, 0, 1] = 1  # head 1 always wrong, head 2 right half the time, head 0 always right
    picks[::2, 0, 2] = 1
    per_probe = [{"id": f"p{i}", "text": f"text {i}", "pronoun": "it"} for i in range(probes)]
    result = ProbeResult.from_picks(
        picks, gold, gold + 1, gold, np.full(probes, 4, dtype=np.int16), per_probe, model="hand-made"
    )
    df = atlas_table(_stats_of(a), sums, probes=result)
    met = ["coreference" in roles for roles in df.roles]
    expected = result.accuracy.sort_values("head").beats_chance.tolist()
    assert met == expected and expected[:2] == [True, False]  # always right beats 1/4, always wrong does not
    np.testing.assert_array_equal(df.coreference_p_holm.to_numpy(), result.accuracy.sort_values("head").p_holm)
    assert df.coreference.tolist() == [1.0, 0.0, 0.5]
    assert df.coreference_example.iloc[0] == "probe p0: text 0 (pronoun 'it')"


def test_bad_input_says_what_was_wrong_and_what_to_do(tmp_path):
    model, tok = attnviz.testing.tiny_model("gpt2"), IdsTokenizer()
    with pytest.raises(attnviz.InputError, match=r"the corpus has no text: give one text per line"):
        head_atlas(model, ["", "   "], tokenizer=tok, progress=False)
    with pytest.raises(attnviz.InputError, match=r"unknown role 'sinks'; choose from previous_token, next_token"):
        head_atlas(model, ["5 6 7"], tokenizer=tok, roles=["sinks"], progress=False)
    with pytest.raises(attnviz.InputError, match=r"random_length must be a whole number ≥ 2, got 1"):
        head_atlas(model, ["5 6 7"], tokenizer=tok, random_length=1, progress=False)
    with pytest.raises(attnviz.InputError, match=r"batch_size must be a whole number ≥ 1, got 0"):
        head_atlas(model, ["5 6 7"], tokenizer=tok, batch_size=0, progress=False)
    with pytest.raises(attnviz.InputError, match=r"not a head atlas table \(no roles column\)"):
        attnviz.figures.atlas_map(pd.DataFrame({"layer": [0], "head": [0]}))


def test_roles_picks_the_roles_reported():
    model, tok = attnviz.testing.tiny_model("gpt2"), IdsTokenizer()
    df = head_atlas(model, _texts(3), tokenizer=tok, roles=["sink", "broad"], random_sequences=2, progress=False)
    assert {"sink", "broad"} <= set(df.columns) and "previous_token" not in df.columns
    assert not any(c.startswith("coreference") for c in df.columns)  # coreference_p_holm came along
    assert set(r for cell in df.roles for r in cell.split(", ") if r) <= {"sink", "broad"}
    # the command line's spelling in Python too (it said "unknown role 'sink,broad'")
    same = head_atlas(model, _texts(3), tokenizer=tok, roles="sink, broad", random_sequences=2, progress=False)
    pd.testing.assert_frame_equal(same, df)
    # a role named twice is one column, counted once (it was two columns and "sink, sink")
    twice = head_atlas(model, _texts(3), tokenizer=tok, roles="sink,broad,sink", random_sequences=2, progress=False)
    pd.testing.assert_frame_equal(twice, df)


def test_coreference_asked_for_without_a_probe_set_is_refused_before_the_model_runs():
    """Asked for by name, coreference without probes would be NaN for every head after the whole pass."""
    with pytest.raises(InputError, match="coreference role reads a probe set: give probes="):
        head_atlas("no-such-model", ["a text"], roles=["sink", "coreference"], progress=False)  # before loading
    model, tok = attnviz.testing.tiny_model("gpt2"), IdsTokenizer()
    df = head_atlas(model, _texts(2), tokenizer=tok, random_sequences=2, progress=False)  # every role: NaN is fine
    assert df.coreference.isna().all() and "coreference" not in ",".join(df.roles)
    hover = attnviz.figures.atlas_map(df).data[0].customdata[0][0]
    assert "coreference: — (not scored: no probe set was given)" in hover and "nan" not in hover


def test_an_example_at_a_special_token_names_it_in_its_context():
    """[CLS] covers no text: its example read "…[]Tom thanked…" — now the token's own name in the brackets."""
    from attnviz.workflows.corpus.atlas import example_describer

    text = "Tom thanked Mike."
    offsets = [(0, 0), (0, 3), (4, 11), (12, 16), (16, 17), (0, 0)]
    encoded = [([101, 3419, 5763, 3000, 1012, 102], offsets, ["[CLS]", "tom", "thanked", "mike", ".", "[SEP]"])]
    describe = example_describer([text], encoded)
    assert describe(0, 0) == "text 0, query token 0 '[CLS]': …[[CLS]]Tom thanked Mike.…"
    assert describe(0, 1) == "text 0, query token 1 'tom': …[Tom] thanked Mike.…"  # the text's own spelling
    assert describe(0, 5) == "text 0, query token 5 '[SEP]': …Tom thanked Mike.[[SEP]]…"  # where it stands


def test_a_score_is_written_on_the_side_of_its_threshold_it_is_on():
    """0.79965 against broad's ≥ 0.8 written "0.800" read as met while the head was not counted."""
    broad, previous = ROLES["broad"], ROLES["previous_token"]  # ≥ 0.8; > 0.5
    assert broad.text(0.799645) == "0.7996" and broad.text(0.8) == "0.800" and broad.text(0.81234) == "0.812"
    assert previous.text(0.5000001) == "0.5000001" and previous.text(0.4999) == "0.500"  # > 0.5: not met either way
    assert previous.text(float("nan")) == "—"
    df = pd.DataFrame({"layer": [0], "head": [0], "roles": [""], "broad": [0.799645]})
    assert "· broad: 0.7996 (≥ 0.8)" in attnviz.figures.atlas_map(df).data[0].customdata[0][0]
    assert "<td" in (page := attnviz.figures.atlas_page(df)) and ">0.7996<" in page


def test_cli_atlas_writes_csv_and_html_and_refuses_bad_paths(tmp_path, capsys, model_folder, tiny_bert_words):
    model, tok = tiny_bert_words
    folder = model_folder("tiny-bert-words", model, tok)
    corpus = tmp_path / "c.jsonl"
    texts = ["The cat sat on the mat.", "A dog barked at the cat, twice!", "It rained."]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    out = tmp_path / "atlas.csv"
    assert main(["atlas", folder, str(corpus), "-o", str(out), "--quiet", "--seed", "3"]) == 0
    err = capsys.readouterr().err
    assert "3 texts" in err and "heads per role" in err and "cut at" not in err
    # texts cut to fit are said, as attnviz stats says them (they were cut without a word)
    assert main(["atlas", folder, str(corpus), "-o", str(tmp_path / "cut.csv"), "--quiet", "--max-length", "6"]) == 0
    assert "(2 cut at the model's limit), " in capsys.readouterr().err
    # or refused, before the pass: the atlas tokenizes the whole corpus first
    assert main(["atlas", folder, str(corpus), "--quiet", "--max-length", "6", "--no-truncate"]) == 2
    said = capsys.readouterr().err
    assert said.startswith("error: text 1 of the corpus has 9 tokens; the limit is 6. Leave truncate on") and (
        said.count("\n") == 1
    )
    written = pd.read_csv(out, keep_default_na=False)
    direct = head_atlas(model, texts, tokenizer=tok, seed=3, progress=False)
    assert written.roles.tolist() == direct.roles.tolist()
    np.testing.assert_allclose(written.sink.to_numpy(dtype=float), direct.sink.to_numpy(), atol=1e-12)
    page = tmp_path / "atlas.html"
    assert main(["atlas", folder, str(corpus), "-o", str(page), "--quiet"]) == 0
    html = page.read_text(encoding="utf-8")
    capsys.readouterr()
    assert "Head atlas" in html and "Criteria" in html and "<script src" not in html and "Gu et al. 2024" in html
    assert main(["atlas", folder, str(corpus), "-o", str(tmp_path / "atlas.txt")]) == 2
    said = capsys.readouterr().err.strip()  # one line: the flag (-o, or -o/--out), the path, what to give
    assert said.startswith("error: -o") and said.endswith(
        f"{str(tmp_path / 'atlas.txt')!r}: give a .csv, .parquet or .html path"
    )
    assert "\n" not in said
    assert main(["atlas", folder, str(corpus), "--roles", "nope", "--quiet"]) == 2
    assert "unknown role 'nope'; choose from" in capsys.readouterr().err


def test_the_figure_colours_each_head_by_its_first_role_and_writes_every_role():
    a = _hand_made()
    tally = _tally_of(a)
    sums = AtlasSums(
        "encoder", [0], 3, tally.offsets.numpy(), tally.rare.numpy(), tally.rows.numpy(), tally.log_keys.numpy(), N
    )
    df = atlas_table(_stats_of(a), sums)
    fig = attnviz.figures.atlas_map(df)
    heat = fig.data[0]
    roles = list(ROLES)
    assert list(heat.z[0]) == [roles.index("previous_token"), roles.index("positional"), roles.index("rare_word")]
    assert list(heat.text[0]) == ["prev·pos", "pos", "rare"]
    assert "✓ previous_token: 0.900 (&gt; 0.5)" in heat.customdata[0][0]
    assert "(offset -1)" in heat.customdata[0][0]


@pytest.mark.slow
def test_two_processes_give_the_one_process_atlas(tmp_path, model_folder, tiny_bert_words):
    """``torchrun --standalone --nproc_per_node 2`` starts two gloo processes on this CPU machine: each
    runs its share of the corpus, the tallies are added (and the examples' best rows kept) over both,
    and the table equals the one-process table (marked slow: two processes start and import torch)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    folder = model_folder("tiny-bert-words", *tiny_bert_words)
    corpus = tmp_path / "c.txt"
    words = "the cat sat on a mat because it was tired and the dog ran to the park".split()
    g = torch.Generator().manual_seed(0)
    lines = [
        " ".join(words[i] for i in torch.randint(0, len(words), (int(n),), generator=g).tolist()) + "."
        for n in torch.randint(3, 25, (40,), generator=g)
    ]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    frames = []
    for n, command in (
        (1, [sys.executable]),
        (2, [str(bin_dir / "torchrun"), "--standalone", "--nproc_per_node", "2"]),
    ):
        out = tmp_path / f"{n}.csv"
        done = subprocess.run(
            [*command, "-m", "attnviz", "atlas", folder, str(corpus), "-o", str(out), "--quiet"],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stderr.count("heads per role") == 1  # the main process reports
        frames.append(pd.read_csv(out, keep_default_na=False))
    one, two = frames
    numbers = [c for c in one.columns if one[c].dtype.kind == "f"]
    np.testing.assert_allclose(two[numbers].to_numpy(), one[numbers].to_numpy(), atol=1e-9)
    text = [c for c in one.columns if c not in numbers and not c.endswith("_example")]
    pd.testing.assert_frame_equal(two[text], one[text])


def test_the_page_carries_the_cjk_face_only_when_it_holds_such_text():
    a = _hand_made()
    tally = _tally_of(a)
    sums = AtlasSums(
        "encoder", [0], 3, tally.offsets.numpy(), tally.rare.numpy(), tally.rows.numpy(), tally.log_keys.numpy(), N
    )
    df = atlas_table(_stats_of(a), sums)
    assert "@font-face" not in attnviz.figures.atlas_page(df)
    example = next(c for c in df.columns if c.endswith("_example"))
    df.loc[0, example] = "我家的小猫很可爱，它很好动。"  # a corpus' example in Chinese
    page = attnviz.figures.atlas_page(df)
    assert '@font-face{font-family:"attnviz CJK"' in page and "小猫" in page


def test_a_probe_set_the_tokenizer_cannot_score_is_refused_before_the_corpus_pass(monkeypatch):
    """MiniLM reads the zh set's pronouns as [UNK] only: the atlas said so after its whole corpus pass."""
    from attnviz.workflows.corpus import atlas as atlas_workflow

    def no_pass(*args, **kwargs):
        raise AssertionError("the corpus pass ran")

    monkeypatch.setattr(atlas_workflow, "corpus_stats", no_pass)
    with pytest.raises(InputError, match=r"no probe could be scored \(\d+ left out\): zh-\d+: the tokenizer reads"):
        head_atlas("minilm", ["A short text."], probes="zh", progress=False)
    with pytest.raises(AssertionError, match="the corpus pass ran"):  # a set it can score: on to the pass
        head_atlas("minilm", ["A short text."], probes="en", progress=False)


def test_truncate_false_refuses_a_long_text_before_the_pass(monkeypatch):
    from attnviz.errors import InputTooLongError
    from attnviz.workflows.corpus import atlas as atlas_workflow

    def no_pass(*args, **kwargs):
        raise AssertionError("the corpus pass ran")

    monkeypatch.setattr(atlas_workflow, "corpus_stats", no_pass)
    model, tok = attnviz.testing.tiny_model("gpt2"), IdsTokenizer()
    texts = ["5 6 7", "5 6 7 8 9 10 11"]  # the second is over max_length 5
    with pytest.raises(InputTooLongError, match="text 2 of the corpus has 7 tokens; the limit is 5"):
        head_atlas(model, texts, tokenizer=tok, max_length=5, truncate=False, progress=False)
    with pytest.raises(AssertionError, match="the corpus pass ran"):  # cut and counted by default: on to the pass
        head_atlas(model, texts, tokenizer=tok, max_length=5, progress=False)
