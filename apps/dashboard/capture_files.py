"""What one Run asks for (:class:`Request`: it stays on the server, the page holds its key) and the files
through which a long capture's background job — another process, a fork of the server — gets its request
and leaves its capture: :class:`JobFolder`. Every file is written atomically (:mod:`attnviz.files`), so
neither side ever reads half of one.

Keys are never paths: the page sends a key and a Run's name, and the server uses them only when they have
the one form it gives them (:func:`check_key`: a digest, :data:`~.cache.KEY`; :func:`check_run`: a uuid's
hex); every file is named from them inside the server's own folder (:meth:`JobFolder.inside`), and no glob
is built from them (the folder is listed and the names compared)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

import attnviz
import attnviz.files
from attnviz.models import Encoded

from .cache import capture_key, is_key

STALE_REQUEST_S = 120  # a job reads its request within seconds of the Run: one left this long never will be


def request_key(
    model: str, text: str, bos: bool = False, target: str | None = None, new_tokens: int | None = None
) -> str:
    """The key of a capture: its model, text and what the user chose (BOS, target, new tokens)."""
    return capture_key(
        model
        + ("\x00bos" if bos else "")
        + (f"\x00target\x00{target}" if target else "")
        + (f"\x00generate\x00{new_tokens}" if new_tokens else ""),
        text,
    )


class CaptureGone(attnviz.AttnvizError):
    """The page names a capture the server no longer holds (the page says so; the model is not run again)."""


class UnknownCapture(CaptureGone, attnviz.InputError):
    """The page (a link, a store, a request) names a capture by something that is not a key this server
    gives: it names no file, and nothing is read or removed for it."""


RUN = re.compile(r"[0-9a-f]{32}")  # a Run's name: uuid4().hex, made by the server
TEMPORARY = attnviz.files.temporary_name("x").suffix  # what an atomic write's temporary file ends in

UNKNOWN = (
    "This page names a capture this server does not know: a link opens only a capture this server made "
    "(or was started with, --capture), named by the key the server gave it, never a file. Press Run model to "
    "capture the text."
)


def check_key(key: object) -> str:
    """``key`` if it has the form of a key this server makes (:data:`~.cache.KEY`), else
    :class:`UnknownCapture` (the page's message): a key is never a path, a glob or anything but a digest."""
    if is_key(key):
        return key  # type: ignore[return-value]
    raise UnknownCapture(UNKNOWN)


def check_run(run: object) -> str:
    """``run`` if it has the form of a Run's name this server makes (uuid hex), else :class:`CaptureGone`."""
    if isinstance(run, str) and RUN.fullmatch(run):
        return run
    raise CaptureGone("This page names a background capture this server did not start: press Run model again.")


@dataclass
class Request:
    """What one Run asks for: it stays on the server (the page holds its ``key``). ``encoded``: the text
    tokenized once, as the capture reads it; ``n_tokens``: what the page's limits count."""

    model: str
    text: str
    bos: bool = False
    target: str | None = None
    new_tokens: int | None = None
    encoded: Encoded | None = None
    n_tokens: int = 0

    @property
    def key(self) -> str:
        return request_key(self.model, self.text, self.bos, self.target, self.new_tokens)

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict) -> Request:
        request = cls(**data)
        if request.encoded is not None:
            ids, offsets, tokens = request.encoded
            request.encoded = (list(ids), [tuple(o) for o in offsets], list(tokens))  # type: ignore[misc]
        return request


