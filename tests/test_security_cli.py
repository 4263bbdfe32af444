"""Issue #51, as an attacker reproduced it: the command line ends every input or environment problem with
one line on stderr and exit status 2 (1 only for a failed validation, 75 for a signal's stop), never a
traceback; and no input is taken silently wrong (an invisible text, a byte-order mark, a file that is not
UTF-8, a lone surrogate, a terminal escape in a capture's text, a NaN's count of heads).

A few cases run ``python -m attnviz`` in a fresh process (each start costs seconds); the rest call
``attnviz.cli.main`` or the library."""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import attnviz
from attnviz.cli import EXIT_STATUS, build_parser, exit_status, main
from attnviz.errors import (
    CaptureFileError,
    EmptyTextError,
    FileWriteError,
    InputError,
    Interrupted,
    ModelNotFoundError,
    ValidationError,
)

TEXT = "the cat sat on the mat"


def one_error_line(err: str) -> str:
    """The single line stderr holds: no traceback, no warning, no second line."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "attnviz", *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd
    )


class _Planted:
    """A pickle that, loaded without ``weights_only``, creates a file: the proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory, bert_tokenizer):
    """A tiny BERT saved as a good folder, and the attacker's: a pickle for weights, broken safetensors,
    a link out of the folder; the marker the pickle would create."""
    root = tmp_path_factory.mktemp("attack")
    model = attnviz.testing.tiny_model("bert", attn_implementation="eager", vocab_size=bert_tokenizer.vocab_size)
    good = root / "good"
    model.save_pretrained(good)
    bert_tokenizer.save_pretrained(good)
    made = {"good": good, "marker": root / "PWNED"}
    for name in ("pickle", "broken", "link"):
        made[name] = root / name
        shutil.copytree(good, made[name])
        (made[name] / "model.safetensors").unlink()
    with open(made["pickle"] / "pytorch_model.bin", "wb") as f:
        pickle.dump(_Planted(str(made["marker"])), f)
    (made["broken"] / "model.safetensors").write_bytes(b"\x00\x01 not safetensors " * 8)
    secret = root / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (made["link"] / "model.safetensors").symlink_to(secret)
    return made


@pytest.fixture
def no_server(monkeypatch):
    import attnviz.dashboard

    served: list[dict] = []
    monkeypatch.setattr(attnviz.dashboard, "run", lambda **kwargs: served.append(kwargs))
    return served


# ------------------------------------------------------------------ exit status: one table, in --help
def test_the_exit_status_is_one_table_said_in_help():
    assert exit_status(ValidationError("a head over tolerance")) == 1
    assert exit_status(Interrupted("stopped by SIGTERM")) == 75
    for err in (
        InputError("x"),
        ModelNotFoundError("x"),
        CaptureFileError("x"),
        FileWriteError("x"),
        IsADirectoryError(21, "Is a directory"),
        UnicodeDecodeError("utf-8", b"\xe9", 0, 1, "invalid continuation byte"),
        pickle.UnpicklingError("Unsupported operand 149"),
    ):
        assert exit_status(err) == 2, err
    from safetensors import SafetensorError

    assert exit_status(SafetensorError("Error while deserializing header: header too large")) == 2
    assert exit_status(ZeroDivisionError()) is None  # a bug keeps its traceback
    assert [status for _, status in EXIT_STATUS][:2] == [1, 75]  # the finding before the errors it is one of
    said = " ".join(build_parser().format_help().split())
    assert "exit status: 0 success; 1 validation failed" in said
    assert "2 a usage, input or environment error" in said and "75 stopped by SIGTERM/SIGINT" in said


def test_the_cli_reference_says_the_exit_statuses():
    from pathlib import Path

    page = " ".join((Path(__file__).parent.parent / "docs" / "reference" / "cli.md").read_text().split())
    assert "<!-- attnviz:cli -->" in page  # the --help (and its epilog) is generated into the page
    assert "2 for a usage, input or environment error" in page


# ------------------------------------------------------------------ unsafe and broken weights
def test_a_pickle_for_weights_is_exit_2_in_one_line_and_runs_no_code(folders):
    done = cli("capture", str(folders["pickle"]), TEXT)  # end to end: a fresh process, as an attacker runs it
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert "pytorch_model.bin" in line and "pickle" in line and "model.safetensors" in line, line
    assert not folders["marker"].exists()


