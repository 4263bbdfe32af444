"""The head atlas over a corpus: :func:`head_atlas` (re-exported as ``attnviz.analysis.head_atlas``).

One pass over the corpus through :func:`~attnviz.workflows.corpus.corpus.corpus_stats` — batched by length,
reduced layer by layer as the forward goes, spread over the processes of ``torchrun`` / ``accelerate
launch`` — gives the mass-based roles (its statistics) and, in the same reduction, where each row's
maximum falls (:class:`~attnviz.analysis.head_tally.HeadTally`: the positional and rare-word roles,
and each role's example row). The texts are tokenized once, before it: their token counts (rarity)
and the pass read the same encodings. No moved statistic is read, so none is computed. The induction role reads repeated random sequences the atlas
generates from ``seed`` (Olsson et al. 2022), run through the same reducer; coreference, a probe set
through :func:`attnviz.evaluate_probes`. :func:`~attnviz.analysis.atlas.atlas_table` names the roles.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...analysis.atlas import ROLES, TABLE_STATISTICS, AtlasSums, atlas_table
from ...analysis.head_tally import EXAMPLES, HeadTally
from ...analysis.probes import Probe, load_probes
from ...deprecation import warn_renamed
from ...errors import InputError
from ..capture.inputs import Encoded, check_max_length, tokenize
from ..capture.models import load_model
from ..capture.pipeline import n_layers, resolve
from .batched import BatchReducer
from .corpus import NO_TEXT, corpus_stats, read_texts, too_long
from .probing import evaluate_probes, refuse_unscorable
from .processes import process_state

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "RANDOM_LENGTH",
    "RANDOM_SEQUENCES",
    "TokenizedCorpus",
    "example_describer",
    "head_atlas",
    "random_repeats",
    "role_names",
    "tokenize_corpus",
]

ATLAS_STATISTICS = TABLE_STATISTICS  # what the pass computes: the statistics its table reads, alone
RANDOM_SEQUENCES = 16  # repeated random sequences the induction role reads
RANDOM_LENGTH = 25  # random tokens in each copy (each sequence holds two copies)


@dataclass(frozen=True)
class TokenizedCorpus:
    """A corpus's texts and their encodings (uncut, as :func:`corpus_stats` tokenizes them), made once by
    :func:`tokenize_corpus` and handed to :func:`head_atlas` as its ``corpus`` for each model that shares the
    tokenizer (:func:`~attnviz.workflows.corpus.timeline.head_timeline`: every checkpoint of a run)."""

    texts: list[str]
    encoded: list[Encoded]
    tokenizer: Any
    add_bos: bool


def tokenize_corpus(
    corpus: str | Path | Iterable[str], tokenizer: Any, *, add_bos: bool = False, name: str = "the model"
) -> TokenizedCorpus:
    """Read ``corpus`` (texts, or a ``.txt`` / ``.jsonl`` file) and tokenize every text once, in one call, as
    :func:`head_atlas` does before its pass; ``name`` is the model named in a text's error."""
    texts = list(read_texts(corpus))
    if not texts:
        raise InputError(NO_TEXT)
    return TokenizedCorpus(texts, tokenize(tokenizer, texts, None, None, name, add_bos), tokenizer, add_bos)


