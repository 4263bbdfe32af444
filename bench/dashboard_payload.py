"""What the dashboard sends and how long its server takes, per view, at n = 512, 2,048 and 8,192 tokens
(issue #10's goals: ≤ 2 MB per response at every n; a 512 × 512 zoom window at n = 8,192 in ≤ 200 ms of
server time; a head switch at n = 512 in ≤ 100 ms; rollout shown ≤ 2 s after opening its tab at n = 512;
issue #19's: with ``--heavy-up-to 8192``, the four heavy views at n = 8,192 ≤ 90 s after the capture was shown).

The real app (``create_app``, SmolLM2, BOS on as the page opens) is served by Flask in a thread and driven
by headless Chromium as a user drives it: type a text of n tokens (BOS included) and run it — past 1,024
tokens that is the page's background capture job, with its progress polls — then the heatmap, another
head of the same layer, a 512 × 512 zoom (a drag on the overview; at n = 512 the map is exact already
and plotly zooms on its own), the model view, the head view, head statistics, rollout, *Recomputed vs
model* and the AttentionLab. Past 1,024 tokens the model view, head statistics, rollout and the
validation read one fused pass over every head, computed by a background job (the page polls its
progress): the first of them to open waits for the pass ("shown s"), the others then open at once. A WSGI middleware around the Flask app (``bench/wsgi_recorder.py``, which
``tests/test_dashboard_payload_bounds.py`` uses too) records every ``/_dash-update-component`` request:
its outputs, the bytes of the JSON it answered (what the browser receives; the app does not compress)
and the server's seconds from the request to the last byte of the response. Each step's row is the
response carrying that view's figure; "all" sums every response of the step (other callbacks that fire
too, and 204s of hidden views). "shown s" is the wall time from the action until the view's figure is on the
page (plotly has its new layout), "browser s" until the page is quiet (no request for 1.5 s more).

    .venv/bin/python bench/dashboard_payload.py                 # n = 512, 2048, 8192 (~11 min here; 8,192 needs ~5 GiB)
    .venv/bin/python bench/dashboard_payload.py --sizes 512     # one size
    .venv/bin/python bench/dashboard_payload.py --sizes 512,4096,8192 --units tokens,words --heavy-up-to 8192

``--units words`` (issue #56's goals) runs each size again with the page in words: the run, then the model
view opened — its fused job (the word thumbnails pooled from the same chunks as the tokens') starts —,
at once the AttentionLab's row and the heatmap while that job runs ("… (job running)": ≤ 10 s each), then
the model view drawn in words (≤ 90 s after the capture at 4,096 tokens, ≤ 180 s at 8,192) and the other
heavy views, which read the same pass.

The model view, head statistics, rollout and the validation are run up to ``--heavy-up-to`` tokens (2,048):
beyond it their pass (minutes, growing as n²) would dominate the run; their rows then give the n²
extrapolation. ``--heavy-up-to 8192`` runs them at every size.

Exits 1 when a goal is missed. Needs Debian's chromium + chromium-driver (as the browser tests do).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wsgi_recorder import Recorder  # noqa: E402 - bench/ is the script's folder: on the path

MB2 = 2_000_000
ZOOM_GOAL_S = 0.200  # a 512 × 512 window at n = 8,192
HEAVY_GOAL_S = 90.0  # issue #19: the four heavy views at n = 8,192, from the capture on the page
ROLLOUT_GOAL_S = 2.0  # from opening the Rollout tab until its figure is on the page, at n = 512
WORDS_GOAL_S = {4096: 90.0, 8192: 180.0}  # issue #56: the model view in words, from the capture on the page
BESIDE_JOB_GOAL_S = 10.0  # issue #56: another view's figure while a background job runs
SWITCH_GOAL_S = 0.100  # a head switch at n = 512
WINDOW = 512
STEP_TIMEOUT = 240.0
POLL_MAX = 0.5  # the longest pause between two looks at the page while a step waits (Page.wait)


# ---------------------------------------------------------------- the texts
def text_of(tokenizer, n: int, first: int = 1) -> str:
    """A text of exactly ``n`` SmolLM2 tokens (the page adds the BOS: n + 1 in all); ``first``: its first
    paragraph's number (another text of the same length: the page captures it anew, nothing cached)."""
    base = " ".join(
        f"In paragraph {i}, the cat chased the mouse because it was hungry, and the mouse hid in the box "
        f"because it was small. The trophy of chapter {i} did not fit into the suitcase because it was too big."
        for i in range(first, first + 399)
    )
    ids = tokenizer(base)["input_ids"]
    assert len(ids) > n, len(ids)
    for cut in range(n, n - 20, -1):  # decoding and re-encoding may merge two tokens at the cut
        text = tokenizer.decode(ids[:cut])
        if len(tokenizer(text)["input_ids"]) == n:
            return text
        text = tokenizer.decode(ids[: cut + 1])
        if len(tokenizer(text)["input_ids"]) == n:
            return text
    raise RuntimeError(f"no text of exactly {n} tokens")


