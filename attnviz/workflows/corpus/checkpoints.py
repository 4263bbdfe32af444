"""Checkpoint files of a long run: written atomically, read only when whole, one per process.

A checkpoint is written as every file attnviz writes (:mod:`attnviz.files`): a temporary file in the same
folder, flushed and ``fsync``-ed, then moved over the old one with :func:`os.replace` — a run killed while
writing leaves the previous checkpoint as it was, never half of a new one. The file starts with a header naming what it holds and the
SHA-256 of the payload (a ``torch.save`` of plain tensors and numbers, read back with
``weights_only=True``): a truncated or damaged file is refused with what to do, never read.

Under ``torchrun`` / ``accelerate launch`` each process writes its own file beside the one named
(``run.ckpt.rank1-of-2``; one process writes ``run.ckpt`` itself), so no process waits on another
to checkpoint — a preempted job's processes each save their share as the signal reaches them.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError
from ...files import atomic_open

__all__ = ["MAGIC", "check_interval", "rank_path", "read_checkpoint", "write_checkpoint", "written_by"]

MAGIC = b"attnviz checkpoint 1\n"  # then the payload's sha256 (hex) and a newline, then the payload


def check_interval(name: str, value: Any, default: float, unit: str) -> None:
    """Refuse a checkpoint interval that is no number > 0 (``checkpoint_every_probes=0``: a checkpoint after
    no probe at all), naming the value and what to pass: a positive number of ``unit``, or ``default``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InputError(
            f"{name} must be a number > 0, got {value!r}: pass how many {unit} may pass between two checkpoints "
            f"(default: {default:g}), or checkpoint=None for none"
        )


def rank_path(path: str | Path, rank: int, num_processes: int) -> Path:
    """The file process ``rank`` of ``num_processes`` writes for the checkpoint ``path``."""
    path = Path(path)
    return path if num_processes == 1 else path.with_name(f"{path.name}.rank{rank}-of-{num_processes}")


def written_by(path: str | Path) -> list[int]:
    """The numbers of processes whose checkpoint files exist for ``path`` (1 for ``path`` itself)."""
    path = Path(path)
    counts = {1} if path.is_file() else set()
    for other in path.parent.glob(f"{path.name}.rank*-of-*"):
        tail = other.name[len(path.name) + len(".rank") :]
        rank, _, count = tail.partition("-of-")
        if rank.isdigit() and count.isdigit():
            counts.add(int(count))
    return sorted(counts)


def write_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically: a temporary file beside it, fsync, rename."""
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getvalue()
    header = MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n"
    with atomic_open(path, "wb", what="the checkpoint") as f:
        f.write(header + body)
    return path


def read_checkpoint(path: str | Path, kind: str) -> dict[str, Any]:
    """The payload of a whole checkpoint file of ``kind``; a truncated, damaged or foreign file is refused."""
    path = Path(path)
    data = path.read_bytes()
    fix = f"delete {str(path)!r} and run again without --resume (resume=False), or point --checkpoint elsewhere"
    if not data.startswith(MAGIC):
        raise InputError(f"{str(path)!r} is not an attnviz checkpoint; {fix}")
    digest, newline, body = data[len(MAGIC) :].partition(b"\n")
    if not newline or hashlib.sha256(body).hexdigest().encode() != digest:
        raise InputError(
            f"the checkpoint {str(path)!r} is truncated or damaged ({len(data):,} bytes that do not match their "
            f"checksum); {fix}"
        )
    try:
        payload = torch.load(io.BytesIO(body), weights_only=True)
    except Exception as err:  # noqa: BLE001 - a whole file torch cannot read is the same problem for the user
        raise InputError(f"{str(path)!r} cannot be read as a checkpoint ({type(err).__name__}: {err}); {fix}") from err
    if not isinstance(payload, dict) or payload.get("format") != kind:
        raise InputError(f"{str(path)!r} is not a {kind}; {fix}")
    return payload
