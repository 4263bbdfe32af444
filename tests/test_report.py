"""One capture as one self-contained HTML report (``cap.report``, ``figures.report``, ``attnviz report``,
the Export tab's Report button): nothing loaded from anywhere, the maps switched in the page itself and
equal to ``cap.attention`` within the stated quantisation, the CJK face embedded and used.

Broken on purpose while writing these, each alone: the page's decoder reading ``s·level/256`` (the switch
test goes red, 0.0039 off at L1·H1), the words' merge summing a query word's rows instead of
averaging them (red, 3.0 off at L0·H3 in words), the mask dropped (red: the causal triangle drawn as zeros), the face's
``@font-face`` left out (red: ``document.fonts.load`` finds no face for 它小猫, and the inlined-font check)
and a ``<script src=https://cdn.plot.ly/…>`` added to the page's head (red: the resource check)."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import plotly.offline
import pytest
import torch

import attnviz
from attnviz import figures
from attnviz.views.html import cjk_font_path
from attnviz.views.report_data import LEVELS, QUANTISATION, encode_map

ZH = "我家的小猫很可爱，它很好动。"
ROOT = Path(__file__).resolve().parents[1]
READY = "const done = arguments[arguments.length - 1]; window.attnvizReport.ready.then(() => done(true), e => done(String(e)));"
Z = "return document.getElementById('av-heatmap').data[0].z;"
ROW = "return document.getElementById('av-row').data[0].y;"


@pytest.fixture(scope="module")
def zh_capture(smol_tokenizer):
    """A tiny random Llama (causal: the mask matters) on SmolLM2's vocabulary reading the Chinese seed."""
    model = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer))
    return attnviz.capture(model, ZH, smol_tokenizer)


