"""Where a corpus run stands, saved so that a stopped run continues without counting a text twice.

The corpus is read as pools of batches cut the same way on every run (the same texts, the same
``batch_size``: :func:`~attnviz.workflows.corpus.corpus.length_batches` is deterministic), and every
process takes the same share of each pool. So a place in the run is: the texts read before the
current pool (``read``, and ``truncated`` among them), and how many batches of this process's
share of that pool are added (``done``). A checkpoint holds that place and this process's own sums
(never added over processes: no process waits on another to save), written by
:mod:`~attnviz.workflows.corpus.checkpoints` atomically, one file per process.

It is written every ``every_texts`` texts this process added or ``every_seconds`` seconds,
whichever comes first, at a stop signal, and when the run's last batch is added.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...analysis.stats import HeadStatsSums
from ...errors import InputError
from .checkpoints import rank_path, read_checkpoint, write_checkpoint, written_by

__all__ = ["EVERY_SECONDS", "EVERY_TEXTS", "KIND", "CorpusCheckpoint", "Place"]

KIND = "attnviz corpus checkpoint"
EVERY_TEXTS = 1000  # texts one process adds between two checkpoints, at most
EVERY_SECONDS = 60.0  # seconds between two checkpoints, at most


@dataclass
class Place:
    """Where a run stands: texts read before the current pool (``truncated`` of them cut), the batches
    of this process's share of that pool already added, and this process's sums and counters."""

    read: int = 0
    truncated: int = 0
    done: int = 0
    sums: HeadStatsSums | None = None
    mine: tuple[int, int, int] = (0, 0, 0)  # texts, real tokens, padded tokens this process added


class CorpusCheckpoint:
    """This process's checkpoint file of a corpus run, and when to write it next."""

    def __init__(
        self,
        path: str | Path,
        *,
        rank: int,
        num_processes: int,
        batch_size: int,
        every_texts: int = EVERY_TEXTS,
        every_seconds: float = EVERY_SECONDS,
    ):
        for name, value in (("checkpoint_every_texts", every_texts), ("checkpoint_every_seconds", every_seconds)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise InputError(f"{name} must be a number > 0, got {value!r}")
        self.named = Path(path)
        if not self.named.parent.is_dir():
            raise InputError(
                f"no folder {str(self.named.parent)!r} to write the checkpoint {self.named.name!r} in: create it, "
                "or give --checkpoint a path in an existing folder"
            )
        self.path = rank_path(path, rank, num_processes)
        self.rank, self.num_processes, self.batch_size = rank, num_processes, batch_size
        self.every_texts, self.every_seconds = every_texts, every_seconds
        self._texts_at_save = 0
        self._time_at_save = time.monotonic()

    def load(self) -> Place:
        """The saved place; the beginning (with a warning saying so) where no checkpoint was written.

        A checkpoint of another number of processes, or of another batch size, is refused with what to do."""
        if not self.path.is_file():
            others = [n for n in written_by(self.named) if n != self.num_processes]
            if others:
                processes = " or ".join(str(n) for n in others)
                raise InputError(
                    f"the checkpoint {str(self.named)!r} was written by {processes} process(es), this run has "
                    f"{self.num_processes}; resume with the same number (torchrun --nproc_per_node "
                    f"{others[0]} …), or start again without --resume (resume=False)"
                )
            warnings.warn(
                f"no checkpoint at {str(self.path)!r} to resume from: starting from the first text", stacklevel=3
            )
            return Place()
        saved = read_checkpoint(self.path, KIND)
        if (saved["rank"], saved["num_processes"]) != (self.rank, self.num_processes):
            raise InputError(
                f"{str(self.path)!r} holds process {saved['rank']} of {saved['num_processes']}, not {self.rank} of "
                f"{self.num_processes}; resume with the processes it was written by, or start without --resume"
            )
        if saved["batch_size"] != self.batch_size:
            raise InputError(
                f"the checkpoint was written with batch_size={saved['batch_size']}; resume with the same batch size "
                "(the batches are cut the same way only then)"
            )
        self._texts_at_save = saved["mine"][0]
        sums = HeadStatsSums.from_state(saved["sums"]) if saved["sums"] is not None else None
        return Place(saved["read"], saved["truncated"], saved["done"], sums, tuple(saved["mine"]))

    def due(self, texts_added: int) -> bool:
        """Whether ``every_texts`` texts were added or ``every_seconds`` passed since the last save."""
        return (
            texts_added - self._texts_at_save >= self.every_texts
            or time.monotonic() - self._time_at_save >= self.every_seconds
        )

    def save(self, place: Place) -> Path:
        """Write ``place`` (atomically) and restart the clocks of :meth:`due`."""
        payload: dict[str, Any] = {
            "format": KIND,
            "rank": self.rank,
            "num_processes": self.num_processes,
            "batch_size": self.batch_size,
            "read": place.read,
            "truncated": place.truncated,
            "done": place.done,
            "sums": place.sums.state() if place.sums is not None else None,
            "mine": [int(x) for x in place.mine],
        }
        write_checkpoint(self.path, payload)
        self._texts_at_save = place.mine[0]
        self._time_at_save = time.monotonic()
        return self.path
