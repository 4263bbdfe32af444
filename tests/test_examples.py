"""Every ```python block of README.md and docs/**/*.md runs, and prints what its ``#>`` lines say.

The convention is in ``tests/markdown_examples.py`` and docs/development.md ("Examples that run"). Each
page is one test: its blocks in order in one namespace, in a temporary folder; a block marked
``<!-- example: skip: why -->`` is reported as skipped with its reason. The real models are loaded once
for the whole module (``load_model`` memoised), so the pages share SmolLM2 and MiniLM.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from pathlib import Path

import pytest
from markdown_examples import blocks, compare, run_page

import attnviz

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if blocks(p))
#: where the pipeline and the corpus paths look ``load_model`` up
LOADERS = ["attnviz", "attnviz.workflows.capture.models", "attnviz.workflows.capture.pipeline", "attnviz.workflows.corpus.atlas",
           "attnviz.workflows.corpus.corpus"]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def models_loaded_once():
    """Each (name, options) loaded once for every page of this module, then the loaders restored."""
    original = attnviz.load_model

    @functools.cache
    def load(name, device, dtype, attn_implementation):
        return original(name, device=device, dtype=dtype, attn_implementation=attn_implementation)

    def memoised(name, *, device=None, dtype=None, attn_implementation=None):  # one key however it is called
        return load(str(name), device, dtype, attn_implementation)

    patched = []
    for name in LOADERS:
        module = importlib.import_module(name)
        if getattr(module, "load_model", None) is original:
            patched.append(module)
            module.load_model = memoised
    yield
    for module in patched:
        module.load_model = original


def _run(page: Path, tmp_path: Path) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an example may show a warning on purpose (a probe file's problems)
        return run_page(page, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_of_the_page_runs_and_prints_what_it_says(page, tmp_path, record_property):
    outcomes = _run(page, tmp_path)
    for o in outcomes:
        record_property(
            o.block.where, o.skipped and f"skipped: {o.skipped}" or f"{o.seconds:.1f} s, {o.checked} #> lines"
        )
    problems = [p for o in outcomes for p in o.problems]
    assert not problems, "\n\n".join(problems)
    ran = [o for o in outcomes if not o.skipped]
    assert len(outcomes) == len(blocks(page)) and ran, "no block ran"
    skipped = [f"{o.block.where}: {o.skipped}" for o in outcomes if o.skipped]
    if skipped:
        warnings.warn(UserWarning(f"{page.name}: not run here: " + "; ".join(skipped)), stacklevel=2)


@pytest.mark.slow
def test_a_readme_block_that_stops_running_or_prints_another_number_fails(tmp_path):
    """The README's own script, mutated two ways: a word it no longer finds, and a number it no longer prints."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert 'words.index("cat")' in readme and "#> 'it' → 'cat': 0.80 of the weight" in readme

    broken = tmp_path / "broken" / "README.md"
    broken.parent.mkdir()
    broken.write_text(readme.replace('words.index("cat")', 'words.index("dog")', 1), encoding="utf-8")
    (first, *_) = _run(broken, tmp_path)
    assert (
        first.problems and "raised at README.md:" in first.problems[0] and "'dog' is not in list" in first.problems[0]
    )

    wrong = tmp_path / "wrong" / "README.md"
    wrong.parent.mkdir()
    wrong.write_text(readme.replace("0.80 of the weight", "0.50 of the weight", 1), encoding="utf-8")
    (first, *_) = _run(wrong, tmp_path)
    assert len(first.problems) == 1 and "printed something else: 0.80 where the page shows 0.50" in first.problems[0]


def test_a_skipped_block_is_reported_with_its_reason_and_not_run(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n\n<!-- example: skip: needs the hub -->\n```python\nraise SystemExit\n```\n"
        "\n```python\nprint(x + 1)\n#> 2\n```\n",
        encoding="utf-8",
    )
    outcomes = run_page(page, tmp_path)
    assert [o.skipped for o in outcomes] == [None, "needs the hub", None]
    assert [o.checked for o in outcomes] == [0, 0, 1] and not any(o.problems for o in outcomes)


def test_a_block_that_raises_is_a_problem_naming_its_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nx = 1\ny = x / 0\n```\n", encoding="utf-8")
    (outcome,) = run_page(page, tmp_path)
    assert outcome.problems == ["raised at page.md:5: ZeroDivisionError: division by zero"]


@pytest.mark.parametrize(
    ("shown", "printed", "rtol", "ok"),
    [
        ("0.80 of the weight", "0.80 of the weight", 0, True),
        ("0.80 of the weight", "0.81 of the weight", 0, True),  # within one unit of the last digit
        ("0.80 of the weight", "0.82 of the weight", 0, False),
        ("0.80 of the weight", "0.8 of the weight", 0, True),  # the same number, written shorter
        ("30 layers × 9 heads", "30 layers × 8 heads", 0.5, False),  # integers exactly, whatever rtol
        ("max error 4.77e-07 at L15·H6", "max error 5.96e-07 at L15·H6", 0, False),
        ("max error 4.77e-07 at L15·H6", "max error 5.96e-07 at L15·H6", 0.5, True),
        ("max error 4.77e-07 at L15·H6", "max error 4.77e-07 at L21·H5", 0.5, False),  # another head
        ("PASS: smollm2, …", "PASS: smollm2, 30 layers and more", 0, True),
        ("648,632 bytes", "648,632 bytes", 0, True),
        ("648,632 bytes", "648,633 bytes", 0, False),
        ("(9, 11, 64)", "(9, 11, 64)", 0, True),
        ("PASS", "FAIL", 0, False),
    ],
)
def test_printed_lines_are_compared_as_text_and_numbers(shown, printed, rtol, ok):
    assert (compare([shown], printed + "\n", rtol) is None) is ok


def test_a_missing_or_extra_line_is_a_difference():
    assert "2 lines, the page shows 1" in compare(["a"], "a\nb\n")
