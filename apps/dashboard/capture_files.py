"""What one Run asks for (:class:`Request`: it stays on the server, the page holds its key) and the files
through which a long capture's background job — another process, a fork of the server — gets its request
and leaves its capture: :class:`JobFolder`. Every file is written under a temporary name and renamed, so
neither side ever reads half of one."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

import attnviz
from attnviz.models import Encoded

from .cache import capture_key

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
    leaves (``{key}.attnviz``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def job_file(self, key: str) -> Path:
        """Where a background job leaves the capture of ``key``."""
        return self.folder / f"{key}.attnviz"

    def request_file(self, key: str, run: str) -> Path:
        """Where the server leaves the request of one Run's background job (the text stays on the server):
        one file per Run, so that two pages running the same text each have their own."""
        return self.folder / f"{key}.{run}.request.json"

    def pid_file(self, key: str) -> Path:
        """The server's watch on a job: is the job's process still alive?"""
        return self.folder / f"{key}.job.pid"

    def started(self) -> list[str]:
        """The keys of the jobs that wrote a pid (running, or stopped without cleaning up)."""
        return [p.name.removesuffix(".job.pid") for p in self.folder.glob("*.job.pid")]

    def leave(self, request: Request) -> str:
        """Write ``request`` where its job reads it and return the Run's name for it; requests no job read
        within :data:`STALE_REQUEST_S` (a job cancelled before it began) go first."""
        for stale in self.folder.glob("*.request.json"):
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > STALE_REQUEST_S:
                    stale.unlink()
        run = uuid.uuid4().hex[:12]
        partial = self.folder / f"{request.key}.{run}.request.partial"
        partial.write_text(json.dumps(request.to_json()))
        partial.replace(self.request_file(request.key, run))
        return run

    def take(self, key: str, run: str) -> Request:
        """In the job: note its pid (before the request goes: the job is never neither), then read and remove
        the request ``run`` left under ``key``. A request that is gone raises :class:`CaptureGone`."""
        pid_file = self.pid_file(key)
        pid_file.write_text(str(os.getpid()))
        try:
            request = Request.from_json(json.loads(self.request_file(key, run).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as err:
            pid_file.unlink()
            raise CaptureGone(
                "the background job's request is gone (cancelled, or cleaned up as stale): press Run again"
            ) from err
        with contextlib.suppress(OSError):  # read: a job cancelled or killed from here on leaves no request
            self.request_file(key, run).unlink()
        return request

    def drop(self, key: str, run: str) -> None:
        """In a job that has nothing to do (the capture of ``key`` is already here): the request ``run`` left goes."""
        with contextlib.suppress(OSError):
            self.request_file(key, run).unlink()

    def leave_capture(self, key: str, cap: attnviz.Capture) -> None:
        """In the job: write ``cap`` where the server adopts it."""
        partial = self.folder / f"{key}.{os.getpid()}.{threading.get_ident()}.partial"
        cap.save(partial)
        partial.replace(self.job_file(key))

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
            return "starting" if any(self.folder.glob(f"{key}.*.request.json")) else "stopped"
        try:
            alive = psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        except psutil.Error:
            alive = False
        return "running" if alive else "stopped"

    def clean(self, key: str) -> None:
        """Remove what a stopped background capture of ``key`` left: its request, its pid, half a file."""
        left = [*self.folder.glob(f"{key}.*.request.json"), *self.folder.glob(f"{key}.*.partial")]
        for path in [self.pid_file(key), *left]:
            with contextlib.suppress(OSError):
                path.unlink()
