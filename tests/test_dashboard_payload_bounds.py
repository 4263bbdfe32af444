"""Every response of every view stays ≤ 2 MB at a long text (#19 item 2): the real app on SmolLM2 at
2,000 tokens (a background capture), every tab driven once in headless Chromium, every callback
response measured on the server by a WSGI middleware (``bench/wsgi_recorder.py``, the payload
bench's own); and, without a browser, the bounds behind it: the comparison's exact window, the
Coreference map and its word-chip pages."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from attnviz.dashboard import create_app
from attnviz.dashboard.coref_view import CHIP_PAGE, LONG, coref_map, page_options
from attnviz.dashboard.ids import AID, CID, EID, ID, IID, SID, TID
from attnviz.dashboard.layout import VIEWS
from dash._utils import to_json
from test_dashboard import no_console_errors, open_tab, show_heatmap_in_tokens, wait_status
from test_dashboard_long import set_text

import attnviz
from attnviz import figures
from attnviz.views.compare import comparison_window

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # the bench's middleware and texts
from dashboard_payload import text_of  # noqa: E402
from wsgi_recorder import Recorder  # noqa: E402

MB2 = 2_000_000
N = 2000  # tokens, BOS included: past the page's 1,024-token background threshold
TAB_TIMEOUT = 600.0  # the heavy views at 2,000 tokens take a minute or two each on a loaded 2-core machine


# ---------------------------------------------------------------- without a browser: the bounds
@pytest.fixture(scope="module")
def smol_llama(smol_tokenizer):
    """A tiny random Llama reading SmolLM2's vocabulary (4,096 positions, d_head 64): long texts in seconds."""
    model = attnviz.testing.tiny_model(
        "llama",
        vocab_size=len(smol_tokenizer),
        max_position_embeddings=4096,
        hidden_size=128,
        num_attention_heads=2,
        head_dim=64,
    )
    return model, smol_tokenizer


@pytest.fixture(scope="module")
def long_cap(smol_llama):
    model, tokenizer = smol_llama
    return attnviz.capture(model, text_of(tokenizer, N - 1), tokenizer, add_bos=True)


def test_a_window_is_all_of_a_small_map_and_at_most_the_cells_around_the_largest_of_a_big_one():
    assert comparison_window((12, 64), (3, 5)) == ((0, 12), (0, 64))
    assert comparison_window((2000, 64), (1990, 7)) == ((976, 2000), (0, 64))  # every column, 1,024 rows
    assert comparison_window((2000, 64), (0, 0)) == ((0, 1024), (0, 64))
    assert comparison_window((2000, 2000), (700, 10)) == ((572, 828), (0, 256))  # weights: 256 × 256
    rows, cols = comparison_window((5, 40_000), (2, 39_999))  # a short target × a long source: wide
    assert rows == (0, 5) and cols == (40_000 - 13_107, 40_000)


def test_the_comparison_of_a_long_text_is_an_exact_window_with_the_whole_maps_largest_difference(long_cap):
    cap, layer, head = long_cap, 1, 1
    rec = cap.layer(layer)
    theirs, ours = rec.out[head].float(), cap.output(layer, head)
    full = (ours - theirs).abs()
    worst = divmod(int(full.argmax()), full.shape[1])
    fig = figures.validation_comparison(cap, layer, head)
    assert len(to_json(fig)) <= 1_200_000  # 3 × 1,024 × 64 float32 cells, base64
    model, attn, diff = (np.asarray(t.z, dtype=np.float32) for t in fig.data)
    r0 = fig.data[0].y[0]
    assert model.shape == (1024, 64) and list(fig.data[0].y) == list(range(r0, r0 + 1024))
    assert r0 <= worst[0] < r0 + 1024
    np.testing.assert_array_equal(model, theirs[r0 : r0 + 1024].numpy())  # the model's own numbers, unpooled
    np.testing.assert_array_equal(attn, ours[r0 : r0 + 1024].numpy())
    assert fig.layout.title.text.startswith(f"L1·H1: max |difference| {float(full.max()):.2e}<br>")  # the whole map's
    assert f"rows {r0}–{r0 + 1023} of 2,000, exact, around the largest |difference| (position {worst[0]}" in (
        fig.layout.title.text
    )
    assert fig.data[2].zmax == pytest.approx(float(full.max()))
    whole = figures.validation_comparison(cap, layer, head, cells=N * 64)  # room for every row: the map as it was
    assert (
        np.asarray(whole.data[0].z).shape == (N, 64)
        and whole.data[0].y is None
        and "<br>" not in (whole.layout.title.text)
    )


