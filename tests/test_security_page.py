"""Issue 51: the dashboard's keys are never paths. An attacker who can reach the page sends a key of their
own — in a link (``?capture=``), in the capture store of one POST to ``/_dash-update-component``, in the
background job's store (its key and Run name) — and the server must neither show nor delete any file for
it: the key is checked against the one form the server gives keys (``check_key``), a file is read or
removed only for a background Run this server started, and the page says the capture is unknown.

The attacks run against a real server (werkzeug in a thread, plain HTTP) and a real browser (a link), and
against ``Captures`` / ``JobFolder`` directly, with a victim capture (a real saved capture of a tiny BERT)
outside the server's folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from attnviz.dashboard import create_app
from attnviz.dashboard.cache import capture_key, digest_key
from attnviz.dashboard.capture_files import JobFolder, check_key, check_run
from attnviz.dashboard.captures import CaptureGone, Captures, UnknownCapture
from attnviz.dashboard.ids import ID
from hypothesis import given, settings
from hypothesis import strategies as st

import attnviz

TEXT = "The cat sat on the mat because it was tired."
UNKNOWN = "does not know"  # what the page says of a key that is not one the server gives


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def bert(model_folder, tiny_bert_words):
    return model_folder("tiny-bert", *tiny_bert_words)


@pytest.fixture
def victim(tmp_path, tiny_bert_words) -> Path:
    """A real capture outside the server's folder, and files beside it a job's cleanup would match."""
    outside = tmp_path / "outside"
    outside.mkdir()
    model, tok = tiny_bert_words
    path = attnviz.capture(model, "A secret text on the server.", tok).save(outside / "victim.attnviz")
    (outside / "victim.job.pid").write_text("999999999")  # a "stopped job": its pid names no process
    (outside / "victim.keep.request.json").write_text("{}")
    (outside / "victim.keep.partial").write_text("half")
    for name in ("other.job.pid", "other.keep.request.json", "other.keep.partial"):  # a "stopped job" without a capture
        (outside / name).write_text("999999999")
    return path


def untouched(victim: Path) -> None:
    outside = victim.parent
    assert sorted(p.name for p in outside.iterdir()) == [
        "other.job.pid",
        "other.keep.partial",
        "other.keep.request.json",
        "victim.attnviz",
        "victim.job.pid",
        "victim.keep.partial",
        "victim.keep.request.json",
    ]
    assert attnviz.load(victim).text == "A secret text on the server."


def hostile_keys(folder: Path, victim: Path) -> list:
    """The keys an attacker sends: the victim by a relative and an absolute path, globs, a long key, a key
    of the right length in the wrong form, and values that are not strings at all."""
    stem = str(victim.with_suffix(""))
    return [
        os.path.relpath(stem, folder),  # ../outside/victim
        os.path.relpath(victim.parent / "other", folder),  # a "stopped job" outside: its leftovers
        "../../" * 12 + stem.lstrip("/"),
        stem,  # an absolute path
        "*",
        "victim*",
        "?" * 24,
        "[0-9a-f]" * 3,
        "a" * 100_000,
        "0123456789ABCDEF01234567",  # the length of a key, not its form
        "0123456789abcdef01234567\n",
        "0123456789abcdef0123456/",
        123,
        ["x"],
        {"key": stem},
        None,
    ]


def folder_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------- the one form of a key
def test_every_key_the_server_makes_has_the_one_form_and_nothing_else_passes():
    made = [capture_key("minilm", TEXT), Captures.key("minilm", TEXT, True, "t", 5), digest_key(b"image", b"x")]
    assert all(check_key(k) == k for k in made)
    for bad in ("../x", "/etc/passwd", "*", "k*", "a" * 24 + "\n", "A" * 24, "a" * 23, "a" * 25, "", 1, None, ["a"]):
        with pytest.raises(UnknownCapture, match=UNKNOWN):
            check_key(bad)
    with pytest.raises(CaptureGone):
        check_run("../../x")
    assert check_run("0" * 32) == "0" * 32


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("latin-1"))))
def test_any_string_is_a_key_of_the_form_or_refused_and_never_names_a_file_outside(tmp_path_factory, key):
    folder = tmp_path_factory.getbasetemp() / "keys"
    folder.mkdir(exist_ok=True)
    files = JobFolder(folder)
    try:
        paths = [files.job_file(key), files.pid_file(key), files.request_file(key, "0" * 32)]
    except UnknownCapture:
        return
    assert len(key) == 24 and set(key) <= set("0123456789abcdef")
    assert all(p.parent == folder.resolve() for p in paths)


# ---------------------------------------------------------------- Captures and JobFolder, directly
def test_a_hostile_key_is_neither_shown_nor_deleted(tmp_path, victim, bert):
    folder = tmp_path / "server"
    folder.mkdir()
    captures = Captures({bert: "tiny BERT"}, folder=folder)
    for key in hostile_keys(folder, victim):
        for attack in (captures.cached, captures.job_state, captures.clean_job, captures.job_files.clean):
            with contextlib.suppress(UnknownCapture, TypeError):
                attack(key)
            untouched(victim)  # first: nothing read into the cache and removed, no job's leftovers removed
        with pytest.raises(UnknownCapture, match=UNKNOWN):
            captures.cached(key)
        with pytest.raises(UnknownCapture, match=UNKNOWN):
            captures.from_store({"key": key, "model": bert, "bos": False})
        with pytest.raises(UnknownCapture):
            captures.job_state(key)
        with pytest.raises(UnknownCapture):
            captures.clean_job(key)
        for clean in (captures.job_files.clean, captures.job_files.state):
            with pytest.raises(UnknownCapture):
                clean(key)
        untouched(victim)
    assert folder_names(folder) == []
    with pytest.raises(UnknownCapture, match=UNKNOWN):
        captures.from_store(["a", "list"])  # type: ignore[arg-type]


def test_a_capture_file_the_server_did_not_write_is_neither_read_nor_deleted(tmp_path, victim, bert):
    """A key of the right form whose file is in the server's folder, but whose job this server never
    started (another process put it there): not adopted, not removed — the capture is unknown."""
    folder = tmp_path / "server"
    folder.mkdir()
    captures = Captures({bert: "tiny BERT"}, folder=folder)
    key = captures.key(bert, "A secret text on the server.")
    planted = folder / f"{key}.attnviz"
    planted.write_bytes(victim.read_bytes())
    assert captures.cached(key) is None
    with pytest.raises(CaptureGone, match="no longer on the server"):
        captures.from_store({"key": key, "model": bert, "bos": False})
    assert planted.exists() and key not in captures.cache
    captures.clean_job(key)  # not a job of this server's: nothing goes
    assert folder_names(folder) == [planted.name]


def test_a_glob_key_cleans_nothing_of_another_pages_run(tmp_path, bert):
    """``*`` as a job's key once matched every page's pending request, pid and half-written capture."""
    folder = tmp_path / "server"
    folder.mkdir()
    captures = Captures({bert: "tiny BERT"}, folder=folder)
    run = captures.leave_request(captures.request(bert, TEXT))  # another page's Run, not begun yet
    key = captures.key(bert, TEXT)
    assert len(run) == 32 and key in captures.started
    left = folder_names(folder)
    assert left == [f"{key}.{run}.request.json"]  # written atomically: no temporary file stays
    for glob in ("*", "*.*", f"{key[:4]}*", "?" * 24):
        with pytest.raises(UnknownCapture):
            captures.clean_job(glob)
        with pytest.raises(UnknownCapture):
            captures.job_files.clean(glob)
    assert folder_names(folder) == left
    assert captures.job_state(key) == "starting"


def test_the_job_takes_only_a_request_the_server_left_under_its_key(tmp_path, victim, bert):
    folder = tmp_path / "server"
    folder.mkdir()
    captures = Captures({bert: "tiny BERT"}, folder=folder)
    run = captures.leave_request(captures.request(bert, TEXT))
    key = captures.key(bert, TEXT)
    for bad_run in ("../../outside/victim", "keep", "*", run[:12], 7, None):
        with pytest.raises(CaptureGone):
            captures.save_for_server(key, bad_run)  # type: ignore[arg-type]
    with pytest.raises(UnknownCapture):
        captures.save_for_server(os.path.relpath(victim.with_suffix(""), folder), "keep")
    other = captures.key(bert, "another text")
    os.rename(folder / f"{key}.{run}.request.json", folder / f"{other}.{run}.request.json")
    with pytest.raises(CaptureGone, match="request is gone"):  # a request renamed under another key
        captures.save_for_server(other, run)
    untouched(victim)


def test_a_background_capture_is_written_whole_and_adopted_by_the_server_that_started_it(tmp_path, bert):
    folder = tmp_path / "server"
    folder.mkdir()
    server = Captures({bert: "tiny BERT"}, folder=folder)
    job = Captures({bert: "tiny BERT"}, folder=folder)  # the job's copy
    run = server.leave_request(server.request(bert, TEXT))
    key = server.key(bert, TEXT)
    job.save_for_server(key, run)
    assert folder_names(folder) == [f"{key}.attnviz"]  # no temporary file, no pid, no request
    assert server.from_store({"key": key, "model": bert, "bos": False}).text == TEXT
    assert folder_names(folder) == []  # adopted, then removed: a file this server's job wrote


# ---------------------------------------------------------------- a real server, plain HTTP
@pytest.fixture
def served(bert, monkeypatch):
    from attnviz.dashboard import app as app_module
    from werkzeug.serving import make_server

    made: list[Captures] = []
    monkeypatch.setattr(app_module, "Captures", lambda *a, **k: made.append(Captures(*a, **k)) or made[-1])
    app = create_app({bert: "tiny BERT"}, default_model=bert)
    app.captures = made[0]  # the tests' way in: what the server holds
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield app, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


def _http(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as err:
        return err.code, {}


def post(served, output: str, inputs: dict, state: dict | None = None) -> dict:
    """One POST to ``/_dash-update-component`` as the page makes it (a background callback polled until it
    answers): the callback's outputs, by id."""
    app, base = served
    callback = app.callback_map[output]
    state = state or {}
    outputs = [o.split(".") for o in output.strip(".").split("...")]
    body = {
        "output": output,
        "outputs": [{"id": i, "property": p} for i, p in outputs]
        if "..." in output
        else dict(zip(("id", "property"), outputs[0], strict=True)),
        "inputs": [{**i, "value": inputs.get(i["id"])} for i in callback["inputs"]],
        "state": [{**s, "value": state.get(s["id"])} for s in callback["state"]],
        "changedPropIds": [f"{callback['inputs'][0]['id']}.{callback['inputs'][0]['property']}"],
    }
    status, answer = _http(f"{base}/_dash-update-component", body)
    deadline = time.monotonic() + 120
    while status in (200, 204) and "response" not in answer and "job" in answer:  # a background job
        assert time.monotonic() < deadline
        time.sleep(0.2)
        query = f"?cacheKey={answer['cacheKey']}&job={answer['job']}"
        status, polled = _http(f"{base}/_dash-update-component{query}", body)
        answer = polled or answer if "response" not in polled else polled
    assert status == 200, status
    return answer["response"]


