"""Probe sets run through a model: every head scored on Winograd-style coreference probes.

This runs models (the probes in padded batches, by length), so it sits beside :mod:`attnviz.workflows.capture.runner`;
ranking one capture's heads is :func:`attnviz.analysis.rank_heads`, which never touches a model, and both read
a pronoun's weights through :func:`attnviz.analysis.coref.span_attention`.
"""

from __future__ import annotations

import hashlib
import signal
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...analysis.coref import (
    Span,
    covering_tokens,
    refuse_later_candidates,
    sink_positions,
    span_attention,
)
from ...analysis.layer_reduction import PickedRows
from ...analysis.probe_choices import HeadChoices, PronounRows, batch_candidate_weights
from ...analysis.probes import Probe, ProbeResult, ProbeSet, load_probes
from ...data.capture import Capture
from ...errors import ArgumentTypeError, InputError, Interrupted
from ..capture.inputs import Encoded, tokenize_each
from ..capture.pipeline import Resolved, resolve
from ..capture.runner import capture_forward, encode_texts
from .batched import BatchReducer
from .checkpoints import check_interval, rank_path, read_checkpoint, write_checkpoint, written_by
from .corpus import length_batches
from .interrupts import StopRounds, stop_requests
from .processes import process_state

__all__ = ["BATCH_SIZE", "BATCH_TOKENS", "KIND", "evaluate_probes", "refuse_unscorable"]

# Probes per forward, and padded tokens per forward at most. Each layer's taps, recomputation and
# check cost about the same whatever the batch, so short probes want many per forward: MiniLM's
# scoring went from 0.72x of a plain forward's speed at 8 per batch to 0.77-0.78x at 64 on a quiet
# machine (bench/probe_throughput.py). The token cap keeps a batch of long probes (GAP's paragraphs) as
# large in memory and time as 64 short ones: a signal still stops the run within one such batch.
BATCH_SIZE = 64
BATCH_TOKENS = 4096

EVERY_PROBES = 100  # probes one process scores between two checkpoints, at most
EVERY_SECONDS = 60.0  # seconds between two checkpoints, at most
KIND = "attnviz probes checkpoint 2"  # 2: the picks of every head per probe (1 kept only counts)


