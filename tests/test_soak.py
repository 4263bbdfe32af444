"""The load-and-soak bench's harness (bench/soak.py, bench/dash_http.py), small enough for every test run:
two sessions × ten interactions on one server with a tiny Llama and short texts past ``background_from=4``
(so background captures and view jobs run), its checks passing; and the cross-talk check failing when
one page reads another page's capture."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from attnviz.dashboard import create_app
from attnviz.dashboard.app import DEFAULT_TEXT
from attnviz.dashboard.captures import Captures, wants_bos

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import soak  # noqa: E402 - bench/ on the path


def test_a_small_soak_passes_its_checks(llama_folder, tmp_path):
    out = tmp_path / "soak.md"
    command = [sys.executable, str(BENCH / "soak.py"), "--sessions", "2", "--steps", "10", "--sizes", "24", "40"]
    command += ["--background-from", "4", "--model", llama_folder, "--seed", "3", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    table = out.read_text() if out.exists() else done.stdout + done.stderr[-3000:]
    assert done.returncode == 0, table
    assert "| errors | 0 |" in table and "| cross-talk | 0 |" in table
    assert "| view workers killed | 1 |" in table and "| capture processes killed | 1 |" in table
    polls = int(table.split("(callback requests + background polls) | ")[1].split("(")[1].split(" polls")[0])
    assert polls > 0  # the background captures ran, and were polled to their end
    assert "- FAILED" not in table


@pytest.fixture
def server(llama_folder):
    app = create_app({llama_folder: "tiny"}, default_model=llama_folder, cache_bytes=64 << 20)
    server, base = soak.serve(app)
    yield base
    server.shutdown()


def test_the_crosstalk_check_sees_a_page_reading_another_pages_capture(server, llama_folder, smol_tokenizer):
    measure = Captures({llama_folder: "tiny"})
    bos = wants_bos(llama_folder)
    texts = [soak.Text(measure, llama_folder, soak.text_of(smol_tokenizer, n, i), bos) for i, n in enumerate([20, 30])]
    stats = soak.Stats()
    initial = soak.Text(measure, llama_folder, DEFAULT_TEXT, bos)
    one, two = (soak.Session(f"s{i}", server, texts, i, stats, 60, initial) for i in range(2))
    for session, text in ((one, texts[0]), (two, texts[1])):
        session.start()
        session.run(text)
        session.check()
    assert stats.crosstalk == [] and stats.errors == []
    two.page.props[("capture-store", "data")] = one.page.get("capture-store", "data")  # the sabotage
    two.head()
    two.check()
    assert any("not its own" in said for said in stats.crosstalk), stats.crosstalk
    assert stats.errors == []
