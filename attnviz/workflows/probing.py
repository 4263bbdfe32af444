"""Probe sets run through a model: every head scored on Winograd-style coreference probes.

This runs models (one capture per probe), so it sits beside :mod:`attnviz.workflows.runner`; the scoring of
one capture is :func:`attnviz.analysis.rank_heads`, which never touches a model.
"""

from __future__ import annotations

import hashlib
import signal
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..analysis.coref import rank_heads
from ..analysis.probes import Probe, ProbeResult, load_probes
from ..errors import ArgumentTypeError, InputError, Interrupted
from .checkpoints import rank_path, read_checkpoint, write_checkpoint, written_by
from .interrupts import StopRounds, stop_requests
from .pipeline import resolve
from .processes import process_state
from .runner import capture_forward, encode_texts

__all__ = ["KIND", "evaluate_probes"]

KIND = "attnviz probes checkpoint"


def _probe_list(probes: Any) -> list[Probe]:
    """A shipped set's name, a JSONL path, or a list of :class:`Probe` / dicts."""
    if isinstance(probes, (str, Path)):
        return load_probes(probes)
    if not isinstance(probes, (list, tuple)) or not probes:
        raise ArgumentTypeError(
            f"probes must be a probe set's name (en, zh), a JSONL file, or a non-empty list of probes; got {probes!r}"
        )
    out, problems = [], []
    for i, item in enumerate(probes):
        try:
            out.append(item if isinstance(item, Probe) else Probe.from_dict(item, f"probe-{i}"))
        except InputError as err:
            problems.append(f"probes[{i}]: {err}")
    if problems:
        raise InputError(f"{len(problems)} bad probe(s), nothing was scored — " + "; ".join(problems))
    return out


def _load_place(path: Path, named: str | Path, num_processes: int, digest: str) -> dict | None:
    """This process's saved place; ``None`` (with a warning) where none was written."""
    if not path.is_file():
        others = [n for n in written_by(named) if n != num_processes]
        if others:
            raise InputError(
                f"the checkpoint {str(named)!r} was written by {others[0]} process(es), this run has {num_processes}; "
                f"resume with the same number (torchrun --nproc_per_node {others[0]} …), or start again without "
                "--resume (resume=False)"
            )
        warnings.warn(f"no checkpoint at {str(path)!r} to resume from: starting from the first probe", stacklevel=3)
        return None
    saved = read_checkpoint(path, KIND)
    if saved["probes"] != digest:
        raise InputError(
            f"the checkpoint {str(path)!r} was written for other probes; resume with the same probe set, or start "
            "again without --resume (resume=False)"
        )
    return saved


