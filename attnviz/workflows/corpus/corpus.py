"""Head statistics over a whole corpus: streamed, batched by length, spread over processes.

One sentence says little about a head (Clark et al. pooled 1,000 segments). :func:`corpus_stats`
reads texts lazily, groups them into batches of similar length (padding at most
:data:`MAX_PADDING` of a batch's tokens), runs each batch in one forward and reduces it at once,
layer by layer as the forward goes (:mod:`~attnviz.workflows.corpus.batched`), into per-head float64 sums
(:class:`~attnviz.analysis.stats.HeadStatsSums`) — memory does not grow with the corpus. An
encoder-decoder's batch is captured and added text by text (its parts read different tokens).

Started by ``torchrun`` or ``accelerate launch``, each process takes its share of every pool of
batches (accelerate's ``PartialState.split_between_processes``) and the sums are added across
processes with accelerate's ``reduce`` over torch.distributed (gloo on CPU, nccl on GPU): N
processes give the one-process numbers. attnviz opens no socket and starts no process itself. With a
checkpoint, the processes agree before each batch whether the run stops
(:class:`~attnviz.workflows.corpus.interrupts.StopRounds`): a signal that reaches any of them stops all of
them, each saving its own place, so none is left waiting in the final sum for one that stopped.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ...analysis.head_tally import HeadTally
from ...analysis.layer_reduction import wanted_columns
from ...analysis.stats import HeadStatsSums
from ...deprecation import warn_renamed
from ...errors import ArgumentTypeError, InputError, InputTooLongError, Interrupted
from ...files import atomic_path, not_utf8
from ..capture.inputs import Encoded, check_max_length
from ..capture.models import EMBEDDED_MODELS, load_model, resolve_dtype
from ..capture.pipeline import Resolved, n_layers, resolve
from ..capture.runner import capture_forward, encode_texts
from .batched import BatchReducer
from .checkpoints import check_interval
from .corpus_checkpoint import EVERY_SECONDS, EVERY_TEXTS, CorpusCheckpoint, Place
from .interrupts import StopRounds, stop_requests
from .processes import process_state

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MAX_PADDING", "check_corpus", "corpus_stats", "length_batches", "read_table", "read_texts", "write_table"]

MAX_PADDING = 0.10  # at most this share of a batch's tokens is padding
POOL = 64  # batches' worth of texts read ahead and sorted by length
T = TypeVar("T")  # what length_batches batches: texts, or a caller's own indices


TABLES = (".csv", ".tsv", ".parquet", ".json", ".xlsx", ".xls")  # not one text per line
NO_TEXT = 'the corpus has no text: give one text per line (.txt) or {"text": ...} per line (.jsonl)'


def check_corpus(source: str | Path | Iterable[str]) -> None:
    """A corpus file's problems before any model loads: not there, no text in it, or a bad first line
    (an iterable of texts is checked as it is read)."""
    if isinstance(source, (str, Path)) and next(read_texts(source), None) is None:
        raise InputError(NO_TEXT)


def read_texts(source: str | Path | Iterable[str]) -> Iterator[str]:
    """Texts one at a time: from a ``.jsonl`` file (``{"text": ...}`` per line), a text file (one
    text per line; blank lines skipped), or any iterable of strings. A table's file (``.csv``, ``.parquet``
    …) is refused: read its column of texts and pass them."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise InputError(f"no corpus file at {str(path)!r}: give a .txt (one text per line) or .jsonl file")
        if path.suffix.lower() in TABLES:  # read line by line, a table's header and columns became "texts"
            raise InputError(
                f"{str(path)!r} is a {path.suffix} table: a corpus is a .txt (one text per line) or .jsonl "
                '({"text": ...} per line) file, or the texts themselves, e.g. pandas.read_csv(path)["text"].tolist()'
            )
        yield from _read_file(path)
        return
    for i, text in enumerate(source):
        if not isinstance(text, str):
            raise ArgumentTypeError(f"texts must be strings; item {i} is {type(text).__name__}")
        if text.strip():
            yield text


def too_long(number: int, tokens: int, limit: int) -> InputTooLongError:
    """The refusal of a corpus' text over the model's limit with ``truncate=False`` (its ``number``, from 1)."""
    return InputTooLongError(
        f"text {number} of the corpus has {tokens:,} tokens; the limit is {limit:,}. Leave truncate on "
        "(the default: such texts are cut and counted) or shorten it"
    )


