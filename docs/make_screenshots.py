"""Regenerate the README's screenshots: every dashboard view on the ~500-token example, and the long-text,
Compare and edit pictures.

.venv/bin/python docs/make_screenshots.py                      # all (~6 min; the 8k capture needs ~5 GiB)
.venv/bin/python docs/make_screenshots.py --only edits compare # some: see SHOTS

Needs Debian's chromium + chromium-driver. The window is 1280 px wide, and every picture is taken with no
dropdown or tooltip open (``close_menus``: Escape, then a click outside; a menu still open fails the run). The
pictures (all SmolLM2, the page's BOS on):

- lab-zh, coref-zh: the opening Chinese example in the AttentionLab and Coreference views.
- lab-zh-moved: the AttentionLab on that example, words, L13·H8, 它's row with Show: "moved" — each
  key's share of what the head writes into 它 beside its weight, and the lines that say it.
- view-edits: that example, words, L13·H8, the key 小猫 knocked out of 它's row and "Apply to the model"
  with the continuation 好 (next-token bars before/after, the edited row).
- view-importance: Coreference's "Map head importance" for 好 (a background job, ~30–120 s).
- generation-step-slider: "The cat sat on the mat because" continued by 20 new tokens (greedy, no BOS, as
  the generation guide runs it), the AttentionLab's step slider at step 3 (the model writes 'cat'), L15·H3.
- view-compare: the Winograd pair (too big / too small): the page proposes the partner, A, B and A − B.
- view-<key>: every view on the ~500-token example (layout.LONG_EXAMPLE).
- view-head-512: the head view at 512 tokens (it opens on the top-k rule).
- view-overview-8k, view-overview-zoom: 8,000 tokens (this project's README, then its guides) captured in the
  background, the pooled overview, then a drag's 512 × 512 window of exact weights on the diagonal.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.keys import Keys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnviz.dashboard import create_app  # noqa: E402
from attnviz.dashboard.ids import CID, EID, GID, OID  # noqa: E402
from attnviz.dashboard.layout import ID, LONG_EXAMPLE, VIEWS  # noqa: E402

import attnviz  # noqa: E402

OUT = Path(__file__).parent
ROOT = OUT.parent
SHOTS = [
    "lab-zh",
    "lab-zh-moved",
    "coref-zh",
    "edits",
    "importance",
    "compare",
    "generation",
    "views",
    "head-512",
    "overview-8k",
]
ZH = "我家的小猫很可爱，它很好动。"
BIG = "The trophy doesn't fit in the suitcase because it is too big."
GEN = "The cat sat on the mat because"  # docs/guides/generation.md's prompt
LONG_N = 8000  # tokens, the BOS included
#: the 8k text: the README, then the guides (the README alone is shorter than 8,000 tokens)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]


def main(port: int = 8077) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the README's screenshots.")
    parser.add_argument("--only", nargs="+", choices=SHOTS, default=SHOTS)
    parser.add_argument("--port", type=int, default=port)
    args = parser.parse_args()
    port, only = args.port, set(args.only)
    app = create_app(default_model="smollm2")
    threading.Thread(target=lambda: app.run(port=port, debug=False), daemon=True).start()
    options = webdriver.ChromeOptions()
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,1100"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options)
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        wait(driver, lambda: "tokens" in driver.find_element("id", ID.status).text, 120)
        if "lab-zh" in only:  # a taller window: the row's lines on moved sit above the bars
            open_tab(driver, "AttentionLab")
            click_words(driver)
            time.sleep(6)
            save(driver, "lab-zh", height=1300)
        if "lab-zh-moved" in only:
            shoot_lab_moved(driver)
        if "coref-zh" in only:
            shoot(driver, "tab-coref", "coref-zh")
        if "edits" in only:
            shoot_edits(driver)
        if "importance" in only:
            shoot_importance(driver)
        if "compare" in only:
            shoot_compare(driver)
        if "generation" in only:
            shoot_generation(driver)
        if "views" in only:
            run(driver, LONG_EXAMPLE)
            print(driver.find_element("id", ID.status).text)
            for key, _ in VIEWS:
                if key != "compare":  # its picture is the Winograd pair ("compare" above)
                    shoot(driver, f"tab-{key}", f"view-{key}")
        if "head-512" in only:
            run(driver, text_of(512 - 1), "smollm2: 512 tokens")
            open_tab(driver, "Head view")
            wait(driver, lambda: "lines" in title(driver, ID.head_view), 120)
            print(title(driver, ID.head_view))
            scroll_to(driver, ID.heads_multi, offset=40)
            save(driver, "view-head-512", height=1500)
        if "overview-8k" in only:
            shoot_overview(driver)
    finally:
        driver.quit()


# ---------------------------------------------------------------- the new pictures
def lab_at_it(driver) -> None:
    """The AttentionLab on 它's row at L13·H8, in words, after a run of the Chinese example."""
    run(driver, ZH, "27 tokens")
    driver.find_elements("css selector", f"#{ID.words} input")[1].click()  # words
    choose(driver, ID.layer, 13)
    choose(driver, ID.head, 8)
    open_tab(driver, "AttentionLab")
    wait(driver, lambda: "query '它'" in driver.find_element("id", ID.lab_stats).text, 60)


