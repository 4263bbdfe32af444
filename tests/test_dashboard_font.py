"""The page and its exports read on a machine without a CJK font: the dashboard serves its own CJK face
("attnviz CJK", assets/fonts.css), the figures name it, and an exported HTML page carries it inlined.

The proof is the pixels: on a machine without a CJK font (Debian without fonts-noto-cjk or
fonts-wqy-*, this suite's machines: ``fc-list :lang=zh`` is empty) every character the fonts lack is
drawn as the same box, so two different labels come out alike (0–2 % of their pixels apart, where the
box falls on the pixel grid); with the face about 38 % differ. Removing
``attnviz/assets/fonts/attnviz-cjk.woff2`` (the dashboard serves it at ``assets/fonts/``) makes these tests fail, and so does exporting the PNG
with plotly's own ``Plotly.toImage`` (the camera button's own handler) instead of ``attnviz.figureImage``
(the export bar's Figure button's path, and the camera button's through ``assets/modebar_camera.js``)."""

from __future__ import annotations

import base64
import io
import re
import time
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from attnviz.dashboard import create_app
from attnviz.dashboard.ids import ID
from PIL import Image
from test_dashboard import show_heatmap_in_tokens, wait_status

import attnviz
from attnviz import figures
from attnviz.views.html import cjk_font_path

ZH = "我家的小猫很可爱，它很好动。"
LOADED = """const done = arguments[arguments.length - 1];
document.fonts.load('16px "attnviz CJK"', arguments[0]).then(
  faces => done([faces.filter(f => f.status === "loaded").length, document.fonts.check('16px "attnviz CJK"', arguments[0])]),
  err => done([0, String(err)]));"""


LAST = "return window.attnvizLastExport"  # [{name, url}] of the Figure button's last click (figure_image.js)


def pixels(element) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(element.screenshot_as_png)).convert("L"), dtype=np.int16)


def assert_drawn_apart(a: np.ndarray, b: np.ndarray) -> None:
    """Two labels of different characters, drawn in one font at one size, are not the same picture; boxes
    are, up to where they fall on the pixel grid (so the closest of the two shifted by up to a pixel counts)."""
    assert (a < 160).any() and (b < 160).any(), "a label drew nothing"
    h, w = min(a.shape[0], b.shape[0]) - 2, min(a.shape[1], b.shape[1]) - 2
    apart = min(
        (np.abs(a[1 : 1 + h, 1 : 1 + w] - b[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]) > 64).mean()
        for dy in (-1, 0, 1)
        for dx in (-1, 0, 1)
    )
    assert apart > 0.1, f"the two labels render alike ({apart:.1%} of pixels apart): boxes, not characters"


def poll(find, timeout: float = 20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = find()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError("timed out")


@pytest.mark.browser
def test_the_page_draws_chinese_in_its_own_font(dash_duo):
    dash_duo.start_server(create_app({"minilm": "MiniLM (BERT)"}, default_model="minilm"))
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)  # MiniLM's tokens: a character each
    driver = dash_duo.driver
    # the page's own face: served from the assets, loaded for the page's text
    assert driver.execute_async_script(LOADED, "小猫") == [1, True]
    # two labels in the page's font stack (as every label of the page), one of 小猫 and one of 好动
    driver.execute_script(
        "for (const [id, text] of [['zh-a', '小猫'], ['zh-b', '好动']]) {"
        "  const s = document.createElement('span'); s.id = id; s.textContent = text;"
        "  s.style.cssText = 'display: block; width: max-content; font-size: 32px; line-height: 40px';"
        "  document.querySelector('#react-entry-point').prepend(s); }"
    )
    assert "attnviz CJK" in driver.execute_script("return getComputedStyle(document.getElementById('zh-a')).fontFamily")
    assert_drawn_apart(pixels(driver.find_element("id", "zh-a")), pixels(driver.find_element("id", "zh-b")))
    # the heatmap of the first capture (MiniLM reads a character a token): its tick labels 猫 and 动
    ticks = poll(lambda: {t.text: t for t in driver.find_elements("css selector", f"#{ID.heatmap} .xtick text")})
    assert "attnviz CJK" in ticks["猫"].get_attribute("style")
    assert_drawn_apart(pixels(ticks["猫"]), pixels(ticks["动"]))
    # the figure as PNG (assets/figure_image.js: the face inlined in its SVG), the two labels cut out of it
    png = driver.execute_async_script(
        "attnviz.figureImage(document.getElementById(arguments[0]), 'png').then(arguments[1], e => arguments[1](String(e)))",
        ID.heatmap,
    )
    assert_drawn_apart(*label_crops(driver, png, "猫", "动"))
    assert dash_duo.get_logs() == []