def _probe_list(probes: Any) -> list[Probe]:
    """A shipped set's name, a JSONL path, or a list of :class:`Probe` / dicts."""
    if isinstance(probes, (str, Path)):
        return load_probes(probes)
    if isinstance(probes, ProbeSet) and probes:  # loaded already: its problems are the result's skipped lines
        return probes
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
    batch_size: int = BATCH_SIZE,
    progress: bool = True,
    exclude_sinks: bool = True,
    renormalise: bool = True,
    add_bos: bool = False,
    part: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    checkpoint_every_probes: int = EVERY_PROBES,
    checkpoint_every_seconds: float = EVERY_SECONDS,
) -> ProbeResult:
    """Score every head of ``model`` on ``probes``: how often its preferred candidate is the gold one.

    ``model`` is anything :func:`attnviz.capture` takes (a name is loaded once); ``probes`` a shipped set's
    name, a file :func:`~attnviz.analysis.load_probes` reads, or a list of :class:`Probe` / dicts. A
    probe's pronoun and candidates are found where :meth:`Probe.locate` says (its offsets when given).

    The probes run ``batch_size`` at a time, sorted by length and right-padded (padding ≤ 10 % of a
    batch's tokens, as :func:`~attnviz.workflows.corpus.corpus.corpus_stats` batches; at most
    :data:`BATCH_TOKENS` padded tokens, so long probes run fewer at a time): each text's records hold
    only its own tokens, so a head's pick is the one a forward of that probe alone gives
    (``batch_size=1``). ``add_bos=True`` prepends a BOS token (off by default, as everywhere in attnviz):
    for a decoder, pass it — its attention sink is the first token, left out of the picks with
    ``exclude_sinks``, and many probes begin with a candidate. A progress bar shows unless ``progress=False``.
    ``part`` picks the encoder or the decoder of an encoder-decoder model (the probe text is then the
    source, or the target; such a model runs probe by probe). ``on_progress(done, total)`` is called
    before each batch (a page's progress bar).

    A probe that cannot be scored (a candidate after the pronoun in a causal decoder, a text too long
    for the model, no token under a span) is left out and named in ``result.skipped`` with why.

    ``checkpoint``: a file where each process saves its place (atomically; under N processes
    ``<checkpoint>.rank<i>-of-<N>``) every ``checkpoint_every_probes`` probes or
    ``checkpoint_every_seconds`` seconds, and when SIGTERM or SIGINT arrives — then
    :class:`~attnviz.errors.Interrupted` is raised once it is saved. ``resume=True`` continues from it
    (the same probes, ``batch_size`` and number of processes); with no checkpoint there it warns and
    starts. Under several processes they agree before each batch whether the run stops
    (:class:`~attnviz.workflows.corpus.interrupts.StopRounds`): a signal that reaches any of them stops all.
    """
    from tqdm.auto import tqdm  # deferred: only a progress bar needs it

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InputError(f"batch_size must be a whole number ≥ 1, got {batch_size!r}")
    check_interval("checkpoint_every_probes", checkpoint_every_probes, EVERY_PROBES, "probes")
    check_interval("checkpoint_every_seconds", checkpoint_every_seconds, EVERY_SECONDS, "seconds")
    probes = _probe_list(probes)
    loaded_problems = _load_problems(probes)
    resolved = resolve(model, tokenizer)  # a name is loaded once, for every probe
    tokenizer = resolved.require_tokenizer()
    how = (
        "first token and special tokens left out" + (", rows renormalised" if renormalise else "")
        if exclude_sinks
        else "raw attention"
    )
    state = process_state()  # one process, or this process's share under torchrun / accelerate launch
    with state.split_between_processes(list(enumerate(probes))) as share:
        mine: list[tuple[int, Probe]] = list(share)
    rank = state.process_index if state.num_processes > 1 else 0
    path = rank_path(checkpoint, rank, state.num_processes) if checkpoint is not None else None
    digest = hashlib.sha256(repr([(_identity(p), batch_size, add_bos) for p in probes]).encode()).hexdigest()

    scored: list[dict] = []  # one entry per scored probe: its index in probes, its picks, its per_probe row
    skipped: list[str] = []
    encoded, order = _by_length(resolved, mine, add_bos, skipped)
    start = 0
    if checkpoint is not None and path is not None and resume:
        saved = _load_place(path, checkpoint, state.num_processes, digest)
        if saved is not None:
            start, scored, skipped = saved["done"], saved["scored"], saved["skipped"]

    def save(done: int) -> Path:
        assert path is not None
        place = {
            "format": KIND,
            "probes": digest,
            "rank": rank,
            "num_processes": state.num_processes,
            "done": done,
            "scored": scored,
            "skipped": skipped,
        }
        return write_checkpoint(path, place)

    run = ProbeRun(resolved, mine, encoded, part, add_bos, exclude_sinks, renormalise)

    last = (start, time.monotonic())
    bar = tqdm(total=len(order), initial=start, desc="probes", disable=not progress or not state.is_main_process)

    def interrupted(stopping: signal.Signals, done: int, where: Path) -> Interrupted:
        return Interrupted(
            f"stopped by {stopping.name}: {done:,} probes{' of this process' if rank else ''} "
            f"saved in {str(where)!r}; run the same command with --resume (resume=True) to continue",
            checkpoint=where,
            signal=stopping.name,
            rank=rank,
        )

    # the bar ends its line also when the run raises: an error is never printed on the bar's line
    with stop_requests(active=path is not None) as stop, bar:
        # under several processes they agree before each batch whether the run stops (a round each)
        rounds = StopRounds(stop, state, agree=path is not None)
        done = start
        for batch in _batches(order[start:], encoded, 1 if resolved.encoder_decoder else batch_size):
            bar.update(done - bar.n)
            if on_progress is not None:
                on_progress(done, len(order))
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
            done_now, skipped_now = run.score(batch)
            scored += done_now
            skipped += skipped_now
            done += len(batch)
        bar.update(done - bar.n)
        if path is not None:
            where = save(len(order))
            # in the rounds until every process is past its last probe: a stop meanwhile stops this one too
            stopping = rounds.finished()
            if stopping is not None:
                raise interrupted(stopping, len(order), where)
        # every process is here together: a signal from now on finds the run complete (noted, not obeyed)
        if state.num_processes > 1:
            from accelerate.utils import gather_object  # deferred: accelerate is optional (attnviz[stats])

            scored = gather_object(scored)
            skipped = gather_object(skipped)
    bar.close()
    if not scored:
        raise InputError(_none_scored(loaded_problems + skipped))
    return _result(sorted(scored, key=lambda s: s["index"]), resolved.name, how, loaded_problems + skipped)