def head_atlas(
    model: Any,
    corpus: str | Path | Iterable[str] | TokenizedCorpus,
    *,
    tokenizer: Any = None,
    batch_size: int = 8,
    probes: Sequence[Probe] | str | Path | None = None,
    seed: int = 0,
    roles: Iterable[str] | None = None,
    layers: Iterable[int] | None = None,
    max_length: int | None = None,
    add_bos: bool = False,
    truncate: bool = True,
    random_sequences: int = RANDOM_SEQUENCES,
    random_length: int = RANDOM_LENGTH,
    device: str | None = None,
    dtype: str | None = None,
    progress: bool = True,
    on_progress: Callable[..., None] | None = None,
) -> pd.DataFrame:
    """Name each head's roles with published criteria, over a corpus.

    - ``corpus``: texts (an iterable of strings, read into memory: the atlas counts their tokens and
      names its examples by them), or a ``.txt`` / ``.jsonl`` file as :func:`corpus_stats` reads, or a
      :class:`TokenizedCorpus` (:func:`tokenize_corpus`): its encodings are read, not made again (its tokenizer
      is the model's unless ``tokenizer=`` is given; its ``add_bos`` must be this call's).
    - ``batch_size``, ``layers``, ``max_length``, ``add_bos``: as :func:`corpus_stats`; ``truncate=False``
      refuses a text over the model's limit (or ``max_length``) before the pass, instead of cutting it and
      counting it (``df.attrs["truncated"]``).
    - ``probes``: a probe set (a shipped set's name, a file, or probes) for the coreference role.
    - ``seed``: the repeated random sequences of the induction role (``random_sequences`` of them,
      ``random_length`` random tokens repeated twice, special tokens as the tokenizer adds them).
    - ``roles``: the roles reported, as names or one comma-separated string (default: every role of
      :data:`~attnviz.analysis.atlas.ROLES`).
    - ``on_progress(done, total)``: called as the corpus's texts are added (this process's), then after the
      random sequences and after the probe set: ``total`` counts the texts and those one or two steps (for a
      progress bar of the caller's own, e.g. the dashboard's). A callback of three parameters
      ``(done, total, what)`` gets what is running too — deprecated, it goes in the next release.

    Returns one row per part, layer and head (:func:`~attnviz.analysis.atlas.atlas_table`): each
    role's score, threshold and source, ``positional_offset``, ``roles`` (those the head meets) and each
    met role's example (text number, position, words). ``df.attrs``: ``texts``, ``tokens``, ``seed``,
    ``per_process``, ``truncated``. Under ``torchrun`` / ``accelerate launch`` each process runs its share
    of the corpus and every process returns the same table.
    """
    chosen = _roles(roles)
    if roles is not None and "coreference" in chosen and probes is None:
        raise InputError(
            "the coreference role reads a probe set: give probes= a shipped set's name ('en', 'zh') or a file "
            "(--probes on the command line), or leave coreference out of the roles"
        )
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InputError(f"batch_size must be a whole number ≥ 1, got {batch_size!r}")
    if not isinstance(random_sequences, int) or random_sequences < 1:
        raise InputError(f"random_sequences must be a whole number ≥ 1, got {random_sequences!r}")
    if not isinstance(random_length, int) or random_length < 2:
        raise InputError(f"random_length must be a whole number ≥ 2, got {random_length!r}")
    check_max_length(max_length)
    tokenized = corpus if isinstance(corpus, TokenizedCorpus) else None
    if tokenized is not None and tokenized.add_bos != add_bos:
        raise InputError(
            f"the corpus was tokenized with add_bos={tokenized.add_bos} and the atlas asks add_bos={add_bos}: "
            "tokenize it again with the same add_bos, or pass the same add_bos here"
        )
    if tokenized is not None and tokenizer is None:
        tokenizer = tokenized.tokenizer
    # before the model loads: a missing or empty corpus is said at once
    texts = tokenized.texts if tokenized is not None else list(read_texts(corpus))  # type: ignore[arg-type]
    if not texts:
        raise InputError(NO_TEXT)
    report = _reporter(on_progress, len(texts) + 1 + (probes is not None))
    if isinstance(probes, (str, Path)):
        probes = load_probes(probes)  # likewise a probe set's problems, not after the whole corpus
    state = process_state()
    if isinstance(model, (str, Path)):
        if device is None and state.num_processes > 1 and state.device.type == "cuda":
            device = str(state.device)  # one GPU per process
        model, loaded = load_model(str(model), device=device, dtype=dtype)
        tokenizer = tokenizer if tokenizer is not None else loaded
    resolved = resolve(model, tokenizer)
    tokenizer = resolved.require_tokenizer()
    if resolved.encoder_decoder:
        raise InputError(
            "the head atlas reads one-stack models (an encoder or a decoder); for an encoder-decoder use "
            "corpus_stats(..., part=...) and detect_heads on its captures"
        )
    if probes is not None:  # a set this tokenizer cannot score at all is said before the corpus pass, not after
        refuse_unscorable(resolved, probes)
    checked = resolved.layers(layers)
    wanted = sorted(checked) if checked is not None else list(range(n_layers(resolved.model.config) or 0))
    bounds = [x for x in (max_length, resolved.limit) if x is not None]
    cap_length = min(bounds) if bounds else None
    embeddings: Any = resolved.model.get_input_embeddings()  # type: ignore[operator]
    rows = int(embeddings.num_embeddings)  # the token ids the model has rows for
    # every text tokenized once, in one call (uncut, as corpus_stats tokenizes it): the counts, then the pass
    encoded = (
        tokenized.encoded if tokenized is not None else tokenize(tokenizer, texts, None, None, resolved.name, add_bos)
    )
    if not truncate and cap_length is not None:  # the whole corpus is tokenized already: said before the pass
        over = next(((i, len(ids)) for i, (ids, _, _) in enumerate(encoded, 1) if len(ids) > cap_length), None)
        if over is not None:
            raise too_long(*over, cap_length)
    counts = torch.bincount(torch.tensor([i for ids, _, _ in encoded for i in ids], dtype=torch.long), minlength=rows)
    index: dict[str, int] = {}
    for i, text in enumerate(texts):
        index.setdefault(text, i)
    heads = _n_heads(resolved.model.config)
    tally = HeadTally(wanted, heads, counts, index)
    stats = corpus_stats(
        resolved.model,
        texts,
        tokenizer,
        batch_size=batch_size,
        layers=wanted,
        max_length=max_length,
        add_bos=add_bos,
        truncate=truncate,
        progress=progress,
        tally=tally,
        moved=False,  # the atlas reads no moved statistic: no value norms, no second set of sums
        statistics=ATLAS_STATISTICS,  # nor the punctuation, self, distance: no product over every weight
        encodings=dict(zip(texts, encoded)),
        on_progress=None if report is None else lambda done, _: report(done, f"text {done} of {len(texts)}"),
    )
    if state.num_processes > 1:
        from accelerate.utils import gather, reduce  # deferred: accelerate is optional (attnviz[stats])

        tally.load_vector(reduce(tally.vector().to(state.device), reduction="sum"))
        tally.load_examples(gather(tally.examples_vector()[None].to(state.device)))
    # induction: every process runs the same random sequences (they are few)
    if report is not None:
        report(len(texts), f"induction: {random_sequences} repeated random sequences")
    randoms = random_repeats(tokenizer, rows, random_sequences, random_length, seed=seed, add_bos=add_bos)
    names = [f"{'x' * len(ids)}#{k}" for k, (ids, _, _) in enumerate(randoms)]
    # the random sequences feed the induction role alone: its pair sums and examples, no other statistic
    random_tally = HeadTally(wanted, heads, torch.zeros(rows), {name: k for k, name in enumerate(names)}, full=False)
    inducing = BatchReducer(
        resolved, layers=wanted, max_length=cap_length, add_bos=add_bos, moved=False, statistics=False, patterns=True
    )
    random_sums = None
    for start in range(0, len(randoms), batch_size):
        random_sums, _ = inducing.add(
            random_sums,
            names[start : start + batch_size],
            list(randoms[start : start + batch_size]),
            tally=random_tally,
        )
    assert random_sums is not None
    induction = random_sums.frame()["induction"].to_numpy().reshape(len(wanted), heads)
    result = None
    if probes is not None:
        if report is not None:
            report(len(texts) + 1, "coreference: the probe set")
        result = evaluate_probes(resolved.model, probes, tokenizer, add_bos=add_bos, progress=progress)
    sums = _atlas_sums(tally, stats, random_tally.part)
    k = EXAMPLES.index("induction")
    induction_examples = np.concatenate(
        [random_tally.best[:, k, :, None].numpy(), random_tally.where[:, k].numpy()], -1
    )  # [layer, head, 3]
    if report is not None:
        report(len(texts) + 1 + (probes is not None), "done")
    describe = example_describer(texts, encoded)
    frame = atlas_table(
        stats,
        sums,
        induction=induction,
        induction_examples=induction_examples,
        probes=result,
        describe=describe,
        describe_random=lambda text, position: f"random sequence {text} (seed {seed}), token {position}",
        roles=chosen,
    )
    frame.attrs.update(
        texts=int(stats["texts"].iloc[0]),
        tokens=int(stats["tokens"].iloc[0]),
        seed=seed,
        per_process=stats.attrs["per_process"],
        truncated=stats.attrs["truncated"],
        rank=stats.attrs["rank"],
    )
    return frame


