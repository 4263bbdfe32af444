"""SIGTERM and SIGINT during a long run: noted, not obeyed at once, so the run can checkpoint first.

A cluster scheduler sends SIGTERM before it kills a job (and ``torchrun`` passes it to every
process); Ctrl-C sends SIGINT. :func:`stop_requests` installs a handler for both for one ``with``
block — the handler only notes the signal; the run checks :attr:`StopRequest.signal` between
batches, writes its checkpoint there and raises :class:`~attnviz.errors.Interrupted`. The previous
handlers come back in ``finally``, also when the run raises. Outside the main thread (where Python
lets no handler be installed) the signals keep their usual effect.

Under ``torchrun`` / ``accelerate launch`` the processes must stop together: one that stopped alone
would leave the others waiting for it in the final sum across processes. :class:`StopRounds` has
them agree, batch by batch, whether the run stops — also a process whose share is done, until every
process is past its last batch.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from .processes import largest

__all__ = ["SIGNALS", "StopRequest", "StopRounds", "stop_requests"]

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


class StopRounds:
    """The processes of a run agreeing, batch by batch, whether it stops.

    A process calls :meth:`stopped` before each of its batches and :meth:`finished` after its last.
    Each call is one round: :func:`~attnviz.workflows.corpus.processes.largest` of (the signal this process
    noted, whether it still has a batch), so every process gets the same answer. When any process
    was signalled, all of them stop at the same round, each at its own place — a process whose share
    is done included, for :meth:`finished` goes on taking part in the rounds until no process has a
    batch left — and none enters the final sum across processes alone; otherwise all leave
    :meth:`finished` at the same round, however many batches each had. In one process (or with
    ``agree=False``) no collective runs: :meth:`stopped` is this process's own signal and
    :meth:`finished` is ``None`` (its share done, the run is complete).
    """

    def __init__(self, request: StopRequest, state: Any, *, agree: bool = True) -> None:
        self.request = request
        self.state = state
        self.agree = agree and state.num_processes > 1

    def _round(self, working: bool) -> tuple[signal.Signals | None, bool]:
        own = self.request.signal
        if not self.agree:
            return own, working
        stop, busy = largest(self.state, [int(own) if own is not None else 0, int(working)])
        return (own or (signal.Signals(stop) if stop else None)), bool(busy)

    def stopped(self) -> signal.Signals | None:
        """Before one of this process's batches: the signal that stops every process here, or ``None``."""
        return self._round(True)[0]

    def finished(self) -> signal.Signals | None:
        """After this process's last batch: rounds until no process has a batch left. The signal that
        stopped every process meanwhile, or ``None``: the run is complete."""
        if not self.agree:
            return None
        while True:
            stop, busy = self._round(False)
            if stop is not None or not busy:
                return stop
