"""The Coreference view's probe sets (issue 21): a researcher's own probe file uploaded to the server,
the result's summary and interval bars, the per-probe table of what the top heads picked (a page at a
time, ≤ 2 MB whatever the set's size), and the drill-down from a probe into the AttentionLab (its text
captured as the page's text, its pronoun the query, the chosen head selected).

The callbacks are driven as the page drives them (the server's test client, ``_post``) on a small app
that holds only the Coreference view; one browser test runs the whole path on the embedded MiniLM."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pandas as pd
import pytest
from attnviz.dashboard import coref_view, probe_view
from attnviz.dashboard.app import background_manager
from attnviz.dashboard.captures import Captures
from attnviz.dashboard.ids import AID, ID
from attnviz.dashboard.probe_runs import ProbeRuns
from attnviz.dashboard.probe_table import (
    PAGE,
    TEXT_CHARS,
    chosen_head,
    lab_text,
    page_count,
    pronoun_token,
    shown_rows,
    skipped_lines,
    table_columns,
    table_page,
    text_cell,
)
from dash import Dash, html
from dash._utils import to_json
from test_dashboard_server import _post

import attnviz
from attnviz import figures
from attnviz.analysis import ProbeResult

MB2 = 2_000_000
PROBES = [  # 'it' twice in the last one: its offset says which one is meant
    {"id": "p1", "text": "The trophy did not fit in the suitcase because it was big.", "pronoun": "it",
     "candidates": ["trophy", "suitcase"], "gold": "trophy"},
    {"id": "p2", "text": "The trophy did not fit in the suitcase because it was small.", "pronoun": "it",
     "candidates": ["trophy", "suitcase"], "gold": "suitcase"},
    {"id": "p3", "text": "Anna thanked Maria because she had helped her.", "pronoun": "she",
     "candidates": ["Anna", "Maria"], "gold": "Maria"},
    {"id": "p4", "text": "The cat chased the dog until it was tired, and it slept.", "pronoun": "it",
     "candidates": ["cat", "dog"], "gold": "cat", "pronoun_start": 29},
]  # fmt: skip


# ---------------------------------------------------------------- a result built by hand
def hand_result(n: int, *, n_layers: int = 3, n_heads: int = 4, seed: int = 0) -> ProbeResult:
    """A result of ``n`` probes with random picks (2 or 3 candidates each), its accuracy counted here."""
    rng = np.random.default_rng(seed)
    n_candidates = rng.integers(2, 4, size=n)
    picks = (rng.random((n, n_layers, n_heads)) * n_candidates[:, None, None]).astype(np.int16)
    picks[:, 0, 0] = -1  # one head whose layer was not captured
    gold = (rng.random(n) * n_candidates).astype(np.int16)
    rows, accuracy = [], []
    for i in range(n):
        words = [f"w{i}x{c}" for c in range(int(n_candidates[i]))]
        text = f"Probe {i}: " + " and ".join(words) + " met, then it left." + " filler" * (i % 3) * 80
        at = text.index(" it ") + 1
        rows.append(
            {
                "id": f"p{i}",
                "text": text,
                "pronoun": "it",
                "gold": words[gold[i]],
                "candidates": words,
                "best_head": f"L{i % n_layers}·H{i % n_heads}",
                "best_head_pick": words[i % len(words)],
                "pronoun_start": at,
                "pronoun_end": at + 2,
            }
        )
    for layer in range(n_layers):
        for head in range(n_heads):
            scored = picks[:, layer, head] >= 0
            if scored.any():
                hits = int((picks[scored, layer, head] == gold[scored]).sum())
                accuracy.append(
                    {"layer": layer, "head": head, "accuracy": hits / scored.sum(), "correct": hits, "n": scored.sum()}
                )
    return ProbeResult(
        pd.DataFrame(accuracy),
        pd.DataFrame(rows),
        {"nearest": 0.5, "first": 0.5},
        "hand",
        "",
        n_layers,
        n_heads,
        [],
        picks,
        gold,
        np.zeros(n, dtype=np.int16),
        np.zeros(n, dtype=np.int16),
        n_candidates.astype(np.int16),
    )


def best_heads(result: ProbeResult, top: int) -> list[tuple[int, int]]:
    """The top heads, sorted here: accuracy down, then layer, then head."""
    rows = sorted(result.accuracy.itertuples(), key=lambda r: (-r.accuracy, r.layer, r.head))
    return [(int(r.layer), int(r.head)) for r in rows[:top]]


def test_a_page_of_the_table_shows_each_top_heads_pick_marked_right_or_wrong():
    result = hand_result(45)
    heads = best_heads(result, 5)
    columns = table_columns(result)
    assert [c["id"] for c in columns] == ["probe", "text", "pronoun", "gold", "h0", "h1", "h2", "h3", "h4", "best_head"]
    layer, head = heads[0]
    accuracy = result.accuracy.set_index(["layer", "head"]).loc[(layer, head), "accuracy"]
    assert columns[4]["name"] == f"L{layer}·H{head} ({accuracy:.0%})"
    assert len(table_page(result, 0)) == PAGE and len(table_page(result, 2)) == 45 - 2 * PAGE
    assert table_page(result, 99) == table_page(result, 2)  # past the end: the last page
    for row in table_page(result, 1):
        i = row["id"]
        probe = result.per_probe.iloc[i]
        assert row["probe"] == probe["id"] and row["gold"] == probe["gold"] and row["pronoun"] == "it"
        shown, at = unmarked(row["text"])
        assert probe["text"].startswith(shown.rstrip("…")) and at == probe["pronoun_start"]
        assert len(shown.rstrip("…")) == min(TEXT_CHARS, len(probe["text"]))
        mark = "✓" if probe["best_head_pick"] == probe["gold"] else "✗"
        assert row["best_head"] == f"{probe['best_head']}: {mark} {probe['best_head_pick']}"
        for rank, (layer, head) in enumerate(heads):
            picked = probe["candidates"][result.picks[i, layer, head]]
            assert row[f"h{rank}"] == ("✓ " if picked == probe["gold"] else "✗ ") + picked, (i, rank)


def unmarked(cell: str) -> tuple[str, int]:
    """A table cell's text without its markdown, and where its bold part starts in it."""
    at = cell.index("**")
    plain = re.sub(r"\\(.)", r"\1", cell[:at]) + re.sub(r"\\(.)", r"\1", cell[at:].replace("**", ""))
    return plain, len(re.sub(r"\\(.)", r"\1", cell[:at]))