def random_repeats(
    tokenizer: Any, vocab: int, count: int, length: int, *, seed: int = 0, add_bos: bool = False
) -> list[Encoded]:
    """``count`` sequences of ``length`` distinct random token ids repeated twice (ids below ``vocab``
    that are no special token), between the special tokens the tokenizer puts around a text (BERT's
    [CLS] … [SEP]) and after a BOS with ``add_bos``; the same for the same ``seed``."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    size = min(vocab, len(tokenizer)) if hasattr(tokenizer, "__len__") else vocab
    pool = torch.tensor([i for i in range(size) if i not in special], dtype=torch.long)
    if len(pool) < length:
        raise InputError(
            f"random sequences of {length} distinct tokens need a vocabulary of as many; it has {len(pool)}"
        )
    # the special tokens the tokenizer puts around a text: those around a one-token text ("5")
    probe = list(tokenizer("5")["input_ids"])
    inner = [k for k, i in enumerate(probe) if i not in special]
    before, after = (probe[: inner[0]], probe[inner[-1] + 1 :]) if inner else (probe, [])
    bos = getattr(tokenizer, "bos_token_id", None)
    if add_bos and bos is not None and (not before or before[0] != bos):
        before = [bos, *before]
    g = torch.Generator().manual_seed(seed)
    made: list[Encoded] = []
    for _ in range(count):
        ids = pool[torch.randperm(len(pool), generator=g)[:length]].tolist()
        full = [*before, *ids, *ids, *after]
        spans = [(0, 0) if i in special else (k, k + 1) for k, i in enumerate(full)]
        made.append((full, spans, [str(i) for i in full]))
    return made


def _roles(roles: Iterable[str] | None) -> list[str]:
    return role_names(roles)


def role_names(roles: Iterable[str] | str | None) -> list[str]:
    """The roles asked for, each once, in the order given: names or one comma-separated string (``None``: every
    role of :data:`~attnviz.analysis.atlas.ROLES`); an unknown role or none is refused, naming the roles."""
    if roles is None:
        return list(ROLES)
    if isinstance(roles, str):
        roles = [r.strip() for r in roles.split(",")]  # "sink,broad", as the command line's --roles takes them
    chosen = list(dict.fromkeys(roles))  # each role once: "sink,sink" is one sink column, counted once
    unknown = [r for r in chosen if r not in ROLES]
    if unknown or not chosen:
        what = f"unknown role {unknown[0]!r}" if unknown else "roles is empty"
        raise InputError(f"{what}; choose from {', '.join(ROLES)}")
    return chosen


def _n_heads(config) -> int:
    for name in ("num_attention_heads", "n_head", "num_heads"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise InputError("cannot tell how many attention heads this model has (no num_attention_heads in its config)")


def _atlas_sums(tally: HeadTally, stats: pd.DataFrame, part: str | None) -> AtlasSums:
    examples = {}
    for k, name in enumerate(EXAMPLES):
        examples[name] = np.concatenate([tally.best[:, k, :, None].numpy(), tally.where[:, k].numpy()], -1)
    offset_examples = np.concatenate([tally.offset_best[..., None].numpy(), tally.offset_where.numpy()], -1)
    return AtlasSums(
        part=tally.part or part or "",
        layers=tally.layers,
        n_heads=tally.n_heads,
        offsets=tally.offsets.numpy(),
        rare=tally.rare.numpy(),
        rare_rows=tally.rare_rows.numpy(),
        rows=tally.rows.numpy(),
        log_keys=tally.log_keys.numpy(),
        tokens=int(stats["tokens"].iloc[0]),
        examples=examples,
        offset_examples=offset_examples,
    )


def example_describer(texts: list[str], encoded: list[Encoded]) -> Callable[[int, int], str]:
    """How the atlas names an example row: ``describe(text, position)`` → ``"text 3, query token 5 'it': …the
    40 characters before[the token]the 40 after…"``, from the corpus ``texts`` and their ``encoded`` (ids,
    character offsets, tokens); a special token, which covers no text, by its own name where it stands."""

    def describe(text: int, position: int) -> str:
        if not 0 <= text < len(texts):
            return f"text {text}, token {position}"
        body, (_, offsets, tokens) = texts[text], encoded[text]
        if not 0 <= position < len(tokens):
            return f"text {text}, token {position}"
        start, end = offsets[position]
        if start == end:  # a special token covers no text ((0, 0) wherever it stands): after the tokens before it
            start = end = max((e for s, e in offsets[:position] if e > s), default=0)
        before, after = body[max(0, start - 40) : start], body[end : end + 40]
        shown = body[start:end] or tokens[position]  # a special token: its own name ([CLS])
        return f"text {text}, query token {position} {tokens[position]!r}: …{before}[{shown}]{after}…"

    return describe


def _reporter(on_progress: Callable[..., None] | None, total: int) -> Callable[[int, str], None] | None:
    """``report(done, what)`` calling ``on_progress(done, total)``, or ``on_progress(done, total, what)``
    for a callback of three parameters (deprecated)."""
    if on_progress is None:
        return None
    try:
        parameters = list(inspect.signature(on_progress).parameters.values())
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        three = len(positional) >= 3 or any(p.kind is p.VAR_POSITIONAL for p in parameters)
    except (TypeError, ValueError):  # no signature to read: the documented two arguments
        three = False
    if three:
        warn_renamed("head_atlas(on_progress=) of (done, total, what)", "a callback of (done, total)")

    def report(done: int, what: str) -> None:
        assert on_progress is not None
        if three:
            on_progress(done, total, what)
        else:
            on_progress(done, total)

    return report