def output_of(app, *parts: str) -> str:
    """The callback_map key of the callback whose outputs include every ``id.property`` in ``parts``."""
    found = [key for key in app.callback_map if all(part in key for part in parts)]
    assert found, parts
    return min(found, key=len)


def test_a_hostile_store_key_in_one_post_shows_no_file_and_deletes_none(served, victim):
    app, _ = served
    folder = app.captures.folder
    provenance = output_of(app, f"{ID.provenance}.children")
    for key in hostile_keys(folder, victim):
        shown = post(served, provenance, {ID.store: {"key": key, "model": "x", "bos": False}, ID.tabs: "validation"})
        untouched(victim)  # first: neither deleted (adopted into the cache, then removed) …
        said = json.dumps(shown)
        assert "secret" not in said and "BertModel" not in said  # … nor shown (its provenance table)
        assert UNKNOWN in said
    assert not list(folder.glob("*.attnviz"))


def test_a_hostile_link_in_one_post_is_a_message_not_a_file(served, victim):
    """``?capture=/path``: the address callback reads the key of the link."""
    app, _ = served
    read = next(k for k, cb in app.callback_map.items() if {"id": ID.url, "property": "search"} in cb["inputs"])
    for key in hostile_keys(app.captures.folder, victim)[:8]:
        shown = post(served, read, {ID.url: f"?capture={urllib.parse.quote(str(key))}&model=x&tab=lab"})
        assert UNKNOWN in shown[ID.message]["children"]
        untouched(victim)