def resources(page: str) -> list[str]:
    """Every address the page's markup would load: src=, href=, url(…), @import (data: ones included)."""
    markup = re.sub(r"<script type=\"text/javascript\">.*?</script>", "", page, flags=re.S)  # plotly.js' own text
    found = re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]+)""", markup)
    found += re.findall(r"url\(\s*['\"]?([^'\")]{0,40})", markup)
    found += re.findall(r"@import\s+['\"]?([^'\";]+)", markup)
    return found


def test_the_report_loads_nothing_from_anywhere(zh_capture, tmp_path):
    page = figures.report(zh_capture)
    assert page.count(plotly.offline.get_plotlyjs()) == 1  # plotly.js inlined once
    assert all(address.startswith("data:") for address in resources(page)), resources(page)
    assert not re.search(r"<script[^>]+src=", page) and "<link" not in page and "<iframe" not in page
    inlined = re.search(r'font-family:"attnviz CJK".*?src:url\(data:font/woff2;base64,([A-Za-z0-9+/=]+)\)', page)
    assert inlined is not None and base64.b64decode(inlined.group(1)) == cjk_font_path().read_bytes()
    assert QUANTISATION in page and "Model and provenance" in page and "Validation certificate" in page
    # the resource check sees a planted CDN script and a planted stylesheet
    assert not all(a.startswith("data:") for a in resources(page + '<script src="https://cdn.plot.ly/x.js"></script>'))
    assert not all(a.startswith("data:") for a in resources(page + "<style>@import 'http://x/y.css';</style>"))
    path = zh_capture.report(tmp_path / "r.html")  # the Capture's method: the same page, written
    assert path == tmp_path / "r.html" and len(path.read_text(encoding="utf-8")) == len(page)


def test_a_map_is_stored_within_its_stated_quantisation():
    z = torch.rand(7, 9) ** 4
    scale, b64 = encode_map(z)
    levels = torch.frombuffer(bytearray(zlib.decompress(base64.b64decode(b64))), dtype=torch.uint8).reshape(7, 9)
    assert scale == pytest.approx(float(z.max()))
    assert (levels.float() * scale / LEVELS - z).abs().max() <= scale / (2 * LEVELS) + 1e-7
    assert encode_map(torch.zeros(2, 2))[0] == 1.0  # an all-zero map: scale 1, every level 0


def test_the_page_size_follows_its_formula_and_keeps_the_chosen_heads_past_its_budget(zh_capture):
    cap = zh_capture
    n, h, layers = cap.n_tokens, cap.n_heads, len(cap.layer_indices())
    w = len(cap.word_labels)
    base = len(figures.report(cap, heads=[(0, 0)], budget_mb=0))  # past any budget: one head's maps
    full = len(figures.report(cap))
    # per map at most its bytes deflated (≤ bytes + 11 + 5 per 16 kB block) as base64 (4/3) and its key
    per_map = lambda cells: 4 / 3 * (cells + 16) + 4 + 40  # noqa: E731
    # stored: the token weights and what moves between words; each layer's mask and norms (uint16 [head, key])
    bound = layers * h * (per_map(n * n) + per_map(w * w)) + layers * (per_map(n * n) + per_map(2 * h * n))

    assert 0 < full - base <= bound, (full - base, bound)
    small = figures.report(cap, heads=[(1, 2)], budget_mb=0)
    assert "Left out of this report" in small and "decoder L1·H2" in small and '/1/2"' in small
    assert '/0/0"' not in small  # other heads' maps are gone
    with pytest.raises(attnviz.OutOfRangeError, match="none of these"):
        figures.report(cap, heads=[(99, 0)], budget_mb=0)


def test_a_report_holds_a_generation_the_edits_a_ranking_and_the_provenance(smol_tokenizer):
    from attnviz.analysis import rank_heads

    model = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer))
    gen = attnviz.generate(model, "The cat sat because it", smol_tokenizer, max_new_tokens=3)
    gen.capture.model["provenance"] = {"weights_sha256": "abc123", "revision": "r1"}
    page = figures.report(gen.capture)
    assert "Generation steps" in page and 'id="av-step"' in page
    assert "weights_sha256" in page and "abc123" in page
    cap = attnviz.capture(model, "The cat sat on the mat because it was tired.", smol_tokenizer)
    ranking = rank_heads(cap, "it", ["cat", "mat"])
    out = attnviz.intervene(model, cap.text, attnviz.edits.knockout(key="cat", layer=1, head=0), smol_tokenizer)
    probes = attnviz.evaluate_probes(model, "en", smol_tokenizer, progress=False)
    page = figures.report(out.capture_after, ranking=ranking, intervention=out, probes=probes)
    assert "Coreference ranking" in page and "Edits: before and after" in page
    assert "accuracy with its intervals" in page and "Wilson" in page
    assert "before the edits" in page and "after the edits" in page


def test_the_cli_writes_the_report_of_a_saved_capture(zh_capture, tmp_path):
    saved = zh_capture.save(tmp_path / "zh.attnviz")
    out = tmp_path / "zh.html"
    done = subprocess.run(
        [sys.executable, "-m", "attnviz", "report", str(saved), "-o", str(out), "--layer", "1", "--head", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert f"written to {out}" in done.stdout and "opens offline" in done.stdout
    page = out.read_text(encoding="utf-8")
    assert '"open":{"part":"decoder","layer":1,"head":2' in page
    refused = subprocess.run(
        [sys.executable, "-m", "attnviz", "report", str(saved), "--dtype", "float16", "-o", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert refused.returncode != 0 and "is a saved capture, so --dtype would be ignored" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def offline(driver) -> None:
    """The browser's network off (Chrome DevTools): anything the page would fetch fails."""
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.emulateNetworkConditions",
        {"offline": True, "latency": 0, "downloadThroughput": 0, "uploadThroughput": 0},
    )


def choose(driver, select_id: str, value) -> None:
    driver.execute_script(
        "const s = document.getElementById(arguments[0]); s.value = String(arguments[1]);"
        "s.dispatchEvent(new Event('change'));",
        select_id,
        value,
    )


