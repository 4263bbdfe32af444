"""Figures written as images through kaleido draw their Chinese labels on a machine without a CJK font
(``attnviz.figures.write_image`` / ``to_image``, attnviz/views/export.py), where plotly's own
``fig.write_image`` draws every character as the same box.

The proof is the pixels, as in tests/test_dashboard_font.py: two labels of different characters drawn
alike are boxes (this suite's machines have no CJK font: ``fc-list :lang=zh`` is empty); drawn in the face
about 40 % of their ink's pixels differ. With a face that holds no CJK in the face's place (a Latin font
converted in its stead) the same comparison finds boxes — the difference is the face's."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

import attnviz
from attnviz import figures
from attnviz.errors import ArgumentTypeError, InputError
from attnviz.views.export import cjk_fontconfig, cjk_fontconfig_file
from attnviz.views.html import cjk_font_path

SIZE = dict(width=320, height=120)
CAT, MOVE = "猫猫猫", "动动动"  # one character thrice each: the same number of boxes when drawn as boxes


def grey(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.int16)


def apart(a: np.ndarray, b: np.ndarray) -> float:
    """The share of pixels two pictures of one size differ in, inside the box holding both's ink, the
    closest of the two shifted by up to a pixel (boxes differ only where they fall on the pixel grid)."""
    assert a.shape == b.shape
    ink = (a < 160) | (b < 160)
    assert (a < 160).any() and (b < 160).any(), "a label drew nothing"
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    top, bottom = max(rows[0] - 1, 1), min(rows[-1] + 2, a.shape[0] - 1)
    left, right = max(cols[0] - 1, 1), min(cols[-1] + 2, a.shape[1] - 1)
    crop = a[top:bottom, left:right]
    return min(
        float((np.abs(crop - b[top + dy : bottom + dy, left + dx : right + dx]) > 64).mean())
        for dy in (-1, 0, 1)
        for dx in (-1, 0, 1)
    )


def label(text: str):
    return figures.message_figure(text)  # an attnviz figure: its font names "attnviz CJK" first


def test_a_png_draws_two_different_chinese_labels_apart(tmp_path):
    cat = figures.write_image(label(CAT), tmp_path / "cat.png", **SIZE)
    move = figures.write_image(label(MOVE), tmp_path / "move.png", **SIZE)
    assert cat == tmp_path / "cat.png" and cat.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    share = apart(grey(cat.read_bytes()), grey(move.read_bytes()))
    assert share > 0.2, f"the two labels render alike ({share:.1%} of their pixels apart): boxes, not characters"


@pytest.mark.skipif(
    shutil.which("fc-list") is None
    or subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout.strip() != "",
    reason="this machine has a CJK system font: plotly's own export draws Chinese here, there are no boxes to compare with",
)
def test_plotly_own_export_draws_boxes_on_this_machine():
    """The reference: the same figures through plotly's ``fig.to_image`` (kaleido without the face)."""
    share = apart(*(grey(label(text).to_image(format="png", **SIZE)) for text in (CAT, MOVE)))
    assert share < 0.05, f"plotly's own export drew the labels apart ({share:.1%}): the machine has a CJK font"


def test_a_face_without_cjk_in_the_face_s_place_draws_boxes(tmp_path):
    """The difference is the face's: the converted face replaced by a Latin font (DejaVu Sans, no hanzi)."""
    from fontTools.ttLib import TTFont

    latin = subprocess.run(["fc-match", "-f", "%{file}", "DejaVu Sans"], capture_output=True, text=True).stdout
    if not latin.endswith(".ttf"):
        pytest.skip(f"no DejaVu Sans TTF to stand in for the face (fc-match gave {latin!r})")
    digest = hashlib.sha256(cjk_font_path().read_bytes()).hexdigest()[:12]
    (tmp_path / f"cjk-font-{digest}").mkdir()
    font = TTFont(latin)
    for record in font["name"].names:  # named as the face, so the figures' font stack picks it
        if record.nameID in (1, 4, 16):
            record.string = "attnviz CJK"
    font.save(tmp_path / f"cjk-font-{digest}" / "attnviz-cjk.otf")
    share = apart(*(grey(figures.to_image(label(text), **SIZE, font_folder=tmp_path)) for text in (CAT, MOVE)))
    assert share < 0.05, f"labels drawn apart without the face ({share:.1%}): the test would not see it missing"


@pytest.mark.browser
def test_an_svg_carries_the_face_and_draws_chinese_in_a_browser(dash_duo, minilm, tmp_path):
    """An SVG of a heatmap of Chinese text, opened in Chromium on this machine: its 猫 and 动 tick labels
    are two different pictures (the face inlined in the SVG); an SVG of English text carries no face."""
    model, tok = minilm
    cap = attnviz.capture(model, "我家的小猫很可爱，它很好动。", tok)
    path = figures.write_image(figures.heatmap(cap, 0, 0), tmp_path / "zh.svg")
    svg = path.read_text(encoding="utf-8")
    inlined = re.search(r'font-family:"attnviz CJK".*?src:url\(data:font/woff2;base64,([A-Za-z0-9+/=]+)\)', svg)
    assert inlined is not None and base64.b64decode(inlined.group(1)) == cjk_font_path().read_bytes()
    english = figures.to_image(figures.heatmap(attnviz.capture(model, "The cat sat.", tok), 0, 0), "svg")
    assert english.startswith(b"<svg") and b"@font-face" not in english
    driver = dash_duo.driver
    driver.get(path.as_uri())
    ticks = {t.text: t for t in driver.find_elements("css selector", ".xtick text")}
    cat, move = (grey(ticks[c].screenshot_as_png) for c in "猫动")
    h, w = min(cat.shape[0], move.shape[0]), min(cat.shape[1], move.shape[1])
    share = apart(cat[:h, :w], move[:h, :w])
    assert share > 0.1, f"the SVG's 猫 and 动 render alike in the browser ({share:.1%} apart): boxes"


def test_the_font_setting_is_restored_after_the_browser_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("FONTCONFIG_FILE", "/etc/fonts/fonts.conf")
    conf = cjk_fontconfig_file(tmp_path)
    text = conf.read_text()
    assert '<include ignore_missing="yes">/etc/fonts/fonts.conf</include>' in text  # the system's fonts stay
    assert f"<dir>{conf.parent}</dir>" in text and (conf.parent / "attnviz-cjk.otf").stat().st_size > 1_000_000
    with pytest.raises(RuntimeError, match="inside"), cjk_fontconfig(tmp_path) as inside:
        assert os.environ["FONTCONFIG_FILE"] == str(inside) == str(conf)
        raise RuntimeError("inside")
    assert os.environ["FONTCONFIG_FILE"] == "/etc/fonts/fonts.conf"
    monkeypatch.delenv("FONTCONFIG_FILE")
    with cjk_fontconfig(tmp_path):
        pass
    assert "FONTCONFIG_FILE" not in os.environ


def test_bad_image_requests_say_what_to_do(tmp_path):
    fig = label(CAT)
    with pytest.raises(
        InputError, match=r"cannot write an image as 'gif': pass format= one of png, jpg, jpeg, webp, svg, pdf"
    ):
        figures.write_image(fig, tmp_path / "cat.gif")
    with pytest.raises(InputError, match=r"the folder '.*nowhere' does not exist"):
        figures.write_image(fig, tmp_path / "nowhere" / "cat.png")
    with pytest.raises(ArgumentTypeError, match="take a plotly Figure, got dict"):
        figures.to_image({"data": []})  # type: ignore[arg-type]