def label_crops(driver, png: str, *labels: str) -> list[np.ndarray]:
    """The heatmap's x tick ``labels`` cut out of its PNG (a data URL) where the page draws them."""
    boxes = driver.execute_script(
        "const svg = document.querySelector(arguments[0] + ' .main-svg').getBoundingClientRect();"
        "const ticks = Array.from(document.querySelectorAll(arguments[0] + ' .xtick text'));"
        "return arguments[1].map(label => { const r = ticks.find(t => t.textContent === label).getBoundingClientRect();"
        "  return [r.left - svg.left, r.top - svg.top, r.right - svg.left, r.bottom - svg.top].map(Math.round); });",
        f"#{ID.heatmap}",
        list(labels),
    )
    image = Image.open(io.BytesIO(base64.b64decode(png.split(",", 1)[1]))).convert("L")
    return [np.asarray(image.crop(box), dtype=np.int16) for box in boxes]


@pytest.mark.browser
def test_the_figure_button_downloads_the_view_with_chinese_drawn(dash_duo):
    """The export bar's Figure button (not plotly's camera): the shown figure as PNG, its 猫 and 动 two
    different pictures, and as SVG carrying the face; both arrive as files named after the view."""
    dash_duo.start_server(create_app({"minilm": "MiniLM (BERT)"}, default_model="minilm"))
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)  # MiniLM's tokens: a character each
    driver = dash_duo.driver
    poll(lambda: driver.find_elements("css selector", f"#{ID.heatmap} .xtick text"))
    folder = Path(dash_duo.download_path)

    def export(fmt: str, index: int) -> tuple[str, Path]:
        dash_duo.find_elements(f"#{ID.export_format} input")[index].click()
        driver.execute_script("window.attnvizLastExport = null")
        dash_duo.find_element(f"#{ID.figure_button}").click()
        [(name, url)] = poll(lambda: [(e["name"], e["url"]) for e in driver.execute_script(LAST) or []])
        assert re.fullmatch(rf"attnviz-heatmap-L\d+-H\d+\.{fmt}", name), name  # the view, layer and head shown
        poll(lambda: (folder / name).exists() and (folder / name).stat().st_size > 1000)
        return url, folder / name

    png, png_file = export("png", 0)
    assert_drawn_apart(*label_crops(driver, png, "猫", "动"))
    assert png_file.read_bytes() == base64.b64decode(png.split(",", 1)[1])
    svg, svg_file = export("svg", 1)
    svg = unquote(svg.split(",", 1)[1])
    assert '@font-face{font-family:"attnviz CJK"' in svg and "data:font/woff2;base64," in svg
    assert svg_file.read_text() == svg
    assert dash_duo.get_logs() == []


def test_an_exported_page_inlines_the_font_only_where_it_has_cjk(minilm, tmp_path):
    model, tok = minilm
    zh, en = (attnviz.capture(model, text, tok) for text in (ZH, "The cat sat on the mat."))
    zh_page = figures.html_page(figures.heatmap(zh, 0, 0), title="小猫")
    en_page = figures.html_page(figures.heatmap(en, 0, 0), title="cat")
    inlined = re.search(r'font-family:"attnviz CJK".*?src:url\(data:font/woff2;base64,([A-Za-z0-9+/=]+)\)', zh_page)
    assert inlined is not None and base64.b64decode(inlined.group(1)) == cjk_font_path().read_bytes()
    assert '"attnviz CJK"' in zh_page.split("<body", 1)[1]  # the figure's font names the face
    assert "@font-face" not in en_page
    assert 1.3e6 < len(zh_page) - len(en_page) < 2.2e6  # the face, ≈1.8 MB as base64
    assert figures.to_html(figures.heatmap(zh, 0, 0), tmp_path / "zh.html") == tmp_path / "zh.html"


@pytest.mark.browser
def test_an_exported_page_draws_chinese_offline(dash_duo, minilm, tmp_path):
    model, tok = minilm
    path = figures.to_html(figures.heatmap(attnviz.capture(model, ZH, tok), 0, 0), tmp_path / "zh.html")
    driver = dash_duo.driver
    driver.get(path.as_uri())
    assert driver.execute_async_script(LOADED, "小猫") == [1, True]
    ticks = poll(lambda: {t.text: t for t in driver.find_elements("css selector", ".xtick text")})
    assert_drawn_apart(pixels(ticks["猫"]), pixels(ticks["动"]))


