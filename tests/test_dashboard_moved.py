"""The page's "Show: weights | moved" switch in a real browser: the heatmap, the head view and the
model view redraw what each head moves (α_ij·‖f_h(x_j)‖) and come back to the weights."""

import numpy as np
import pytest
import torch
from attnviz.dashboard.compare_view import compare_figure
from attnviz.dashboard.ids import ID
from attnviz.dashboard.overview_view import edges_of, note_for, shown_overview, shown_window
from test_dashboard import CAT, choose, no_console_errors, open_tab, poll, run_text, start_minilm

import attnviz


@pytest.fixture(scope="module")
def cat_capture(minilm):
    model, tok = minilm
    return attnviz.capture(model, CAT, tok)


def graph(dash_duo, graph_id: str, script: str):
    return dash_duo.driver.execute_script(f"const gd = document.querySelector('#{graph_id} .js-plotly-plot'); {script}")


def title(dash_duo, graph_id: str) -> str:
    return graph(dash_duo, graph_id, "return (gd && gd.layout.title && gd.layout.title.text) || '';") or ""


def heatmap_z(dash_duo) -> np.ndarray:
    """The heatmap's cells as plotly drew them (masked cells: NaN)."""
    z = graph(dash_duo, ID.heatmap, "return gd.calcdata[0][0].z.map(row => Array.from(row, v => v ?? NaN));")
    return np.array(z, dtype=float)


def show(dash_duo, measure: str):
    dash_duo.find_elements(f"#{ID.measure} input")[["weights", "moved"].index(measure)].click()


@pytest.mark.browser
@pytest.mark.slow
def test_switching_to_what_moves_redraws_the_heatmap_and_head_view_and_back(dash_duo, cat_capture):
    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="minilm: 13 tokens")
    choose(dash_duo, f"#{ID.layer}", 2)  # L2
    choose(dash_duo, f"#{ID.head}", 5)  # H5
    poll(lambda: "L2·H5" in title(dash_duo, ID.heatmap) and "attention weights" in title(dash_duo, ID.heatmap))
    weights, moved = cat_capture.attention(2, 5).numpy(), cat_capture.moved(2, 5).numpy()
    np.testing.assert_allclose(heatmap_z(dash_duo), weights, atol=1e-4)
    assert graph(dash_duo, ID.heatmap, "return gd.data[0].colorbar.title.text;") == "α"

    show(dash_duo, "moved")
    poll(lambda: "moved (‖α·f(x)‖)" in title(dash_duo, ID.heatmap), timeout=30)
    np.testing.assert_allclose(heatmap_z(dash_duo), moved, rtol=1e-4, atol=1e-5)
    assert not np.allclose(moved, weights, atol=1e-2)
    assert graph(dash_duo, ID.heatmap, "return gd.data[0].colorbar.title.text;") == "‖α·f(x)‖"
    assert graph(dash_duo, ID.heatmap, "return gd.data[0].zmax;") == pytest.approx(float(moved.max()), rel=1e-4)

    # the head view reads the same switch: lines by the share of the largest value moved
    open_tab(dash_duo, "Head view")
    poll(lambda: "head view, moved — every query" in title(dash_duo, ID.head_view), timeout=30)
    heads = sorted(
        {int(n[1:]) for n in graph(dash_duo, ID.head_view, "return gd.data.map(t => t.name);") if n and n[0] == "H"}
    )
    drawn = cat_capture.moved(2)[heads]
    share = drawn / drawn.max()
    text = title(dash_duo, ID.head_view)
    assert f"the largest ({float(drawn.max()):.3g})" in text
    assert f"({int((share >= 0.02).sum()):,} lines)" in text, text

    show(dash_duo, "weights")
    poll(lambda: "head view — every query: weights ≥ 0.02" in title(dash_duo, ID.head_view), timeout=30)
    w = cat_capture.attention(2)[heads]
    assert f"({int(((w >= 0.02) & (w > 0)).sum()):,} lines)" in title(dash_duo, ID.head_view)

    # and the heatmap is back on the weights
    open_tab(dash_duo, "Heatmap")
    poll(lambda: "attention weights" in title(dash_duo, ID.heatmap), timeout=30)
    np.testing.assert_allclose(heatmap_z(dash_duo), weights, atol=1e-4)
    assert graph(dash_duo, ID.heatmap, "return gd.data[0].colorbar.title.text;") == "α"
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_the_model_view_shows_what_moves_on_its_own_scale(dash_duo, cat_capture):
    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="minilm: 13 tokens")
    open_tab(dash_duo, "Model view")
    poll(lambda: title(dash_duo, ID.model_view).startswith("Model view: 6 layers × 12 heads (click"), timeout=30)
    show(dash_duo, "moved")
    poll(lambda: "heads, moved (‖α·f(x)‖" in title(dash_duo, ID.model_view), timeout=60)
    top = max(float(cat_capture.moved(layer).max()) for layer in cat_capture.layer_indices())
    assert graph(dash_duo, ID.model_view, "return gd.data[0].zmax;") == pytest.approx(top, rel=1e-4)
    assert graph(dash_duo, ID.model_view, "return gd.data[0].showscale;") is True
    show(dash_duo, "weights")
    poll(lambda: title(dash_duo, ID.model_view).startswith("Model view: 6 layers × 12 heads (click"), timeout=30)
    assert graph(dash_duo, ID.model_view, "return gd.data[0].zmax;") == 1
    no_console_errors(dash_duo)


