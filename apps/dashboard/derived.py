"""Results the views derive from a capture (a summary, a rollout, an embedding, the opening head), kept by
the server per (capture key, what) in a bounded memo: the last 256 results, their tensors at most
``max_bytes`` together (one result always fits, however large)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

MAX_RESULTS = 256


def nbytes(value: Any) -> int:
    """A tensor's bytes, or what a result says it holds (a Summary's ``.nbytes``)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return int(getattr(value, "nbytes", 0) or 0)


class Derived:
    """The memo: :meth:`known` reads it, :meth:`derived` computes what it lacks and keeps it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._results: OrderedDict[tuple, Any] = OrderedDict()

    def known(self, key: str, what: tuple) -> Any:
        """The result ``what`` of the capture ``key`` if the memo holds it, else None."""
        with self._lock:
            value = self._results.get((key, *what))
            if value is not None:
                self._results.move_to_end((key, *what))
            return value

    def derived(self, key: str, what: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()``'s result for the capture ``key``, computed once per ``what`` while it is kept."""
        memo = (key, *what)
        value = self.known(key, what)
        if value is None:
            value = compute()
        with self._lock:
            self._results[memo] = value
            self._results.move_to_end(memo)
            while len(self._results) > MAX_RESULTS or (
                len(self._results) > 1 and sum(nbytes(v) for v in self._results.values()) > self.max_bytes
            ):
                self._results.popitem(last=False)
        return value
