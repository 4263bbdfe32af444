"""The docs site builds: `mkdocs build --strict` of the repository's mkdocs.yml (the Concepts page's
numbers and the CLI reference made by docs/hooks.py from SmolLM2 and MiniLM), and a broken
reference fails the build with the same settings."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _missing() -> list[str]:
    missing = []
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers"):
        if importlib.util.find_spec(module) is None:
            missing.append(module)
    return missing


pytestmark = pytest.mark.skipif(
    bool(_missing()),
    reason=f"the docs tools are not installed ({', '.join(_missing())}): pip install -e '.[docs]' (make setup does)",
)


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _text(path: Path) -> str:
    return re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_the_site_builds_strict_and_offline_with_its_reference_and_measured_numbers(tmp_path):
    site = tmp_path / "site"
    result = _build(ROOT / "mkdocs.yml", site)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "DeprecationWarning" not in result.stderr, result.stderr[-4000:]  # urllib3's, silenced by docs/hooks.py
    assert "url(data:font/woff2;base64," in (site / "stylesheets" / "cjk.css").read_text(encoding="utf-8")

    analysis = _text(site / "reference" / "analysis.html")
    for name in ("qk_space", "head_atlas", "corpus_stats", "rank_heads", "cost_tables"):
        assert name in analysis, name
    assert "atlas_page" in _text(site / "reference" / "figures.html")
    assert "knockout" in _text(site / "reference" / "edits.html")
    assert "attention_rows" in _text(site / "reference" / "capture.html")

    # every public name has its entry (an anchor mkdocstrings made), in the module or where it is defined
    import attnviz.analysis
    import attnviz.edits
    import attnviz.figures
    import attnviz.models
    import attnviz.processes

    ids = set()
    for page in (site / "reference").glob("*.html"):
        ids |= set(re.findall(r'id="(attnviz[\w.]*)"', page.read_text(encoding="utf-8")))
    for module in (attnviz, attnviz.analysis, attnviz.figures, attnviz.edits, attnviz.models, attnviz.processes):
        missing = [n for n in module.__all__ if not any(i.endswith("." + n) for i in ids)]
        assert not missing, (module.__name__, missing)

    cli = _text(site / "reference" / "cli.html")
    for sub in ("capture", "generate", "validate", "coref", "probes", "stats", "atlas", "export", "report", "app"):
        assert f"attnviz {sub}" in cli and f"usage: attnviz {sub}" in cli, sub

    concepts = _text(site / "concepts.html")
    assert "Computed while this page was built" in concepts
    assert "attnviz validation PASS" in concepts
    assert re.search(r"lets through (\d+) of the (\d+)² = (\d+)", concepts)

    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        # every marker the hook fills was filled (the sweep's <!-- attnviz:sweep --> lines only frame what
        # `python -m attnviz.testing.sweep --write` wrote between them, and stay)
        assert "<!-- attnviz:cli -->" not in html and "<!-- attnviz:concepts -->" not in html, page
        assert not re.search(r":(func|class|meth|mod):<code>", html), page  # Sphinx roles read as code
        assert "fonts.googleapis" not in html and "fonts.gstatic" not in html, page
        assert not re.search(r"<(script|link)[^>]+(src|href)=\"(https?:)?//", html), page  # nothing from a CDN


def test_a_broken_reference_fails_the_build(tmp_path):
    """The repository's own settings (theme, plugins, strict), one page with ``::: attnviz.nope``."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config.pop("hooks")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Broken\n\n::: attnviz.nope\n", encoding="utf-8")
    config.update(docs_dir=str(docs), nav=[{"Broken": "index.md"}])
    config["plugins"][1]["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT)]
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")

    result = _build(path, tmp_path / "site")
    assert result.returncode != 0
    assert "attnviz.nope" in result.stderr
