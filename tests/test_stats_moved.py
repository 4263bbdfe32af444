"""Moved head statistics (``<name>_moved``): each row's shares of what a head moves,
``α_ij·‖f_h(x_j)‖ / Σ_k α_ik·‖f_h(x_k)‖`` (Kobayashi et al. 2020), averaged like the weights —
against a hand computation from the capture's own ``attention`` and ``value_norms``, in
``head_stats``, the fused pass (``summarize``), ``corpus_stats`` and ``attnviz stats``."""

from __future__ import annotations

import base64
import json
import unicodedata
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from attnviz.dashboard.ids import AID, ID

import attnviz
from attnviz.analysis import corpus_stats, head_stats, summarize
from attnviz.analysis.stats import MOVED_STATISTICS, HeadStatsSums, statistic_keys
from attnviz.cli import main
from attnviz.workflows.capture.models import IdsTokenizer
from attnviz.workflows.corpus.checkpoints import read_checkpoint, write_checkpoint
from attnviz.workflows.corpus.corpus_checkpoint import KIND

MOVED = [
    "first_moved",
    "special_moved",
    "punctuation_moved",
    "self_moved",
    "previous_moved",
    "next_moved",
    "distance_moved",
    "previous_token_moved",
    "duplicate_token_moved",
    "induction_moved",
]


def _punct(text: str) -> bool:
    text = text.strip()
    return bool(text) and all(unicodedata.category(c)[0] in "PS" for c in text)


def by_hand(caps: list[attnviz.Capture]) -> pd.DataFrame:
    """The moved columns computed from each capture's own tensors: the shares ``S = C / ΣC`` with
    ``C = cap.attention(layer) * cap.value_norms(layer)[:, None, :]``, each column's cells summed
    over its scored rows of every text, over the scored rows' count."""
    totals: dict[tuple[int, int, str], float] = {}
    counts: dict[str, int] = {}
    for cap in caps:
        n = cap.n_tokens
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        ids = torch.tensor(cap.token_ids)
        special = [p for p, (s, e) in enumerate(cap.offsets) if s == e and p != 0]
        punct = [p for p, (s, e) in enumerate(cap.offsets) if e > s and _punct(cap.text[s:e])]
        cells = {  # [q, k] bool: the keys each column counts, per row
            "first": (j == 0).expand(n, n),
            "special": torch.zeros(n, n, dtype=torch.bool).index_fill_(
                1, torch.tensor(special, dtype=torch.long), True
            ),
            "punctuation": torch.zeros(n, n, dtype=torch.bool).index_fill_(
                1, torch.tensor(punct, dtype=torch.long), True
            ),
            "self": j == i,
            "previous": j == i - 1,
            "next": j == i + 1,
            "previous_token": j == i - 1,
            "duplicate_token": (ids[:, None] == ids[None, :]) & (j < i),
            "induction": torch.cat([torch.zeros(n, 1, dtype=torch.bool), ids[:, None] == ids[None, :-1]], 1) & (j < i),
        }
        scored = {name: cell.any(-1) for name, cell in cells.items()}
        scored["first"] = scored["self"] = scored["punctuation"] = torch.ones(n, dtype=torch.bool)
        scored["special"] = torch.full((n,), bool(special))
        scored["distance"] = torch.ones(n, dtype=torch.bool)
        for name, rows in scored.items():
            counts[name] = counts.get(name, 0) + int(rows.sum())
        for layer in cap.layer_indices():
            c = cap.attention(layer).double() * cap.value_norms(layer).double()[:, None, :]
            s = c / c.sum(-1, keepdim=True)
            for name, rows in scored.items():
                if name == "distance":
                    per_row = (s * (i - j).abs()).sum(-1)
                else:
                    per_row = (s * cells[name]).sum(-1)
                for head, value in enumerate(per_row[:, rows].sum(-1).tolist()):
                    totals[(layer, head, name)] = totals.get((layer, head, name), 0.0) + value
    cap = caps[0]
    return pd.DataFrame(
        [
            {
                "layer": layer,
                "head": head,
                **{
                    f"{name}_moved": totals[(layer, head, name)] / counts[name] if counts[name] else float("nan")
                    for name in counts
                },
            }
            for layer in cap.layer_indices()
            for head in range(cap.n_heads)
        ]
    )[["layer", "head", *MOVED]]