# ---------------------------------------------------------------- the long-text helpers, without a browser
@pytest.fixture(scope="module")
def long_cap():
    model = attnviz.testing.tiny_model("llama", max_position_embeddings=1024)
    ids = torch.randint(3, model.config.vocab_size, (1, 600), generator=torch.Generator().manual_seed(1))
    return attnviz.capture(model, input_ids=ids)


def test_the_long_heatmap_overview_and_zoom_follow_the_measure(long_cap):
    moved = long_cap.moved(1, 2)
    fig, view = shown_overview(long_cap, 1, 2, mode="max", measure="moved")
    edges = edges_of(view["rows"])
    ref = np.array([[float(moved[a:b, c:d].max()) for c, d in zip(edges, edges[1:])] for a, b in zip(edges, edges[1:])])
    z = np.array(fig.data[0].z, dtype=float)
    np.testing.assert_allclose(z[ref > 0], ref[ref > 0], rtol=1e-4)
    assert "max moved (‖α·f(x)‖)" in fig.layout.title.text and "exact values" in fig.layout.title.text
    assert "to see the exact moved (‖α·f(x)‖)" in note_for(long_cap, view, False, None, "moved")
    zoom, zoomed = shown_window(long_cap, 1, 2, (100, 150), (80, 140), measure="moved")
    allowed = long_cap.allowed(1)[100:150, 80:140].numpy()
    np.testing.assert_allclose(
        np.array(zoom.data[0].z, dtype=float)[allowed], moved[100:150, 80:140].numpy()[allowed], rtol=1e-4
    )
    assert note_for(long_cap, zoomed, False, None, "moved").startswith("Exact moved (‖α·f(x)‖): queries 100–149")
    plain, _ = shown_window(long_cap, 1, 2, (100, 150), (80, 140))
    assert "exact weights" in plain.layout.title.text and note_for(long_cap, zoomed, False, None).startswith(
        "Exact weights"
    )


def test_compare_figure_passes_the_measure(long_cap):
    fig, problem = compare_figure(long_cap, long_cap, 1, 2, words=False, part=None, measure="moved")
    assert problem == "" and "tokens, moved (‖α·f(x)‖): max |A − B| 0.000" in fig.layout.title.text
    fig, problem = compare_figure(long_cap, long_cap, 1, 2, words=False, part=None, measure="norm")
    assert problem.startswith("measure must be 'weights'")


def test_the_exports_follow_the_switch(cat_capture):
    """The CSV of the shown matrix and the HTML export carry what the page shows."""
    from attnviz.dashboard.export_view import matrix_frame, view_figures

    cap = cat_capture
    moved = matrix_frame(cap, 2, 5, words=True, measure="moved")
    np.testing.assert_allclose(moved.to_numpy(), cap.moved(2, 5, words=True).numpy(), rtol=1e-6)
    weights = matrix_frame(cap, 2, 5, words=True)
    np.testing.assert_allclose(weights.to_numpy(), cap.attention(2, 5, words=True).numpy(), rtol=1e-6)
    for tab in ("heatmap", "head", "model"):
        [fig] = view_figures(cap, tab, 2, 5, words=False, part=None, measure="moved")
        assert "moved" in fig.layout.title.text or "‖α·f(x)‖" in fig.layout.title.text, tab
    [row] = view_figures(cap, "lab", 2, 5, words=False, part=None, query=8, measure="moved")
    assert "moved (‖α·f(x)‖)" in row.layout.title.text
