"""A server-side capture cache, bounded in bytes, shared by the sessions of one app."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from attnviz import Capture


def capture_key(model: str, text: str) -> str:
    """The cache key of (model, text): the model runs once per pair, whoever asks."""
    return hashlib.sha256(f"{model}\x00{text}".encode()).hexdigest()[:24]


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
