"""A server-side capture cache, bounded in bytes, shared by the sessions of one app, and the one way a
capture's key is made: a digest the server computes (:func:`digest_key`), never a name the page chose.
Every key the page sends back is checked against :data:`KEY` before it is used (``capture_files.check_key``)."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict

from attnviz import Capture

KEY_DIGITS = 24  # hex digits of a key: 96 bits of a SHA-256
KEY = re.compile(f"[0-9a-f]{{{KEY_DIGITS}}}")  # the form of every key: no separator, no dot, no wildcard


def digest_key(*parts: bytes) -> str:
    """A capture's key: a digest of what made it (the only way a key is made; its form is :data:`KEY`)."""
    return hashlib.sha256(b"\x00".join(parts)).hexdigest()[:KEY_DIGITS]


def is_key(key: object) -> bool:
    """Whether ``key`` has the form of a key the server makes (anything the page sends may be anything)."""
    return isinstance(key, str) and KEY.fullmatch(key) is not None


def capture_key(model: str, text: str) -> str:
    """The cache key of (model, text): the model runs once per pair, whoever asks."""
    return digest_key(model.encode(), text.encode())


class CaptureCache:
    """Least-recently-used captures, at most ``max_bytes`` of tensors in all (one always fits)."""

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[Capture, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Capture | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: str, cap: Capture) -> None:
        size = cap.nbytes
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = (cap, size)
            while self.total_bytes > self.max_bytes and len(self._items) > 1:
                self._items.popitem(last=False)

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items