def probe_places(tokenizer: Any, probe: Probe, encoded: Encoded) -> tuple[Span, list[Span]] | InputError:
    """The probe's pronoun and candidates (:meth:`Probe.locate`) as spans of its tokens (``encoded``: its
    ids, offsets and tokens), or the InputError that says why not. A span the tokenizer could only read as
    its unknown token (MiniLM's vocabulary has no 它) is refused: its weight would be the weight of [UNK],
    not of the word."""
    ids, offsets, _ = encoded
    unknown = getattr(tokenizer, "unk_token_id", None)  # None: a byte-level tokenizer
    try:
        (p_start, p_end), ranges = probe.locate()
        spans = []
        for start, end in [(p_start, p_end), *ranges]:
            text, tokens = probe.text[start:end], covering_tokens(offsets, start, end)
            if not tokens:
                raise InputError(f"no token covers characters {start}..{end} ({text!r}) of the text")
            if unknown is not None and all(ids[t] == unknown for t in tokens):
                raise InputError(
                    f"the tokenizer reads {text!r} as its unknown token only: a head's weight on it would be "
                    "the weight of that token, not of the word; use a model whose vocabulary has it"
                )
            spans.append(Span(text, start, end, tokens))
    except InputError as err:
        return err
    return spans[0], spans[1:]


def refuse_unscorable(resolved: Any, probes: Sequence[Probe], add_bos: bool = False) -> None:
    """Raise what :func:`evaluate_probes` raises after its run when no probe can be scored, from the
    tokenizer alone — every probe's text too long for the model, or its pronoun or candidates covered by no
    token or by the unknown token only (the ``zh`` set on MiniLM) — so that a caller with a long pass
    before the probes (the head atlas) says it before that pass."""
    mine = list(enumerate(probes))
    skipped: list[str] = []
    encoded, _ = _by_length(resolved, mine, add_bos, skipped)
    for b, one in encoded.items():
        place = probe_places(resolved.tokenizer, mine[b][1], one)
        if not isinstance(place, InputError):
            return
        skipped.append(f"{mine[b][1].id}: {place}")
    raise InputError(_none_scored(skipped))


def _none_scored(reasons: list[str], shown: int = 3) -> str:
    """Why no probe could be scored: the first reasons, and how many more (a set can hold thousands)."""
    more = f"; and {len(reasons) - shown:,} more" if len(reasons) > shown else ""
    return f"no probe could be scored ({len(reasons):,} left out): " + "; ".join(reasons[:shown]) + more


def _identity(probe: Probe) -> tuple:  # what a checkpoint must have been written for
    return (
        probe.id,
        probe.text,
        probe.pronoun,
        probe.candidates,
        probe.gold,
        getattr(probe, "pronoun_start", None),
        tuple(getattr(probe, "candidate_starts", ())),
    )


def _load_problems(probes: list[Probe]) -> list[str]:
    """The probes a loaded set could not use (``ProbeSet.problems``), as the result's skipped lines."""
    problems = getattr(probes, "problems", None)
    if problems is None or len(problems) == 0:
        return []
    return [
        # a line the reader could not make a probe of has no id: its line number, said as one
        f"{row.get('id') or 'line ' + str(row.get('row', '?'))}: {row['reason']} (when loading)"
        for row in problems.to_dict("records")
    ]


