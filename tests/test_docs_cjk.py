"""The docs site carries the dashboard's CJK face (issue 46, deliver 4): every CJK character the docs use is in
it, and a page built with the site's theme, stylesheet and hooks draws 它 and 小猫 with it in headless
Chromium on a machine without a CJK font — opened from disk, as ``site/index.html`` is."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fontTools.ttLib import TTFont
from test_dashboard_font import LOADED, assert_drawn_apart, pixels

from attnviz.assets import CJK_FONT

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]")
#: the face's unicode-range in docs/stylesheets/cjk.css (and the dashboard's fonts.css)
RANGES = [(0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xFF00, 0xFFEF)]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="the docs tools are not installed: pip install -e '.[docs]' (make setup does)",
)


def docs_characters() -> set[str]:
    """The CJK characters of every docs page and of what docs/hooks.py writes into them (the Concepts page's
    sentence and its tokens)."""
    sources = [*DOCS.rglob("*.md"), DOCS / "hooks.py"]
    return {ch for path in sources for ch in CJK.findall(path.read_text(encoding="utf-8"))}


def test_the_face_covers_every_cjk_character_the_docs_use():
    chars = docs_characters()
    assert {"它", "小", "猫", "。", "，"} <= chars  # the Concepts page's sentence is seen
    cmap = TTFont(CJK_FONT).getBestCmap()
    missing = sorted(ch for ch in chars if ord(ch) not in cmap)
    assert missing == [], f"not in attnviz-cjk.woff2 (scripts/make_cjk_font.py makes it): {missing}"
    outside = sorted(ch for ch in chars if not any(lo <= ord(ch) <= hi for lo, hi in RANGES))
    assert outside == [], f"outside the face's unicode-range in docs/stylesheets/cjk.css: {outside}"
    css = (DOCS / "stylesheets" / "cjk.css").read_text(encoding="utf-8")
    assert "unicode-range: " + ", ".join(f"U+{lo:04X}-{hi:04X}" for lo, hi in RANGES) in css
    assert "stylesheets/cjk.css" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def small_site(tmp_path_factory) -> Path:
    """A site built as ``make docs`` builds it — the repository's theme, stylesheet and hooks — of one page
    holding the Concepts page's sentence in prose and in code (the full build runs two models: test_docs)."""
    sys.path.insert(0, str(DOCS))
    try:
        from hooks import TEXT  # the Concepts page's sentence
    finally:
        sys.path.remove(str(DOCS))
    root = tmp_path_factory.mktemp("docs-cjk")
    (root / "docs" / "stylesheets").mkdir(parents=True)
    (root / "docs" / "stylesheets" / "cjk.css").write_bytes((DOCS / "stylesheets" / "cjk.css").read_bytes())
    (root / "docs" / "concepts.md").write_text(
        f"# Concepts\n\nThe sentence:\n\n<p><span id='zh'>{TEXT}</span></p>\n\n<p><span id='zh-reversed'>{TEXT[::-1]}</span></p>\n\n"
        f"<p><span id='it'>它</span> → <span id='kitten'>小猫</span></p>\n\n```text\n{TEXT}\n```\n",
        encoding="utf-8",
    )
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config.update(
        docs_dir=str(root / "docs"),
        site_dir=str(root / "site"),
        hooks=[str(DOCS / "hooks.py")],
        plugins=["search"],
        nav=[{"Concepts": "concepts.md"}],
    )
    (root / "mkdocs.yml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return root / "site"


def test_the_built_stylesheet_carries_the_face_and_the_site_its_licence(small_site):
    css = (small_site / "stylesheets" / "cjk.css").read_text(encoding="utf-8")
    assert "url(data:font/woff2;base64," in css and "attnviz-cjk.woff2" not in css  # inlined: no file to fetch
    assert (small_site / "assets" / "fonts" / "OFL.txt").read_bytes() == (CJK_FONT.parent / "OFL.txt").read_bytes()
    assert 'href="stylesheets/cjk.css"' in (small_site / "concepts.html").read_text(encoding="utf-8")


def no_system_cjk_font() -> bool:
    listed = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True, check=False)
    return listed.returncode == 0 and not listed.stdout.strip()


@pytest.mark.browser
def test_the_concepts_sentence_renders_with_the_embedded_face_not_tofu(dash_duo, small_site):
    driver = dash_duo.driver
    driver.get((small_site / "concepts.html").as_uri())  # from disk, as site/index.html is opened
    assert driver.execute_async_script(LOADED, "它小猫") == [1, True]  # the face loads and holds them
    family = driver.execute_script("return getComputedStyle(document.getElementById('zh')).fontFamily")
    assert '"attnviz CJK"' in family, family
    code = driver.execute_script("return getComputedStyle(document.querySelector('pre code')).fontFamily")
    assert '"attnviz CJK"' in code, code
    # the sentence and the same characters reversed, as the page laid them out: two different pictures (boxes
    # would be one picture: with the face listed after Arial, the sentence's full-width punctuation drew it so)
    assert_drawn_apart(pixels(driver.find_element("id", "zh")), pixels(driver.find_element("id", "zh-reversed")))
    if no_system_cjk_font():  # the control: without the face this machine draws them alike
        driver.execute_script(
            "for (const id of ['zh', 'zh-reversed']) {"
            "  const p = document.getElementById(id).cloneNode(true); p.id = 'plain-' + id;"
            "  p.style.fontFamily = 'sans-serif'; document.querySelector('article').append(p); }"
        )
        with pytest.raises(AssertionError, match="render alike"):
            assert_drawn_apart(
                pixels(driver.find_element("id", "plain-zh")), pixels(driver.find_element("id", "plain-zh-reversed"))
            )
    assert [e for e in dash_duo.get_logs() or [] if e.get("level") == "SEVERE"] == []