# ---------------------------------------------------------------- the browser side
class Page:
    def __init__(self, driver, recorder: Recorder) -> None:
        self.driver, self.rec = driver, recorder

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def text(self, element_id: str) -> str:
        return self.driver.find_element("id", element_id).text

    def wait(self, condition, timeout: float = STEP_TIMEOUT, what: str = "", poll: float = 0.2) -> None:
        """Ask ``condition()`` every ``poll`` s, then, past a second, every 1 % of the time waited (at most
        every ``POLL_MAX`` s): each question is a script run in Chromium through the driver, in the server's
        own process, so asking 50 times a second through a minute's job took ~0.4 of a core from it (what
        the page is measured for), for a precision the long wait does not need."""
        start = time.time()
        deadline = start + timeout
        while time.time() < deadline:
            try:
                if condition():
                    return
            except Exception:  # noqa: BLE001 - an element re-rendered while read
                pass
            waited = time.time() - start
            time.sleep(poll if waited < 1.0 else min(POLL_MAX, max(poll, waited / 100)))
        raise TimeoutError(what or "the page did not answer in time")

    def idle(self, quiet: float = 1.5, timeout: float = STEP_TIMEOUT) -> None:
        self.wait(lambda: self.rec.quiet_for(quiet), timeout, "the page kept calling the server")

    def set_text(self, text: str) -> None:
        from attnviz.dashboard.ids import ID

        self.js(
            "const el = document.getElementById(arguments[0]);"
            "Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, 'value').set.call(el, arguments[1]);"
            "el.dispatchEvent(new Event('input', {bubbles: true}));",
            ID.text,
            text,
        )

    def open_tab(self, label: str) -> None:
        for tab in self.driver.find_elements("css selector", ".tab"):
            if tab.text.strip() == label:
                tab.click()
                return
        raise RuntimeError(f"no tab {label!r}")

    def choose(self, element_id: str, index: int) -> None:
        dropdown = self.driver.find_element("id", element_id)
        self.js("arguments[0].scrollIntoView({block: 'center'});", dropdown)
        dropdown.click()
        self.wait(lambda: self.driver.find_elements("css selector", ".dash-dropdown-option"), 10)
        option = self.driver.find_elements("css selector", ".dash-dropdown-option")[index]
        self.js("arguments[0].click();", option)

    def graph(self, graph_id: str, script: str):
        return self.js(f"const gd = document.querySelector('#{graph_id} .js-plotly-plot'); {script}")

    def title(self, graph_id: str) -> str:
        return self.graph(graph_id, "return gd && gd.layout.title ? gd.layout.title.text : '';") or ""


def step(page: Page, label: str, output: str, action, *, done=None, quiet: float | None = 1.5) -> dict:
    """Do ``action``, wait until the page is quiet (and ``done()``), and sum up the responses since.
    ``quiet=None``: not waiting for quiet (a background job's bar polls the server until it ends)."""
    mark = len(page.rec.records)
    t0 = time.time()
    error = ""
    print(f"  {time.strftime('%H:%M:%S')} {label} …", file=sys.stderr, flush=True)
    shown = float("nan")
    try:
        action()
        if done is not None:
            page.wait(done, STEP_TIMEOUT, f"{label}: not shown", poll=0.02)
            shown = time.time() - t0
        if quiet is not None:
            page.idle(quiet)
    except Exception as err:  # noqa: BLE001 - a step that fails is reported, the others still run
        error = f"{type(err).__name__}: {err}"
    wall = time.time() - t0
    records = page.rec.records[mark:]
    mine = [r for r in records if output in r["output"] and r["status"] == "200"]
    main = max(mine, key=lambda r: r["bytes"]) if mine else None
    row = {
        "view": label,
        "output": output,
        "bytes": main["bytes"] if main else None,
        "seconds": main["seconds"] if main else None,
        "responses": len(records),
        "all_bytes": sum(r["bytes"] for r in records),
        "max_bytes": max((r["bytes"] for r in records), default=0),
        "max_output": max(records, key=lambda r: r["bytes"])["output"] if records else "",
        "wall": wall,
        "shown": shown,
        "started": t0,
        "error": error or ("" if main else "no response carried it"),
    }
    return row