def _by_length(
    resolved: Any, mine: list[tuple[int, Probe]], add_bos: bool, skipped: list[str]
) -> tuple[dict[int, Encoded], list[int]]:
    """Each probe of this process tokenized once, and the order they run in: by length (stable), so that a
    batch pads little. A text the model cannot take whole is skipped, with why."""
    encoded: dict[int, Encoded] = {}
    texts = [probe.text for _, probe in mine]
    found = tokenize_each(resolved.tokenizer, texts, None, resolved.limit, resolved.name, add_bos)
    for b, ((_, probe), one) in enumerate(zip(mine, found)):
        if isinstance(one, InputError):
            skipped.append(f"{probe.id}: {one}")
        else:
            encoded[b] = one
    order = sorted(encoded, key=lambda b: len(encoded[b][0]))
    return encoded, order


def _batches(order: list[int], encoded: dict[int, Encoded], batch_size: int) -> list[list[int]]:
    """``order`` (already by length) cut as :func:`~attnviz.workflows.corpus.corpus.length_batches` cuts a pool."""
    if not order:
        return []
    [cut] = length_batches(order, lambda b: len(encoded[b][0]), batch_size, pool=len(order), max_tokens=BATCH_TOKENS)
    return [[b for b, _ in batch] for batch in cut]


@dataclass
class ProbeRun:
    """How this process scores its probes, a batch at a time (:meth:`score`).

    One-stack models run each batch through :class:`~attnviz.workflows.corpus.batched.BatchReducer` — one
    padded forward, each layer's weights recomputed for the whole batch as its kernel returns and
    checked against the kernel's own output (``capture(check="sample")``'s rows and tolerances) — and
    keep only the pronoun's rows (:class:`~attnviz.analysis.layer_reduction.PickedRows`); no per-probe
    :class:`~attnviz.Capture` is made. An encoder-decoder's probes are captured one by one
    (:func:`~attnviz.workflows.capture.runner.capture_forward`: its parts read different tokens)."""

    resolved: Resolved
    mine: list[tuple[int, Probe]]  # (index in the whole set, probe)
    encoded: dict[int, Encoded]  # by position in mine
    part: str | None
    add_bos: bool
    exclude_sinks: bool
    renormalise: bool
    reducer: BatchReducer | None = None

    def __post_init__(self) -> None:
        if not self.resolved.encoder_decoder:
            self.reducer = BatchReducer(
                self.resolved.model,
                self.resolved.tokenizer,
                add_bos=self.add_bos,
                part=self.part,
                detectors=False,
                moved=False,  # the probes read weights only: no value norms,
                statistics=False,  # no head statistics — each layer's check and the pronoun's rows
            )

    def score(self, batch: list[int]) -> tuple[list[dict], list[str]]:
        """(each scored probe's picks and ``per_probe`` row, "id: reason" for each probe it could not score)."""
        scored, skipped = [], []
        for b, outcome in zip(batch, self._weights(batch)):
            index, probe = self.mine[b]
            if isinstance(outcome, InputError):
                skipped.append(f"{probe.id}: {outcome}")
            else:
                scored.append(_outcome(index, probe, *outcome))
        return scored, skipped

    def _weights(self, batch: list[int]) -> list:
        """Per probe of ``batch``: (pronoun, candidates, :class:`HeadChoices` of its heads), or the InputError
        that says why it cannot be scored."""
        texts = [self.mine[b][1].text for b in batch]
        if self.reducer is None:
            inputs = encode_texts(
                self.resolved, texts, target=texts if self.part == "decoder" else None, add_bos=self.add_bos
            )
            captured, _ = capture_forward(self.resolved, inputs)
            return [self._from_capture(cap.select(self.part), self.mine[b][1]) for b, cap in zip(batch, captured)]
        places: list[tuple[Span, list[Span]] | InputError] = [
            self._places(self.mine[b][1], self.encoded[b]) for b in batch
        ]
        rows = [() if isinstance(p, InputError) else p[0].tokens for p in places]
        width = max(1, max(len(r) for r in rows))
        positions = torch.tensor([[*r, *[-1] * (width - len(r))] for r in rows], dtype=torch.long)
        picked = PickedRows(positions)
        self.reducer.add(None, texts, [self.encoded[b] for b in batch], picked)
        causal = any(picked.causal.values())
        layers = sorted(picked.weights)
        every = torch.stack([picked.weights[layer] for layer in layers], 1)  # [batch, layer, head, row, key]
        out: list = list(places)
        readings, where = [], []
        for i, (b, place) in enumerate(zip(batch, places)):
            if isinstance(place, InputError):
                continue
            pronoun, spans = place
            try:
                refuse_later_candidates(causal, pronoun, spans)
            except InputError as err:
                out[i] = err
                continue
            out[i] = (pronoun, spans)
            offsets = self.encoded[b][1]
            exclude = tuple(sink_positions(offsets, pronoun.tokens)) if self.exclude_sinks else ()
            keys = tuple(tuple(t for t in s.tokens if t not in exclude) for s in spans)
            readings.append(PronounRows(i, len(pronoun.tokens), len(offsets), exclude, keys))
            where.append(i)
        if readings:
            weights = batch_candidate_weights(every, readings, self.renormalise)  # [probe, layer, head, candidate]
            for i, choices in zip(where, HeadChoices.of(weights, layers, layers[-1] + 1)):
                out[i] = (*out[i], choices)
        return out

    def _places(self, probe: Probe, encoded: Encoded) -> tuple[Span, list[Span]] | InputError:
        return probe_places(self.resolved.tokenizer, probe, encoded)

    def _from_capture(self, cap: Capture, probe: Probe):
        """One probe from its own capture (an encoder-decoder's part)."""
        place = self._places(probe, (cap.token_ids, cap.offsets, cap.tokens))
        if isinstance(place, InputError):
            return place
        pronoun, spans = place
        try:
            refuse_later_candidates(any(r.causal for r in cap.records.values()), pronoun, spans)
        except InputError as err:
            return err
        exclude = sink_positions(cap.offsets, pronoun.tokens) if self.exclude_sinks else []
        layers = cap.layer_indices()
        weights = torch.stack(
            [
                span_attention(cap, layer, pronoun, spans, exclude=exclude, renormalise=self.renormalise)
                for layer in layers
            ]
        )
        [choices] = HeadChoices.of(weights[None], layers, cap.n_layers)
        return pronoun, spans, choices


