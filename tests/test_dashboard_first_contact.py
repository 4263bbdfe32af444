"""A newcomer's first contact with the page (issue 46, deliver 4): it opens where the README's first picture
says — the AttentionLab, in words, 它 → 小猫 on SmolLM2 — a Run of a text already captured says so, and no
page message names an exception class."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from attnviz.dashboard import create_app
from attnviz.dashboard.ids import ID
from attnviz.dashboard.opening import default_query
from attnviz.dashboard.run_outputs import ALREADY_CAPTURED
from test_dashboard import MODELS, no_console_errors, run_text, wait_status

import attnviz

ZH = "我家的小猫很可爱，它很好动。"
DASHBOARD = Path(__file__).resolve().parent.parent / "apps" / "dashboard"


def test_the_lab_opens_on_the_pronouns_last_piece_which_has_read_the_whole_word(smol_tokenizer):
    """SmolLM2 splits 它 in two byte pieces: the query is the second (in words: the word 它)."""
    tiny = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer))
    cap = attnviz.capture(tiny, ZH, smol_tokenizer, add_bos=True, layers=[0])
    [it] = [w for w in cap.words if w.text == "它"]
    assert it.token_stop - it.token_start == 2
    assert default_query(cap) == it.token_stop - 1
    assert cap.token_labels[default_query(cap)] == "它₂"


@pytest.mark.browser
@pytest.mark.slow
def test_the_first_screen_is_the_readmes_picture_and_a_second_run_says_already_captured(dash_duo):
    dash_duo.start_server(create_app(MODELS, default_model="smollm2"))
    wait_status(dash_duo, "smollm2: 27 tokens, 11 words", timeout=180)
    # the tab and the units the README's picture shows
    selected = [t.text.strip() for t in dash_duo.find_elements(".tab--selected")]
    assert selected == ["AttentionLab"], selected
    units = dash_duo.find_elements(f"#{ID.words} input")
    assert [u.is_selected() for u in units] == [False, True]  # words
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "query '它'", timeout=60)
    stats = dash_duo.find_element(".lab-row").text
    layer = int(dash_duo.find_element(f"#{ID.layer}").text.strip().lstrip("L"))
    head = int(dash_duo.find_element(f"#{ID.head}").text.strip().lstrip("H"))
    # the reference: the library's own capture of the same text, the word row of 它 at the head shown
    cap = attnviz.capture("smollm2", ZH, add_bos=True, layers=[layer])
    words = cap.word_labels
    row = cap.attention(layer, head, words=True)[words.index("它")]
    top = int(row.argmax())
    assert words[top] == "小猫", (layer, head, words[top])  # what SmolLM2 does: it → the kitten
    assert f"top weight {float(row[top]):.2f} on '小猫'" in stats, stats
    assert "'它₁'" not in stats and "<|im_start|>'" not in stats.split(";")[0]

    # Run again with the same text: shown at once, and the page says why nothing seemed to run
    dash_duo.find_element(f"#{ID.run}").click()
    dash_duo.wait_for_text_to_equal(f"#{ID.message}", ALREADY_CAPTURED, timeout=30)
    assert "already captured — shown" in ALREADY_CAPTURED
    # another text is a new capture: the message goes
    run_text(dash_duo, "The cat sat on the mat because it was tired.", expect="12 tokens")  # the message empties
    no_console_errors(dash_duo)


def _names_a_class(node: ast.AST) -> bool:
    """``type(x).__name__`` or ``x.__class__.__name__``."""
    if not (isinstance(node, ast.Attribute) and node.attr == "__name__"):
        return False
    inner = node.value
    return (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "type") or (
        isinstance(inner, ast.Attribute) and inner.attr == "__class__"
    )


def class_names_in_messages(source: str) -> list[int]:
    """The lines of ``source`` where an f-string puts an exception's class name into a text."""
    return sorted(
        node.lineno
        for joined in ast.walk(ast.parse(source))
        if isinstance(joined, ast.JoinedStr)
        for node in ast.walk(joined)
        if _names_a_class(node)
    )


def test_no_page_message_names_an_exception_class():
    """A page message says what happened and what to do; the class name goes to the server's log only."""
    assert class_names_in_messages('f"stopped ({type(err).__name__})"') == [1]  # the scan sees one
    assert class_names_in_messages('f"stopped ({err.__class__.__name__})"') == [1]
    found = {
        path.name: lines
        for path in sorted(DASHBOARD.glob("*.py"))
        if (lines := class_names_in_messages(path.read_text(encoding="utf-8")))
    }
    assert found == {}, found