def test_the_text_cell_bolds_the_scored_pronoun_and_keeps_the_characters_around_it():
    text = "The cat (a *big* one) chased the dog until it was tired, and it slept."
    first = text.index(" it ") + 1
    cell = text_cell(text, first, first + 2)
    assert unmarked(cell) == (text, first) and cell.count("**") == 2  # the first 'it', all of the text
    long = "Before. " * 60 + "Anna met Maria, and she smiled. " + "After. " * 60
    start = long.index("she")
    shown, at = unmarked(text_cell(long, start, start + 3))
    assert shown.startswith("…") and shown.endswith("…") and len(shown) == TEXT_CHARS + 2
    assert long[start - at + 1 : start - at + 1 + TEXT_CHARS] == shown[1:-1]  # the window, as in the text
    assert shown[at : at + 3] == "she" and abs(at - TEXT_CHARS // 2) <= 1
    assert text_cell("A\r\nB", None, None) == "A B"


def test_the_table_can_list_only_the_probes_the_best_head_gets_wrong_or_right():
    result = hand_result(90)
    (layer, head), n = best_heads(result, 1)[0], len(result.per_probe)
    wrong = [i for i in range(n) if result.picks[i, layer, head] != result.gold[i]]
    assert list(shown_rows(result, "wrong")) == wrong and list(shown_rows(result, "all")) == list(range(n))
    assert sorted([*shown_rows(result, "right"), *wrong]) == list(range(n))
    pages = [table_page(result, p, rows=shown_rows(result, "wrong")) for p in range(page_count(result, wrong))]
    listed = [row for page in pages for row in page]
    assert [row["id"] for row in listed] == wrong  # each row keeps its probe's row in the result
    assert all(row["h0"].startswith("✗ ") for row in listed) and len(pages) == -(-len(wrong) // PAGE)


def test_a_click_chooses_that_columns_head_the_probes_own_or_the_sets_best():
    result = hand_result(30)
    heads = best_heads(result, 5)
    assert chosen_head(result, 7, "h2") == heads[2]
    assert chosen_head(result, 7, "best_head") == (7 % 3, 7 % 4)  # the probe's own best head, 'L1·H3'
    assert chosen_head(result, 7, "text") == chosen_head(result, 7, None) == heads[0]


def test_the_probes_the_evaluator_skipped_are_listed_with_their_reasons():
    result = hand_result(3)
    result.skipped = [f"q{i}: the pronoun 'it' falls outside the model's {i} tokens" for i in range(7)]
    assert skipped_lines(result) == result.skipped
    assert skipped_lines(result, at_most=5) == [*result.skipped[:5], "… and 2 more"]


def test_the_pronoun_token_is_the_one_at_the_evaluators_offsets(tiny_bert_words):
    model, tok = tiny_bert_words
    text = "The cat chased the dog until it was tired, and it slept."
    first = text.index(" it ") + 1  # the first 'it', not the last
    cap = attnviz.capture(model, text, tok)
    token = pronoun_token(cap, first, first + 2)
    lo, hi = cap.offsets[token]
    assert (lo, hi) == (first, first + 2) and text[lo:hi] == "it"
    assert pronoun_token(cap, text.rindex("it"), text.rindex("it") + 2) > token
    with pytest.raises(attnviz.InputError, match="no token of this capture covers characters 500–502"):
        pronoun_token(cap, 500, 502)
    # a textarea turns \r\n into \n: the range moves with it and still holds the pronoun
    windows = "First line.\r\nThe cat slept because it was tired."
    start = windows.index("it was")
    plain, s, e = lab_text(windows, start, start + 2)
    assert "\r" not in plain and plain[s:e] == "it" and s == start - 1


# ---------------------------------------------------------------- the callbacks, as the page calls them
def probe_app(models: dict, folder) -> Dash:
    """An app with the Coreference view only, its server folder ``folder`` (the tests read it too)."""
    app = Dash(__name__, suppress_callback_exceptions=True, background_callback_manager=background_manager())
    captures = Captures(models, folder=folder)
    app.layout = html.Div(coref_view.layout())  # its probes slot holds probe_view's panel
    coref_view.register(app, captures)
    probe_view.register(app, captures)
    app.captures = captures  # the tests' way in: what the server holds
    return app


def callback(app: Dash, output: str) -> str:
    return next(key for key in app.callback_map if key.startswith(f"..{output}"))


def upload(app: Dash, name: str, content: bytes, fmt: str = "auto") -> dict:
    contents = "data:application/octet-stream;base64," + base64.b64encode(content).decode()
    return _post(
        app,
        callback(app, f"{AID.probe_source}.data"),
        {AID.probe_upload: contents, AID.probe_format: fmt},
        {AID.probe_upload: name},
        changed=[f"{AID.probe_upload}.contents"],
    )


def jsonl(probes: list[dict]) -> bytes:
    return "\n".join(json.dumps(p) for p in probes).encode()


def test_an_uploaded_file_stays_on_the_server_and_is_read_at_once(tmp_path):
    app = probe_app({"minilm": "MiniLM"}, tmp_path)
    content = jsonl(PROBES)
    response = upload(app, "mine.jsonl", content)
    source = response[AID.probe_source]["data"]
    assert set(source) == {"file", "name"} and source["name"] == "mine.jsonl"
    assert response[AID.probe_upload]["contents"] is None  # the page lets go of the file
    assert content.decode() not in json.dumps(response)  # and nothing of it comes back
    assert ProbeRuns(tmp_path / "probes").upload_path(source["file"]).read_bytes() == content
    assert response[AID.probe_set]["value"] == "upload"
    assert response[AID.probe_set]["options"][-1]["label"] == "uploaded: mine.jsonl (4 probes)"
    assert "mine.jsonl: " in json.dumps(response[AID.probe_loaded]["children"])

    # a line that is no probe: the others are kept, and the table says which line and why
    bad = upload(app, "mine.jsonl", content + b"\n{not json")
    loaded = json.dumps(bad[AID.probe_loaded]["children"], ensure_ascii=False)
    assert "attnviz mine.jsonl: 4 probes from 5 lines; 1 unusable (1× not JSON)" in loaded, loaded
    [problem] = bad[AID.probe_problems]["data"]
    assert problem["row"] == 5 and problem["kind"] == "not JSON", problem
    assert bad[AID.probe_problems_box]["style"]["display"] == "block"
    # a file with no usable probe: a message, and the list keeps the last good choice
    none = upload(
        app, "none.jsonl", b'{"text": "No pronoun here.", "pronoun": "it", "candidates": ["a", "b"], "gold": "a"}'
    )
    message = json.dumps(none[AID.probe_loaded]["children"])
    assert "none.jsonl: 0 probes" in message and "no probe is usable" in message, message
    assert "value" not in none[AID.probe_set]
    # columns no format knows: the message names the file, never the server's folder
    odd = upload(app, "odd columns.csv", b"a,b\n1,2\n")
    message = json.dumps(odd[AID.probe_loaded]["children"])
    assert "odd_columns.csv" in message and str(tmp_path) not in message, message
    named = json.dumps(upload(app, "odd columns.csv", b"a,b\n1,2\n", fmt="cluewsc")[AID.probe_loaded])
    assert "odd_columns.csv is not in the cluewsc format" in named, named

    wrong = upload(app, "mine.docx", content)
    assert "a probe file ends in .jsonl, .json, .csv, .tsv, .parquet" in json.dumps(wrong[AID.probe_loaded]["children"])
    with pytest.raises(attnviz.AttnvizError, match="no longer on the server"):
        ProbeRuns(tmp_path / "probes").upload_path("../../etc/passwd")


GAP = (  # GAP's own TSV layout (unquoted), two rows: 'her' is Maria in the first, Anna in the second
    "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL\n"
    "dev-1\tAnna thanked Maria because her help came in time.\ther\t27\tAnna\t0\tFALSE\tMaria\t13\tTRUE\thttp://x\n"
    "dev-2\tAnna called Maria because her car broke down.\ther\t26\tAnna\t0\tTRUE\tMaria\t12\tFALSE\thttp://x\n"
)


def test_a_new_format_reads_the_uploaded_file_again(tmp_path):
    app = probe_app({"minilm": "MiniLM"}, tmp_path)
    first = upload(app, "dev.tsv", GAP.encode())
    source = first[AID.probe_source]["data"]
    assert "GAP dev.tsv: 2 probes from 2 rows" in json.dumps(first[AID.probe_loaded]["children"])
    reread = callback(app, f"{AID.probe_source}.data")
    changed = [f"{AID.probe_format}.value"]
    wrong = _post(app, reread, {AID.probe_format: "cluewsc"}, {AID.probe_source: source}, changed=changed)
    assert "dev.tsv is not in the cluewsc format" in json.dumps(wrong[AID.probe_loaded]["children"])
    assert wrong[AID.probe_source]["data"] == source  # the same file, kept for another try
    right = _post(app, reread, {AID.probe_format: "gap"}, {AID.probe_source: source}, changed=changed)
    assert "GAP dev.tsv: 2 probes" in json.dumps(right[AID.probe_loaded]["children"])
    assert right[AID.probe_set]["value"] == "upload"
    assert _post(app, reread, {AID.probe_format: "gap"}, {}, changed=changed) == {}  # no upload yet: nothing to read


def test_the_table_of_three_thousand_probes_comes_a_page_at_a_time_under_2_mb(tmp_path):
    app = probe_app({"minilm": "MiniLM"}, tmp_path)
    result = hand_result(3000, n_layers=30, n_heads=9)
    key = ProbeRuns(tmp_path / "probes").keep(result)  # what the job leaves
    kept = {"key": key, "model": "minilm", "part": None, "n": 3000}
    table = callback(app, f"{AID.probe_table}.data")
    client_bytes = []
    for page in (0, 77, 149):
        response = _post(
            app, table, {AID.probe_result: kept, AID.probe_table: page}, {}, changed=[f"{AID.probe_table}.page_current"]
        )
        client_bytes.append(len(json.dumps(response)))
        assert response[AID.probe_table]["page_count"] == 150
        assert response[AID.probe_table]["data"] == table_page(result, page)
    assert max(client_bytes) < 100_000 < MB2, client_bytes  # ~20 rows of at most 240 characters of text
    first = _post(app, table, {AID.probe_result: kept, AID.probe_table: 77}, {})  # a new result: its first page
    assert first[AID.probe_table]["page_current"] == 0 and first[AID.probe_table]["data"][0]["id"] == 0
    # what the job sends the page for such a set: the summary and two figures of heads, not of probes
    full = ProbeResult.from_picks(
        result.picks, result.gold, result.nearest, result.first, result.n_candidates, result.per_probe, model="hand"
    )
    sent = to_json([str(full), figures.probe_accuracy_map(full), figures.probe_intervals(full, top=15)])
    assert len(sent) < 200_000, len(sent)
    only = _post(
        app,
        table,
        {AID.probe_result: kept, AID.probe_table: 3, AID.probe_show: "wrong"},
        {},
        changed=[f"{AID.probe_show}.value"],
    )
    wrong = shown_rows(result, "wrong")
    assert only[AID.probe_table]["page_current"] == 0 and only[AID.probe_table]["page_count"] == -(-len(wrong) // PAGE)
    assert only[AID.probe_table]["data"] == table_page(result, 0, rows=wrong)
    assert f"{len(wrong):,} of 3,000 probes, 20 a page" in only[AID.probe_note]["children"]
    gone = _post(app, table, {AID.probe_result: {**kept, "key": "0" * 32}, AID.probe_table: 0}, {})
    assert "no longer on the server" in json.dumps(gone[AID.probe_note]["children"])


def test_a_probe_row_opens_its_text_in_the_lab_at_its_pronoun_and_head(tmp_path, model_folder, tiny_bert_words):
    folder = model_folder("tiny-bert", *tiny_bert_words)
    app = probe_app({folder: "tiny BERT"}, tmp_path)
    result = hand_result(12)
    result.per_probe.loc[5, "text"] = text = "The cat chased the dog until it was tired, and it slept."
    result.per_probe.loc[5, "pronoun_start"] = text.index(" it ") + 1  # the first 'it'
    result.per_probe.loc[5, "pronoun_end"] = text.index(" it ") + 3
    kept = {"key": ProbeRuns(tmp_path / "probes").keep(result), "model": folder, "part": None, "n": 12, "bos": True}
    heads = best_heads(result, 5)
    cell = {"row": 5 % PAGE, "column": 6, "column_id": "h2", "row_id": 5}
    opened = _post(
        app,
        callback(app, f"{ID.text}.value"),
        {AID.probe_table: cell},
        {AID.probe_result: kept, ID.model: folder, ID.run: 3},
    )
    assert opened[ID.text]["value"] == text and opened[ID.bos]["value"] == ["bos"]  # scored with a BOS
    assert opened[ID.run]["n_clicks"] == 4  # the page's Run captures it
    assert ID.model not in opened  # the model that scored the set is the page's already
    drill = opened[AID.probe_drill]["data"]
    assert drill["key"] == Captures.key(folder, text, True) and (drill["layer"], drill["head"]) == heads[2]

    show = callback(app, f"{ID.lab_query}.data")
    other = _post(app, show, {ID.store: {"key": "another", "model": folder, "bos": True}}, {AID.probe_drill: drill})
    assert other[AID.probe_drill]["data"] is None and ID.tabs not in other  # another capture: the drill is dropped
    app.captures.get(folder, text, bos=True)  # what the Run does
    store = {"key": drill["key"], "model": folder, "bos": True}
    shown = _post(app, show, {ID.store: store}, {AID.probe_drill: drill})
    query = shown[ID.lab_query]["data"]
    cap = app.captures.from_store(store)
    assert cap.text[slice(*cap.offsets[query])] == "it" and cap.offsets[query][0] == text.index(" it ") + 1
    assert (shown[ID.layer]["value"], shown[ID.head]["value"]) == heads[2] and shown[ID.tabs]["value"] == "lab"
    assert shown[AID.probe_drill]["data"] is None


def test_a_probe_scored_on_a_decoder_opens_with_its_text_as_the_target(tmp_path, model_folder, bert_tokenizer):
    """An encoder-decoder's decoder read each probe as the target (the evaluator's part="decoder"): the Lab
    opens on that part, at the pronoun's token of the target."""
    bart = attnviz.testing.tiny_model(
        "bart", vocab_size=bert_tokenizer.vocab_size, pad_token_id=0, decoder_start_token_id=102
    )
    folder = model_folder("tiny-bart", bart, bert_tokenizer)
    app = probe_app({folder: "tiny BART"}, tmp_path)
    result = hand_result(3)
    text = result.per_probe.loc[0, "text"]  # the short one (the tiny model reads 64 positions)
    kept = {"key": ProbeRuns(tmp_path / "probes").keep(result), "model": folder, "part": "decoder", "n": 3}
    cell = {"row": 0, "column": 1, "column_id": "text", "row_id": 0}
    opened = _post(
        app, callback(app, f"{ID.text}.value"), {AID.probe_table: cell}, {AID.probe_result: kept, ID.model: folder}
    )
    assert opened[ID.text]["value"] == opened[ID.target]["value"] == text
    drill = opened[AID.probe_drill]["data"]
    assert (
        drill["key"] == Captures.key(folder, text, True, text)
        and (drill["layer"], drill["head"]) == best_heads(result, 1)[0]
    )
    app.captures.get(folder, text, bos=True, target=text)
    store = {"key": drill["key"], "model": folder, "bos": True}
    shown = _post(app, callback(app, f"{ID.lab_query}.data"), {ID.store: store}, {AID.probe_drill: drill})
    assert shown[ID.part]["value"] == "decoder"
    target = app.captures.from_store(store).sequences("decoder")[0]
    lo, hi = target.offsets[shown[ID.lab_query]["data"]]
    start = int(result.per_probe.loc[0, "pronoun_start"])
    assert (lo, hi) == (start, start + 2) and target.text[lo:hi] == "it"


def test_the_probe_job_scores_the_uploaded_file_and_keeps_the_result_on_the_server(
    tmp_path, model_folder, tiny_bert_words
):
    folder = model_folder("tiny-bert", *tiny_bert_words)
    app = probe_app({folder: "tiny BERT"}, tmp_path)
    long = {"id": "long", "text": "The cat slept because it was tired." + " Then it slept more." * 20, "pronoun": "it",
            "candidates": ["cat", "slept"], "gold": "cat"}  # fmt: skip
    probes = [*PROBES, long]  # more tokens than the tiny model's 64 positions: skipped, with why
    source = upload(app, "mine.jsonl", jsonl(probes))[AID.probe_source]["data"]
    app.captures.get(folder, "The cat sat.")
    store = {"key": Captures.key(folder, "The cat sat."), "model": folder, "bos": False}
    state = {ID.store: store, AID.probe_set: "upload", AID.probe_source: source, AID.probe_format: "auto"}
    response = _post(
        app, callback(app, f"{AID.probe_summary}.children"), {AID.probe_run: 1}, {**state, AID.coref_sinks: ["sinks"]}
    )
    expected = attnviz.evaluate_probes(folder, [attnviz.analysis.Probe.from_dict(p) for p in probes], progress=False)
    assert len(expected.skipped) == 1 and expected.skipped[0].startswith("long: ")
    summary, skipped = response[AID.probe_summary]["children"]
    assert summary == str(expected)
    listed = json.dumps(skipped, ensure_ascii=False)
    assert "1 probe skipped when scoring: why" in listed and json.dumps(expected.skipped[0])[1:-1] in listed
    kept = response[AID.probe_result]["data"]
    assert set(kept) == {"key", "model", "part", "n", "bos"} and kept["n"] == 4 and not kept["bos"]  # a key
    held = ProbeRuns(tmp_path / "probes").result(kept["key"])
    assert np.array_equal(held.picks, expected.picks) and held.accuracy.equals(expected.accuracy)
    assert held.per_probe.loc[3, "pronoun_start"] == 29  # the file's offset: the first of two 'it'
    title = response[AID.probe_intervals]["figure"]["layout"]["title"]["text"]
    assert title == figures.probe_intervals(expected, top=15).layout.title.text


# ---------------------------------------------------------------- the whole path, in the browser
def probe_cell(dash_duo, probe: str, column: str):
    """The per-probe table's cell of ``probe`` (its id) in ``column``."""
    for row in dash_duo.find_elements(f"#{AID.probe_table} tr"):
        ids = row.find_elements("css selector", 'td[data-dash-column="probe"]')
        if ids and ids[0].text == probe:
            return row.find_element("css selector", f'td[data-dash-column="{column}"]')
    raise AssertionError(f"no row for probe {probe!r}")


@pytest.mark.browser
@pytest.mark.slow
def test_an_uploaded_probe_set_runs_and_a_probe_opens_in_the_lab_at_its_pronoun_and_head(
    dash_duo, tmp_path, bert_tokenizer
):
    from test_dashboard import no_console_errors, open_tab, poll, start_minilm

    start_minilm(dash_duo)
    open_tab(dash_duo, "Coreference")
    path = tmp_path / "mine.jsonl"
    path.write_bytes(jsonl(PROBES))
    dash_duo.find_element(f"#{AID.probe_upload} input").send_keys(str(path))
    dash_duo.wait_for_contains_text(f"#{AID.probe_loaded}", "attnviz mine.jsonl: 4 probes from 4 lines", timeout=30)
    dash_duo.find_element(f"#{AID.probe_run}").click()
    dash_duo.wait_for_contains_text(f"#{AID.probe_summary}", "4 probes on minilm", timeout=180)
    dash_duo.wait_for_contains_text(f"#{AID.probe_intervals} .gtitle", "on 4 probes: accuracy, 95 % Wilson intervals")
    dash_duo.wait_for_element(f'#{AID.probe_table} td[data-dash-column="h1"]', timeout=30)

    # the last probe says 'it' twice, and its offset says the first is meant
    text, start = PROBES[3]["text"], PROBES[3]["pronoun_start"]
    assert text[start : start + 2] == "it" and start < text.rindex(" it ")
    header = dash_duo.find_element(f'#{AID.probe_table} th[data-dash-column="h1"]').text
    layer, head = (int(x) for x in header.split(" ")[0].lstrip("L").split("·H"))
    bold = probe_cell(dash_duo, "p4", "text").find_elements("css selector", "strong")
    assert [b.text for b in bold] == ["it"]  # the text's cell says which 'it' was scored
    html_ = bold[0].find_element("xpath", "..").get_attribute("innerHTML")
    assert "until <strong>it</strong> was tired, and it slept." in html_, html_  # the first of the two
    cell = probe_cell(dash_duo, "p4", "h1")
    assert cell.text[0] in "✓✗" and cell.text[2:] in ("cat", "dog")
    right = cell.text[2:] == PROBES[3]["gold"]
    assert cell.text[0] == ("✓" if right else "✗")
    colour = cell.value_of_css_property("background-color")  # the marks' colours (style_data_conditional)
    assert colour == ("rgba(227, 244, 230, 1)" if right else "rgba(253, 228, 228, 1)"), colour
    dash_duo.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", cell)
    cell.click()

    # the Lab, on that text (as the page's own text box runs it), its pronoun the query, at that head
    offsets = bert_tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    token = offsets.index((start, start + 2))  # the tokenizer's own token of the pronoun ([CLS] first)
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", f"query 'it' (#{token})", timeout=60)
    assert dash_duo.find_element(f"#{ID.text}").get_attribute("value") == text
    poll(lambda: dash_duo.find_element(f"#{ID.layer}").text.strip() == f"L{layer}")
    poll(lambda: dash_duo.find_element(f"#{ID.head}").text.strip() == f"H{head}")
    dash_duo.wait_for_contains_text(f"#{ID.lab_graph} .gtitle", f"L{layer}·H{head}")
    chips = [c.text for c in dash_duo.find_elements(".lab-token.selected")]
    assert chips == ["it"], chips

    # the same probe at the best head: its capture is the page's already (the Run is a cache hit)
    open_tab(dash_duo, "Coreference")
    header = dash_duo.find_element(f'#{AID.probe_table} th[data-dash-column="h0"]').text
    best = tuple(int(x) for x in header.split(" ")[0].lstrip("L").split("·H"))
    assert best != (layer, head)
    cell = probe_cell(dash_duo, "p4", "h0")
    dash_duo.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", cell)
    cell.click()
    dash_duo.wait_for_contains_text(f"#{ID.lab_graph} .gtitle", f"L{best[0]}·H{best[1]}", timeout=60)
    assert f"query 'it' (#{token})" in dash_duo.find_element(f"#{ID.lab_stats}").text
    no_console_errors(dash_duo)