def _outcome(index: int, probe: Probe, pronoun: Span, spans: list[Span], choices: HeadChoices) -> dict:
    """One probe's picks in every head and its row of ``per_probe``."""
    before = [i for i, s in enumerate(spans) if s.char_end <= pronoun.char_start] or list(range(len(spans)))
    nearest = min(before, key=lambda i: abs(pronoun.char_start - spans[i].char_end))
    first = min(range(len(spans)), key=lambda i: spans[i].char_start)
    gold = list(probe.candidates).index(probe.gold)
    return {
        "index": index,
        "picks": choices.picks,
        "gold": gold,
        "nearest": nearest,
        "first": first,
        "row": {
            "id": probe.id,
            "text": probe.text,
            "pronoun": probe.pronoun,
            "pronoun_start": pronoun.char_start,
            "pronoun_end": pronoun.char_end,
            "candidates": list(probe.candidates),
            "gold": probe.gold,
            "nearest": probe.candidates[nearest],
            "first": probe.candidates[first],
            "best_head": f"L{choices.layer}·H{choices.head}",
            "best_head_pick": probe.candidates[choices.pick],
            "best_head_weight": choices.weight,
        },
    }


def _result(scored: list[dict], model: str, how: str, skipped: list[str]) -> ProbeResult:
    """The scored probes (in the set's order) as a :class:`ProbeResult`: the picks and what follows from them."""
    import pandas as pd  # deferred: pandas is heavy and only tables need it

    layers = max(s["picks"].shape[0] for s in scored)
    heads = max(s["picks"].shape[1] for s in scored)
    picks = np.full((len(scored), layers, heads), -1, dtype=np.int16)
    for i, s in enumerate(scored):
        picks[i, : s["picks"].shape[0], : s["picks"].shape[1]] = s["picks"].numpy()
    return ProbeResult.from_picks(
        picks,
        gold=np.array([s["gold"] for s in scored], dtype=np.int16),
        nearest=np.array([s["nearest"] for s in scored], dtype=np.int16),
        first=np.array([s["first"] for s in scored], dtype=np.int16),
        n_candidates=np.array([len(s["row"]["candidates"]) for s in scored], dtype=np.int16),
        per_probe=pd.DataFrame([s["row"] for s in scored]),
        model=model,
        how=how,
        skipped=skipped,
    )