@pytest.mark.browser
def test_the_camera_button_exports_through_the_face(dash_duo):
    """Plotly's camera button in a graph's toolbar (modebar_camera.js hands it to attnviz.figureImage): clicked
    as a user would, it saves the heatmap as <its toImageButtonOptions' filename>.png with 猫 and 动 two
    different pictures — plotly's own export (Plotly.toImage, the button's handler) draws them alike — and, with
    SVG chosen in the export bar, an SVG carrying the face."""
    from selenium.webdriver.common.action_chains import ActionChains

    dash_duo.start_server(create_app({"minilm": "MiniLM (BERT)"}, default_model="minilm"))
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)  # MiniLM's tokens: a character each
    driver = dash_duo.driver
    poll(lambda: driver.find_elements("css selector", f"#{ID.heatmap} .xtick text"))
    folder = Path(dash_duo.download_path)
    # plotly's own export of the same figure, the reference: its labels are boxes on this machine
    plotly_png = driver.execute_async_script(
        "const gd = document.querySelector(arguments[0] + ' .js-plotly-plot');"
        "Plotly.toImage(gd, {format: 'png', width: gd._fullLayout.width, height: gd._fullLayout.height})"
        ".then(arguments[1], e => arguments[1](String(e)))",
        f"#{ID.heatmap}",
    )
    with pytest.raises(AssertionError, match="render alike|drew nothing"):  # boxes, here faint outlines
        assert_drawn_apart(*label_crops(driver, plotly_png, "猫", "动"))

    def camera(fmt: str) -> tuple[str, Path]:
        driver.execute_script("window.attnvizLastCamera = null")
        graph = dash_duo.find_element(f"#{ID.heatmap} .js-plotly-plot")
        button = next(
            b
            for b in graph.find_elements("css selector", ".modebar-btn")
            if driver.execute_script("return attnviz.isCameraButton(arguments[0])", b)
        )
        ActionChains(driver).move_to_element(graph).pause(0.3).move_to_element(button).click().perform()
        last = poll(lambda: driver.execute_script("return window.attnvizLastCamera"))
        assert "error" not in last, last
        assert last["name"] == f"attnviz-{ID.heatmap}.{fmt}"  # the graph's toImageButtonOptions (export_view)
        poll(lambda: (folder / last["name"]).exists() and (folder / last["name"]).stat().st_size > 1000)
        return last["url"], folder / last["name"]

    png, png_file = camera("png")
    assert png_file.read_bytes() == base64.b64decode(png.split(",", 1)[1])
    assert_drawn_apart(*label_crops(driver, png, "猫", "动"))
    assert sorted(p.name for p in folder.iterdir()) == [png_file.name]  # plotly's own handler did not run too
    dash_duo.find_elements(f"#{ID.export_format} input")[1].click()  # SVG
    svg, svg_file = camera("svg")
    assert '@font-face{font-family:"attnviz CJK"' in svg_file.read_text() and svg.startswith("data:image/svg+xml")
    assert dash_duo.get_logs() == []


def _styles(component):
    """Every style dict of a layout: a component's ``style`` and a DataTable's ``style_cell`` / ``style_header``
    / ``style_data`` (and their conditional lists), with the component's id."""
    for name in (
        "style",
        "style_cell",
        "style_header",
        "style_data",
        "style_cell_conditional",
        "style_data_conditional",
    ):
        value = getattr(component, name, None)
        for style in value if isinstance(value, list) else [value] if value else []:
            yield getattr(component, "id", None), style
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if hasattr(child, "to_plotly_json"):
            yield from _styles(child)


def test_every_font_the_page_sets_reaches_the_cjk_face():
    """A reviewer found the tables' cells (coreference's candidates, its preferred column) drawn as boxes:
    their style named ``system-ui, sans-serif`` and no CJK face. Every font stack the layout sets names it."""
    app = create_app({"minilm": "MiniLM (BERT)"}, default_model="minilm")
    layout = app.layout() if callable(app.layout) else app.layout
    stacks = [(where, style["fontFamily"]) for where, style in _styles(layout) if "fontFamily" in style]
    assert len(stacks) >= 5, stacks  # the tables (coreference, statistics, atlas, probes) and two summaries
    assert [(where, stack) for where, stack in stacks if "attnviz CJK" not in stack] == []
