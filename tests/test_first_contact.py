"""Small things a new user meets: byte-level tokens shown as the characters they form, capture files
with the user's normal permissions, an install without setuptools warnings."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import attnviz
from attnviz.data.predictions import byte_text, token_text, tokens_text
from attnviz.workflows.capture.models import IdsTokenizer, describe_model

ROOT = Path(__file__).parent.parent


def test_bytes_read_as_the_characters_they_form_and_a_partial_one_is_marked():
    small = "小".encode()  # e5 b0 8f
    assert byte_text(small) == "小"
    assert byte_text(small[:2]) == "‹e5 b0›" and byte_text(small[2:]) == "‹8f›"
    assert byte_text("中".encode() + small[:1]) == "中‹e5›"
    assert byte_text(b"cat") == "cat" and byte_text(small[1:] + b"a" + small[:1]) == "‹b0 8f›a‹e5›"


@pytest.mark.slow
def test_a_chinese_prediction_shows_its_character_not_its_bytes():
    """SmolLM2's byte-level BPE: 的 is one token, ç (the byte e7) the first byte of 的, 看 … — the
    prediction labels read 的 and ‹e7›, never '\\xe7'."""
    _, tok = describe_model("smollm2")
    whole = tok("的", add_special_tokens=False)["input_ids"]
    assert len(whole) == 1 and token_text(tok, whole[0]) == "的"
    lead = tok.convert_tokens_to_ids("ç")  # the byte 0xe7 in GPT-2's byte table
    assert token_text(tok, lead) == "‹e7›"
    pieces = tok("𝄞", add_special_tokens=False)["input_ids"]  # a 4-byte character, split into pieces
    labels = [token_text(tok, i) for i in pieces]
    assert all("\\x" not in label for label in labels), labels
    assert len(pieces) == 1 or all(label.startswith("‹") for label in labels), labels


@pytest.mark.slow
def test_several_tokens_read_as_one_text_join_their_bytes_first():
    """head_importance's target given as ids: the pieces of one character read as that character."""
    _, tok = describe_model("smollm2")
    ids = tok("小猫𝄞", add_special_tokens=False)["input_ids"]
    assert tokens_text(tok, ids) == "小猫𝄞"
    assert tokens_text(tok, ids[:-1]).startswith("小猫") and "\\x" not in tokens_text(tok, ids[:-1])
    assert tokens_text(None, [5, 7]) == "5 7"


@pytest.fixture
def umask():
    """Set the process's umask for a test; restored after."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_a_capture_file_gets_the_users_normal_permissions(tmp_path, umask, mask, mode):
    cap = attnviz.capture(attnviz.testing.tiny_model("gpt2"), "1 2 3", IdsTokenizer())
    umask(mask)
    path = cap.save(tmp_path / "cap.attnviz")
    assert stat.S_IMODE(path.stat().st_mode) == mode  # safetensors alone writes 0600
    path.chmod(0o640)
    cap.save(path)  # an existing file keeps its own mode, as a plain write leaves it
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert attnviz.load(path).n_tokens == cap.n_tokens


def test_a_failed_save_leaves_no_empty_file(tmp_path, monkeypatch):
    cap = attnviz.capture(attnviz.testing.tiny_model("gpt2"), "1 2 3", IdsTokenizer())

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", disk_full)
    with pytest.raises(attnviz.CaptureFileError, match="cannot write .*the disk is full"):
        cap.save(tmp_path / "cap.attnviz")
    assert list(tmp_path.iterdir()) == []  # neither the file nor a temporary one


@pytest.mark.slow
def test_building_the_package_prints_no_setuptools_warning(tmp_path):
    """setuptools warned that attnviz.probes and attnviz.dashboard.assets (data folders) are absent
    from `packages`, and that a license table is deprecated."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    log = result.stdout + result.stderr
    assert "BuildBackendWarning" not in log and "absent from the `packages` configuration" not in log, log[-3000:]
    wheel = next(tmp_path.glob("attnviz-*.whl"))
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "attnviz/probes/en.jsonl" in names and "attnviz/dashboard/assets/attnviz.css" in names