def assert_moved_equal(table: pd.DataFrame, expected: pd.DataFrame, atol: float = 1e-6, rtol: float = 0.0) -> None:
    pd.testing.assert_frame_equal(
        table[["layer", "head"]].reset_index(drop=True), expected[["layer", "head"]].reset_index(drop=True)
    )
    ours, theirs = table[MOVED].to_numpy(), expected[MOVED].to_numpy()
    assert (pd.isna(ours) == pd.isna(theirs)).all()  # NaN exactly where a column has no scored row
    known = ~pd.isna(theirs)
    excess = abs(ours - theirs)[known] - rtol * abs(theirs[known])
    assert float(excess.max()) <= atol


def _ids_texts(count: int, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 30, (count,), generator=g).tolist()
    return [" ".join(str(t) for t in torch.randint(3, 20, (m,), generator=g).tolist()) for m in lengths]


SENTENCES = ["The cat sat on the mat, and it slept.", "Dogs bark; cats purr!", "It was tired."]


@pytest.fixture(scope="module")
def decoder_caps():
    """Two decoders — llama with GQA (4 query heads on 2 value heads) and GPT-2 (a transposed Conv1D
    projection) — each over three texts of different lengths, with repeated tokens (detectors)."""
    tok = IdsTokenizer()
    made = {}
    for family, overrides in (("llama", {"num_key_value_heads": 2}), ("gpt2", {})):
        model = attnviz.testing.tiny_model(family, **overrides)
        made[family] = model, [attnviz.capture(model, t, tok) for t in _ids_texts(3)]
    return made


@pytest.fixture(scope="module")
def bert(bert_tokenizer):
    model = attnviz.testing.tiny_model("bert", vocab_size=bert_tokenizer.vocab_size)
    return model, [attnviz.capture(model, t, bert_tokenizer) for t in SENTENCES]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_decoder_moved_columns_equal_a_hand_computation(decoder_caps, family):
    _, caps = decoder_caps[family]
    table = head_stats(caps)
    assert table.columns.tolist() == ["layer", "head", *statistic_keys()]
    assert set(MOVED) <= set(table.columns) and set(MOVED) == set(MOVED_STATISTICS)
    assert_moved_equal(table, by_hand(caps))
    # the shares really differ from the weights: a random model's values have unequal norms
    assert float((table["first_moved"] - table["first"]).abs().max()) > 1e-3
    assert (table["next_moved"] == 0).all()  # causal: nothing is moved from a later token


def test_encoder_moved_columns_equal_a_hand_computation_with_special_and_punctuation_tokens(bert):
    _, caps = bert
    table = head_stats(caps)
    expected = by_hand(caps)
    assert expected[["special_moved", "punctuation_moved", "next_moved"]].gt(0).all().all()  # [SEP], ",", "."
    assert_moved_equal(table, expected)


def test_a_layer_without_value_norms_gets_nan_by_norm_and_its_weight_columns_unchanged(decoder_caps):
    _, caps = decoder_caps["llama"]
    stripped = [
        replace(
            cap,
            records={key: replace(rec, value_dots=None) if key[1] == 1 else rec for key, rec in cap.records.items()},
        )
        for cap in caps
    ]
    table, full = head_stats(stripped), head_stats(caps)
    layer1 = table["layer"] == 1
    assert table.loc[layer1, MOVED].isna().all().all()
    pd.testing.assert_frame_equal(table[~layer1], full[~layer1])
    weights = [c for c in table.columns if c not in MOVED]
    pd.testing.assert_frame_equal(table[weights], full[weights])