class JobFolder:
    """The server's capture folder as background capture jobs use it: per key, the request of each Run
    (``{key}.{run}.request.json``), the job's pid while it runs (``{key}.job.pid``) and the capture it
    leaves (``{key}.attnviz``). Every name is made from a checked key (and Run), inside the folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def inside(self, name: str) -> Path:
        """``folder / name``, refused unless it resolves inside the folder (the names are checked already:
        this is the second lock, against a key form that ever allowed a separator)."""
        root = self.folder.resolve()
        path = (root / name).resolve()
        if path.parent != root:
            raise UnknownCapture(UNKNOWN)
        return path

    def job_file(self, key: str) -> Path:
        """Where a background job leaves the capture of ``key``."""
        return self.inside(f"{check_key(key)}.attnviz")

    def request_file(self, key: str, run: str) -> Path:
        """Where the server leaves the request of one Run's background job (the text stays on the server):
        one file per Run, so that two pages running the same text each have their own."""
        return self.inside(f"{check_key(key)}.{check_run(run)}.request.json")

    def pid_file(self, key: str) -> Path:
        """The server's watch on a job: is the job's process still alive?"""
        return self.inside(f"{check_key(key)}.job.pid")

    def _names(self) -> list[str]:
        """The folder's file names (listed, never globbed from a key)."""
        try:
            return os.listdir(self.folder)
        except OSError:
            return []

    def _requests(self, key: str) -> list[Path]:
        """The requests left for ``key`` (one per Run), by name: ``{key}.{run}.request.json``."""
        key = check_key(key)
        found = []
        for name in self._names():
            run = name.removeprefix(f"{key}.").removesuffix(".request.json")
            if name == f"{key}.{run}.request.json" and RUN.fullmatch(run):
                found.append(self.inside(name))
        return found

    def _temporaries(self, key: str) -> list[Path]:
        """What an atomic write of ``key``'s capture left when its process was killed (the process gone)."""
        key = check_key(key)
        found = []
        for name in self._names():
            rest = name.removeprefix(f".{key}.attnviz.").removesuffix(TEMPORARY)
            pid = rest.split(".")[0]
            if name == f".{key}.attnviz.{rest}{TEMPORARY}" and pid.isdigit() and not psutil.pid_exists(int(pid)):
                found.append(self.inside(name))
        return found

    def started(self) -> list[str]:
        """The keys of the jobs that wrote a pid (running, or stopped without cleaning up)."""
        keys = (name.removesuffix(".job.pid") for name in self._names() if name.endswith(".job.pid"))
        return [key for key in keys if is_key(key)]

    def leave(self, request: Request) -> str:
        """Write ``request`` where its job reads it and return the Run's name for it; requests no job read
        within :data:`STALE_REQUEST_S` (a job cancelled before it began) go first."""
        for name in self._names():
            if not name.endswith(".request.json"):
                continue
            stale = self.folder / name
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > STALE_REQUEST_S:
                    stale.unlink()
        run = uuid.uuid4().hex
        attnviz.files.write_text(
            self.request_file(request.key, run), json.dumps(request.to_json()), what="the background job's request"
        )
        return run

    def take(self, key: str, run: str) -> Request:
        """In the job: note its pid (before the request goes: the job is never neither), then read and remove
        the request ``run`` left under ``key``. A request that is gone, or that is not ``key``'s, raises
        :class:`CaptureGone`."""
        request_file = self.request_file(key, run)  # checked before anything is written
        pid_file = self.pid_file(key)
        attnviz.files.write_text(pid_file, str(os.getpid()))
        try:
            request = Request.from_json(json.loads(request_file.read_text()))
            if request.key != key:
                raise ValueError("a request under another key")
        except (OSError, ValueError, KeyError, TypeError) as err:
            pid_file.unlink()
            raise CaptureGone(
                "the background job's request is gone (cancelled, or cleaned up as stale): press Run again"
            ) from err
        with contextlib.suppress(OSError):  # read: a job cancelled or killed from here on leaves no request
            request_file.unlink()
        return request

    def drop(self, key: str, run: str) -> None:
        """In a job that has nothing to do (the capture of ``key`` is already here): the request ``run`` left goes."""
        with contextlib.suppress(OSError):
            self.request_file(key, run).unlink()

    def leave_capture(self, key: str, cap: attnviz.Capture) -> None:
        """In the job: write ``cap`` where the server adopts it (atomically: the server never reads half)."""
        with attnviz.files.atomic_path(self.job_file(key), what="the background capture") as tmp:
            cap.save(tmp)

    def finished(self, key: str) -> None:
        """In the job, however it ended: its pid goes."""
        with contextlib.suppress(OSError):
            self.pid_file(key).unlink()

    def state(self, key: str) -> str:
        """Where a job without a capture yet is: ``"running"`` (its process is alive), ``"starting"``
        (requested, not begun) or ``"stopped"`` (its process ended without a capture)."""
        try:
            pid = int(self.pid_file(key).read_text())
        except (OSError, ValueError):
            return "starting" if self._requests(key) else "stopped"
        try:
            alive = psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        except psutil.Error:
            alive = False
        return "running" if alive else "stopped"

    def clean(self, key: str) -> None:
        """Remove what a stopped background capture of ``key`` left: its request, its pid, half a file."""
        for path in [self.pid_file(key), *self._requests(key), *self._temporaries(key)]:
            with contextlib.suppress(OSError):
                path.unlink()
