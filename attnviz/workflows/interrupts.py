"""SIGTERM and SIGINT during a long run: noted, not obeyed at once, so the run can checkpoint first.

A cluster scheduler sends SIGTERM before it kills a job (and ``torchrun`` passes it to every
process); Ctrl-C sends SIGINT. :func:`stop_requests` installs a handler for both for one ``with``
block — the handler only notes the signal; the run checks :attr:`StopRequest.signal` between
batches, writes its checkpoint there and raises :class:`~attnviz.errors.Interrupted`. The previous
handlers come back in ``finally``, also when the run raises. Outside the main thread (where Python
lets no handler be installed) the signals keep their usual effect.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["SIGNALS", "StopRequest", "stop_requests"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """The first stop signal received during the block (``None`` while none came)."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None

    def note(self, signum: int, frame: object) -> None:
        """The handler: note the signal, nothing else (no I/O in a handler)."""
        if self.signal is None:
            self.signal = signal.Signals(signum)


@contextlib.contextmanager
def stop_requests(active: bool = True) -> Iterator[StopRequest]:
    """A :class:`StopRequest` that SIGTERM and SIGINT set for the block; the old handlers restored after."""
    request = StopRequest()
    if not active or threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        for s in SIGNALS:
            signal.signal(s, request.note)
        yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