def test_the_fused_pass_gives_the_same_moved_columns_also_over_chunks_of_a_long_text():
    """At 1,030 tokens the pass is cut into chunks of query rows, each causal chunk holding only
    the keys its rows see: every row's moved total is still whole."""
    model = attnviz.testing.tiny_model("llama", max_position_embeddings=1100)
    ids = torch.randint(3, 40, (1, 1030), generator=torch.Generator().manual_seed(3))
    cap = attnviz.capture(model, input_ids=ids)
    fused = summarize(cap).head_stats()
    pd.testing.assert_frame_equal(fused, head_stats(cap), rtol=1e-5, atol=1e-6)
    # the moved mean distance is ~255 tokens here, where one float32 step is 1.5e-5: relative there
    assert_moved_equal(fused, by_hand([cap]), atol=1e-6, rtol=1e-6)


def test_the_fused_pass_of_an_encoder_decoder_part(tiny):
    g = torch.Generator().manual_seed(1)
    cap = attnviz.capture(
        attnviz.testing.tiny_model("t5"),
        input_ids=torch.randint(3, 100, (1, 17), generator=g),
        decoder_input_ids=torch.randint(3, 100, (1, 11), generator=g),
    )
    for part in ("encoder", "decoder"):
        fused = summarize(cap, part=part).head_stats()
        pd.testing.assert_frame_equal(fused, head_stats(cap, part=part), rtol=1e-5, atol=1e-6)
        assert_moved_equal(fused, by_hand([cap.select(part)]))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_corpus_stats_moved_columns_equal_the_hand_computation_over_the_same_texts(decoder_caps, family):
    model, caps = decoder_caps[family]
    df = corpus_stats(model, [cap.text for cap in caps], IdsTokenizer(), batch_size=2, progress=False)
    assert not df[MOVED].drop(columns=["special_moved"]).isna().any().any()
    assert_moved_equal(df, by_hand(caps))


@pytest.mark.parametrize("family", ["gpt_oss", "bloom", "mistral", "roberta"])
def test_a_padded_chunked_batch_moves_what_its_captures_move(family):
    """Learned sinks (gpt_oss: a row's weights sum to < 1, its moved shares to 1), projection hooks
    and ALiBi (bloom), a sliding window (mistral: a chunk's keys start after 0) and an encoder
    (roberta), in one padded batch cut into chunks of rows: the moved columns equal the captures'
    hand computation, NaN in the same places."""
    from attnviz.workflows.corpus.batched import BatchReducer

    model, tok = attnviz.testing.tiny_model(family), IdsTokenizer()
    texts = [
        "5 6",
        " ".join(str(3 + i % 7) for i in range(45)),
        "9 9 9 10 9 10",
        " ".join(str(20 + i) for i in range(23)),
    ]
    sums, _ = BatchReducer(model, tok, budget=300).add(None, texts)
    assert_moved_equal(sums.frame(), by_hand([attnviz.capture(model, t, tok) for t in texts]))


def test_corpus_stats_of_an_encoder_with_a_layer_offloaded_to_disk_read_its_projection(tmp_path, bert, bert_tokenizer):
    """accelerate keeps an offloaded layer's weights on the meta device between its forwards: the
    reduction loads its output projection to read the value norms instead of giving up."""
    model, caps = bert
    folder = tmp_path / "bert"
    model.save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    on_disk = {"embeddings": "cpu", "encoder.layer.0": "cpu", "encoder.layer.1": "disk", "pooler": "cpu"}
    df = corpus_stats(str(folder), SENTENCES, device_map=on_disk, offload_folder=tmp_path / "off", progress=False)
    assert not df[MOVED].isna().any().any()
    assert_moved_equal(df, by_hand(caps))


