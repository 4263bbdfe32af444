"""Every file attnviz writes, written atomically: one helper, used everywhere.

A write goes to a temporary file in the destination's own folder (``.NAME.PID.RANDOM.attnviz-tmp``), is
flushed and fsynced, then renamed over the destination with :func:`os.replace` — so a reader sees the old
file or the new one, never half of one; two writers to one path leave one whole file; a write that fails
part way (a full disk, a library's error, ``KeyboardInterrupt``) removes its temporary file and leaves the
previous file as it was. A SIGTERM that arrives while a write runs in the main thread of a process without a SIGTERM handler of its
own removes the temporary file, then ends the process as it would have; a process with its own handler keeps
it (the write finishes). A process
killed outright (SIGKILL) cannot clean up: the next write to the same path removes what such a process left
(a temporary file whose process is gone).

A new file gets the permissions a plain ``open(path, "w")`` would give it (0o666 less the umask); a file
that is replaced keeps its own.

::

    with atomic_path("capture.attnviz") as tmp:   # for a library that writes by path (safetensors, kaleido)
        save_file(tensors, str(tmp))
    with atomic_open("report.html", "w") as f:     # for a file object
        f.write(page)
    write_text("report.html", page)                # the one-liners
    write_bytes("figure.png", data)

Failures are :class:`~attnviz.errors.FileWriteError` (an ``OSError`` too), naming the path and what to do.

Text files attnviz reads (corpora, probe sets) are read as UTF-8 the one way, :func:`read_utf8`: a byte-order
mark is no part of the first line, and a file that is not UTF-8 is an :class:`~attnviz.errors.InputError`
naming the file and its first line that is not (:func:`not_utf8`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .errors import FileWriteError, InputError

__all__ = ["atomic_open", "atomic_path", "not_utf8", "read_utf8", "temporary_name", "write_bytes", "write_text"]

SUFFIX = ".attnviz-tmp"
_lock = threading.Lock()
_pending: set[Path] = set()  # this process's temporary files being written (removed on SIGTERM)


def temporary_name(path: str | Path) -> Path:
    """A fresh temporary file's name beside ``path``: hidden, with this process's id (so that what a killed
    process left can be told from what a live one is writing) and a random part."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{SUFFIX}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's process, or no way to ask: leave its file alone
    return True


