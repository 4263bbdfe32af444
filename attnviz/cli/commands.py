"""The subcommands: each takes its parsed arguments and returns the exit status."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..errors import InputError, Interrupted, OutOfRangeError
from .options import check_capture_out, check_writable, column_mapping, corpus_kwargs, loading_kwargs, names
from .preflight import preflight

EXIT_INTERRUPTED = 75  # sysexits' EX_TEMPFAIL: stopped by a signal after checkpointing; resubmit with --resume
R = TypeVar("R")  # what a run over processes returns (a table, a probe set's result)


def _count(n: int, thing: str) -> str:
    """ "1 text", "5,000 texts"."""
    return f"{n:,} {thing}{'' if n == 1 else 's'}"


def error_line(err: BaseException) -> str:
    """An error as the one line the command line prints."""
    return "error: " + " ".join(str(err).split())


def _capture(args, check: str | None = None):
    """The capture a command asked for; ``check``: the command's own (validate: every row), else ``--check``."""
    from ..workflows.capture.runner import (
        capture,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    return capture(
        args.model,
        args.text,
        max_length=args.max_length,
        **loading_kwargs(args),
        add_bos=getattr(args, "add_bos", False),
        target=args.target,
        check=check or args.check,
        keep=getattr(args, "keep", None),
    )


def cmd_capture(args) -> int:
    """``attnviz capture``: capture a text (saved with ``-o``), and with ``--query`` print where a word's attention goes."""
    if args.query is None:
        given = [f"--{name}" for name in ("layer", "part") if getattr(args, name) is not None]
        if given:
            raise InputError(
                f"{' and '.join(given)} choose{'s' if len(given) == 1 else ''} what --query prints: add --query WORD "
                "(to capture only some layers, use --layers)"
            )
    if args.out:
        check_capture_out(args.out)
    if args.keep is not None:
        from ..workflows.capture.pipeline import check_keep  # deferred, as the runner: torch loads after the checks

        check_keep(args.keep, "--keep")
    preflight(args, args.text, layer=args.layer, query=args.query, part=args.part or "encoder")
    cap = _capture(args)
    print(cap)
    print("words:", " | ".join(cap.word_labels))
    if cap.target is not None:
        print("target words:", " | ".join(cap.target.word_labels))
    if args.query is not None:
        part = cap.resolve_part(args.part) if args.part or len(cap.parts) == 1 else "encoder"
        layer = args.layer if args.layer is not None else min(cap.layer_indices(part))
        queries, keys = cap.sequences(part)
        if part in ("decoder", "cross") and args.query not in queries.word_labels:
            raise InputError(
                f"no word {args.query!r} in the target {queries.word_labels}: {part} attention's queries "
                "are the decoder's tokens, so give the target text with --target"
            )
        q = queries.word_index(args.query)
        weights = cap.attention(layer, part=part, words=True)[:, q]  # [head, word]
        where = f" ({part})" if len(cap.parts) > 1 else ""
        print(f"attention from {queries.words[q].text!r} in layer {layer}{where}, per head (word level, top 3):")
        for head in range(weights.shape[0]):
            top = weights[head].topk(min(3, weights.shape[-1]))
            pairs = ", ".join(
                f"{keys.words[i].text}={v:.2f}" for v, i in zip(top.values.tolist(), top.indices.tolist())
            )
            print(f"  H{head}: {pairs}")
    if args.out:
        path = cap.save(args.out)
        print(f"saved to {path}")
    return 0


def cmd_generate(args) -> int:
    """``attnviz generate``: let the model write and record every step's attention."""
    from ..workflows.generation import (
        generate,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    if args.out:
        check_capture_out(args.out)
    sampling = {}
    if args.sample:
        sampling = {"do_sample": True, "temperature": args.temperature, "top_p": args.top_p}
    elif args.temperature is not None or args.top_p is not None:
        raise InputError("--temperature and --top-p apply to sampling: add --sample")
    if args.layer is not None and not args.steps:
        raise InputError(
            "--layer chooses the layer --steps prints: add --steps (to capture only some layers, use --layers)"
        )
    preflight(args, args.prompt, layer=args.layer, part="decoder", what="prompt", generates=True)
    gen = generate(
        args.model,
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        add_bos=args.add_bos,
        **loading_kwargs(args),
        check=args.check,
        seed=args.seed,
        **{k: v for k, v in sampling.items() if v is not None},
    )
    print(args.prompt + gen.text if not gen.capture.model.get("encoder_decoder") else gen.text)
    stopped = "the model ended the text" if gen.info["stopped"] == "eos" else "max_new_tokens reached"
    checked = "" if args.check == "off" else f"; every generated row checked against its step ({args.check})"
    print(f"{len(gen)} new tokens after {gen.prompt_length} ({stopped}){checked}", file=sys.stderr)
    if args.steps:
        layer = args.layer if args.layer is not None else max(gen.capture.layer_indices("decoder"))
        print(f"what each new token attended to most (layer {layer}, mean over heads):")
        for i in range(len(gen)):
            step = gen.step(i)
            top = ", ".join(f"{t}@{p}={w:.2f}" for p, t, w in step.top(3, layer=layer))
            print(f"  {i:>4} {step.token!r:>14}  {top}")
    if args.out:
        path = gen.save(args.out)
        print(f"saved to {path} (open it with: attnviz app --capture {path})", file=sys.stderr)
    return 0


def cmd_stats(args) -> int:
    """``attnviz stats``: head statistics over a corpus, over processes, checkpointed and resumable."""
    from ..workflows.corpus.corpus import (  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        corpus_stats,
        write_table,
    )

    if args.resume and not args.checkpoint:
        raise InputError("--resume continues from a checkpoint: give it with --checkpoint FILE")
    statistics = None if args.statistics is None else names(args.statistics)
    if statistics is not None:
        if not statistics:
            raise InputError(
                f"--statistics takes comma-separated names (e.g. entropy,previous), got {args.statistics!r}"
            )
        from ..analysis.layer_reduction import wanted_columns  # deferred with torch and the rest

        try:
            wanted_columns(statistics)  # an unknown name is said before the model loads
        except InputError as err:
            raise InputError(f"--statistics: {err}") from err

    def run():
        return corpus_stats(
            args.model,
            args.corpus,
            **corpus_kwargs(args),
            device_map=args.device_map,
            part=args.part,
            statistics=statistics,
            truncate=not args.no_truncate,
            checkpoint=args.checkpoint,
            resume=args.resume,
            checkpoint_every_texts=args.checkpoint_every_texts,
            checkpoint_every_seconds=args.checkpoint_every_seconds,
        )

    def report(df) -> None:
        shares = " + ".join(f"{n:,}" for n in df.attrs["per_process"])
        print(
            f"{_count(int(df['texts'].iloc[0]), 'text')}, {_count(int(df['tokens'].iloc[0]), 'token')} "
            f"(texts per process: {shares}; padding {df.attrs['padding']:.1%}; "
            f"{df.attrs['truncated']:,} cut at the model's limit"
            + (f"; resumed after {df.attrs['resumed_after']:,} texts" if df.attrs["resumed_after"] else "")
            + ")",
            file=sys.stderr,
        )
        if args.out:
            print(f"wrote {write_table(df, args.out)}", file=sys.stderr)
        else:
            print(df.round(4).to_string(index=False))

    return run_corpus_command(args, (".parquet", ".csv"), run, report)


def cmd_atlas(args) -> int:
    """``attnviz atlas``: each head's roles over a corpus, as a table or an HTML page."""
    from ..workflows.corpus.atlas import (  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        head_atlas,
    )

    def run():
        return head_atlas(
            args.model,
            args.corpus,
            **corpus_kwargs(args),
            probes=args.probes,
            seed=args.seed,
            roles=args.roles,
            truncate=not args.no_truncate,
        )

    def report(df) -> None:
        met = [r for cell in df["roles"] for r in cell.split(", ") if r]
        counts = ", ".join(f"{name} {met.count(name)}" for name in dict.fromkeys(met)) or "none"
        cut = df.attrs.get("truncated", 0)  # said as attnviz stats says it (they were cut without a word)
        print(
            f"{_count(df.attrs['texts'], 'text')}, {_count(df.attrs['tokens'], 'token')}"
            + (f" ({cut:,} cut at the model's limit)" if cut else "")
            + f", {len(df)} heads; heads per role: {counts}",
            file=sys.stderr,
        )
        if args.out:
            if args.out.lower().endswith(".html"):
                from ..views.atlas import atlas_page  # deferred: plotly loads only for a page

                atlas_page(df, args.out)
                print(f"wrote {args.out}", file=sys.stderr)
            else:
                from ..workflows.corpus.corpus import write_table  # deferred with the rest of the workflows

                print(f"wrote {write_table(df, args.out)}", file=sys.stderr)
        else:
            shown = ["part", "layer", "head", "roles", "positional_offset", *(r for r in args.roles or [] if r)]
            print(df[[c for c in shown if c in df.columns]].to_string(index=False))

    return run_corpus_command(args, (".csv", ".parquet", ".html"), run, report)


def run_corpus_command(args, suffixes: tuple[str, ...], run: Callable[[], Any], report: Callable[[Any], None]) -> int:
    """What ``attnviz stats`` and ``attnviz atlas`` share: ``-o/--out`` refused unless writable and of
    one of ``suffixes`` (named in this order in the error; in any case: ``atlas.CSV``), the checks before
    the model loads, then :func:`in_processes` with the table's own rank (``df.attrs["rank"]``)."""
    if args.out:
        check_writable(args.out)
        if not args.out.lower().endswith(suffixes):
            named = ", ".join(suffixes[:-1]) + " or " + suffixes[-1]
            raise InputError(f"-o/--out {args.out!r}: give a {named} path")
    preflight(args, None)
    with quiet_loading() if args.quiet else contextlib.nullcontext():
        return in_processes(run, report, rank=lambda df: df.attrs["rank"])


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """No progress bar while a model loads, for the block: transformers' own (loading the weights), and a
    GGUF file's conversion, which transformers draws with tqdm itself (``disable_progress_bar`` leaves it
    on). Both are put back after it, so a command run in a process that goes on (``attnviz.cli.main`` in a
    notebook or a test) leaves them as it found them."""
    from transformers.utils import logging as transformers_logging  # deferred with torch and the rest

    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    gguf_loading: Any = None
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_loading  # deferred likewise
    except ImportError:  # a transformers without GGUF loading: no such bar
        pass
    bar = getattr(gguf_loading, "tqdm", None)
    if bar is not None:
        gguf_loading.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_loading.tqdm = bar
        if enabled:
            transformers_logging.enable_progress_bar()


def in_processes(run: Callable[[], R], report: Callable[[R], None], *, rank: Callable[[R], int]) -> int:
    """A run that may be spread over processes (torchrun, accelerate launch): ``run()`` with each
    warning on one line, then ``report`` of its result on the process of rank 0 only. A run stopped
    by a signal (:class:`Interrupted`, its checkpoint written) is one line and exit status
    :data:`EXIT_INTERRUPTED`; the process group, if any, is ended whatever happens."""
    interrupted = False
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line  # restored by catch_warnings
            result = run()
        if rank(result) == 0:
            report(result)
        return 0
    except Interrupted as err:
        interrupted = True  # every process stopped too (they agree before each batch): no barrier to wait at
        if err.rank == 0:
            print(error_line(err), file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        _end_processes(barrier=not interrupted)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr (``warning: …``), not Python's two-line form."""
    print(f"warning: {message}", file=sys.stderr)


def _process_rank() -> int:
    """This process's rank in the group torchrun or accelerate launch made (0 outside one)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _end_processes(barrier: bool = True) -> None:
    """Close a process group torchrun or accelerate launch made (one left open can abort at exit);
    ``barrier=False`` where the others may have stopped already (a signal)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


# the options that say how a model runs: read only when there is a model to run (not with --capture)
_RUN_OPTIONS = (
    ("model", "MODEL"),
    ("text", "TEXT"),
    ("layers", "--layers"),
    ("device", "--device"),
    ("dtype", "--dtype"),
    ("attn_implementation", "--attn-implementation"),
    ("max_length", "--max-length"),
    ("add_bos", "--add-bos"),
    ("target", "--target"),
)


def _refuse_run_options(args, command: str) -> None:
    """With ``--capture FILE`` nothing runs: a model, a text or a loading option given too is refused, not ignored."""
    given = [name for dest, name in _RUN_OPTIONS if getattr(args, dest, None) not in (None, False)]
    if given:
        raise InputError(
            f"attnviz {command}: --capture reads a saved capture, so {', '.join(given)} would be ignored; "
            "give MODEL TEXT (and its options), or --capture FILE alone"
        )


def cmd_validate(args) -> int:
    """``attnviz validate``: recompute every head and compare it with the model's own numbers (exit 1 over tolerance)."""
    if args.out:
        check_writable(args.out)
    if args.capture:
        from ..data.io import (
            load,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        )

        _refuse_run_options(args, "validate")
        cap = load(args.capture)
    else:
        if not args.model or not args.text:
            raise InputError("attnviz validate: give MODEL TEXT, or --capture FILE")
        preflight(args, args.text)
        cap = _capture(args, check="full")  # every row against the kernel's output, its weights where it has them
    report = cap.validate()
    print(report)
    if args.out:
        report.to_pandas().to_csv(args.out, index=False)
        print(f"per layer/head errors written to {args.out}")
    return 0 if report.passed else 1


def cmd_coref(args) -> int:
    """``attnviz coref``: rank the heads by how much a pronoun attends to its candidates."""
    from ..analysis import (
        rank_heads,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    candidates = [c.strip() for c in args.candidates.split(",")] if args.candidates else None
    for flag, words in (("--pronoun", [args.pronoun]), ("--candidates", candidates or [])):
        for word in words:  # a word missing from the text is said before the model loads
            if not word or word.lower() not in args.text.lower():
                raise InputError(f"{flag} {word!r} is not in the text {args.text!r}: give a word of it")
    preflight(args, args.text)
    cap = _capture(args)
    ranking = rank_heads(cap, args.pronoun, candidates, exclude_sinks=not args.keep_sinks, part=args.part)
    print(ranking)
    print(ranking.table.head(args.top).round(3).to_string(index=False))
    return 0


def cmd_probes(args) -> int:
    """``attnviz probes``: evaluate every head on a probe set (accuracy, intervals, tests)."""
    if args.out:
        check_writable(args.out)
    from ..workflows.corpus.probing import (
        evaluate_probes,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    if args.resume and not args.checkpoint:
        raise InputError("--resume continues from a checkpoint: give it with --checkpoint FILE")
    if args.per_probe:
        check_writable(args.per_probe)
    from ..analysis.probes import load_probes  # deferred: a refused argument answers before pandas loads

    def run():
        # read (and every unusable probe reported) before the model loads: a bad file costs no model
        probes = load_probes(args.probes, format=args.format, columns=column_mapping(args.columns), strict=args.strict)
        return evaluate_probes(
            args.model,
            probes,
            batch_size=args.batch_size,
            exclude_sinks=not args.keep_sinks,
            add_bos=not args.no_bos,
            checkpoint=args.checkpoint,
            resume=args.resume,
            checkpoint_every_seconds=args.checkpoint_every_seconds,
        )

    def report(result) -> None:
        print(result)
        print(result.ranked().head(args.top).round(3).to_string(index=False))
        if args.out:
            result.accuracy.to_csv(args.out, index=False)
            print(f"per-head accuracy written to {args.out}")
        if args.per_probe:
            result.picks_table(top=args.top).to_csv(args.per_probe, index=False)
            print(f"each probe with the picks of the top {args.top} heads written to {args.per_probe}")

    return in_processes(run, report, rank=lambda _: _process_rank())


EXPORT_VIEWS = ("heatmap", "head", "model", "validation")


def _check_shown(args, cap) -> None:
    """``export --capture FILE``'s ``--part``, ``--layer`` and ``--head`` against what the file holds,
    said as the options (as preflight says them against a model)."""
    if args.part is not None and args.part not in cap.parts:
        raise InputError(f"--part {args.part}: {args.capture} holds {', '.join(cap.parts)}; give one of them")
    part = args.part or cap.parts[0]
    held = cap.layer_indices(part)
    if args.layer is not None and args.layer not in held:
        raise OutOfRangeError(
            f"--layer {args.layer}: {args.capture} holds layers {held} of its {part}; give one of them"
        )
    heads = cap.info(part)["n_heads"]
    if not 0 <= args.head < heads:
        raise OutOfRangeError(f"--head {args.head} is out of range: {args.capture} has heads 0..{heads - 1}")


def cmd_export(args) -> int:
    """``attnviz export``: a capture's views as one self-contained HTML file."""
    from .. import (
        figures,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )
    from ..data.io import (
        load,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    if not args.out.lower().endswith((".html", ".htm")):
        raise InputError(f"attnviz export writes one HTML page: give an .html path for -o (got {args.out!r})")
    check_writable(args.out)
    views = names(args.views)
    unknown = [v for v in views if v not in EXPORT_VIEWS]
    if unknown or not views:
        raise InputError(f"--views takes a comma-separated list of {', '.join(EXPORT_VIEWS)}; got {args.views!r}")
    if args.capture:
        _refuse_run_options(args, "export")
        cap = load(args.capture)
        _check_shown(args, cap)
    elif args.model and args.text:
        preflight(args, args.text, layer=args.layer, head=args.head, part=args.part or "encoder")
        cap = _capture(args)
    else:
        raise InputError("attnviz export: give MODEL TEXT, or --capture FILE")
    part = args.part if args.part or len(cap.parts) == 1 else cap.parts[0]
    layer = args.layer if args.layer is not None else cap.layer_indices(part)[0]
    build = {
        "heatmap": lambda: [figures.heatmap(cap, layer, args.head, words=args.words, part=part)],
        "head": lambda: [figures.head_view(cap, layer, words=args.words, part=part)],
        "model": lambda: [figures.model_view(cap, words=args.words, part=part, selected=(layer, args.head))],
        "validation": lambda: [
            figures.validation_map(cap.validate(), part=cap.resolve_part(part)),
            figures.validation_comparison(cap, layer, args.head, part=part),
        ],
    }
    figs = [fig for view in views for fig in build[view]()]
    path = figures.to_html(figs, args.out, title=f"attnviz — {cap.model.get('name')}: {cap.text[:80]}")
    print(f"{len(figs)} figure(s) written to {path} (self-contained: opens offline)")
    return 0


#: the texts of ``attnviz app --corpus FILE`` the dashboard reads (apps/dashboard/space_view.py's
#: CORPUS_TEXTS, not imported: the checks answer before dash loads)
APP_CORPUS_TEXTS = 500


def _check_app_corpus(path: str) -> None:
    """``attnviz app --corpus FILE`` read as ``attnviz atlas`` reads a corpus, as far as the dashboard
    reads it (its first :data:`APP_CORPUS_TEXTS` texts): a file with no text, a bad JSONL line among
    them or a table's suffix is refused before the page serves, in the corpus commands' words."""
    from ..workflows.corpus.corpus import NO_TEXT, read_texts  # deferred with the rest of the library

    try:
        if not list(itertools.islice(read_texts(path), APP_CORPUS_TEXTS)):
            raise InputError(NO_TEXT)
    except InputError as err:  # a file that is not UTF-8 too: read_texts says so
        raise InputError(f"attnviz app --corpus: {err}") from err


def cmd_app(args) -> int:
    """``attnviz app``: start the dashboard."""
    for option, path in (("--capture", args.capture), ("--stats", args.stats), ("--corpus", args.corpus)):
        if path is not None and not os.path.isfile(path):
            raise InputError(f"attnviz app {option}: no file {path!r}; give the path of one (or leave {option} out)")
    if args.corpus is not None:
        _check_app_corpus(args.corpus)
    try:
        from attnviz.dashboard import (
            run,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        )
    except ImportError as err:
        print(f"error: the dashboard needs dash ({err}); install with: pip install 'attnviz[app]'", file=sys.stderr)
        return 2
    run(
        models=args.model,
        capture_file=args.capture,
        stats_file=args.stats,
        corpus_file=args.corpus,
        host=args.host,
        port=args.port,
    )
    return 0