def evaluate_probes(
    model: Any,
    probes: Sequence[Probe] | str | Path,
    tokenizer: Any = None,
    *,
    progress: bool = True,
    exclude_sinks: bool = True,
    renormalise: bool = True,
    add_bos: bool = True,
    part: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    checkpoint_every_probes: int = 100,
    checkpoint_every_seconds: float = 60.0,
) -> ProbeResult:
    """Score every head of ``model`` on ``probes``: how often its preferred candidate is the gold one.

    ``model`` is anything :func:`attnviz.capture` takes (a name is loaded once). Each probe runs one
    forward, with a BOS token prepended (``add_bos``) so that a decoder's attention sink is not the
    first word — many probes begin with a candidate. A progress bar shows unless ``progress=False``.
    ``part`` picks the encoder or the decoder of an encoder-decoder model (the probe text is then the
    source, or the target). ``on_progress(done, total)`` is called after each probe (a page's
    progress bar).

    ``checkpoint``: a file where each process saves its place (atomically; under N processes
    ``<checkpoint>.rank<i>-of-<N>``) every ``checkpoint_every_probes`` probes or
    ``checkpoint_every_seconds`` seconds, and when SIGTERM or SIGINT arrives — then
    :class:`~attnviz.errors.Interrupted` is raised once it is saved. ``resume=True`` continues from it
    (the same probes and number of processes); with no checkpoint there it warns and starts. Under
    several processes they agree before each probe whether the run stops
    (:class:`~attnviz.workflows.interrupts.StopRounds`): a signal that reaches any of them stops all.
    """
    import pandas as pd  # deferred: pandas is heavy and only tables need it
    from tqdm.auto import tqdm  # deferred: only a progress bar needs it

    probes = _probe_list(probes)
    resolved = resolve(model, tokenizer)  # a name is loaded once, for every probe
    name = resolved.name
    correct: dict[tuple[int, int], int] = {}
    per_probe, skipped = [], []
    nearest_hits = first_hits = 0
    shape = (0, 0)
    how = (
        "first token and special tokens left out" + (", rows renormalised" if renormalise else "")
        if exclude_sinks
        else "raw attention"
    )
    state = process_state()  # one process, or this process's share under torchrun / accelerate launch
    with state.split_between_processes(probes) as share:
        mine = list(share)
    rank = state.process_index if state.num_processes > 1 else 0
    path = rank_path(checkpoint, rank, state.num_processes) if checkpoint is not None else None
    digest = hashlib.sha256(
        repr([(p.id, p.text, p.pronoun, p.candidates, p.gold) for p in probes]).encode()
    ).hexdigest()
    start = 0
    if checkpoint is not None and path is not None and resume:
        saved = _load_place(path, checkpoint, state.num_processes, digest)
        if saved is not None:
            start, per_probe, skipped = saved["done"], saved["per_probe"], saved["skipped"]
            correct = {(int(layer), int(head)): int(hits) for layer, head, hits in saved["correct"]}
            nearest_hits, first_hits, shape = saved["nearest_hits"], saved["first_hits"], tuple(saved["shape"])

    def save(done: int) -> Path:
        assert path is not None
        place = {
            "format": KIND,
            "probes": digest,
            "rank": rank,
            "num_processes": state.num_processes,
            "done": done,
            "per_probe": per_probe,
            "skipped": skipped,
            "correct": [[int(layer), int(head), int(hits)] for (layer, head), hits in correct.items()],
            "nearest_hits": int(nearest_hits),
            "first_hits": int(first_hits),
            "shape": list(shape),
        }
        return write_checkpoint(path, place)

    def score(probe: Probe, done: int) -> None:
        nonlocal nearest_hits, first_hits, shape
        if on_progress is not None:
            on_progress(done, len(mine))
        target = probe.text if part == "decoder" else None
        [captured], _ = capture_forward(resolved, encode_texts(resolved, probe.text, target=target, add_bos=add_bos))
        cap = captured.select(part)
        try:
            ranking = rank_heads(
                cap, probe.pronoun, probe.candidates, exclude_sinks=exclude_sinks, renormalise=renormalise
            )
        except InputError as err:
            skipped.append(f"{probe.id}: {err}")
            return
        shape = (cap.n_layers, cap.n_heads)
        gold = ranking.table.columns[2 + list(probe.candidates).index(probe.gold)]
        for row in ranking.table.itertuples(index=False):
            key = (row.layer, row.head)
            correct[key] = correct.get(key, 0) + int(row.preferred == gold)
        spans = ranking.candidates
        before = [s for s in spans if s.char_end <= ranking.pronoun.char_start] or spans
        nearest = min(before, key=lambda s: abs(ranking.pronoun.char_start - s.char_end)).text
        first = min(spans, key=lambda s: s.char_start).text
        nearest_hits += nearest == spans[list(probe.candidates).index(probe.gold)].text
        first_hits += first == spans[list(probe.candidates).index(probe.gold)].text
        best = ranking.best
        per_probe.append(
            {
                "id": probe.id,
                "text": probe.text,
                "pronoun": probe.pronoun,
                "gold": probe.gold,
                "nearest": nearest,
                "first": first,
                "best_head": f"L{best['layer']}·H{best['head']}",
                "best_head_pick": best["preferred"],
                "best_head_weight": float(best[best["preferred"]]),
            }
        )

    last = (start, time.monotonic())
    bar = tqdm(total=len(mine), initial=start, desc="probes", disable=not progress or not state.is_main_process)

    def interrupted(stopping: signal.Signals, done: int, where: Path) -> Interrupted:
        return Interrupted(
            f"stopped by {stopping.name}: {done:,} probes{' of this process' if rank else ''} "
            f"saved in {str(where)!r}; run the same command with --resume (resume=True) to continue",
            checkpoint=where,
            signal=stopping.name,
            rank=rank,
        )

    with stop_requests(active=path is not None) as stop:
        # under several processes they agree before each probe whether the run stops (a round each)
        rounds = StopRounds(stop, state, agree=path is not None)
        for done in range(start, len(mine)):
            probe = mine[done]
            bar.update(done - bar.n)
            stopping = rounds.stopped()
            if path is not None:
                due = (
                    done - last[0] >= checkpoint_every_probes or time.monotonic() - last[1] >= checkpoint_every_seconds
                )
                if stopping is not None or due:
                    where = save(done)
                    last = (done, time.monotonic())
                    if stopping is not None:
                        raise interrupted(stopping, done, where)
            score(probe, done)
        if path is not None:
            where = save(len(mine))
            # in the rounds until every process is past its last probe: a stop meanwhile stops this one too
            stopping = rounds.finished()
            if stopping is not None:
                raise interrupted(stopping, len(mine), where)
        # every process is here together: a signal from now on finds the run complete (noted, not obeyed)
        if state.num_processes > 1:
            from accelerate.utils import gather_object  # deferred: accelerate is optional (attnviz[stats])

            per_probe = gather_object(per_probe)
            skipped = gather_object(skipped)
            parts = gather_object([(correct, nearest_hits, first_hits, shape)])
            correct = {}
            for counts, _, _, _ in parts:
                for key, hits in counts.items():
                    correct[key] = correct.get(key, 0) + hits
            nearest_hits = sum(p[1] for p in parts)
            first_hits = sum(p[2] for p in parts)
            shape = max(p[3] for p in parts)
    bar.close()
    n = len(per_probe)
    if n == 0:
        raise InputError("no probe could be scored: " + "; ".join(skipped))
    accuracy = pd.DataFrame(
        [
            {"layer": layer, "head": head, "accuracy": hits / n, "correct": hits, "n": n}
            for (layer, head), hits in sorted(correct.items())
        ]
    )
    return ProbeResult(
        accuracy,
        pd.DataFrame(per_probe),
        {"nearest": nearest_hits / n, "first": first_hits / n},
        name,
        how,
        shape[0],
        shape[1],
        skipped,
    )
