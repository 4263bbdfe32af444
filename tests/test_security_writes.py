"""Every file attnviz writes is written atomically (attnviz.files): attacked with concurrent writers, a disk
that fills part way, a folder given for a file, SIGTERM and SIGKILL in the middle of a write."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import attnviz
from attnviz import files
from attnviz.files import SUFFIX, atomic_open, atomic_path, write_bytes, write_text


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(SUFFIX))


def test_two_writers_and_a_reader_only_ever_see_whole_files(tmp_path):
    """Two threads rewrite one path with two different pages while a third reads it: every read is one whole
    page (a plain write_text shows a truncated or mixed file within a few tries)."""
    path = tmp_path / "report.html"
    pages = ["A" * 400_000 + "end-a", "B" * 600_000 + "end-b"]
    write_text(path, pages[0])
    stop = threading.Event()
    seen: list[str] = []

    def writer(page: str) -> None:
        for _ in range(30):
            write_text(path, page)

    def reader() -> None:
        while not stop.is_set():
            seen.append(path.read_text())

    threads = [threading.Thread(target=writer, args=(p,)) for p in pages]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert seen, "the reader read nothing"
    assert {s for s in seen if s not in pages} == set()
    assert path.read_text() in pages
    assert leftovers(tmp_path) == []


def test_a_write_that_fails_part_way_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "report.html"
    path.write_text("the previous report")
    with pytest.raises(attnviz.FileWriteError, match="the disk is full.*previous file, if any, is unchanged") as err:
        with atomic_open(path, "w", what="the report") as f:
            f.write("half of the new one")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert isinstance(err.value, OSError)  # old `except OSError` handlers still catch it
    assert "the report" in str(err.value)
    assert path.read_text() == "the previous report"
    assert leftovers(tmp_path) == []


def test_a_library_error_inside_the_block_is_not_swallowed_and_leaves_nothing(tmp_path):
    path = tmp_path / "capture.attnviz"
    path.write_bytes(b"old")

    class LibraryError(Exception):
        pass

    with pytest.raises(LibraryError):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"half")
            raise LibraryError("safetensors said no")
    assert path.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


def test_a_folder_or_a_missing_folder_is_one_clear_error(tmp_path):
    with pytest.raises(attnviz.FileWriteError, match="it is a folder; give a file name"):
        write_text(tmp_path, "x")
    with pytest.raises(attnviz.FileWriteError, match="does not exist; create it first"):
        write_bytes(tmp_path / "no" / "such.png", b"x")
    assert list(tmp_path.iterdir()) == []


def test_a_block_that_writes_nothing_replaces_nothing(tmp_path):
    path = tmp_path / "out.csv"
    path.write_text("kept")
    with pytest.raises(attnviz.FileWriteError, match="nothing was written"):
        with atomic_path(path):
            pass
    assert path.read_text() == "kept"


def test_modes_are_those_of_a_plain_write(tmp_path):
    new = write_text(tmp_path / "new.html", "x")
    umask = os.umask(0)
    os.umask(umask)
    assert new.stat().st_mode & 0o777 == 0o666 & ~umask
    old = tmp_path / "old.html"
    old.write_text("x")
    old.chmod(0o640)
    write_text(old, "y")
    assert old.stat().st_mode & 0o777 == 0o640


SLOW_WRITER = textwrap.dedent(
    """
    import signal, sys, time
    from attnviz.files import atomic_open
    if sys.argv[2] == "handler":
        signal.signal(signal.SIGTERM, lambda *a: print("handled", flush=True))
    with atomic_open(sys.argv[1], "w") as f:
        f.write("new" * 1000)
        print("writing", flush=True)
        for _ in range(100):
            time.sleep(0.1)
    print("done", flush=True)
    """
)


def start_writer(path: Path, mode: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(path), mode], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "writing"
    return process


def test_sigterm_in_the_middle_of_a_write_removes_the_temporary_file_and_ends_the_process(tmp_path):
    path = tmp_path / "capture.attnviz"
    path.write_text("the previous capture")
    process = start_writer(path, "default")
    assert len(leftovers(tmp_path)) == 1  # it is writing
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM  # ended as SIGTERM ends a process
    assert leftovers(tmp_path) == []
    assert path.read_text() == "the previous capture"


def test_a_process_with_its_own_sigterm_handler_keeps_it_and_the_write_finishes(tmp_path):
    path = tmp_path / "checkpoint.pt"
    process = start_writer(path, "handler")
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert out.split() == ["handled", "done"]
    assert path.read_text() == "new" * 1000
    assert leftovers(tmp_path) == []


def test_what_a_killed_writer_left_is_removed_by_the_next_write(tmp_path):
    """SIGKILL cannot be handled: the temporary file stays until the next write to that path, which removes
    it (its process is gone) — but never a live process's."""
    path = tmp_path / "capture.attnviz"
    process = start_writer(path, "default")
    process.kill()
    process.wait(timeout=30)
    (orphan,) = leftovers(tmp_path)
    live = files.temporary_name(path)  # this process's: alive
    live.write_text("being written")
    time.sleep(0.01)
    write_text(path, "next")
    assert leftovers(tmp_path) == [live.name]
    assert orphan not in leftovers(tmp_path)
    assert path.read_text() == "next"


def test_a_name_with_glob_characters_cleans_only_its_own_leftovers(tmp_path):
    path = tmp_path / "a*.html"
    other = tmp_path / ".ab.html.999999999.00000000.attnviz-tmp"  # another file's, of a dead process
    other.write_text("x")
    write_text(path, "y")
    assert other.exists()
    assert path.read_text() == "y"