def test_compare_heads_of_a_long_text_pools_block_means_with_the_exact_largest_difference(smol_llama, long_cap):
    model, tokenizer = smol_llama
    a = long_cap
    text = a.text.replace("hungry", "sleepy", 1)
    b = attnviz.capture(model, text, tokenizer, add_bos=True)
    assert b.n_tokens == a.n_tokens == N
    fig = figures.compare_heads(a, b, 1, 0)
    assert len(to_json(fig)) <= 1_300_000 and len(fig.data) == 3
    ov_a, ov_b = (np.asarray(t.z, dtype=np.float32) for t in fig.data[:2])
    assert ov_a.shape == (250, 250)  # blocks of 8 × 8 tokens
    wa, wb = a.attention(1, 0), b.attention(1, 0)
    block = (wa - wb)[8:16, :8].mean()  # the difference panel: the mean of each block's differences
    assert float(fig.data[2].z[1][0]) == pytest.approx(float(block), abs=1e-6)
    assert float(ov_a[1][0]) == pytest.approx(float(wa[8:16, :8].mean()), abs=1e-6)
    exact = float((wa - wb).abs().max())
    assert f"max |A − B| {exact:.3f} cell by cell; position by position, " in fig.layout.title.text
    assert "pooled: the mean of each block of 8×8 tokens (of 2,000 × 2,000)" in fig.layout.title.text
    words = figures.compare_heads(a, a, 1, 0, words=True)  # 1,900 words: pooled in tokens, and said so
    assert "more than 512 words, so in tokens" in words.layout.title.text and len(to_json(words)) <= 1_300_000
    short = attnviz.capture(model, "It is too big.", tokenizer)
    apart = figures.compare_heads(a, short, 1, 0)
    assert len(apart.data) == 2 and "no difference map: the tokens differ (2,000 vs" in apart.layout.title.text


def test_the_coreference_map_of_a_long_text_is_the_exact_window_from_the_candidates_to_the_pronoun(long_cap):
    cap = long_cap
    assert len(cap.words) > LONG
    pronoun = max(i for i, w in enumerate(cap.words) if w.text.strip() == "it")
    near = [pronoun - 6, pronoun - 3]
    fig = coref_map(cap, 1, 0, pronoun, near)
    first, stop = cap.words[near[0]].token_start, cap.words[pronoun].token_stop
    start = stop - max(stop - first, 64)
    assert f"exact weights of queries {start}–{stop - 1} × keys {start}–{stop - 1}" in fig.layout.title.text
    shown = torch.tensor(np.asarray(fig.data[0].z, dtype=np.float32))
    allowed = cap.allowed(1)[start:stop, start:stop]
    torch.testing.assert_close(shown[allowed], cap.attention(1, 0)[start:stop, start:stop][allowed])
    assert len(to_json(fig)) <= MB2 // 4
    far = coref_map(cap, 1, 0, pronoun, [1])  # the first word: more than 512 tokens before the pronoun
    assert "overview of 2,000 × 2,000 tokens" in far.layout.title.text and "pooled map" in far.layout.title.text
    assert np.asarray(far.data[0].z).shape == (250, 250) and len(to_json(far)) <= MB2 // 2


def test_the_coreference_map_of_a_short_text_is_still_the_word_map(smol_llama):
    model, tokenizer = smol_llama
    cap = attnviz.capture(model, "The cat sat on the mat because it was tired.", tokenizer)
    fig = coref_map(cap, 1, 0, 7, [1, 5])
    assert "word × word" in fig.layout.title.text and np.asarray(fig.data[0].z).shape == (len(cap.words),) * 2


