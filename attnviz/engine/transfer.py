"""Copies of what a tap keeps to the host, started without waiting for the device and waited for once.

On a GPU a forward runs ahead of the host: the host queues kernels and goes on. A blocking copy to
the host (``t.to("cpu")``) makes it wait for every kernel queued so far, so a tap that copied each
layer's tensors as its call returned stalled the forward once per copy. :class:`HostCopies` starts
each copy into pinned (page-locked) host memory with ``non_blocking=True`` — on a side stream for
tensors that stay alive until it is done, on the current stream for those the model may write again
(a static cache's buffers: the stream orders the copy before the next write) — and :meth:`~HostCopies.wait`
waits for all of them once. A tensor already on the host is handed back as it is (copied only when
``own`` asks for storage of its own); a device that is not CUDA gets an ordinary copy.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["HostCopies"]


class HostCopies:
    """Copies to the host started now, complete after :meth:`wait`."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._current: set[torch.device] = set()

    def copy(self, t: Tensor, *, own: bool = False) -> Tensor:
        """``t`` on the host: started without waiting on CUDA (read it after :meth:`wait`), else at once.
        ``own``: the model may write ``t``'s storage again (a step of a static cache), so the copy is
        queued behind the kernel that made ``t``, on the current stream, and a host tensor is cloned."""
        if t.device.type == "cpu":
            return t.clone() if own else t
        if t.device.type != "cuda":  # another accelerator: an ordinary copy
            return t.to("cpu")
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        if own:
            host.copy_(t, non_blocking=True)
            self._current.add(t.device)
            return host
        stream = self._streams.get(t.device)
        if stream is None:
            stream = self._streams[t.device] = torch.cuda.Stream(t.device)
        stream.wait_stream(torch.cuda.current_stream(t.device))  # after the kernel that made t
        with torch.cuda.stream(stream):
            host.copy_(t, non_blocking=True)
        t.record_stream(stream)  # t's memory is not reused before the copy is done
        return host

    def wait(self) -> None:
        """Wait once for every copy started (nothing to wait for on the CPU)."""
        for stream in self._streams.values():
            stream.synchronize()
        for device in self._current:
            torch.cuda.current_stream(device).synchronize()
        self._current.clear()