def test_a_hostile_job_key_in_one_post_cleans_nothing(served, victim, bert):
    """The background capture's watch (a key whose job "stopped" had its pid, requests and half files
    removed: outside the folder by a path, another page's running job by a glob) and the job itself (a key
    whose capture "is there" had its request removed; a Run name that is no Run had the pid removed)."""
    app, _ = served
    folder = app.captures.folder
    key = capture_key(bert, TEXT)
    running = [f"{key}.job.pid", f"{key}.1234.5678.partial", f".{key}.attnviz.{os.getpid()}.0a0b0c0d.attnviz-tmp"]
    (folder / running[0]).write_text(str(os.getpid()))  # another page's job, still running (this process)
    for name in running[1:]:
        (folder / name).write_text("half a capture")
    watch = output_of(app, f"{ID.job_watch}.disabled")
    said = []
    for hostile in hostile_keys(folder, victim):
        shown = post(served, watch, {ID.job_watch: 1}, {ID.job: {"key": hostile, "cancels": 0}, ID.job_cancel: 0})
        untouched(victim)
        assert folder_names(folder) == sorted(running)  # the running job keeps its pid and its half capture
        said.append(json.dumps(shown))
    assert all("did not start" in s or UNKNOWN in s for s in said), said
    app.captures.leave_request(app.captures.request(bert, TEXT))  # a page's Run, not begun
    pending = folder_names(folder)
    job = output_of(app, f"{ID.job_done}.data")
    said = []
    for hostile, run in [(os.path.relpath(victim.with_suffix(""), folder), "keep"), (key, "*"), (key, "../x")]:
        shown = post(served, job, {ID.job: {"key": hostile, "run": run, "model": bert, "bos": False}})
        untouched(victim)
        assert folder_names(folder) == pending
        said.append(shown[ID.job_done]["data"].get("error", ""))
    assert all("did not start" in s or UNKNOWN in s for s in said), said