def shoot_lab_moved(driver) -> None:
    """The AttentionLab showing moved: 它's row at L13·H8 (words), shares beside weights."""
    lab_at_it(driver)
    driver.find_elements("css selector", f"#{ID.measure} input")[1].click()  # Show: moved
    wait(driver, lambda: "moved (‖α·f(x)‖)" in title(driver, ID.lab_graph), 60)
    wait(driver, lambda: "of what L13·H8 writes" in driver.find_element("id", ID.lab_stats).text, 60)
    time.sleep(4)
    print(driver.find_element("id", ID.lab_stats).text)
    scroll_to(driver, ID.layer, offset=40)  # the Show control, the lines and the bars
    save(driver, "lab-zh-moved", height=1000)
    driver.find_elements("css selector", f"#{ID.measure} input")[0].click()  # back to the weights for the next
    wait(driver, lambda: "moved (‖α·f(x)‖)" not in title(driver, ID.lab_graph), 60)


def shoot_edits(driver) -> None:
    """The AttentionLab's "Apply to the model": 小猫 knocked out of 它's row at L13·H8, continuation 好."""
    lab_at_it(driver)
    words = attnviz.capture("smollm2", ZH, add_bos=True, layers=[0]).word_labels
    wait(driver, lambda: "none" in driver.find_element("id", EID.lab_knock_text).text, 30)
    click_point(driver, ID.lab_graph, words.index("小猫"))
    wait(driver, lambda: "none" not in driver.find_element("id", EID.lab_knock_text).text, 30)
    type_into(driver, EID.lab_continuation, "好")
    driver.find_element("id", EID.lab_apply).click()
    wait(driver, lambda: "next token" in driver.find_element("id", EID.lab_result).text, 180)
    print(driver.find_element("id", EID.lab_result).text)
    scroll_to(driver, ID.lab_stats, offset=10)
    save(driver, "view-edits", height=1450)


def shoot_importance(driver) -> None:
    """Coreference's head-importance map for the continuation 好 (a background job)."""
    run(driver, ZH, "27 tokens")
    open_tab(driver, "Coreference")
    wait(driver, lambda: "它" in driver.find_element("id", "coref-headline").text, 60)
    type_into(driver, EID.coref_continuation, "好")
    driver.find_element("id", EID.importance_run).click()
    t0 = time.time()
    wait(driver, lambda: "log P('好')" in driver.find_element("id", EID.importance_note).text, 400)
    print(f"importance map in {time.time() - t0:.0f} s:", driver.find_element("id", EID.importance_note).text)
    scroll_to(driver, EID.importance_run, offset=60)
    save(driver, "view-importance")


def shoot_compare(driver) -> None:
    """The Winograd pair: the page proposes B (too small) for A (too big)."""
    run(driver, BIG)
    open_tab(driver, "Compare")
    wait(driver, lambda: "too small" in driver.find_element("id", CID.text).get_attribute("value"), 30)
    driver.find_element("id", CID.run).click()
    wait(driver, lambda: "max |A − B|" in title(driver, CID.graph), 120)
    print(title(driver, CID.graph))
    scroll_to(driver, CID.text, offset=160)
    save(driver, "view-compare")


def shoot_generation(driver) -> None:
    """The AttentionLab's step slider replaying a generation: GEN continued by 20 new tokens, L15·H3, step 3,
    without the BOS (as the generation guide's script runs it); the BOS switched back on after."""
    bos = driver.find_element("css selector", f"#{ID.bos} input")
    if bos.is_selected():
        bos.click()
    run(driver, GEN, "generated", button=GID.generate, timeout=300)
    print(driver.find_element("id", ID.status).text)
    choose(driver, ID.layer, 15)
    choose(driver, ID.head, 3)
    open_tab(driver, "AttentionLab")
    wait(driver, lambda: driver.find_element("id", GID.step_box).is_displayed(), 60)
    handle = driver.find_element("css selector", f"#{GID.step} [role='slider']")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].focus();", handle)
    for _ in range(3):  # the keyboard moves the slider a step at a time, as a reader would
        handle.send_keys(Keys.ARROW_RIGHT)
        time.sleep(0.3)
    wait(driver, lambda: driver.find_element("id", GID.step_text).text.startswith("Step 3:"), 60)
    wait(driver, lambda: title(driver, GID.step_graph).startswith("Step 3 of"), 60)
    time.sleep(4)
    print(driver.find_element("id", GID.step_text).text)
    scroll_to(driver, GID.step_box, offset=40)
    save(driver, "generation-step-slider", height=1100)
    bos = driver.find_element("css selector", f"#{ID.bos} input")
    if not bos.is_selected():
        bos.click()


