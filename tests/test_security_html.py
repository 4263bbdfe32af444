"""Issue #51: a page attnviz writes runs nothing and fetches nothing that a model, a file or a capture put in it.

Hostile strings (an ``<img onerror>``, a ``</script>``, ``<!--<script>``, U+2028, a ``javascript:`` link, a
link to another host, quotes, ``{{``) as the model's name, the provenance, the tokens, the text, a word, a
title, a ranking's and a probe set's names go through every public HTML writer — the report
(``cap.report``), ``figures.to_html``, ``figures.atlas_page``, a capture's, a ranking's and a probe result's
notebook HTML (``_repr_html_``) — and each page is opened from disk in headless Chromium with
``alert``/``confirm``/``prompt`` trapped before the page's own scripts run, every request the page makes
logged and every Content-Security-Policy violation counted: no dialog, no request but ``file:``, ``data:``
and ``blob:``, each hostile string shown as text, and the page drawn (its plots' SVG, the report's maps).

Broken on purpose while writing these, each alone (and each red): the report's model name put in
unescaped (the report test: an ``<img>`` made of the name, the name missing from the text, a request to
attacker.invalid); the report's JSON escaped as before (``</`` only: ``<!--<script>`` in a token swallows the
report's own script, whose maps are never drawn); the policy left out of the pages (the injected-script
test: the ``onerror`` handler runs and the image is fetched); ``write_page`` writing with
``Path.write_text`` (a folder given as the file is an ``IsADirectoryError``, not a ``FileWriteError``)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import attnviz
from attnviz import figures
from attnviz.errors import FileWriteError
from attnviz.testing import IdsTokenizer
from attnviz.views.html import content_security_policy, escape_html, page_head, script_json, write_page

ATTACKER = "https://attacker.invalid/x.png"
#: each alone a token of the text (the tokenizer below splits on "¦")
HOSTILE = [
    f"<img src={ATTACKER} onerror=alert(1)>",
    '"><script>alert(2)</script>',
    "<!--<script>",
    "</script><script>alert(3)</script>",
    "a\u2028b\u2029c",
    '<a href="javascript:alert(4)">click</a>',
    "{{7*7}} ' \" ` ${x}",
]
NAME = f"m<img src={ATTACKER} onerror=alert(document.domain)>"
SEP = "¦"

TRAP = """
window.__alerts = [];
for (const k of ['alert', 'confirm', 'prompt']) window[k] = (...a) => { window.__alerts.push(k + ':' + a.join(',')); };
window.__violations = [];
document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));
"""
#: markup a hostile string would have made had it been put in unescaped
INJECTED = """return [...document.querySelectorAll('*')].filter(e =>
  [...e.attributes].some(a => a.name.startsWith('on') || /^\\s*javascript:/i.test(a.value))
  || (e.tagName === 'IMG' && !e.src.startsWith('data:'))
  || (e.tagName === 'SCRIPT' && /^\\s*alert/.test(e.textContent))).map(e => e.outerHTML.slice(0, 120));"""
READY = "const done = arguments[arguments.length - 1]; window.attnvizReport.ready.then(() => done(true), e => done(String(e)));"


class HostileTokenizer(IdsTokenizer):
    """Each piece of the text between "¦" is one token whose label is that piece: the hostile strings
    reach the figures' axes, the report's selectors and its JSON whole."""

    def __init__(self) -> None:
        self.vocab: list[str] = ["<pad>", "<unk>", "<s>"]

    def _id(self, piece: str) -> int:
        if piece not in self.vocab:
            self.vocab.append(piece)
        return self.vocab.index(piece)

    def __call__(self, text=None, text_target=None, return_offsets_mapping=False, **kwargs):
        text = text if text is not None else text_target
        ids, offsets, pos = [], [], 0
        for piece in text.split(SEP):
            ids.append(self._id(piece))
            offsets.append((pos, pos + len(piece)))
            pos += len(piece) + len(SEP)
        return {"input_ids": ids, "offset_mapping": offsets} if return_offsets_mapping else {"input_ids": ids}

    def convert_ids_to_tokens(self, ids):
        return [self.vocab[i] for i in ids]

    def convert_tokens_to_string(self, tokens):
        return SEP.join(tokens)

    def decode(self, ids, skip_special_tokens=False, **kwargs):
        return SEP.join(self.vocab[i] for i in ids)


@pytest.fixture(scope="module")
def hostile_cap():
    """A tiny random Llama reading the hostile strings as its tokens, its model name and provenance
    what a crafted capture file or a model folder's name would say."""
    model = attnviz.testing.tiny_model("llama")
    cap = attnviz.capture(model, SEP.join(HOSTILE), HostileTokenizer())
    cap.model["name"] = NAME
    cap.model["provenance"] = {f"field {i} {s}": s for i, s in enumerate(HOSTILE)} | {NAME: NAME}
    return cap


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (selenium) with alert/confirm/prompt trapped before any page script runs and
    the performance log on (every request the page makes)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    chrome = shutil.which("chromium") or "/usr/bin/chromium"
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not (Path(chrome).exists() and Path(driver_path).exists()):
        pytest.skip("needs Chromium and chromedriver (/usr/bin/chromium, /usr/bin/chromedriver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_script_timeout(60)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": TRAP})
    yield driver
    driver.quit()