def shown(driver, script: str, want: int, timeout: float = 20):
    """The plotted values once the figure holds ``want`` rows (or bars) after a switch."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = driver.execute_script(script)
        if got is not None and len(got) == want:
            return got
        time.sleep(0.2)
    raise AssertionError("the figure was not redrawn")


def switched(driver, title: str, timeout: float = 20) -> None:
    """Wait until the page's status line names ``title`` (the selectors' map is drawn)."""
    deadline = time.time() + timeout
    while title not in driver.execute_script("return document.getElementById('av-status').textContent"):
        assert time.time() < deadline, "the page did not switch"
        time.sleep(0.2)


def as_tensor(z) -> torch.Tensor:
    return torch.tensor([[float("nan") if v is None else v for v in row] for row in z])


@pytest.mark.browser
def test_the_report_opens_offline_switches_heads_and_draws_cjk_in_its_face(dash_duo, zh_capture, tmp_path):
    cap = zh_capture
    path = cap.report(tmp_path / "report.html")
    driver = dash_duo.driver
    offline(driver)
    driver.get(path.as_uri())
    assert driver.execute_async_script(READY) is True
    # the model view's mosaic, rebuilt in the page from its 8-bit levels, and the head each cell names
    mosaic = driver.execute_script("const d = document.getElementById('av-model').data[0]; return [d.z, d.customdata];")
    want = torch.tensor(figures.model_view(cap).data[0].z, dtype=torch.float32)
    got = as_tensor(mosaic[0])
    assert torch.equal(got.isnan(), want.isnan()) and (got - want).nan_to_num(0).abs().max() <= 1 / 508 + 1e-3
    assert mosaic[1][-1][-1] == [cap.layer_indices()[-1], cap.n_heads - 1]
    for layer, head, words, measure in (
        (1, 1, False, "weights"),
        (0, 3, True, "weights"),
        (1, 0, True, "moved"),
        (1, 2, False, "moved"),
    ):
        choose(driver, "av-units", "words" if words else "tokens")
        choose(driver, "av-measure", measure)
        choose(driver, "av-layer", layer)
        choose(driver, "av-head", head)
        want = (cap.moved if measure == "moved" else cap.attention)(layer, head, words=words).float()
        title = f"L{layer}·H{head} — {'weights α' if measure == 'weights' else 'what moves'}"
        switched(driver, title)
        z = as_tensor(shown(driver, Z, want.shape[0]))
        allowed = cap.allowed(layer)
        if words:
            assert z.shape == want.shape
        else:
            assert torch.equal(z.isnan(), ~allowed)  # the masked triangle drawn empty
        s = float(cap.attention(layer, head).max())  # the stored token map's scale
        tol = float(want.max()) / (2 * LEVELS) + 1e-6  # the stated bounds: s/510 for a stored map
        if measure == "weights" and words:  # merged in the page: m·s/510, m the longest key word's tokens
            tol = max(w.token_stop - w.token_start for w in cap.words) * s / (2 * LEVELS) + 1e-6
        if measure == "moved" and not words:  # the stored weight times the key's norm: ‖f(x)‖·s/510
            tol = s * float(cap.value_norms(layer)[head].max()) / (2 * LEVELS) * (1 + 1e-4) + 1e-6
        assert (z.nan_to_num(0) - want.masked_fill(z.isnan(), 0)).abs().max() <= tol
        row = torch.tensor(shown(driver, ROW, want.shape[1]))
        query = int(driver.execute_script("return document.getElementById('av-query').value"))
        assert (row - want[query]).abs().max() <= tol  # the chosen query's row (first: the last query)
    choose(driver, "av-query", 3)
    time.sleep(0.5)
    assert (torch.tensor(shown(driver, ROW, cap.n_tokens)) - cap.moved(1, 2)[3]).abs().max() < 0.01
    # nothing but the file itself and data: URLs was loaded
    loaded = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(name.startswith(("data:", "blob:")) for name in loaded), loaded
    # the CJK face, embedded, renders the text's characters
    faces = driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; document.fonts.load('16px \"attnviz CJK\"', '它小猫')"
        ".then(f => done([f.length, document.fonts.check('16px \"attnviz CJK\"', '它小猫')]), e => done(String(e)));"
    )
    assert faces == [1, True]
    assert driver.get_log("browser") == []


@pytest.mark.browser
def test_a_report_of_some_heads_offers_and_draws_them_by_the_model_s_numbers(dash_duo, smol_tokenizer, tmp_path):
    """capture(heads=[1, 3]): the page opens on head 1 (the first kept), its selector offers H1 and H3, each
    drawn as the capture's own head of that number (what moves too: each head's own value norms), and the
    mosaic's cells name the heads kept."""
    model = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer))
    cap = attnviz.capture(model, ZH, smol_tokenizer, heads=[1, 3])
    with pytest.raises(attnviz.HeadNotKeptError):
        figures.report(cap, head=0)
    driver = dash_duo.driver
    offline(driver)
    driver.get(cap.report(tmp_path / "some.html").as_uri())
    assert driver.execute_async_script(READY) is True
    offered = driver.execute_script("return Array.from(document.getElementById('av-head').options, o => o.value)")
    assert offered == ["1", "3"] and driver.execute_script("return document.getElementById('av-head').value") == "1"
    mosaic = driver.execute_script("return document.getElementById('av-model').data[0].customdata;")
    assert mosaic[-1][-1] == [cap.layer_indices()[-1], 3]
    for head, measure in ((3, "weights"), (1, "moved"), (3, "moved")):
        choose(driver, "av-measure", measure)
        choose(driver, "av-layer", 1)
        choose(driver, "av-head", head)
        want = (cap.moved if measure == "moved" else cap.attention)(1, head).float()
        title = f"L1·H{head} — {'weights α' if measure == 'weights' else 'what moves'}"
        switched(driver, title)
        z = as_tensor(shown(driver, Z, want.shape[0]))
        s = float(cap.attention(1, head).max())
        tol = s * (float(cap.value_norms(1)[cap.head_index(1, head)].max()) if measure == "moved" else 1) / (2 * LEVELS)
        assert (z.nan_to_num(0) - want.masked_fill(z.isnan(), 0)).abs().max() <= tol * (1 + 1e-4) + 1e-6
    assert driver.get_log("browser") == []


