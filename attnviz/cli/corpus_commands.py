"""The subcommands over a corpus or a probe set, which may run over processes and stop at a signal:
``stats``, ``atlas`` and ``probes``; each takes its parsed arguments and returns the exit status."""

from __future__ import annotations

import sys

from ..errors import AttnvizError, InputError
from .options import check_part, check_writable, column_mapping, corpus_kwargs, names
from .runs import in_processes, loading_bars, run_corpus_command, written_as_csv


def _count(n: int, thing: str) -> str:
    """ "1 text", "5,000 texts"."""
    return f"{n:,} {thing}{'' if n == 1 else 's'}"


def cmd_stats(args) -> int:
    """``attnviz stats``: head statistics over a corpus, over processes, checkpointed and resumable."""
    from ..analysis import (  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        check_statistics,
        corpus_stats,
        write_table,
    )

    if args.resume and not args.checkpoint:
        raise InputError("--resume continues from a checkpoint: give it with --checkpoint FILE")
    check_part(args, "stats", ("encoder", "decoder"))
    statistics = None if args.statistics is None else names(args.statistics)
    if statistics is not None:
        if not statistics:
            raise InputError(
                f"--statistics takes comma-separated names (e.g. entropy,previous), got {args.statistics!r}"
            )
        try:
            check_statistics(statistics)  # an unknown name is said before the model loads
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
    if args.checkpoints is not None or args.revisions is not None:
        return _timeline(args)
    if args.model is None:
        raise InputError("give MODEL (an embedded alias, hub name or folder), or --checkpoints for a training run")
    if args.checkpoint or args.resume:
        raise InputError("--checkpoint and --resume save a timeline's place: give them with --checkpoints")
    from ..analysis import (  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
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
                from ..figures import atlas_page  # deferred: plotly loads only for a page

                atlas_page(df, args.out)
                print(f"wrote {args.out}", file=sys.stderr)
            else:
                from ..analysis import write_table  # deferred with the rest of the library

                print(f"wrote {write_table(df, args.out)}", file=sys.stderr)
        else:
            shown = ["part", "layer", "head", "roles", "positional_offset", *(r for r in args.roles or [] if r)]
            print(df[[c for c in shown if c in df.columns]].to_string(index=False))

    return run_corpus_command(args, (".csv", ".parquet", ".html"), run, report)


def _timeline(args) -> int:
    """``attnviz atlas --checkpoints DIR_OR_LIST`` (or MODEL ``--revisions``): the atlas of every checkpoint."""
    if args.checkpoints is not None and args.revisions is not None:
        raise InputError("give --checkpoints (folders) or MODEL with --revisions (a hub model's), not both")
    if args.checkpoints is not None and args.model is not None:
        raise InputError(
            f"--checkpoints reads the checkpoints' own weights: leave MODEL ({args.model!r}) out, or give it "
            "with --revisions for a hub model's revisions"
        )
    if args.revisions is not None and args.model is None:
        raise InputError("--revisions names a hub model's revisions: give the hub name as MODEL")
    if args.resume and not args.checkpoint:
        raise InputError("--resume continues from a checkpoint: give it with --checkpoint FILE")
    if args.out:
        check_writable(args.out)
        if not args.out.lower().endswith((".csv", ".parquet")):
            raise InputError(f"-o/--out {args.out!r}: a timeline is a table, give a .csv or .parquet path")
    from .. import head_timeline  # deferred: `attnviz --help` and a refused argument answer before torch loads

    listed = [p.strip() for p in (args.checkpoints or "").split(",") if p.strip()]
    where = listed[0] if len(listed) == 1 else listed

    def run():
        kwargs = corpus_kwargs(args)
        kwargs.pop("attn_implementation", None)
        try:
            return timeline(kwargs)
        except AttnvizError as err:  # a later checkpoint failed: the rows of those finished are written
            _write_finished(args, err)
            raise

    def timeline(kwargs):
        return head_timeline(
            args.model if args.revisions is not None else where,
            args.corpus,
            revisions=names(args.revisions) if args.revisions is not None else None,
            probes=args.probes,
            seed=args.seed,
            roles=args.roles,
            truncate=not args.no_truncate,
            checkpoint=args.checkpoint,
            resume=args.resume,
            **kwargs,
        )

    def report(df) -> None:
        passing = df[df.passes]
        firsts = passing.groupby("role").step.min()
        said = ", ".join(f"{role} at step {step}" for role, step in firsts.items()) or "no role met"
        print(
            f"{_count(len(df.attrs['checkpoints']), 'checkpoint')} (steps {df.attrs['steps'][0]}–"
            f"{df.attrs['steps'][-1]}), {_count(df.attrs['texts'], 'text')}; first head per role: {said}",
            file=sys.stderr,
        )
        if args.out:
            from ..analysis import write_table  # deferred with the rest of the library

            print(f"wrote {write_table(df, args.out)}", file=sys.stderr)
        else:
            best = df.groupby(["step", "role"]).score.max().unstack()
            print(best.round(3).to_string())

    with loading_bars(args):
        return in_processes(run, report)


def _write_finished(args, err: AttnvizError) -> None:
    """A timeline that failed at a checkpoint: the rows of the checkpoints it finished (the error's ``partial``)
    written to ``-o`` (by the first process), and the error's line says so."""
    table = err.partial
    if not args.out or table is None or table.empty:
        return
    from ..analysis import write_table  # deferred with the rest of the library
    from ..processes import process_rank  # deferred: torch loads with the run

    if process_rank() != 0:
        return
    finished = table["checkpoint"].nunique()
    written = write_table(table, args.out)
    err.args = (f"{err}; the rows of the {_count(finished, 'finished checkpoint')} written to {written}", *err.args[1:])


def cmd_probes(args) -> int:
    """``attnviz probes``: evaluate every head on a probe set (accuracy, intervals, tests)."""
    if args.out:
        check_writable(args.out)
    from .. import (
        evaluate_probes,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    if args.resume and not args.checkpoint:
        raise InputError("--resume continues from a checkpoint: give it with --checkpoint FILE")
    if args.per_probe:
        check_writable(args.per_probe)
    from ..analysis import load_probes  # deferred: a refused argument answers before pandas loads

    def run():
        # read (and every unusable probe reported) before the model loads: a bad file costs no model
        probes = load_probes(args.probes, format=args.format, columns=column_mapping(args.columns), strict=args.strict)
        return evaluate_probes(
            args.model,
            probes,
            batch_size=args.batch_size,
            progress=not args.quiet,
            exclude_sinks=args.exclude_sinks,
            add_bos=args.add_bos,
            checkpoint=args.checkpoint,
            resume=args.resume,
            checkpoint_every_seconds=args.checkpoint_every_seconds,
        )

    def report(result) -> None:
        print(result)
        print(result.ranked().head(args.top).round(3).to_string(index=False))
        if args.out:
            written_as_csv(result.accuracy, args.out, index=False)
            print(f"per-head accuracy written to {args.out}")
        if args.per_probe:
            written_as_csv(result.picks_table(top=args.top), args.per_probe, index=False)
            print(f"each probe with the picks of the top {args.top} heads written to {args.per_probe}")

    with loading_bars(args):
        return in_processes(run, report)
