"""The page's own image downloads carry the capture's provenance (issue 46, item 2): every graph's camera button
(assets/modebar_camera.js) and the export bar's Figure button (assets/figure_image.js) draw the figure in the
browser and put ``cap.provenance`` inside it as ``figures.write_image(provenance=)`` does — a PNG's ``tEXt``
chunk ``attnviz-provenance`` right after IHDR, an SVG's ``<metadata id="attnviz-provenance">``.

The reference is the library: the JavaScript's PNG and SVG are byte for byte what
``attnviz.views.export.with_provenance`` makes of the same image without provenance (the saved image with its
provenance chunk or element taken out: two draws of a graph differ where the mouse left a hover label), Pillow
reads the PNG (checking every chunk's CRC-32 as it reads), ``xml.etree`` the SVG, and the JSON in both equals the
provenance of the capture file the page's *Capture file* button downloads — the capture the server holds."""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import unquote

import pytest
from attnviz.dashboard import create_app
from attnviz.dashboard.ids import ID, IID
from PIL import Image
from test_dashboard import CAT, choose, no_console_errors, open_tab, poll, run_text, start_minilm, wait_status
from test_dashboard_image import vit_folder  # noqa: F401 - the fixture: a tiny ViT's folder and a picture

import attnviz
from attnviz.views.export import with_provenance

SVG_NS = "{http://www.w3.org/2000/svg}"
PLAIN = (  # the shown heatmap drawn as the buttons draw it, no provenance in it
    "attnviz.figureImage(document.querySelector(arguments[0] + ' .js-plotly-plot'), arguments[1])"
    ".then(arguments[2], e => arguments[2]('error: ' + e))"
)


def png_bytes(url: str) -> bytes:
    assert url.startswith("data:image/png;base64,"), url[:40]
    return base64.b64decode(url.split(",", 1)[1])


def svg_text(url: str) -> str:
    assert url.startswith("data:image/svg+xml;charset=utf-8,"), url[:40]
    return unquote(url.split(",", 1)[1])


def png_without_provenance(data: bytes) -> bytes:
    """The PNG with its one ``attnviz-provenance`` chunk taken out (read by the PNG's chunk lengths)."""
    chunks, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        chunks.append((data[at + 4 : at + 8], data[at + 8 : at + 8 + length], data[at : at + 12 + length]))
        at += 12 + length
    kept = [whole for kind, body, whole in chunks if not (kind == b"tEXt" and body.startswith(b"attnviz-provenance\0"))]
    assert len(kept) == len(chunks) - 1, "not one provenance chunk"
    return data[:8] + b"".join(kept)


def svg_without_provenance(svg: str) -> str:
    out, n = re.subn(r'<metadata id="attnviz-provenance">[^<]*</metadata>', "", svg)
    assert n == 1, "not one provenance element"
    return out


def png_provenance(data: bytes) -> dict:
    """The PNG's provenance as Pillow reads it (a wrong CRC is a SyntaxError here), the image decoded whole."""
    image = Image.open(io.BytesIO(data))
    image.load()
    return json.loads(image.text["attnviz-provenance"])


def svg_provenance(svg: str) -> dict:
    [meta] = [m for m in ET.fromstring(svg).iter(f"{SVG_NS}metadata") if m.get("id") == "attnviz-provenance"]
    return json.loads(meta.text)


def camera(dash_duo, graph_id: str) -> tuple[str, Path]:
    """Click the graph's camera button as a user would; the image's data URL and the file it saved."""
    from selenium.webdriver.common.action_chains import ActionChains

    driver = dash_duo.driver
    driver.execute_script("window.attnvizLastCamera = null")
    graph = dash_duo.find_element(f"#{graph_id} .js-plotly-plot")
    button = next(
        b
        for b in graph.find_elements("css selector", ".modebar-btn")
        if driver.execute_script("return attnviz.isCameraButton(arguments[0])", b)
    )
    ActionChains(driver).move_to_element(graph).pause(0.3).move_to_element(button).click().perform()
    found: list = []
    poll(lambda: found.append(driver.execute_script("return window.attnvizLastCamera")) or found[-1], timeout=30)
    last = found[-1]
    assert "error" not in last, last
    path = Path(dash_duo.download_path) / last["name"]
    poll(lambda: path.exists() and path.stat().st_size > 1000, timeout=20)
    return last["url"], path


def figure_button(dash_duo, fmt: str) -> tuple[str, Path]:
    """The export bar's Figure button in ``fmt``: the one image's data URL and the file it saved."""
    driver = dash_duo.driver
    dash_duo.find_elements(f"#{ID.export_format} input")[["png", "svg"].index(fmt)].click()
    driver.execute_script("window.attnvizLastExport = null")
    dash_duo.find_element(f"#{ID.figure_button}").click()
    found: list = []
    poll(lambda: found.append(driver.execute_script("return window.attnvizLastExport")) or found[-1], timeout=30)
    [last] = found[-1]
    assert last["name"].endswith("." + fmt), last["name"]
    path = Path(dash_duo.download_path) / last["name"]
    poll(lambda: path.exists() and path.stat().st_size > 1000, timeout=20)
    return last["url"], path