def _read_file(path: Path) -> Iterator[str]:
    jsonl = path.suffix.lower() == ".jsonl"  # x.JSONL too: read as text lines, each JSON line became a "text"
    try:
        with path.open(encoding="utf-8-sig") as f:  # a byte-order mark is no part of the first text
            yield from _lines(path, f, jsonl)
    except UnicodeDecodeError as err:  # decoded a block at a time: the line is found again in the bytes
        raise not_utf8(path, err) from err


def _lines(path: Path, f: Iterable[str], jsonl: bool) -> Iterator[str]:
    for number, line in enumerate(f, 1):
        if not line.strip():
            continue
        if not jsonl:
            yield line.rstrip("\n")
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f'{path}:{number} is not JSON ({err.msg}); each line must be {{"text": ...}}') from err
        text = item.get("text") if isinstance(item, dict) else None
        if not isinstance(text, str):
            raise InputError(f'{path}:{number} has no "text" string; each line must be {{"text": ...}}')
        if text.strip():
            yield text


def length_batches(
    texts: Iterable[T],
    lengths: Callable[[T], int],
    batch_size: int,
    *,
    pool: int = POOL,
    max_tokens: int | None = None,
) -> Iterator[list[list[tuple[T, int]]]]:
    """Pools of batches: ``pool × batch_size`` texts at a time, sorted by ``lengths(text)`` (tokens)
    and cut into batches of at most ``batch_size`` whose padding stays within :data:`MAX_PADDING`
    (and, given ``max_tokens``, whose padded tokens stay within it: a longer text is a batch alone)."""
    buffer: list[tuple[T, int]] = []
    for text in texts:
        buffer.append((text, lengths(text)))
        if len(buffer) >= pool * batch_size:
            yield _cut(buffer, batch_size, max_tokens)
            buffer = []
    if buffer:
        yield _cut(buffer, batch_size, max_tokens)


def _cut(items: list[tuple[T, int]], batch_size: int, max_tokens: int | None) -> list[list[tuple[T, int]]]:
    items = sorted(items, key=lambda item: item[1])
    batches: list[list[tuple[T, int]]] = []
    batch: list[tuple[T, int]] = []
    for item in items:
        candidate = batch + [item]
        longest = item[1]  # sorted: the newest is the longest
        padding = 1 - sum(n for _, n in candidate) / (longest * len(candidate))
        too_many = max_tokens is not None and longest * len(candidate) > max_tokens
        if batch and (len(candidate) > batch_size or padding > MAX_PADDING or too_many):
            batches.append(batch)
            batch = [item]
        else:
            batch = candidate
    if batch:
        batches.append(batch)
    return batches