@pytest.mark.browser
def test_the_export_bar_s_report_button_downloads_the_page_s_capture(dash_duo, zh_capture, tmp_path):
    from attnviz.dashboard import create_app  # the dashboard only for this test (it imports dash)
    from attnviz.dashboard.ids import ID

    path = zh_capture.save(tmp_path / "zh.attnviz")
    from test_dashboard import show_heatmap_in_tokens

    dash_duo.start_server(create_app({"minilm": "MiniLM (BERT)"}, capture_file=str(path)))
    show_heatmap_in_tokens(dash_duo)  # the page opens on the Lab in words
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "L0·H0", timeout=60)
    dash_duo.select_dcc_dropdown(f"#{ID.layer}", value="L1")
    dash_duo.select_dcc_dropdown(f"#{ID.head}", value="H2")
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "L1·H2")
    dash_duo.find_element(f"#{ID.report_button}").click()
    page = Path(dash_duo.download_path) / "attnviz-report.html"
    deadline = time.time() + 60
    while not (
        page.exists() and page.stat().st_size > 5_000_000 and page.read_text(encoding="utf-8").endswith("</html>\n")
    ):
        assert time.time() < deadline, "no report was downloaded"
        time.sleep(0.3)
    html = page.read_text(encoding="utf-8")
    assert '"open":{"part":"decoder","layer":1,"head":2' in html and ZH in html
    assert all(address.startswith("data:") for address in resources(html))
    assert dash_duo.get_logs() == []


@pytest.mark.parametrize(
    "argv, said",
    [
        (["report", "cat.attnviz", "-o", "cat.png"], "attnviz report writes one HTML page: give an .html path for -o"),
        (["report", "no-such.attnviz", "-o", "cat.html"], "'no-such.attnviz' is not a capture file; give CAPTURE"),
        (["report", "m", "t", "-o", "c.html", "--heads", "3-4"], "--heads takes LAYER:HEAD pairs"),
    ],
)
def test_the_cli_refuses_bad_input_in_one_line_before_any_model_loads(argv, said, capsys, tmp_path, monkeypatch):
    from attnviz.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and said in err, err