def _remove_orphans(path: Path) -> None:
    """Remove the temporary files that processes no longer alive left beside ``path``."""
    with contextlib.suppress(OSError):
        for left in path.parent.glob(f".{_glob_escape(path.name)}.*{SUFFIX}"):
            pid = left.name[len(path.name) + 2 : -len(SUFFIX)].split(".")[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    left.unlink()


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def _plain_mode(path: Path) -> int:
    """The permissions a plain write leaves: an existing file keeps its own, a new one 0o666 less the umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        with _lock:  # os.umask sets as it reads: one thread at a time
            umask = os.umask(0)
            os.umask(umask)
        return 0o666 & ~umask


def _check_destination(path: Path) -> None:
    if path.is_dir():
        raise FileWriteError(
            f"cannot write {str(path)!r}: it is a folder; give a file name (e.g. {str(path / 'out')!r})"
        )
    if not path.parent.is_dir():
        raise FileWriteError(
            f"cannot write {str(path)!r}: the folder {str(path.parent)!r} does not exist; create it first"
        )


class _Terminated(BaseException):
    """SIGTERM arrived during a write: the temporary file goes, then the signal is delivered again."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _sigterm_cleans_up() -> Iterator[None]:
    """In the main thread, while a write runs in a process whose SIGTERM would end it at once (the default
    handler): SIGTERM raises :class:`_Terminated`, the write's ``finally`` removes its temporary file, and the
    signal is delivered again to the default handler, which ends the process as it would have. A process
    with a SIGTERM handler of its own (a corpus run notes the signal and stops at its next checkpoint) keeps
    it: the write goes on and ends normally."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
            yield
            return
    except (ValueError, AttributeError):  # no signals here (an embedded interpreter)
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated(signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except _Terminated as stop:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(stop.signum)  # the process ends as it would have
        raise  # not reached: SIGTERM's default action ends the process
    finally:
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def atomic_path(path: str | Path, *, what: str = "") -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; when the block ends without an error it is fsynced and
    renamed over ``path``. On any error (or SIGTERM) it is removed and ``path`` is left as it was. An
    ``OSError`` becomes :class:`~attnviz.errors.FileWriteError`; ``what`` names the file in that message
    ("the report", "the capture")."""
    path = Path(path)
    _check_destination(path)
    _remove_orphans(path)
    mode = _plain_mode(path)
    tmp = temporary_name(path)
    with _lock:
        _pending.add(tmp)
    try:
        with _sigterm_cleans_up():
            try:
                yield tmp
                if not tmp.exists():
                    raise FileWriteError(f"cannot write {str(path)!r}: nothing was written")
                os.chmod(tmp, mode)
                _fsync(tmp)
                os.replace(tmp, path)
                _fsync_folder(path.parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
    except FileWriteError:
        raise
    except OSError as err:
        raise FileWriteError(_message(path, err, what)) from err
    finally:
        with _lock:
            _pending.discard(tmp)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, encoding: str = "utf-8", what: str = "") -> Iterator[IO[Any]]:
    """``open(path, mode)`` written atomically (``mode``: ``"w"`` or ``"wb"``; text is UTF-8 unless told)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a whole file: mode 'w' or 'wb', not {mode!r}")
    with atomic_path(path, what=what) as tmp:
        try:
            f = open(tmp, mode) if mode == "wb" else open(tmp, mode, encoding=encoding, newline="")  # noqa: SIM115
        except OSError as err:
            raise FileWriteError(_message(Path(path), err, what)) from err
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def write_text(path: str | Path, text: str, *, encoding: str = "utf-8", what: str = "") -> Path:
    """Write ``text`` to ``path`` atomically and return the path."""
    with atomic_open(path, "w", encoding=encoding, what=what) as f:
        f.write(text)
    return Path(path)


def write_bytes(path: str | Path, data: bytes, *, what: str = "") -> Path:
    """Write ``data`` to ``path`` atomically and return the path."""
    with atomic_open(path, "wb", what=what) as f:
        f.write(data)
    return Path(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """The rename itself survives a power cut once the folder is synced (where the system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _message(path: Path, err: OSError, what: str) -> str:
    name = f"{what} " if what else ""
    if err.errno == errno.ENOSPC:
        advice = "the disk is full; free some space or write elsewhere"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        advice = "no permission to write there; choose another folder"
    else:
        advice = err.strerror or str(err)
    return f"cannot write {name}{str(path)!r}: {advice} (the previous file, if any, is unchanged)"


def read_utf8(path: Any) -> str:
    """A file's text, UTF-8 with or without a byte-order mark (which is no part of the first line); a file
    that is not UTF-8 is an :class:`InputError` naming the file and the line (:func:`not_utf8`)."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except UnicodeDecodeError as err:
        raise not_utf8(path, err) from err


def not_utf8(path: Any, err: UnicodeDecodeError) -> InputError:
    """The refusal of a file that is not UTF-8, naming its first line that is not (read again as bytes)."""
    line = 0
    try:
        with open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as bad:
                    line, err = number, bad
                    break
    except OSError:
        pass
    byte = err.object[err.start : err.start + 1].hex() if isinstance(err.object, bytes) else ""
    at = ", ".join(x for x in (f"line {line}" if line else "", f"byte 0x{byte}" if byte else "") if x)
    return InputError(
        f"{str(path)!r} is not UTF-8 text ({err.reason}){f' at {at}' if at else ''}: save the file as UTF-8"
    )