HEAVY = ("model view", "head statistics", "rollout", "recomputed vs model")  # n² on the server: one fused pass


def skipped(label: str, n: int, heavy_up_to: int, before: list[dict] | None, at: int | None) -> dict:
    """The row of a heavy view not run at ``n``: its cost scaled as n² from the largest size measured."""
    note = f"skipped: n > --heavy-up-to {heavy_up_to}"
    row = {"view": label, "output": "", "bytes": None, "seconds": None, "responses": 0, "all_bytes": 0}
    row.update({"max_bytes": 0, "max_output": "", "wall": float("nan"), "error": ""})
    old = next((r for r in before or [] if r["view"] == label and r["seconds"] is not None), None)
    if old is not None:
        scale = (n / at) ** 2
        grows = label == "rollout"  # the model view and statistics ship a fixed grid; rollout ships n × n
        size = fmt_bytes(old["bytes"] * scale) if grows else f"~{fmt_bytes(old['bytes'])}"
        note += f" (as n² from n = {at:,}: ~{old['seconds'] * scale / 60:,.0f} min, {size})"
    row["note"] = note
    return row


def bench_size(
    page: Page,
    n: int,
    text: str,
    views: dict,
    heavy_up_to: int,
    before: list[dict] | None,
    at: int | None,
    words: bool = False,
) -> list[dict]:
    from attnviz.dashboard.ids import AID, ID

    rows = []
    status = f"smollm2: {n} tokens"
    page.open_tab(views["heatmap"])
    page.idle()
    units = page.driver.find_elements("css selector", f"#{ID.words} input")
    if units[1 if words else 0].get_attribute("checked") is None:
        units[1 if words else 0].click()
        page.idle()

    def run():
        page.set_text(text)
        page.driver.find_element("id", ID.run).click()

    shown = "overview of" if n > WINDOW else "word × word" if words else "token × token"
    row = step(
        page,
        "run (capture → status)",
        f"{ID.status}.children",
        run,
        done=lambda: status in page.text(ID.status) and shown in page.title(ID.heatmap),
        quiet=2.0,
    )
    rows.append(row)
    # the heatmap came with the run: its response is among the run's
    mark = page.rec.records
    heat = [r for r in mark if f"{ID.heatmap}.figure" in r["output"] and r["status"] == "200"][-1:]
    rows.append(
        {
            "view": "heatmap / overview",
            "output": f"{ID.heatmap}.figure",
            "bytes": heat[0]["bytes"] if heat else None,
            "seconds": heat[0]["seconds"] if heat else None,
            "responses": 1,
            "all_bytes": heat[0]["bytes"] if heat else 0,
            "max_bytes": heat[0]["bytes"] if heat else 0,
            "max_output": "",
            "wall": float("nan"),
            "error": "" if heat else "no heatmap response",
        }
    )
    layer, head = (int(x) for x in page.title(ID.heatmap).split(" — ")[0].split()[0].lstrip("L").split("·H"))
    other = (head + 1) % 9
    rows.append(
        step(
            page,
            f"head switch (L{layer}·H{head} → H{other})",
            f"{ID.heatmap}.figure",
            lambda: page.choose(ID.head, other),
            done=lambda: f"L{layer}·H{other}" in page.title(ID.heatmap),
        )
    )
    # a 512 × 512 zoom: the last 512 queries × the first 512 keys (all allowed by the causal mask)
    if n > WINDOW:
        width = int(page.graph(ID.heatmap, "return gd.data[0].y[1];").split("–")[0])  # block 1 starts at its width
        last = math.ceil(n / width) - 1  # the last block; the window's rows: the last 512 tokens
        r0 = (n - WINDOW) // width
        k1 = WINDOW // width - 1
        zoom = (  # a range over blocks a..b is [a - 0.4, b + 0.4], as a drag gives (y reversed)
            f"Plotly.relayout(gd, {{'xaxis.range[0]': -0.4, 'xaxis.range[1]': {k1 + 0.4},"
            f" 'yaxis.range[0]': {last + 0.4}, 'yaxis.range[1]': {r0 - 0.4}}});"
        )
        label = f"zoom 512 × 512 (queries {r0 * width}–{n - 1})"
        done = lambda: "exact weights" in page.title(ID.heatmap)  # noqa: E731
    else:
        zoom = (
            "Plotly.relayout(gd, {'xaxis.range[0]': -0.5, 'xaxis.range[1]': 511.5,"
            " 'yaxis.range[0]': 511.5, 'yaxis.range[1]': -0.5});"
        )
        label = "zoom 512 × 512 (the exact map: no request)"
        done = None
    rows.append(step(page, label, f"{ID.heatmap}.figure", lambda: page.graph(ID.heatmap, zoom), done=done))
    if n <= WINDOW:
        rows[-1]["error"] = ""
    views_in_order = [  # (label, output, tab, finished, grows as n²)
        ("model view", f"{ID.model_view}.figure", "model", lambda: page.title(ID.model_view), True),
        ("head view", f"{ID.head_view}.figure", "head", lambda: "lines" in page.title(ID.head_view), False),
        ("head statistics", f"{AID.stats_map}.figure", "stats", lambda: page.title(AID.stats_map), True),
        ("rollout", f"{AID.rollout_graph}.figure", "rollout", lambda: page.title(AID.rollout_graph), True),
        (
            "recomputed vs model",
            f"{ID.validation_map}.figure",
            "validation",
            lambda: page.title(ID.validation_map),
            True,
        ),
    ]
    if words and n <= heavy_up_to:  # the model view's job started, then the other views while it runs
        job_bar = lambda: page.driver.find_element("id", ID.view_job).is_displayed() or page.title(ID.model_view)  # noqa: E731
        rows.append(
            step(
                page,
                "model view: its job starts",
                f"{ID.model_view}.figure",
                lambda: page.open_tab(views["model"]),
                done=job_bar,
                quiet=None,
            )
        )
        rows.append(
            step(
                page,
                "AttentionLab row (job running)",
                f"{ID.lab_graph}.figure",
                lambda: page.open_tab(views["lab"]),
                done=lambda: "query" in page.text(ID.lab_stats),
                quiet=None,
            )
        )
        third = (other + 1) % 9

        def switch() -> None:
            page.open_tab(views["heatmap"])
            page.choose(ID.head, third)

        rows.append(
            step(
                page,
                f"head switch to H{third} (job running)",
                f"{ID.heatmap}.figure",
                switch,
                done=lambda: f"L{layer}·H{third}" in page.title(ID.heatmap),
                quiet=None,
            )
        )
    for label, output, tab, finished, heavy in views_in_order:
        if heavy and n > heavy_up_to:
            rows.append(skipped(label, n, heavy_up_to, before, at))
        else:
            rows.append(step(page, label, output, lambda tab=tab: page.open_tab(views[tab]), done=finished))
    rows.append(
        step(
            page,
            "AttentionLab row",
            f"{ID.lab_graph}.figure",
            lambda: page.open_tab(views["lab"]),
            done=lambda: "query" in page.text(ID.lab_stats),
        )
    )
    lab = page.rec.records
    chips = [r for r in lab if f"{ID.lab_tokens}.children" in r["output"] and r["status"] == "200"][-1:]
    if chips:
        rows.append(
            {
                "view": "AttentionLab token chips",
                "output": f"{ID.lab_tokens}.children",
                "bytes": chips[0]["bytes"],
                "seconds": chips[0]["seconds"],
                "responses": 1,
                "all_bytes": chips[0]["bytes"],
                "max_bytes": chips[0]["bytes"],
                "max_output": "",
                "wall": float("nan"),
                "error": "",
            }
        )
    page.open_tab(views["heatmap"])
    page.idle()
    return rows