def test_broken_safetensors_are_a_model_error_naming_the_file(folders, capsys):
    with pytest.raises(ModelNotFoundError, match=r"model\.safetensors'\): not a readable safetensors file"):
        attnviz.load_model(str(folders["broken"]))
    assert main(["capture", str(folders["broken"]), TEXT]) == 2
    assert "download or save the model again" in one_error_line(capsys.readouterr().err)


def test_a_link_out_of_the_model_folder_is_refused_before_loading(folders, capsys, monkeypatch):
    import safetensors

    def opened(*args, **kwargs):
        raise AssertionError("a file of the folder was read")

    monkeypatch.setattr(safetensors, "safe_open", opened)
    with pytest.raises(InputError, match=r"model\.safetensors' is a symbolic link to .*secret\.txt', outside"):
        attnviz.load_model(str(folders["link"]))
    assert main(["capture", str(folders["link"]), TEXT]) == 2
    assert "outside the model folder" in one_error_line(capsys.readouterr().err)


def test_a_link_inside_the_model_folder_is_read(folders, tmp_path):
    inside = tmp_path / "inside"
    shutil.copytree(folders["good"], inside)
    (inside / "weights").mkdir()
    (inside / "model.safetensors").rename(inside / "weights" / "model.safetensors")
    (inside / "model.safetensors").symlink_to(inside / "weights" / "model.safetensors")
    model, _ = attnviz.load_model(str(inside))
    assert model is not None


def test_atlas_checkpoints_keeps_and_writes_what_it_finished_when_a_later_one_fails(folders, tmp_path, capsys):
    import pandas as pd

    first, second = tmp_path / "checkpoint-1", tmp_path / "checkpoint-2"
    shutil.copytree(folders["good"], first)
    shutil.copytree(folders["broken"], second)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog ran in the park\n")
    saved, out = tmp_path / "timeline.ckpt", tmp_path / "timeline.csv"
    with pytest.raises(ModelNotFoundError, match=r"checkpoint 'checkpoint-2' \(2 of 2\) failed: .*kept in") as caught:
        attnviz.head_timeline([first, second], str(corpus), roles="sink", checkpoint=saved, progress=False)
    assert saved.is_file()  # the first checkpoint's atlas, to resume from
    finished = caught.value.partial
    assert set(finished.checkpoint) == {"checkpoint-1"} and len(finished) == 8  # 2 layers × 4 heads, one role
    saved.unlink()
    capsys.readouterr()  # the library call's loading bars
    argv = ["atlas", "--checkpoints", f"{first},{second}", str(corpus), "--roles", "sink", "-o", str(out), "--quiet"]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        "checkpoint 'checkpoint-2' (2 of 2) failed" in line
        and f"the rows of the 1 finished checkpoint written to {out}" in line
    ), line
    table = pd.read_csv(out)
    assert table.checkpoint.tolist() == finished.checkpoint.tolist()
    assert table.score.tolist() == pytest.approx(finished.score.tolist())


