"""The package as a user installs it: a wheel in a clean virtual environment serves the dashboard."""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

import attnviz

ROOT = Path(__file__).parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_package_of_the_library_is_in_the_wheel_list():
    """Each folder of attnviz/ with an __init__.py (and the dashboard) is in pyproject's packages: a package moved
    or added without it installs from a checkout but is missing from the wheel."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "attnviz").rglob("__init__.py")}
    assert found - listed == set(), f"add to pyproject.toml's packages: {sorted(found - listed)}"


def test_version_and_license():
    assert main_version() == f"attnviz {attnviz.__version__}"
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()


def main_version() -> str:
    out = subprocess.run([sys.executable, "-m", "attnviz", "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.slow
def test_the_wheel_installs_in_a_clean_venv_and_serves_the_dashboard(tmp_path, tiny_bert_words):
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)], check=True)
    (wheel,) = dist.glob("attnviz-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    requirement = os.environ.get("ATTNVIZ_TORCH") or f"torch=={torch.__version__.split('+')[0]}"
    index = os.environ.get("ATTNVIZ_TORCH_INDEX")
    subprocess.run(
        pip + (["--index-url", index, "--extra-index-url", "https://pypi.org/simple"] if index else []) + [requirement],
        check=True,
    )
    subprocess.run(pip + [f"{wheel}[app]", requirement], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "attnviz" / "dashboard" / "assets" / "attnviz.css").is_file()
    fonts = site / "attnviz" / "assets" / "fonts"  # the CJK face, served and inlined in exports
    assert (fonts / "attnviz-cjk.woff2").stat().st_size > 1e6 and "Open Font License" in (fonts / "OFL.txt").read_text()
    assert not (site / "attnviz" / "dashboard" / "assets" / "fonts").exists()  # one copy of the face
    assert not (site / "apps").exists()  # no top-level name other projects use
    model, tok = tiny_bert_words
    capture_file = attnviz.capture(model, "The cat sat on the mat.", tok).save(tmp_path / "cat.attnviz")
    port = free_port()
    server = subprocess.Popen(
        [str(venv / "bin" / "attnviz"), "app", "--capture", str(capture_file), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        deadline, layout = time.time() + 120, ""
        while time.time() < deadline and not layout:
            try:
                layout = urllib.request.urlopen(f"http://127.0.0.1:{port}/_dash-layout", timeout=5).read().decode()
            except OSError:
                assert server.poll() is None, server.stdout.read().decode()
                time.sleep(1)
        assert '"id":"heatmap-graph"' in layout.replace(" ", "") and "cat.attnviz" in layout
        font = urllib.request.urlopen(f"http://127.0.0.1:{port}/assets/fonts/attnviz-cjk.woff2", timeout=5).read()
        assert font == (fonts / "attnviz-cjk.woff2").read_bytes()
    finally:
        server.terminate()
        server.wait(timeout=30)