def fmt_bytes(b) -> str:
    return "—" if b is None else f"{b / 1e6:,.2f} MB" if b >= 100_000 else f"{b / 1e3:,.1f} kB"


def fmt_s(s) -> str:
    return "—" if s is None or s != s else f"{s * 1000:,.0f} ms" if s < 10 else f"{s:,.1f} s"


def after_capture(rows: list[dict]) -> float | None:
    """Seconds from the capture shown on the page (the run step's status and heatmap) until the first heavy
    view was shown — it waits for the fused pass, which the other three then read at once — or None where
    a heavy view was not run (or a step failed)."""
    run = next((r for r in rows if r["view"].startswith("run")), None)
    first = next((r for r in rows if r["view"] in HEAVY and r.get("started") is not None), None)
    if run is None or first is None or run["shown"] != run["shown"] or first["shown"] != first["shown"]:
        return None
    return first["started"] + first["shown"] - (run["started"] + run["shown"])


def print_table(n: int, rows: list[dict], unit: str = "tokens") -> None:
    print(f"\nn = {n:,} tokens (BOS included), the page in {unit}")
    print(f"{'view':44} {'payload':>10} {'server':>9} {'shown s':>8} {'browser s':>9} {'all responses':>22}  note")
    for r in rows:
        wall = "" if r["wall"] != r["wall"] else f"{r['wall']:.1f}"
        shown = "" if r.get("shown", float("nan")) != r.get("shown", float("nan")) else f"{r['shown']:.2f}"
        every = f"{r['responses']} · {fmt_bytes(r['all_bytes'])}"
        print(
            f"{r['view']:44} {fmt_bytes(r['bytes']):>10} {fmt_s(r['seconds']):>9} {shown:>8} {wall:>9} {every:>22}  "
            f"{r['error'] or r.get('note', '')}"
        )
    after = after_capture(rows)
    if after is not None:
        print(
            f"the heavy views' fused pass: shown {after:.1f} s after the capture was (the first heavy view opened then)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="512,2048,8192", help="comma-separated token counts (BOS included)")
    parser.add_argument("--port", type=int, default=8093)
    parser.add_argument(
        "--heavy-up-to",
        type=int,
        default=2048,
        help="run the model view, head statistics and rollout only up to this n (at 2,048 they take 0.5–1.5 min "
        "each here and grow as n²; rollout's n × n payload would reach ~360 MB at 8,192)",
    )
    parser.add_argument("--json", help="also write every row and every response here")
    parser.add_argument(
        "--job-nice",
        type=int,
        default=None,
        help="the background jobs' nice (default: the dashboard's, 19 — the lowest priority, so that the page's "
        "requests come first). On a machine shared with other CPU-bound work a job at 19 gets almost nothing: "
        "0 measures the job's own time there (the other sessions then share the cores with it fairly)",
    )
    parser.add_argument(
        "--units", default="tokens", help="comma-separated: tokens, words (each size run once per unit, the page in it)"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    units = [u.strip() for u in args.units.split(",") if u.strip()]
    if not units or set(units) - {"tokens", "words"}:
        parser.error(f"--units takes tokens and/or words, got {args.units!r}")

    from attnviz.dashboard import create_app, jobs
    from attnviz.dashboard.ids import ID
    from attnviz.dashboard.layout import VIEWS
    from selenium import webdriver

    import attnviz

    if args.job_nice is not None:
        jobs.JOB_NICE = args.job_nice
    print(f"background jobs at nice {jobs.JOB_NICE}; load average {os.getloadavg()}", flush=True)
    _, tokenizer = attnviz.load_model("smollm2")
    # the page adds SmolLM2's BOS; in words another text of the same length (a text run twice is not captured again)
    texts = {(n, unit): text_of(tokenizer, n - 1, 1 if unit == "tokens" else 1000) for n in sizes for unit in units}
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    app = create_app({"smollm2": "SmolLM2-135M"}, default_model="smollm2", cache_bytes=6 << 30)
    recorder = Recorder(app.server.wsgi_app)
    app.server.wsgi_app = recorder
    threading.Thread(target=lambda: app.run(port=args.port, debug=False), daemon=True).start()
    options = webdriver.ChromeOptions()
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options)
    driver.set_script_timeout(120)
    page = Page(driver, recorder)
    results = {}
    t_start = time.time()
    try:
        driver.get(f"http://127.0.0.1:{args.port}/")
        page.wait(lambda: "tokens" in page.text(ID.status), 180, "the page did not open")
        page.idle()
        views = {key: label for key, label in VIEWS}
        for n in sizes:
            for unit in units:
                measured = [m for m, u in results if m <= args.heavy_up_to and u == unit]
                at = max(measured) if measured else None
                before = results.get((at, unit))
                rows = bench_size(page, n, texts[(n, unit)], views, args.heavy_up_to, before, at, words=unit == "words")
                results[(n, unit)] = rows
                print_table(n, rows, unit)
    finally:
        driver.quit()
    encodings = {r["encoding"] for r in recorder.records}
    print(
        f"\n(responses as sent: uncompressed JSON{'; encodings seen: ' + str(encodings) if encodings - {''} else ''};"
    )
    print(f" {len(recorder.records)} callback requests, {time.time() - t_start:.0f} s in all)")

    # the goals
    missed, lines = [], []
    big = [(n, r["view"], r["max_output"], r["max_bytes"]) for (n, _), rows in results.items() for r in rows]
    over = [b for b in big if b[3] > MB2]
    largest = max(big, key=lambda b: b[3]) if big else None
    if largest:
        ok = not over
        lines.append(
            f"≤ 2 MB per response: {'met' if ok else 'MISSED'} (largest {fmt_bytes(largest[3])}: "
            f"{largest[2][:50]} at n = {largest[0]:,}, step '{largest[1]}')"
        )
        missed += [f"{o[2][:50]} at n = {o[0]:,}: {fmt_bytes(o[3])}" for o in over]
    tokens = {n: rows for (n, unit), rows in results.items() if unit == "tokens"}
    in_words = {n: rows for (n, unit), rows in results.items() if unit == "words"}
    if 8192 in tokens:
        zoom = next(r for r in tokens[8192] if r["view"].startswith("zoom"))
        ok = zoom["seconds"] is not None and zoom["seconds"] <= ZOOM_GOAL_S
        lines.append(f"zoom 512 × 512 at n = 8,192 ≤ 200 ms: {'met' if ok else 'MISSED'} ({fmt_s(zoom['seconds'])})")
        missed += [] if ok else ["zoom at 8,192"]
    after = after_capture(tokens[8192]) if 8192 in tokens else None  # None: the heavy views not run there
    if after is not None:
        ok = after <= HEAVY_GOAL_S
        lines.append(
            f"the four heavy views at n = 8,192 ≤ {HEAVY_GOAL_S:.0f} s after the capture: "
            f"{'met' if ok else 'MISSED'} ({after:.1f} s)"
        )
        missed += [] if ok else ["the heavy views at 8,192"]
    for n, goal in WORDS_GOAL_S.items():  # issue #56: the model view in words, after the capture
        after = after_capture(in_words[n]) if n in in_words else None
        if after is not None:
            ok = after <= goal
            lines.append(
                f"the model view in words at n = {n:,} ≤ {goal:.0f} s after the capture: "
                f"{'met' if ok else 'MISSED'} ({after:.1f} s)"
            )
            missed += [] if ok else [f"the model view in words at {n:,}"]
    beside = [(n, r) for n, rows in in_words.items() for r in rows if r["view"].endswith("(job running)")]
    for n, r in beside:
        ok = r["shown"] == r["shown"] and r["shown"] <= BESIDE_JOB_GOAL_S
        lines.append(
            f"{r['view']} at n = {n:,} ≤ {BESIDE_JOB_GOAL_S:.0f} s: {'met' if ok else 'MISSED'} ({r['shown']:.2f} s)"
        )
        missed += [] if ok else [f"{r['view']} at {n:,}"]
    for n_unit in [(512, "tokens"), (512, "words")]:
        roll = next((r for r in results.get(n_unit, []) if r["view"] == "rollout"), None)
        if roll is not None:
            ok = roll["shown"] == roll["shown"] and roll["shown"] <= ROLLOUT_GOAL_S
            lines.append(
                f"rollout shown at n = 512 in {n_unit[1]} ≤ 2 s: {'met' if ok else 'MISSED'} ({roll['shown']:.2f} s)"
            )
            missed += [] if ok else [f"rollout at 512 in {n_unit[1]}"]
    if 512 in tokens:
        switch = next(r for r in tokens[512] if r["view"].startswith("head switch"))
        ok = switch["seconds"] is not None and switch["seconds"] <= SWITCH_GOAL_S
        lines.append(f"head switch at n = 512 ≤ 100 ms: {'met' if ok else 'MISSED'} ({fmt_s(switch['seconds'])})")
        missed += [] if ok else ["head switch at 512"]
    failed = [
        f"n = {n:,} in {unit} {r['view']}: {r['error']}"
        for (n, unit), rows in results.items()
        for r in rows
        if r["error"]
    ]
    print("\ngoals: " + "; ".join(lines))
    for line in failed:
        print("step failed:", line)
    if args.json:
        rows_out = {f"{n} {unit}": rows for (n, unit), rows in results.items()}
        Path(args.json).write_text(json.dumps({"rows": rows_out, "responses": recorder.records}, indent=1))
    return 1 if missed or failed else 0


if __name__ == "__main__":
    sys.exit(main())