def test_the_chip_pages_cover_every_word_once_and_name_the_pronouns(long_cap):
    n = len(long_cap.words)
    options = page_options(long_cap, n - 5)
    assert [o["value"] for o in options] == list(range(-(-n // CHIP_PAGE)))
    assert options[0]["label"].startswith(f"words 0–{CHIP_PAGE - 1:,} of {n:,} (")
    assert options[-1]["label"].startswith(f"words {(len(options) - 1) * CHIP_PAGE:,}–{n - 1:,} of {n:,}")
    assert [o["label"].endswith("the pronoun's") for o in options] == [False] * (len(options) - 1) + [True]


# ---------------------------------------------------------------- in the browser: every tab at 2,000 tokens
def filled(dash_duo, graph_id: str) -> bool:
    """Whether the graph shows a plot (a message figure, as a pending job's, has no trace)."""
    return bool(
        dash_duo.driver.execute_script(
            f"const gd = document.querySelector('#{graph_id} .js-plotly-plot');"
            "return !!gd && Array.isArray(gd.data) && gd.data.length > 0;"
        )
    )


def has_text(dash_duo, element_id: str) -> bool:
    return bool(
        dash_duo.driver.execute_script(
            f"const el = document.getElementById('{element_id}'); return el && el.innerText.trim();"
        )
    )


def wait(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if condition():
                return
        except Exception:  # noqa: BLE001 - an element re-rendered while read
            pass
        time.sleep(0.25)
    raise AssertionError(f"{what}: not shown after {timeout:.0f} s")


def click(dash_duo, selector: str) -> None:
    button = dash_duo.find_element(selector)
    dash_duo.driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].click();", button)


# what to do on each tab, in order, until it is done: wait for a plot ("plot", id) or a text ("text", id),
# or click ("click", css selector)
STEPS = {
    "heatmap": [("plot", ID.heatmap)],
    "head": [("plot", ID.head_view)],
    "model": [("plot", ID.model_view)],
    "lab": [  # the row, then "Apply to the model" with ÷√d_k switched off
        ("plot", ID.lab_graph),
        ("click", f"#{ID.lab_switches} label:nth-of-type(2) input"),
        ("click", f"#{EID.lab_apply}"),
        ("plot", EID.lab_predictions),
    ],
    "validation": [("plot", ID.validation_map), ("plot", ID.comparison)],
    "cost": [("text", ID.cost)],
    "coref": [("text", AID.coref_words), ("plot", AID.coref_bars), ("plot", AID.coref_heatmap)],
    "stats": [("plot", AID.stats_map)],
    "atlas": [("click", f"#{TID.run}"), ("plot", TID.graph)],  # the shipped probe sentences, SmolLM2's every head
    "rollout": [("plot", AID.rollout_graph)],
    "space": [("plot", SID.graph)],
    "compare": [("click", f"#{CID.run}"), ("plot", CID.graph)],  # B empty: A's text on the same model
    "image": [("text", IID.intro)],
    # a run folder's checkpoints, not the page's capture (test_timeline drives it on a run): opened, it sends nothing heavy
    "training": [],  # a text model and no picture: the tab says what it needs, sends nothing heavy
}


@pytest.mark.browser
@pytest.mark.slow
def test_every_response_of_every_tab_stays_under_2mb_at_2000_tokens(dash_duo, smol_tokenizer):
    app = create_app({"smollm2": "SmolLM2-135M"}, default_model="smollm2")
    recorder = Recorder(app.server.wsgi_app)
    app.server.wsgi_app = recorder
    dash_duo.start_server(app)
    wait_status(dash_duo, "smollm2: 27 tokens", timeout=120)  # the page opens with SmolLM2's BOS on
    show_heatmap_in_tokens(dash_duo)
    set_text(dash_duo, ID.text, text_of(smol_tokenizer, N - 1))
    click(dash_duo, f"#{ID.run}")
    wait_status(dash_duo, f"smollm2: {N} tokens", timeout=300)
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", f"overview of {N:,} × {N:,} tokens", timeout=120)
    assert set(STEPS) == {key for key, _ in VIEWS}, "a tab this test does not drive"
    for key, label in VIEWS:
        mark, t0 = len(recorder.records), time.time()
        print(f"{time.strftime('%H:%M:%S')} {label} …", file=sys.stderr, flush=True)
        open_tab(dash_duo, label)
        for what, target in STEPS[key]:
            if what == "click":
                click(dash_duo, target)
                continue
            shown = has_text if what == "text" else filled
            wait(lambda target=target, shown=shown: shown(dash_duo, target), TAB_TIMEOUT, f"{label}: {target}")
        wait(lambda: recorder.quiet_for(1.0), 120, f"{label}: the page kept calling the server")
        mine = recorder.records[mark:]
        largest = max(mine, key=lambda r: r["bytes"], default={"bytes": 0, "output": ""})
        print(
            f"  {label}: {time.time() - t0:.1f} s, {len(mine)} responses, the largest {largest['bytes'] / 1e6:.3f} MB "
            f"({largest['output'][:60]})",
            file=sys.stderr,
            flush=True,
        )
        over = [(r["output"][:80], r["bytes"]) for r in mine if r["bytes"] > MB2]
        assert over == [], f"{label} at {N:,} tokens: responses over 2 MB: {over}"
    records = recorder.records
    assert max(r["bytes"] for r in records) <= MB2  # the run's own responses too
    assert {r["status"] for r in records} <= {"200", "204"}, sorted({(r["status"], r["output"][:60]) for r in records})
    assert dash_duo.find_element(f"#{ID.message}").text == ""
    no_console_errors(dash_duo)