def requests_of(driver) -> list[str]:
    """Every URL the page asked for since the last call (the performance log's Network.requestWillBeSent),
    less those the browser refused to send because of the page's policy (Network.loadingFailed, blocked
    for "csp")."""
    urls, refused = {}, set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
        elif message["method"] == "Network.loadingFailed" and params.get("blockedReason") == "csp":
            refused.add(params["requestId"])
    return [url for rid, url in urls.items() if rid not in refused]


def open_page(driver, path: Path, plots: list[str], *, report: bool = False, settle: float = 1.0) -> dict:
    """Open ``path`` from disk; wait until each of ``plots`` (element ids; the report: its maps) is drawn.
    What the page did: its dialogs, requests, policy violations, text and injected markup."""
    requests_of(driver)  # drop what earlier pages logged
    driver.get("about:blank")
    driver.get(path.as_uri())
    if report:
        assert driver.execute_async_script(READY) is True, "the report's maps were not drawn"
    deadline = time.time() + 30
    missing = plots
    while missing:
        missing = [p for p in plots if not driver.execute_script(f"return !!document.querySelector('{p} .main-svg')")]
        if missing and time.time() > deadline:
            break
        time.sleep(0.2)
    time.sleep(settle)  # an image's error event, a late fetch
    return {
        "alerts": driver.execute_script("return window.__alerts"),
        "violations": driver.execute_script("return window.__violations"),
        "requests": requests_of(driver),
        "text": driver.execute_script("return document.body.textContent"),
        "injected": driver.execute_script(INJECTED),
        "not_drawn": missing,
        "console": [e for e in driver.get_log("browser") if e["level"] == "SEVERE"],
    }


def assert_safe(seen: dict, shown: list[str]) -> None:
    assert seen["alerts"] == [], seen["alerts"]
    assert all(u.startswith(("file:", "data:", "blob:")) for u in seen["requests"]), seen["requests"]
    assert seen["injected"] == [], seen["injected"]
    assert seen["violations"] == [], seen["violations"]  # the page's own scripts and styles fit its policy
    assert seen["console"] == [], seen["console"]
    assert seen["not_drawn"] == [], f"not drawn: {seen['not_drawn']}"
    for s in shown:
        assert s in seen["text"], f"{s!r} not shown as text"


# ---------------------------------------------------------------- the helpers themselves (no browser)
@pytest.mark.parametrize("s", [*HOSTILE, NAME])
def test_script_json_keeps_the_value_and_nothing_that_ends_or_bends_a_script(s):
    data = {"k" + s: [s, {"x": s}]}
    text = script_json(data)
    assert json.loads(text) == data
    assert not any(c in text for c in "<>&\u2028\u2029")
    assert escape_html(s).count("<") == 0 and escape_html(s).count('"') == 0 and escape_html(s).count("'") == 0


def test_the_policy_fetches_nothing_and_runs_only_the_named_scripts():
    policy = content_security_policy(["alert(1)"])
    assert policy.startswith("default-src 'none'; ") and "connect-src" not in policy and "unsafe-eval" not in policy
    assert "'sha256-" in policy and "img-src data: blob:" in policy and "font-src data:" in policy
    assert "script-src 'none'" in content_security_policy()
    head = page_head(NAME)
    assert head.index('http-equiv="Content-Security-Policy"') < head.index("<title>") and "<img" not in head


def test_a_page_written_goes_through_attnviz_files(tmp_path):
    """write_page writes atomically: a folder given as the file is a FileWriteError, the old page kept."""
    (tmp_path / "folder.html").mkdir()
    with pytest.raises(FileWriteError, match="it is a folder"):
        write_page("<p>x</p>", tmp_path / "folder.html")
    page = write_page("<p>old</p>", tmp_path / "p.html")
    assert page.read_text() == "<p>old</p>" and not list(tmp_path.glob(".*attnviz-tmp"))


def test_an_image_written_goes_through_attnviz_files(tmp_path, monkeypatch):
    from attnviz.views import export

    monkeypatch.setattr(export, "to_image", lambda *a, **k: b"\x89PNG fake")
    fig = figures.message_figure("x")
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(FileWriteError, match="it is a folder"):
        figures.write_image(fig, tmp_path / "folder.png")
    assert figures.write_image(fig, tmp_path / "f.png").read_bytes() == b"\x89PNG fake"


