"""The processes a workflow runs in: one, or this process's share under ``torchrun`` / ``accelerate launch``.

attnviz opens no socket and starts no process itself; a run started by a launcher reads its rank
and world size through accelerate's ``PartialState`` (one GPU per process, or gloo on CPU), and
:func:`largest` asks every process the same question at once (a collective: each process calls it
the same number of times, or the ones that called wait for the others).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from ...errors import InputError

__all__ = ["OneProcess", "largest", "process_state"]


class OneProcess:
    """The state of a single process, where accelerate is not installed (``PartialState``'s
    attributes that attnviz reads)."""

    num_processes = 1
    process_index = 0
    is_main_process = True
    device = torch.device("cpu")

    @contextlib.contextmanager
    def split_between_processes(self, items):
        yield items


def process_state() -> Any:
    """accelerate's view of the processes (``PartialState``: ``num_processes``, ``process_index``,
    ``is_main_process``, ``device``, ``split_between_processes``); :class:`OneProcess` when
    accelerate is not installed and no launcher started several processes (then it is an error)."""
    try:
        from accelerate import PartialState  # deferred: accelerate is optional (attnviz[stats])
    except ImportError as err:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise InputError(
                f"spreading the work over processes (torchrun, accelerate launch) needs accelerate ({err}): pip install 'attnviz[stats]'"
            ) from err
        return OneProcess()

    # PartialState on a CPU-only machine sees its rank only with cpu=True (it wants MPI otherwise)
    return PartialState(cpu=not torch.cuda.is_available())


def largest(state: Any, values: list[int]) -> list[int]:
    """Each of ``values`` as its largest over all processes (one ``all_reduce`` with ``MAX`` over
    torch.distributed, on ``state.device``); the values themselves in one process."""
    if state.num_processes == 1:
        return list(values)
    flags = torch.tensor(values, dtype=torch.int64, device=state.device)
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    return [int(x) for x in flags.tolist()]