# ---------------------------------------------------------------- a link in a real browser
@pytest.mark.browser
def test_a_link_naming_a_path_shows_a_message_in_the_browser(dash_duo, victim, bert):
    dash_duo.start_server(create_app({bert: "tiny BERT"}, default_model=bert))
    stem = str(victim.with_suffix(""))
    dash_duo.driver.get(f"{dash_duo.server_url}/?capture={urllib.parse.quote(stem)}&model={bert}&tab=lab")
    dash_duo.wait_for_contains_text(f"#{ID.message}", UNKNOWN, timeout=60)
    message = dash_duo.find_element(f"#{ID.message}").text
    assert "never a file" in message and "secret" not in dash_duo.find_element("body").text
    untouched(victim)


def test_a_download_is_named_from_safe_characters_only():
    """The page's selections (tab, part) name the downloaded file: no separator or control character."""
    from attnviz.dashboard.export_view import file_name

    name = file_name("attnviz-../../etc/cron.d/x\r\nSet-Cookie: a-L1-H2.html")
    assert "/" not in name and "\n" not in name and "\r" not in name and " " not in name
    assert name.endswith("-L1-H2.html") and file_name("attnviz-lab-L1-H2.html") == "attnviz-lab-L1-H2.html"
    assert len(file_name("a" * 10_000 + ".csv")) <= 120 and file_name("a" * 10_000 + ".csv").endswith(".csv")