def shoot_overview(driver) -> None:
    """8,000 tokens in the background; a 512 × 512 window of exact weights on the diagonal (the page's opening
    head); then the overview of L13·H8."""
    run(driver, text_of(LONG_N - 1, DOCS), f"smollm2: {LONG_N} tokens", timeout=600)
    open_tab(driver, "Heatmap")
    wait(driver, lambda: f"overview of {LONG_N:,} × {LONG_N:,}" in title(driver, ID.heatmap), 240)
    time.sleep(4)
    width = int(graph(driver, ID.heatmap, "return gd.data[0].y[1];").split("–")[0])  # block 1 starts at its width
    r0, k0 = 4096 // width, 3840 // width  # queries 4096–4607 × keys 3840–4351: the diagonal, 512 a side
    span = 512 // width - 1
    graph(
        driver,
        ID.heatmap,
        f"Plotly.relayout(gd, {{'xaxis.range[0]': {k0 - 0.4}, 'xaxis.range[1]': {k0 + span + 0.4},"
        f" 'yaxis.range[0]': {r0 + span + 0.4}, 'yaxis.range[1]': {r0 - 0.4}}});",
    )
    wait(driver, lambda: "exact weights" in title(driver, ID.heatmap), 60)
    time.sleep(6)
    print(title(driver, ID.heatmap))
    scroll_to(driver, OID.mode_box, offset=10)
    save(driver, "view-overview-zoom", height=1500)
    graph(driver, ID.heatmap, "Plotly.relayout(gd, {'xaxis.autorange': true, 'yaxis.autorange': true});")
    wait(driver, lambda: "overview of" in title(driver, ID.heatmap), 120)
    choose(driver, ID.layer, 13)  # the page opens on a previous-token head (a bare diagonal): L13·H8 shows more
    choose(driver, ID.head, 8)
    wait(driver, lambda: title(driver, ID.heatmap).startswith("L13·H8 — overview"), 120)
    time.sleep(6)
    print(title(driver, ID.heatmap))
    scroll_to(driver, OID.mode_box, offset=10)
    save(driver, "view-overview-8k", height=1500)


# ---------------------------------------------------------------- driving the page
def text_of(n: int, source: list[Path] | None = None) -> str:
    """A text of exactly ``n`` SmolLM2 tokens: the start of the files ``source`` one after another, or the long
    example and more."""
    tokenizer = attnviz.load_model("smollm2")[1]
    base = (
        "\n\n".join(path.read_text() for path in source)
        if source
        else LONG_EXAMPLE
        + " "
        + " ".join(
            f"In chapter {i}, the trophy did not fit into the suitcase because it was too big." for i in range(1, 60)
        )
    )
    ids = tokenizer(base)["input_ids"]
    for cut in range(n, n - 20, -1):  # decoding and re-encoding may merge two tokens at the cut
        for end in (cut, cut + 1):
            text = tokenizer.decode(ids[:end])
            if len(tokenizer(text)["input_ids"]) == n:
                return text
    raise RuntimeError(f"no text of exactly {n} tokens")


def run(driver, text: str, expect: str = "tokens", timeout: float = 180, button: str = ID.run) -> None:
    """Put ``text`` in the box at once (typing thousands of characters takes minutes) and run the model (or
    press ``button``: Generate)."""
    before = driver.find_element("id", ID.status).text
    driver.execute_script(
        "const el = document.getElementById(arguments[0]);"
        "Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, 'value').set.call(el, arguments[1]);"
        "el.dispatchEvent(new Event('input', {bubbles: true}));",
        ID.text,
        text,
    )
    driver.find_element("id", button).click()
    time.sleep(1)
    wait(
        driver,
        lambda: (
            expect in driver.find_element("id", ID.status).text
            and driver.find_element("id", ID.run).is_enabled()
            and (expect != "tokens" or driver.find_element("id", ID.status).text != before)
        ),
        timeout,
    )
    time.sleep(2)