def test_cli_stats_prints_and_writes_the_moved_columns(tmp_path, capsys, bert, bert_tokenizer):
    model, caps = bert
    folder = tmp_path / "bert"
    model.save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    assert main(["stats", str(folder), str(corpus), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in MOVED)
    assert main(["stats", str(folder), str(corpus), "--quiet", "--out", str(tmp_path / "s.csv")]) == 0
    written = pd.read_csv(tmp_path / "s.csv")
    assert_moved_equal(written, by_hand(caps))


def test_saved_sums_without_the_moved_columns_are_refused_with_what_to_do(tmp_path, decoder_caps):
    model, caps = decoder_caps["gpt2"]
    sums = HeadStatsSums.like(caps[0])
    for cap in caps:
        sums.add(cap)
    again = HeadStatsSums.from_state(sums.state())  # this attnviz's own state loads
    pd.testing.assert_frame_equal(again.frame(), sums.frame())

    # a checkpoint written before the moved columns: its keys and vector lack them
    texts = [cap.text for cap in caps]
    checkpoint = tmp_path / "run.ckpt"
    corpus_stats(model, texts, IdsTokenizer(), batch_size=1, checkpoint=checkpoint, progress=False)
    saved = read_checkpoint(checkpoint, KIND)
    state = saved["sums"]
    old_keys = [k for k in state["keys"] if not k.endswith("_moved")]
    n_layers, n_heads = len(state["layers"]), state["n_heads"]
    sums_part = state["vector"][: len(state["keys"]) * n_layers * n_heads].view(len(state["keys"]), -1)
    keep = [state["keys"].index(k) for k in old_keys]
    tail = state["vector"][len(state["keys"]) * n_layers * n_heads :]
    counts, rest = tail[: len(state["keys"])], tail[len(state["keys"]) :]
    state["keys"] = old_keys
    state["vector"] = torch.cat([sums_part[keep].flatten(), counts[keep], rest])
    write_checkpoint(checkpoint, saved)
    with pytest.raises(
        attnviz.InputError, match=r"no first_moved, special_moved, punctuation_moved… column"
    ) as refused:
        corpus_stats(model, texts, IdsTokenizer(), batch_size=1, checkpoint=checkpoint, resume=True, progress=False)
    assert "start the run again without --resume (resume=False)" in str(refused.value)


def _array(z) -> np.ndarray:
    """A figure's array as its JSON carries it: a list, or plotly's base64 ``{dtype, bdata, shape}``."""
    if isinstance(z, dict):
        shape = [int(x) for x in str(z.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return np.array(z, dtype=float)


def _post(app, inputs: dict) -> dict:
    """The head-statistics view's callback answered as the page asks for it (its inputs by id)."""
    output = next(key for key in app.callback_map if f"{AID.stats_table}.data" in key)
    callback = app.callback_map[output]
    outputs = [o.split(".") for o in output.strip(".").split("...")]
    body = {
        "output": output,
        "outputs": [{"id": i, "property": p} for i, p in outputs],
        "inputs": [
            {"id": i["id"], "property": i["property"], "value": inputs.get(i["id"])} for i in callback["inputs"]
        ],
        "state": [{"id": s["id"], "property": s["property"], "value": None} for s in callback["state"]],
        "changedPropIds": [f"{AID.stats_column}.value"],
    }
    response = app.server.test_client().post("/_dash-update-component", json=body)
    assert response.status_code == 200, response.data[:500]
    return response.get_json()["response"]


def test_the_statistics_view_shows_weight_and_norm_side_by_side_and_maps_the_one_shown(tmp_path, tiny_bert_words):
    from attnviz.dashboard import create_app
    from attnviz.dashboard.stats_view import map_column, side_by_side

    from attnviz.workflows.corpus.corpus import write_table

    model, tok = tiny_bert_words
    table = corpus_stats(model, ["The cat sat.", "It was tired, so it slept."], tok, progress=False)
    app = create_app(
        {"minilm": "MiniLM"}, default_model="minilm", stats_file=str(write_table(table, tmp_path / "s.csv"))
    )
    asked = {ID.tabs: "stats", AID.stats_source: "corpus", AID.stats_column: "first"}
    for measure, shown in (("weights", "first"), ("moved", "first_moved"), (None, "first")):
        answer = _post(app, {**asked, ID.measure: measure})
        names = [c["id"] for c in answer[AID.stats_table]["columns"]]
        assert names[:6] == ["layer", "head", "first", "first_moved", "special", "special_moved"]
        assert names.index("entropy") + 1 == names.index("previous_token")  # no moved twin
        figure = answer[AID.stats_map]["figure"]
        assert figure["layout"]["title"]["text"].startswith(f"{shown}: ")
        z = _array(figure["data"][0]["z"])
        assert z.flatten().tolist() == pytest.approx(table[shown].tolist(), abs=1e-6)  # layer-major, as the rows
    assert map_column("entropy", "moved") == "entropy" and map_column("induction", "moved") == "induction_moved"
    assert side_by_side(table).columns.tolist()[-2:] == ["texts", "tokens"]

    old = table[[c for c in table.columns if not c.endswith("_moved")]]  # a table of an attnviz before
    app = create_app({"minilm": "MiniLM"}, default_model="minilm", stats_file=str(write_table(old, tmp_path / "o.csv")))
    answer = _post(app, {**asked, ID.measure: "moved"})
    assert "no first_moved column" in json.dumps(answer[AID.stats_map]["figure"])
    assert len(answer[AID.stats_table]["data"]) == len(old)  # the table it has is still shown


@pytest.mark.browser
@pytest.mark.slow
def test_show_what_moves_maps_the_statistics_by_norm_in_the_browser(dash_duo, minilm):
    from test_dashboard import CAT, no_console_errors, open_tab, poll, run_text, start_minilm

    model, tok = minilm
    expected = head_stats(attnviz.capture(model, CAT, tok))
    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="minilm: 13 tokens")
    open_tab(dash_duo, "Head statistics")
    dash_duo.wait_for_contains_text(f"#{AID.stats_map} .gtitle", "previous_token: attends to the token just before")
    headers = [h.text for h in dash_duo.find_elements(f"#{AID.stats_table} th")]
    first = next(i for i, h in enumerate(headers) if h.strip() == "first")
    assert headers[first + 1].strip() == "first_moved", headers

    def drawn() -> list[float]:
        z = dash_duo.driver.execute_script(  # the cells as plotly drew them
            f"const gd = document.querySelector('#{AID.stats_map} .js-plotly-plot'); "
            "return gd.calcdata[0][0].z.map(row => Array.from(row));"
        )
        return [v for row in z for v in row]

    dash_duo.find_elements(f"#{ID.measure} input")[1].click()  # Show: moved
    dash_duo.wait_for_contains_text(f"#{AID.stats_map} .gtitle", "previous_token_moved: previous_token, moved")
    poll(lambda: drawn() == pytest.approx(expected["previous_token_moved"].tolist(), abs=1e-5))
    dash_duo.find_elements(f"#{ID.measure} input")[0].click()  # and back to the weights
    dash_duo.wait_for_contains_text(f"#{AID.stats_map} .gtitle", "previous_token: attends")
    poll(lambda: drawn() == pytest.approx(expected["previous_token"].tolist(), abs=1e-5))
    no_console_errors(dash_duo)


def test_head_map_names_a_by_norm_column_by_its_meaning():
    cap = attnviz.capture(attnviz.testing.tiny_model("gpt2"), input_ids=torch.arange(3, 12)[None])
    fig = attnviz.figures.head_map(attnviz.analysis.head_stats(cap), "first_moved")
    assert ", moved:" in fig.layout.title.text and "what the head moves" in fig.layout.title.text