@pytest.mark.browser
@pytest.mark.slow
def test_the_camera_and_figure_buttons_save_the_captures_provenance(dash_duo):
    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="minilm: 13 tokens")
    driver = dash_duo.driver
    folder = Path(dash_duo.download_path)
    # the capture the server holds, as its capture file says
    dash_duo.find_element(f"#{ID.capture_button}").click()
    poll(lambda: (folder / "capture.attnviz").exists() and (folder / "capture.attnviz").stat().st_size > 0, timeout=20)
    held = attnviz.load(folder / "capture.attnviz")
    assert held.text == CAT and held.provenance["name"] == "minilm" and len(held.provenance["weights_sha256"]) == 64
    expected = held.provenance
    # the page holds it as the library writes it (ASCII JSON), on the Heatmap tab as on every other
    poll(lambda: driver.execute_script(f"return document.getElementById('{ID.provenance_json}').textContent"))
    held_json = driver.execute_script(f"return document.getElementById('{ID.provenance_json}').textContent")
    assert held_json == json.dumps(expected, ensure_ascii=True)
    poll(lambda: dash_duo.find_elements(f"#{ID.heatmap} .xtick text"))

    # the camera button's PNG: Pillow reads the chunk (CRC checked), the bytes are the library's
    png, png_file = camera(dash_duo, ID.heatmap)
    data = png_bytes(png)
    assert png_file.read_bytes() == data
    assert png_provenance(data) == expected
    plain = png_without_provenance(data)
    assert "attnviz-provenance" not in Image.open(io.BytesIO(plain)).text
    assert data == with_provenance(plain, "png", expected)  # same chunk, same place

    # the Figure button's PNG and SVG
    png, png_file = figure_button(dash_duo, "png")
    data = png_bytes(png)
    assert png_file.read_bytes() == data and png_provenance(data) == expected
    assert data == with_provenance(png_without_provenance(data), "png", expected)
    svg, svg_file = figure_button(dash_duo, "svg")
    svg = svg_text(svg)
    assert svg_file.read_text() == svg and svg_provenance(svg) == expected
    assert svg == with_provenance(svg_without_provenance(svg).encode(), "svg", expected).decode()
    # the camera button in SVG (the export bar's choice, now SVG)
    svg, _ = camera(dash_duo, ID.heatmap)
    assert svg_provenance(svg_text(svg)) == expected

    # any provenance, written as the library writes it: non-ASCII escaped as json.dumps does (a character past
    # U+FFFF as its surrogate pair), "<", "&" and ">" escaped in the SVG; none at all leaves the image as it was
    odd = {"name": '小猫 <b>&amp; "it" ≥ 🐱', "edits": None, "check_passed": True, "check_worst": 0.25}
    mine = "return attnviz.withProvenance(arguments[0], arguments[1], arguments[2])"
    for fmt, image in (("png", "data:image/png;base64," + base64.b64encode(plain).decode()), ("svg", None)):
        url = image or driver.execute_async_script(PLAIN, f"#{ID.heatmap}", "svg")
        out = driver.execute_script(mine, url, fmt, json.dumps(odd, ensure_ascii=False))
        if fmt == "png":
            assert png_bytes(out) == with_provenance(plain, "png", odd) and png_provenance(png_bytes(out)) == odd
        else:
            assert svg_text(out) == with_provenance(svg_text(url).encode(), "svg", odd).decode()
            assert svg_provenance(svg_text(out)) == odd
        assert driver.execute_script(mine, url, fmt, None) == url
    # the Image tab's figures are another capture's (a picture's, none taken here): the text's is not theirs
    assert driver.execute_script(
        "const d = document.createElement('div'); document.getElementById('view-image').appendChild(d);"
        "const p = [attnviz.pageProvenance(d), attnviz.pageProvenance(document.getElementById(arguments[0]))];"
        "d.remove(); return p;",
        ID.heatmap,
    ) == [None, held_json]
    # a corpus's, a run's or two models' figures are not one capture's: none (not the page's capture's)
    for view in ("view-stats", "view-atlas", "view-training", "view-compare"):
        assert (
            driver.execute_script(
                "const d = document.createElement('div'); document.getElementById(arguments[0]).appendChild(d);"
                "const p = attnviz.pageProvenance(d); d.remove(); return p;",
                view,
            )
            is None
        ), view
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_the_image_tabs_camera_saves_the_pictures_provenance(dash_duo, vit_folder):  # noqa: F811 - imported above
    """The Image tab draws a capture of its own (a picture's): its camera button saves that capture's provenance,
    the one ``attnviz.capture`` records for the same model and picture, not the text's."""
    folder, picture, _ = vit_folder
    dash_duo.start_server(create_app({"minilm": "MiniLM (BERT)", str(folder): "tiny ViT"}, default_model="minilm"))
    wait_status(dash_duo, "minilm")
    choose(dash_duo, f"#{ID.model}", 1)  # the tiny ViT
    open_tab(dash_duo, "Image")
    dash_duo.find_element(f"#{IID.upload} input").send_keys(str(picture))
    poll(lambda: "attends" in dash_duo.find_element(f"#{IID.graph} .gtitle").text, timeout=60)
    expected = attnviz.capture(str(folder), str(picture)).provenance
    assert expected["add_bos"] is None and expected["name"] == str(folder)
    png, _ = camera(dash_duo, IID.graph)
    data = png_bytes(png)
    saved = png_provenance(data)
    # the same weights, versions and check; the check's float errors as close as two runs' rounding makes them
    floats = ("check_max_abs_error", "check_worst")
    assert {k: v for k, v in saved.items() if k not in floats} == {k: v for k, v in expected.items() if k not in floats}
    assert saved["check_max_abs_error"] == pytest.approx(expected["check_max_abs_error"], abs=1e-5)
    assert saved["check_worst"] <= 1 and expected["check_worst"] <= 1
    assert data == with_provenance(png_without_provenance(data), "png", saved)
    text = dash_duo.driver.execute_script(f"return document.getElementById('{ID.provenance_json}').textContent")
    assert json.loads(text)["name"] == "minilm"  # the text's capture keeps its own
    no_console_errors(dash_duo)
