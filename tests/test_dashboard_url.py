"""Links that reopen a view (issue 46, item 3): the page's address holds its capture and selections, so a
reload, back/forward and a copied link opened in a new browser session show the same view, and a link to a
capture the server no longer holds says so."""

from urllib.parse import parse_qs, urlsplit

import pytest
from attnviz.dashboard.ids import ID
from attnviz.dashboard.url_state import parse, search_of
from test_dashboard import CAT, choose, no_console_errors, open_tab, poll, run_text, start_minilm, wait_status


def query(dash_duo) -> dict:
    return {k: v[-1] for k, v in parse_qs(urlsplit(dash_duo.driver.current_url).query).items()}


def title(dash_duo) -> str:
    return dash_duo.find_element(f"#{ID.heatmap} .gtitle").text


def shown(dash_duo) -> dict:
    """What the page shows: its status, the heatmap's title, the units, the measure and the open tab."""
    radios = {
        name: [i.get_attribute("value") for i in dash_duo.find_elements(f"#{ident} input") if i.is_selected()]
        for name, ident in (("units", ID.words), ("measure", ID.measure))
    }
    return {
        "status": dash_duo.find_element(f"#{ID.status}").text,
        "title": title(dash_duo),
        **radios,
        "tab": dash_duo.find_element(".tab--selected").text,
    }


def set_view(dash_duo) -> None:
    """CAT at L3·H2, in words, showing what moves."""
    run_text(dash_duo, CAT, expect="13 tokens")
    choose(dash_duo, f"#{ID.layer}", 3)
    choose(dash_duo, f"#{ID.head}", 2)
    dash_duo.find_elements(f"#{ID.words} input")[1].click()
    dash_duo.find_elements(f"#{ID.measure} input")[1].click()
    poll(lambda: "L3·H2" in title(dash_duo) and "word" in title(dash_duo))
    poll(lambda: query(dash_duo).get("measure") == "moved" and query(dash_duo).get("head") == "2")


def test_a_view_round_trips_through_its_query_string():
    store = {"key": "abc", "model": "minilm", "bos": True}
    search = search_of(store, "lab", "encoder", 3, 2, "words", 7, "moved")
    assert (
        search
        == "?capture=abc&model=minilm&bos=1&tab=lab&part=encoder&layer=3&head=2&units=words&query=7&measure=moved"
    )
    link = parse(search)
    assert link == {
        "store": store,
        "tab": "lab",
        "part": "encoder",
        "layer": 3,
        "head": 2,
        "units": "words",
        "query": 7,
        "measure": "moved",
    }
    # what it cannot read is left to the capture's defaults; no capture, no view
    odd = parse("?capture=abc&model=minilm&tab=nope&layer=x&units=letters&measure=both&generate=5")
    assert odd["store"] == {"key": "abc", "model": "minilm", "bos": False, "generate": 5}
    assert (odd["tab"], odd["layer"], odd["units"], odd["measure"]) == (None, None, None, None)
    assert parse("?tab=lab") is None and parse("") is None and search_of(None, "lab", *[None] * 6) == ""


@pytest.mark.browser
@pytest.mark.slow
def test_a_reload_and_a_copied_link_in_a_new_session_open_the_same_view(dash_duo):
    start_minilm(dash_duo)
    set_view(dash_duo)
    expected = shown(dash_duo)
    assert expected["units"] == ["words"] and expected["measure"] == ["moved"] and "13 tokens" in expected["status"]
    link = dash_duo.driver.current_url
    assert query(dash_duo)["layer"] == "3" and query(dash_duo)["units"] == "words"
    dash_duo.driver.refresh()
    wait_status(dash_duo, "13 tokens")
    poll(lambda: shown(dash_duo) == expected, timeout=30)
    # a new browser session: no page state at all, the link alone
    dash_duo.driver.delete_all_cookies()
    dash_duo.driver.switch_to.new_window("window")
    dash_duo.driver.get(link)
    wait_status(dash_duo, "13 tokens")
    poll(lambda: shown(dash_duo) == expected, timeout=30)
    assert "cat" in [t.text for t in dash_duo.find_elements(f"#{ID.heatmap} .xtick text")]
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_back_and_forward_return_to_the_previous_views(dash_duo):
    start_minilm(dash_duo)
    set_view(dash_duo)
    choose(dash_duo, f"#{ID.head}", 5)
    poll(lambda: "L3·H5" in title(dash_duo) and query(dash_duo).get("head") == "5")
    dash_duo.driver.back()
    poll(lambda: "L3·H2" in title(dash_duo) and query(dash_duo).get("head") == "2", timeout=30)
    assert shown(dash_duo)["measure"] == ["moved"]
    dash_duo.driver.forward()
    poll(lambda: "L3·H5" in title(dash_duo) and query(dash_duo).get("head") == "5", timeout=30)
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_a_link_to_a_capture_the_server_does_not_hold_says_so(dash_duo):
    start_minilm(dash_duo)
    dash_duo.driver.get(dash_duo.server_url + "/?capture=0123456789abcdef01234567&model=minilm&bos=0&tab=lab&layer=2")
    dash_duo.wait_for_contains_text(f"#{ID.message}", "no longer on the server", timeout=30)
    message = dash_duo.find_element(f"#{ID.message}").text
    assert "Press Run model to capture the text again" in message and "Error" not in message
    run_text(dash_duo, CAT, expect="13 tokens")  # the page still works: a Run opens a capture
    poll(lambda: query(dash_duo).get("capture") not in (None, "0123456789abcdef01234567"))
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_the_lab_and_its_query_come_back_after_a_reload(dash_duo):
    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="13 tokens")
    open_tab(dash_duo, "AttentionLab")
    poll(lambda: query(dash_duo).get("tab") == "lab")
    chip = dash_duo.find_element(f'[id*="{ID.lab_token}"][id*=\'"index":3\']')
    dash_duo.driver.execute_script("arguments[0].click();", chip)
    poll(lambda: query(dash_duo).get("query") == "3" and "sat" in dash_duo.find_element(f"#{ID.lab_stats}").text)
    stats = dash_duo.find_element(f"#{ID.lab_stats}").text
    dash_duo.driver.refresh()
    wait_status(dash_duo, "13 tokens")
    poll(lambda: dash_duo.find_element(".tab--selected").text == "AttentionLab", timeout=30)
    poll(lambda: dash_duo.find_element(f"#{ID.lab_stats}").text == stats, timeout=30)
    assert query(dash_duo).get("query") == "3"
    no_console_errors(dash_duo)