# ------------------------------------------------------------------ files the command line writes
def test_out_naming_a_folder_is_one_line_before_the_model_loads(folders, tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before -o was checked")

    monkeypatch.setattr("attnviz.workflows.capture.pipeline.load_model", refuse)
    assert main(["capture", str(folders["good"]), TEXT, "-o", str(tmp_path)]) == 2
    assert "it is a folder; give a file name" in one_error_line(capsys.readouterr().err)


def test_a_full_disk_while_saving_a_capture_is_one_line(folders, tmp_path, capsys, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    out = tmp_path / "cat.attnviz"
    out.write_bytes(b"the previous capture")
    assert main(["capture", str(folders["good"]), TEXT, "-o", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "No space left on device" in line and "cat.attnviz" in line, line
    assert out.read_bytes() == b"the previous capture"
    assert [p.name for p in tmp_path.iterdir()] == ["cat.attnviz"]  # no temporary file left


def test_tables_are_written_through_atomic_path(tmp_path):
    import pandas as pd

    from attnviz.analysis import write_table
    from attnviz.cli.runs import written_as_csv

    frame = pd.DataFrame({"a": [1, 2]})
    (tmp_path / "folder.csv").mkdir()
    for write in (lambda p: write_table(frame, p), lambda p: written_as_csv(frame, str(p), index=False)):
        with pytest.raises(FileWriteError, match="it is a folder"):
            write(tmp_path / "folder.csv")
        with pytest.raises(FileWriteError, match="does not exist"):
            write(tmp_path / "missing" / "t.csv")
        write(tmp_path / "t.csv")
        assert pd.read_csv(tmp_path / "t.csv").a.tolist() == [1, 2]


def test_app_refuses_a_bad_capture_before_it_serves(tmp_path, no_server, capsys):
    bad = tmp_path / "bad.attnviz"
    bad.write_bytes(b"garbage, not safetensors")
    assert main(["app", "--capture", str(bad), "--port", "8097"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: attnviz app --capture: ")
    assert no_server == []


# ------------------------------------------------------------------ texts
@pytest.mark.parametrize("text", ["\u200b\u200c\u200d", "\u2060\ufeff", "\x01\x07\x1b", " \u200b\n\t\x00 ", "\u200b"])
def test_a_text_with_no_visible_character_is_empty(text):
    from attnviz.models import check_texts

    with pytest.raises(EmptyTextError, match="no visible character"):
        check_texts(text)
    assert check_texts(["a\u200bb"]) == ["a\u200bb"]  # a word with a zero-width joiner in it is a word


def test_an_invisible_text_captures_nothing(folders, capsys):
    assert main(["capture", str(folders["good"]), "\u200b\u200b\x07"]) == 2  # it captured [CLS] [SEP] before
    assert "no visible character" in one_error_line(capsys.readouterr().err)


def test_a_lone_surrogate_is_an_input_error_naming_it():
    from attnviz.models import check_texts

    with pytest.raises(InputError, match=r"the text holds a lone surrogate U\+D800 at character 5: "):
        check_texts("hello\ud800world")


def test_a_lone_surrogate_on_the_command_line_is_one_line(folders):
    bad = os.fsencode(str(folders["good"]))
    done = subprocess.run(  # bytes that are not UTF-8 in argv arrive as lone surrogates
        [sys.executable, "-m", "attnviz", "capture", bad, b"the caf\xe9 sat"],
        capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert done.returncode == 2
    assert "lone surrogate U+DCE9 at character 7" in one_error_line(done.stderr.decode())


# ------------------------------------------------------------------ files read: BOM, not UTF-8
def test_a_bom_is_no_part_of_a_corpus(tmp_path):
    from attnviz.analysis import read_texts

    for name, body in (("c.txt", "the cat sat\nit slept\n"), ("c.jsonl", '{"text": "the cat sat"}\n')):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + body.encode())
        assert next(read_texts(path)) == "the cat sat"


PROBE = {"text": "The cat chased the mouse because it was hungry.", "pronoun": "it", "candidates": ["cat", "mouse"]}


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_a_bom_keeps_the_first_probe(tmp_path, suffix):
    from attnviz.analysis import load_probes

    path = tmp_path / f"p{suffix}"
    rows = [{**PROBE, "gold": "cat"}, {**PROBE, "gold": "cat", "text": PROBE["text"].replace("hungry", "fast")}]
    if suffix == ".jsonl":
        body = "".join(json.dumps(r) + "\n" for r in rows)
    elif suffix == ".json":
        body = json.dumps(rows)
    else:
        body = "text,pronoun,candidates,gold\n" + "".join(
            f'"{r["text"]}",it,"[""cat"", ""mouse""]",cat\n' for r in rows
        )
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    probes = load_probes(path)
    assert len(probes) == 2 and probes.problems.empty


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".txt"])
def test_a_file_that_is_not_utf8_names_the_file_and_line(tmp_path, suffix):
    from attnviz.analysis import load_probes, read_texts

    path = tmp_path / f"latin{suffix}"
    path.write_bytes(json.dumps(PROBE).encode() + b"\n" + '{"text": "Café"}\n'.encode("latin-1"))
    read = (lambda: list(read_texts(path))) if suffix == ".txt" else (lambda: load_probes(path))
    with pytest.raises(InputError, match=rf"latin\{suffix}' is not UTF-8 text \(invalid continuation byte\) at line 2"):
        read()


def test_probes_from_a_file_that_is_not_utf8_is_one_line(tmp_path, folders, capsys):
    path = tmp_path / "latin.jsonl"
    path.write_bytes('{"text": "Café"}\n'.encode("latin-1"))
    assert main(["probes", str(folders["good"]), str(path), "--quiet"]) == 2
    assert "is not UTF-8 text" in one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------ what the terminal is shown
def test_info_shows_control_characters_escaped(folders, tmp_path, capsys):
    model, tokenizer = attnviz.load_model(str(folders["good"]))
    text = "the cat\x1b[2J\x1b]0;owned\x07 sat\u202e on the mat"
    path = tmp_path / "escape.attnviz"
    attnviz.capture(model, text, tokenizer=tokenizer).save(path)
    assert main(["info", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "text:" in shown and r"the cat\x1b[2J\x1b]0;owned\x07 sat\u202e on the mat" in shown


def test_the_shown_helper_escapes_only_what_does_not_print():
    from attnviz.cli.runs import shown

    assert shown("Café 猫 sat") == "Café 猫 sat"
    assert shown("a\x1b[31mb\rc\n") == r"a\x1b[31mb\rc\n"


# ------------------------------------------------------------------ the validation's message
def test_a_nan_validation_counts_its_heads():
    from attnviz.data.validate import ValidationReport

    def row(head: int, error: float) -> dict:
        return {
            "part": "encoder",
            "layer": 0,
            "head": head,
            "quantity": "output",
            "rows": 4,
            "max_abs_error": error,
            "rel_error": error,
            "tolerance": 1e-4,
            "passed": not math.isnan(error) and error < 1e-4,
        }

    one = ValidationReport([row(0, math.nan), row(1, 1e-7)], "m", "eager", "float32", 1e-5, 1e-4)
    assert "more heads" not in str(one)
    three = ValidationReport([row(h, math.nan) for h in range(3)], "m", "eager", "float32", 1e-5, 1e-4)
    assert "and 2 more heads with the same error" in str(three)


# the characters an attacker or a careless copy brings: controls, zero-width and direction marks, a BOM,
# surrogates — alone, and among CJK, combining marks, emoji, HTML and ordinary letters
INVISIBLE = st.sampled_from(list("\x00\x07\x1b\x7f\u200b\u200c\u200d\u2060\ufeff\u202e\u2028\u2029\t\n\r \u3000"))
ODD = st.sampled_from(["\ud800", "\udfff", "<", ">", "&", '"', "'", "\u0301", "猫", "它", "😀", "é", "\x1b[31m"])
LETTERS = st.characters(codec="utf-8", categories=("Ll", "Lu", "Nd", "Po"))
TEXTS = st.one_of(
    st.text(INVISIBLE, max_size=8),
    st.lists(st.one_of(INVISIBLE, ODD, LETTERS), max_size=16).map("".join),
)


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(text="\u200b\u200c")
@example(text="\ufeff\x07")
@example(text="a\ud800b")
@given(text=TEXTS)
def test_any_text_is_captured_whole_or_refused_by_name(tiny_bert_words, text):
    """Whatever characters a text holds, a capture either holds every visible character in its words, or
    refuses the text as an InputError (empty, invisible, a lone surrogate) — never another exception, never a
    capture of only the model's special tokens."""
    model, tokenizer = tiny_bert_words
    try:
        cap = attnviz.capture(model, text, tokenizer=tokenizer)
    except EmptyTextError:
        assert not any(not ch.isspace() and unicodedata.category(ch) not in ("Cc", "Cf") for ch in text), (
            f"refused a visible text: {text!r}"
        )
        return
    except InputError as err:
        assert any("\ud800" <= ch <= "\udfff" for ch in text), f"{text!r}: {err}"
        return
    assert any(w.char_end > w.char_start for w in cap.words), f"{text!r} captured without a word: {cap.tokens}"
    covered = {i for w in cap.words for i in range(w.char_start, w.char_end)}
    shown = [i for i, ch in enumerate(text) if not ch.isspace() and unicodedata.category(ch) not in ("Cc", "Cf")]
    assert set(shown) <= covered, (text, cap.words)