def open_tab(driver, label: str) -> None:
    for tab in driver.find_elements("css selector", ".tab"):
        if tab.text.strip() == label:
            tab.click()
            return
    raise RuntimeError(f"no tab {label!r}")


def choose(driver, element_id: str, index: int) -> None:
    """Pick a dcc.Dropdown option by position."""
    dropdown = driver.find_element("id", element_id)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", dropdown)
    dropdown.click()
    wait(driver, lambda: driver.find_elements("css selector", ".dash-dropdown-option"), 10)
    option = driver.find_elements("css selector", ".dash-dropdown-option")[index]
    driver.execute_script("arguments[0].click();", option)
    time.sleep(1)
    close_menus(driver)  # a menu left open would cover the figure in the next picture


def type_into(driver, element_id: str, text: str) -> None:
    box = driver.find_element("id", element_id)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(text, Keys.ENTER)
    time.sleep(0.5)


def graph(driver, graph_id: str, script: str):
    return driver.execute_script(f"const gd = document.querySelector('#{graph_id} .js-plotly-plot'); {script}")


def title(driver, graph_id: str) -> str:
    return graph(driver, graph_id, "return gd && gd.layout.title ? gd.layout.title.text : '';") or ""


def click_point(driver, graph_id: str, x: int, y: int = 0) -> None:
    """A plotly click on (x, y), as the graph reports a click on that bar."""
    graph(
        driver,
        graph_id,
        f"gd.emit('plotly_click', {{points: [{{x: {x}, y: {y}, curveNumber: 0, pointNumber: {x}, pointIndex: {x}}}]}});",
    )


def scroll_to(driver, element_id: str, offset: int = 0) -> None:
    """Scroll so that ``element_id`` sits ``offset`` pixels below the window's top."""
    driver.execute_script(
        "const el = document.getElementById(arguments[0]);"
        "window.scrollTo(0, el.getBoundingClientRect().top + window.scrollY - arguments[1]);",
        element_id,
        offset,
    )
    time.sleep(1)


MENUS = ".dash-dropdown-options, .mantine-Tooltip-tooltip, .mantine-Popover-dropdown"  # a dropdown's list, a tooltip


def close_menus(driver) -> None:
    """Close whatever menu or tooltip is open (a dropdown's options over the figure): Escape, the pointer
    moved onto the page's title, and wait until none is shown — a picture with one open fails."""
    driver.execute_script("document.activeElement && document.activeElement.blur();")
    driver.find_element("tag name", "body").send_keys(Keys.ESCAPE)
    title = driver.find_element("css selector", ".av-title")
    with contextlib.suppress(Exception):  # the title out of sight: the pointer stays where it is
        webdriver.ActionChains(driver).move_to_element(title).perform()
    if [m for m in driver.find_elements("css selector", MENUS) if m.is_displayed()]:
        driver.execute_script("arguments[0].dispatchEvent(new PointerEvent('pointerdown', {bubbles: true}));", title)
        title.click()  # a click outside closes a dropdown that Escape did not
    wait(driver, lambda: not [m for m in driver.find_elements("css selector", MENUS) if m.is_displayed()], 10)


def save(driver, name: str, height: int | None = None) -> None:
    """A screenshot of the window (made ``height`` pixels tall for this one, keeping the scroll), with no
    menu open."""
    close_menus(driver)
    if height:
        y = driver.execute_script("return window.scrollY;")
        size = driver.get_window_size()
        driver.set_window_size(size["width"], height)
        time.sleep(2)
        driver.execute_script("window.scrollTo(0, arguments[0]);", y)
    time.sleep(2)
    driver.save_screenshot(str(OUT / f"{name}.png"))
    print("wrote", OUT / f"{name}.png")
    if height:
        driver.set_window_size(size["width"], size["height"])
    driver.execute_script("window.scrollTo(0, 0);")


def click_words(driver) -> None:
    driver.find_elements("css selector", f"#{ID.words} input")[1].click()
    time.sleep(2)


def shoot(driver, tab_value: str, name: str, extra=None) -> None:
    label = dict(VIEWS)[tab_value.removeprefix("tab-")]
    for tab in driver.find_elements("css selector", ".tab"):
        if tab.text.strip() == label:
            tab.click()
    if extra:
        extra()
    time.sleep(6)
    close_menus(driver)
    driver.save_screenshot(str(OUT / f"{name}.png"))
    print("wrote", OUT / f"{name}.png")


def wait(driver, condition, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if condition():
                return
        except Exception:  # noqa: BLE001 - element not there yet
            pass
        time.sleep(0.5)
    raise TimeoutError("the dashboard did not get ready")


if __name__ == "__main__":
    main()
