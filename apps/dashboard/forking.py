"""Dash's background callbacks, made safe to fork a threaded server.

A background job (a long capture, a probe set, head importance, "Apply to the model") is a fork of the
server process, whose other threads are meanwhile computing with torch or answering polls through
diskcache's SQLite. A fork copies the memory of every lock but only the forking thread, so a lock
another thread held at that instant stays held in the child forever. Two such locks hung jobs here:
GNU libgomp's thread pool (the child's first parallel op waited in ``gomp_team_end``) and SQLite's
memory mutex (the child's first diskcache write waited). So:

- every forked child computes on one thread (``torch.set_num_threads(1)`` after the fork);
- every diskcache call of the server's cache holds one process-wide lock, which a fork takes first:
  no thread is inside SQLite when the child is made;
- a job that ends between Dash's "does it exist" and "look at it" (``psutil.NoSuchProcess``) counts
  as ended, instead of an HTTP 500 to the page's poll.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator

import diskcache
import psutil
import torch
from dash import DiskcacheManager

_DISK = threading.RLock()  # held around every call of the server's diskcache, and across a fork


@functools.cache
def fork_safely() -> None:
    """Register the fork hooks (once per process: ``os.register_at_fork`` cannot be undone)."""
    os.register_at_fork(before=_DISK.acquire, after_in_parent=_DISK.release, after_in_child=_child)


def _child() -> None:
    _DISK.release()
    torch.set_num_threads(1)


class ForkSafeCache(diskcache.Cache):
    """A diskcache whose calls a fork waits for (and that waits for a fork)."""

    @contextlib.contextmanager
    def transact(self, retry: bool = False) -> Iterator[None]:
        with _DISK, super().transact(retry):
            yield


def _locked(name: str):
    method = getattr(diskcache.Cache, name)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with _DISK:
            return method(self, *args, **kwargs)

    return call


for _name in ("get", "set", "add", "delete", "touch", "pop", "incr", "decr", "__contains__", "__getitem__"):
    setattr(ForkSafeCache, _name, _locked(_name))


class ForkSafeManager(DiskcacheManager):
    """Dash's DiskcacheManager over a :class:`ForkSafeCache`, tolerant of jobs that end while it looks."""

    def __init__(self, folder: str) -> None:
        fork_safely()
        super().__init__(ForkSafeCache(folder))

    def job_running(self, job) -> bool:
        try:
            return super().job_running(job)
        except psutil.NoSuchProcess:
            return False

    def terminate_job(self, job) -> None:
        try:
            super().terminate_job(job)
        except psutil.NoSuchProcess:
            pass