# ---------------------------------------------------------------- the pages, opened in Chromium
@pytest.mark.browser
def test_the_report_of_a_hostile_capture_shows_every_string_as_text(browser, hostile_cap, tmp_path):
    path = hostile_cap.report(tmp_path / "report.html")
    seen = open_page(browser, path, ["#av-heatmap", "#av-row", "#av-headview", "#av-model"], report=True)
    assert_safe(seen, [NAME, *HOSTILE[:4], "{{7*7}} ' \" ` ${x}"])
    # the tokens reached the page's selectors (its own script fills them with textContent)
    options = browser.execute_script("return [...document.getElementById('av-query').options].map(o => o.text)")
    assert any(HOSTILE[3] in o for o in options) and any(HOSTILE[2] in o for o in options)


@pytest.mark.browser
def test_a_figures_page_of_a_hostile_capture(browser, hostile_cap, tmp_path):
    figs = [figures.heatmap(hostile_cap, 1, 0), figures.query_row(hostile_cap, 1, 0, query=2)]
    path = figures.to_html(figs, tmp_path / "figs.html", title=NAME, provenance=hostile_cap.model["provenance"])
    seen = open_page(browser, path, ["#attnviz-figure-0", "#attnviz-figure-1"])
    assert_safe(seen, [NAME, *HOSTILE[:4]])
    data = browser.execute_script("return JSON.parse(document.getElementById('attnviz-provenance').textContent)")
    assert data == hostile_cap.model["provenance"]


@pytest.mark.browser
def test_the_atlas_page_of_hostile_examples(browser, tmp_path):
    """An atlas' examples are a corpus' text, its part a model's: both hostile here."""
    import pandas as pd

    atlas = pd.DataFrame(
        {
            "part": [NAME, NAME],
            "layer": [0, 0],
            "head": [0, 1],
            "roles": ["broad", ""],
            "broad": [0.8, 0.1],
            "broad_example": [HOSTILE[0], HOSTILE[3]],
        }
    )
    path = tmp_path / "atlas.html"
    figures.atlas_page(atlas, path, title=NAME)
    seen = open_page(browser, path, ["#attnviz-atlas-0"])
    assert_safe(seen, [NAME, HOSTILE[0], HOSTILE[3]])


@pytest.mark.browser
def test_the_notebook_html_of_a_capture_a_ranking_and_a_probe_set(browser, hostile_cap, tmp_path):
    """The fragments Jupyter shows carry no policy of their own (the notebook's page is not attnviz's):
    here escaping alone keeps them safe, so they are opened without one."""
    from attnviz.analysis.coref import rank_heads
    from attnviz.analysis.probe_result import ProbeResult

    ranking = rank_heads(hostile_cap, 5, [0, 1])
    ranking.model = NAME
    ranking.notes.append(HOSTILE[1])
    picks = np.zeros((3, 2, 4), dtype=np.int16)
    probes = ProbeResult.from_picks(
        picks,
        np.zeros(3, dtype=np.int16),
        np.ones(3, dtype=np.int16),
        np.zeros(3, dtype=np.int16),
        np.full(3, 2, dtype=np.int16),
        [{"id": s, "text": s, "pronoun": s} for s in HOSTILE[:3]],
        model=NAME,
        skipped=[HOSTILE[3]],
    )
    fragments = [hostile_cap._repr_html_(), ranking._repr_html_(), probes._repr_html_()]
    path = tmp_path / "notebook.html"
    path.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>' + "".join(fragments) + "</body></html>",
        encoding="utf-8",
    )
    seen = open_page(browser, path, [])
    assert_safe(seen, [NAME, HOSTILE[0], HOSTILE[3]])


@pytest.mark.browser
def test_the_policy_stops_a_script_that_escaping_missed(browser, hostile_cap, tmp_path):
    """Were a string ever put in unescaped, the page's policy still runs only its own scripts and fetches
    nothing: an ``onerror`` handler, an injected ``<script>`` and an image from another host are refused."""
    page = figures.report(hostile_cap)
    planted = f'<img src="{ATTACKER}" onerror="alert(5)"><script>alert(6)</script><img src=x onerror="alert(7)">'
    path = tmp_path / "planted.html"
    path.write_text(page.replace("<body>", "<body>" + planted, 1), encoding="utf-8")
    seen = open_page(browser, path, ["#av-heatmap", "#av-model"], report=True)
    assert seen["alerts"] == [], seen["alerts"]
    assert all(u.startswith(("file:", "data:", "blob:")) for u in seen["requests"]), seen["requests"]
    assert seen["violations"], "the planted script and image were not refused by a policy"
    assert seen["not_drawn"] == []  # the page's own scripts still ran