def corpus_stats(
    model: Any,
    texts: str | Path | Iterable[str],
    tokenizer: Any = None,
    *,
    batch_size: int = 8,
    layers: Iterable[int] | None = None,
    max_length: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    device_map: str | dict | None = None,
    offload_folder: str | Path | None = None,
    add_bos: bool = False,
    part: str | None = None,
    detectors: bool = True,
    truncate: bool = True,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    checkpoint_every_texts: int = EVERY_TEXTS,
    checkpoint_every_seconds: float = EVERY_SECONDS,
    progress: bool = True,
    tally: HeadTally | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    moved: bool = True,
    encodings: Mapping[str, Encoded] | None = None,
    statistics: Iterable[str] | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """:func:`~attnviz.analysis.head_stats` over a whole corpus, pooled over every query token.

    - ``texts``: an iterable of strings (read lazily), or a ``.txt`` / ``.jsonl`` file.
    - ``batch_size``: texts per forward, grouped by length (padding ≤ 10 % of a batch's tokens).
    - ``device_map``: ``"auto"`` (or a map) loads a model name through accelerate's big-model
      inference — layers spread over GPUs, CPU and disk (``offload_folder`` holds the disk's part);
      the taps record wherever each layer runs.
    - Under ``torchrun`` / ``accelerate launch`` each process captures its share and the sums are
      added over all processes; every process returns the same table.
    - ``truncate``: a text longer than the model's limit (or ``max_length``) is cut there and counted
      (``df.attrs["truncated"]``); ``truncate=False`` refuses it instead.
    - ``checkpoint``: where the run saves its place (atomically; under several processes each writes
      ``<checkpoint>.rank<i>-of-<n>``): every ``checkpoint_every_texts`` texts a process added or
      ``checkpoint_every_seconds`` seconds, at the end, and when SIGTERM or SIGINT arrives — then
      :class:`~attnviz.errors.Interrupted` is raised (carrying the file) once the checkpoint is
      written — on every process when the signal reached any of them. ``resume=True`` continues from it (same corpus, ``batch_size`` and number of
      processes), counting no text twice; with no checkpoint there, it warns and starts at the first text.

    Returns one row per layer and head with the :data:`~attnviz.analysis.stats.STATISTICS` (and
    detector) columns, their moved twins (:data:`~attnviz.analysis.stats.MOVED_STATISTICS`,
    ``<name>_moved``: each layer's value norms read from its output projection; NaN where it has
    none), plus ``texts`` and ``tokens`` (the corpus's, over all processes). A checkpoint written
    before the ``_moved`` columns is refused on ``resume`` (its texts were never summed as moved).
    ``tally``: per-head counts of where each row's maximum falls, added in the same reduction
    (:class:`~attnviz.analysis.head_tally.HeadTally`, what :func:`~attnviz.analysis.head_atlas` reads;
    this process's share — the caller adds them over processes); one-stack models, no checkpoint.
    ``moved=False``: no value norms are read and the ``_moved`` columns are NaN (for a caller that reads
    none of them, as the head atlas). ``statistics``: the names (of :data:`~attnviz.analysis.stats.STATISTICS`
    and the detectors) of the only statistics computed, by weight; every other column, and every ``_moved``
    one, is NaN — without ``punctuation`` and ``distance`` no product runs over every weight, which is what
    the head atlas reads (one-stack models, no checkpoint). ``encodings``: texts the caller has already tokenized as the pass
    tokenizes them (``BatchReducer.encode``: uncut), by text — not tokenized again (one-stack models).
    ``on_progress(done, total)``: called after each batch with the texts this process has added so far and
    the corpus's size (0 while a corpus read lazily — an iterator, a file — has not been counted), for a progress
    bar of the caller's own, e.g. the dashboard's. ``on_batch(texts, tokens)``: what it was before,
    deprecated.
    ``df.attrs`` holds ``per_process`` (texts each process captured), ``padding`` (the share of
    padding tokens in the batches), ``truncated`` and ``resumed_after`` (texts the checkpoint already held).
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InputError(f"batch_size must be a whole number ≥ 1, got {batch_size!r}")
    check_max_length(max_length)
    if on_batch is not None:
        warn_renamed("corpus_stats(on_batch=)", "on_progress=, called with (texts done, the corpus's texts)")
    size = len(texts) if isinstance(texts, (list, tuple)) else 0
    check_interval("checkpoint_every_texts", checkpoint_every_texts, EVERY_TEXTS, "texts")  # before any model loads
    check_interval("checkpoint_every_seconds", checkpoint_every_seconds, EVERY_SECONDS, "seconds")
    check_corpus(texts)
    state = process_state()
    if isinstance(model, (str, Path)):
        if device is None and state.num_processes > 1 and state.device.type == "cuda" and device_map is None:
            device = str(state.device)  # one GPU per process
        model, loaded = _load(str(model), device, dtype, device_map, offload_folder)
        tokenizer = tokenizer if tokenizer is not None else loaded
    resolved = resolve(model, tokenizer)
    tokenizer = resolved.require_tokenizer()
    checked = resolved.layers(layers)
    wanted = sorted(checked) if checked is not None else None
    limit = resolved.limit
    bounds = [x for x in (max_length, limit) if x is not None]
    cap_length: int | None = min(bounds) if bounds else None
    reducer = None  # an encoder-decoder is captured text by text (its parts read different tokens)
    if tally is not None and (checkpoint is not None or getattr(model.config, "is_encoder_decoder", False)):
        raise InputError(
            "a tally of row maxima reads one-stack models without a checkpoint: give a decoder or an encoder, "
            "and no checkpoint"
        )
    if checkpoint is not None and not moved:
        raise InputError("moved=False leaves the _moved sums out, which a checkpoint keeps: give moved=True")
    if statistics is not None:
        statistics = tuple([statistics] if isinstance(statistics, str) else statistics)
        wanted_columns(statistics)  # an unknown name is said before the model runs
        if checkpoint is not None or getattr(model.config, "is_encoder_decoder", False):
            raise InputError(
                "statistics= (--statistics) computes some statistics of one-stack models without a checkpoint "
                "(which keeps every sum): give a decoder or an encoder and no checkpoint, or leave statistics out"
            )
    if not getattr(model.config, "is_encoder_decoder", False):
        reducer = BatchReducer(
            resolved,
            layers=wanted,
            max_length=cap_length,
            add_bos=add_bos,
            part=part,
            detectors=detectors,
            moved=moved and statistics is None,
            statistics=True if statistics is None else statistics,
        )
    truncated = 0
    read = 0  # texts taken from the stream (all processes read the same stream)

    known = encodings  # the caller's, never cleared
    pooled: dict[str, Encoded] = {}  # this pool's texts, tokenized once: to sort them and to capture them

    def count(text: str) -> int:
        nonlocal truncated, read
        read += 1
        if reducer is not None:
            encoded = known.get(text) if known is not None else None
            if encoded is None:
                encoded = reducer.encode(text)
            n = len(encoded[0])
            if cap_length is None or n <= cap_length:
                pooled[text] = encoded
        else:
            n = len(tokenizer(text, verbose=False)["input_ids"])  # a text over the limit is counted here, not warned of
        if cap_length is not None and n > cap_length:
            if not truncate:
                raise too_long(read, n, cap_length)
            truncated += 1
            return cap_length
        return n

    rank = state.process_index if state.num_processes > 1 else 0
    saver = None
    if checkpoint is not None:
        saver = CorpusCheckpoint(
            checkpoint,
            rank=rank,
            num_processes=state.num_processes,
            batch_size=batch_size,
            every_texts=checkpoint_every_texts,
            every_seconds=checkpoint_every_seconds,
        )
    place = saver.load() if saver is not None and resume else Place()
    sums, mine, truncated = place.sums, list(place.mine), place.truncated
    resumed = mine[0]  # texts this process added before the run was stopped
    stream = read_texts(texts)
    for _ in range(place.read):
        if next(stream, None) is None:
            break
    read = place.read
    skip_batches = place.done  # batches of this process's share of the first pool already added
    bar = _bar(progress and state.is_main_process, initial=place.read)
    # the bar ends its line also when the run raises: an error is never printed on the bar's line
    with stop_requests(active=saver is not None) as stop, bar if bar is not None else contextlib.nullcontext():
        # under several processes they agree before each batch whether the run stops (a round each)
        rounds = StopRounds(stop, state, agree=saver is not None)
        for pool in length_batches(stream, count, batch_size):
            with state.split_between_processes(pool) as share:
                for index, batch in enumerate(share):
                    if index < skip_batches:
                        continue
                    stopping = rounds.stopped()
                    if saver is not None and (stopping is not None or saver.due(mine[0])):
                        where = saver.save(Place(place.read, place.truncated, index, sums, (mine[0], mine[1], mine[2])))
                        if stopping is not None:
                            raise _interrupted(stopping.name, where, mine[0], rank, state.num_processes)
                    batch_texts = [text for text, _ in batch]
                    if reducer is not None:
                        given = [pooled.get(text) for text in batch_texts]
                        sums, counts = reducer.add(sums, batch_texts, given, tally=tally)
                    else:
                        sums, counts = _add_captures(
                            sums, resolved, batch_texts, checked, cap_length, add_bos, part, detectors
                        )
                    mine[0] += len(counts)
                    mine[1] += sum(counts)
                    mine[2] += max(counts) * len(counts)
                    if on_progress is not None:
                        on_progress(mine[0], size)
                    if on_batch is not None:
                        on_batch(mine[0], mine[1])
            skip_batches = 0
            place = Place(read, truncated)  # the next pool starts here
            pooled.clear()
            if bar is not None:
                bar.update(read - bar.n)
                bar.set_postfix(tokens=f"~{mine[1] * state.num_processes:,}")
        if saver is not None:  # the whole share added
            where = saver.save(Place(read, truncated, 0, sums, (mine[0], mine[1], mine[2])))
            # in the rounds until every process is past its last batch: a stop meanwhile stops this one too
            stopping = rounds.finished()
            if stopping is not None:
                raise _interrupted(stopping.name, where, mine[0], rank, state.num_processes)
        if sums is None:
            sums = _empty(model, wanted, part, detectors)
        # every process is here together: a signal from now on finds the run complete (noted, not obeyed)
        totals = _reduce(state, sums, mine, resumed)
    if bar is not None:
        bar.close()
    if sums.texts == 0:
        raise InputError(NO_TEXT)
    frame = sums.frame()
    frame["texts"] = sums.texts
    frame["tokens"] = sums.tokens
    frame.attrs.update(
        per_process=totals["per_process"],
        padding=totals["padding"],
        truncated=truncated,
        resumed_after=totals["resumed"],
        rank=rank,
    )
    return frame


def _add_captures(
    sums: HeadStatsSums | None, resolved: Resolved, texts: list[str], wanted, cap_length, add_bos, part, detectors
) -> tuple[HeadStatsSums, list[int]]:
    """One batch captured (one padded forward) and added text by text: an encoder-decoder's part."""
    inputs = encode_texts(resolved, texts, max_length=cap_length, add_bos=add_bos)
    caps, _ = capture_forward(resolved, inputs, layers=wanted)
    for cap in caps:
        cap = cap.select(part)
        if sums is None:
            sums = HeadStatsSums.like(cap, detectors=detectors)
        sums.add(cap)
    assert sums is not None
    return sums, [c.n_tokens for c in caps]


def _load(name: str, device, dtype, device_map, offload_folder=None):
    if device_map is None:
        return load_model(name, device=device, dtype=dtype)
    from transformers import AutoModel, AutoTokenizer  # deferred: importing attnviz does not import transformers

    if name in EMBEDDED_MODELS:
        raise InputError("device_map applies to hub names and folders; the embedded models load whole")
    extra: dict[str, Any] = {"offload_folder": str(offload_folder)} if offload_folder is not None else {}
    model = AutoModel.from_pretrained(name, device_map=device_map, dtype=resolve_dtype(dtype), **extra)
    return model.eval(), AutoTokenizer.from_pretrained(name)


def _empty(model, wanted, part, detectors) -> HeadStatsSums:
    """Zero sums for a process that got no batch (it still takes part in the reduction)."""
    config = model.config
    heads = next(
        getattr(config, name)
        for name in ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads")
        if isinstance(getattr(config, name, None), int)
    )
    return HeadStatsSums(wanted if wanted is not None else range(n_layers(config) or 0), heads, detectors=detectors)


def _reduce(state, sums: HeadStatsSums, mine: list[int], resumed: int) -> dict:
    if state.num_processes == 1:
        padding = 1 - mine[1] / mine[2] if mine[2] else 0.0
        return {"per_process": [mine[0]], "padding": padding, "resumed": resumed}
    from accelerate.utils import gather, reduce  # deferred: accelerate is optional (attnviz[stats])

    total = reduce(sums.vector().to(state.device), reduction="sum")
    sums.load_vector(total)
    counts = gather(torch.tensor([[*mine, resumed]], dtype=torch.float64, device=state.device)).cpu()
    real, padded = float(counts[:, 1].sum()), float(counts[:, 2].sum())
    return {
        "per_process": [int(x) for x in counts[:, 0].tolist()],
        "padding": 1 - real / padded if padded else 0.0,
        "resumed": int(counts[:, 3].sum()),
    }


def _interrupted(signal: str, path: Path, added: int, rank: int, num_processes: int) -> Interrupted:
    whose = (
        f"process {rank} of {num_processes} saved its {added:,} texts"
        if num_processes > 1
        else f"{added:,} texts saved"
    )
    return Interrupted(
        f"stopped by {signal}: {whose} in {str(path)!r}; run the same command with --resume (resume=True) to continue",
        checkpoint=path,
        signal=signal,
        rank=rank,
    )


def _bar(show: bool, initial: int = 0):
    if not show:
        return None
    from tqdm.auto import tqdm  # deferred: only a progress bar needs it

    return tqdm(unit=" texts", desc="corpus", initial=initial)


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a statistics table as Parquet or CSV, by the file's suffix (any case: ``stats.CSV``)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise InputError(f"cannot tell the format of {str(path)!r}: give a .parquet or .csv path")
    with atomic_path(path, what="the table") as tmp:
        if suffix == ".csv":
            df.to_csv(tmp, index=False)
        else:
            try:
                df.to_parquet(tmp, index=False)
            except ImportError as err:
                raise InputError(
                    f"writing Parquet needs pyarrow ({err}): pip install pyarrow, or give a .csv path"
                ) from err
    return path


def read_table(path: str | Path) -> pd.DataFrame:
    """A statistics table written by :func:`write_table` (``attnviz stats --out``)."""
    import pandas as pd  # deferred: pandas is heavy and only tables need it

    path = Path(path)
    if not path.is_file():
        raise InputError(f"no statistics file at {str(path)!r}; write one with: attnviz stats MODEL CORPUS --out FILE")
    try:
        df = pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)
    except (ValueError, OSError, ImportError) as err:
        raise InputError(f"cannot read {str(path)!r} as a .parquet or .csv table: {err}") from err
    missing = {"layer", "head", "texts", "tokens"} - set(df.columns)
    if missing:
        raise InputError(f"{str(path)!r} is not a table of attnviz stats (no {', '.join(sorted(missing))} column)")
    return df
