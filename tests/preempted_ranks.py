"""One of two processes of a checkpointed run, started by tests/test_preemption.py the way torchrun
starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; gloo), with the race made certain where
process 1 has less left to do than process 0: process 1 marks the moment its share is done and it
waits in the rounds before the final sum; process 0, at its ``stop_at``-th batch (or probe), waits
for that mark and only then sends SIGTERM to itself alone.

    python tests/preempted_ranks.py '{"kind": "corpus" | "probes", "model": …, "source": …,
        "checkpoint": …, "resume": bool, "stop_at": int | null, "marker": …, "out": …}'

Writes ``out`` (JSON): ``{"outcome": "interrupted", "message": …}`` or ``{"outcome": "done",
"table": …}`` (the corpus table as records, or the probe accuracy); exits 75 when interrupted."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch.distributed as dist

from attnviz.errors import Interrupted
from attnviz.workflows.corpus import batched, interrupts, probing
from attnviz.workflows.corpus.corpus import corpus_stats


def main(job: dict) -> int:
    rank = int(os.environ["RANK"])
    marker = Path(job["marker"])
    if rank == 1:
        finished = interrupts.StopRounds.finished

        def mark_then_finish(self):
            marker.touch()  # this process's share is done: it waits in the rounds from here
            return finished(self)

        interrupts.StopRounds.finished = mark_then_finish  # type: ignore[method-assign]
    elif job["stop_at"] is not None:  # process 0
        owner, name = (batched.BatchReducer, "add") if job["kind"] == "corpus" else (probing.ProbeRun, "score")
        original, calls = getattr(owner, name), [0]

        def stop_once_the_other_is_done(*args, **kwargs):
            calls[0] += 1
            if calls[0] == job["stop_at"]:
                deadline = time.monotonic() + 120  # a bound on waiting, not a measurement
                while not marker.is_file() and time.monotonic() < deadline:
                    time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGTERM)  # this process alone: the other one is past its share
            return original(*args, **kwargs)

        setattr(owner, name, stop_once_the_other_is_done)
    out = Path(job["out"])
    common = {"checkpoint": job["checkpoint"], "resume": job["resume"], "progress": False}
    try:
        if job["kind"] == "corpus":
            df = corpus_stats(job["model"], job["source"], batch_size=2, **common)
            table = df.to_dict("records")
        else:
            result = probing.evaluate_probes(job["model"], job["source"], batch_size=2, **common)
            table = result.accuracy.to_dict("records")
    except Interrupted as err:
        out.write_text(json.dumps({"outcome": "interrupted", "message": str(err)}))
        return 75
    out.write_text(json.dumps({"outcome": "done", "table": table}))
    return 0


if __name__ == "__main__":
    code = main(json.loads(sys.argv[1]))
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(code)
