"""Command line: ``attnviz capture | generate | validate | coref | probes | stats | atlas | export | app``.

Exit status: 0 on success, 1 when validation fails (a head over tolerance, or a capture's own
check), 2 for usage and input errors, 75 (EX_TEMPFAIL: run it again) when SIGTERM or SIGINT stopped
``attnviz stats`` or ``attnviz probes`` after it wrote its checkpoint — each error one line on stderr.

Arguments are checked before the model runs: a hub name is asked of the hub once (an unknown or
unreachable name fails in seconds), and ``--layers``, ``--layer``, ``--head``, ``--query`` and the
text's length are checked against the model's config and the tokenized text before its weights load.
Every subcommand that writes a file takes ``-o/--out`` (the older ``--output`` and ``--csv`` stay
as aliases)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from .errors import AttnvizError, InputError, Interrupted, ValidationError

__all__ = ["EXIT_INTERRUPTED", "main"]

EXIT_INTERRUPTED = 75  # sysexits' EX_TEMPFAIL: stopped by a signal after checkpointing; resubmit with --resume


def _layers(value: str) -> list[int]:
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--layers takes comma-separated integers like 0,3,5, got {value!r}") from err


def _add_out(p: argparse.ArgumentParser, help: str, *, required: bool = False, alias: str = "--output") -> None:
    """``-o/--out`` of a subcommand that writes a file; ``alias`` (its older spelling) still works."""
    p.add_argument("-o", "--out", alias, dest="out", required=required, metavar="FILE", help=help)


def _add_bos(p: argparse.ArgumentParser) -> None:
    p.add_argument("--add-bos", action="store_true", help="prepend a BOS token so a decoder's sink is not a word")


def _add_model_args(p: argparse.ArgumentParser, *, text_required: bool, check: bool = True) -> None:
    p.add_argument(
        "model",
        nargs=None if text_required else "?",
        help="embedded alias (smollm2, minilm), hub name, or local folder",
    )
    p.add_argument("text", nargs=None if text_required else "?", help="the text to run the model on")
    _add_loading_args(p)
    p.add_argument("--max-length", type=int, default=None, help="truncate the text to this many tokens")
    _add_bos(p)
    p.add_argument(
        "--target",
        default=None,
        help="encoder-decoder models: the decoder's text, teacher-forced (default: its start token only)",
    )
    if check:
        p.add_argument(
            "--check",
            choices=["sample", "full", "off"],
            default="sample",
            help="compare a sample of rows (default), every row, or none with the kernel's own output",
        )


def _add_loading_args(p: argparse.ArgumentParser, *, backend: bool = True) -> None:
    """Which layers, and where and how the model loads."""
    p.add_argument("--layers", type=_layers, default=None, help="capture only these layers, e.g. 0,3,5 (0-based)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: where the model loads)")
    p.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    if backend:
        p.add_argument(
            "--attn-implementation", default=None, help="eager, sdpa, flash_attention_2 … (default: the model's)"
        )


def _loading(args) -> dict:
    """The keyword arguments :func:`_add_loading_args` gathered."""
    names = ("layers", "device", "dtype", "attn_implementation")
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


def _writable(path: str) -> None:
    if not Path(path).parent.is_dir():
        raise InputError(f"cannot write {path!r}: the folder {str(Path(path).parent)!r} does not exist")


def _n_heads(config, part: str | None) -> int | None:
    """The query heads of a part (None: the config does not say)."""
    names = ["num_attention_heads", "n_head", "num_heads", "n_heads"]
    names.insert(0, "encoder_attention_heads" if part in (None, "encoder") else "decoder_attention_heads")
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _preflight(
    args,
    text: str | None,
    *,
    layer: int | None = None,
    head: int | None = None,
    query: str | None = None,
    part: str | None = None,
) -> None:
    """``args.model`` described (config and tokenizer, no weights) and the arguments checked against it:
    a supported family, ``--layers``, ``layer`` and ``head`` in range, the text within the model's limit,
    the ``query`` word in the tokenized text — an error now, not after the weights loaded and the model ran."""
    from .data.words import (  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        TokenSequence,
        words_from_offsets,
    )
    from .engine.specs import check_supported  # deferred with the rest of the library
    from .errors import OutOfRangeError  # deferred with the rest of the library
    from .workflows.inputs import tokenize  # deferred with the rest of the library
    from .workflows.models import describe_model  # deferred with the rest of the library
    from .workflows.pipeline import check_layers, max_positions, n_layers  # deferred with the rest of the library

    config, tokenizer = describe_model(args.model)
    check_supported(config)
    layers = n_layers(config)
    check_layers(getattr(args, "layers", None), layers)
    if layer is not None:
        if layer < 0 or (layers is not None and layer >= layers):
            top = f"0..{layers - 1}" if layers is not None else "≥ 0"
            raise OutOfRangeError(f"--layer {layer} is out of range: {args.model} has layers {top}")
        if args.layers is not None and layer not in args.layers:
            raise OutOfRangeError(f"--layer {layer} is not among --layers {args.layers}: add it to --layers")
    heads = _n_heads(config, part)
    if head is not None and (head < 0 or (heads is not None and head >= heads)):
        top = f"0..{heads - 1}" if heads is not None else "≥ 0"
        raise OutOfRangeError(f"--head {head} is out of range: {args.model} has heads {top}")
    max_length = getattr(args, "max_length", None)
    if text is None or tokenizer is None or (max_length is not None and max_length < 1):
        return  # no text to check (or a max_length the library refuses itself, before any weight loads)
    limit = max_positions(config)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    name = str(args.model)
    [(ids, offsets, tokens)] = tokenize(tokenizer, [text], max_length, limit, name, getattr(args, "add_bos", False))
    target = getattr(args, "target", None)
    if target is not None and encoder_decoder:
        [(t_ids, t_offsets, t_tokens)] = tokenize(tokenizer, [target], max_length, limit, name, what="target")
    if query is None:
        return
    if encoder_decoder and part in ("decoder", "cross"):
        if target is None:
            raise InputError(
                f"--query {query!r} reads {part} attention, whose queries are the decoder's tokens: give the "
                "target text with --target"
            )
        words = TokenSequence(target, t_tokens, t_ids, t_offsets, words_from_offsets(target, t_offsets, t_tokens))
        if query not in words.word_labels:
            raise InputError(f"no word {query!r} in the target {words.word_labels}; --query takes one of them")
        return
    words = TokenSequence(text, tokens, ids, offsets, words_from_offsets(text, offsets, tokens))
    if query not in words.word_labels:
        raise InputError(f"no word {query!r} in the text; --query takes one of its words: {words.word_labels}")


def _capture(args):
    from .workflows.runner import (
        capture,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    return capture(
        args.model,
        args.text,
        max_length=args.max_length,
        **_loading(args),
        add_bos=getattr(args, "add_bos", False),
        target=args.target,
        check=getattr(args, "check", "off"),
    )


def _cmd_capture(args) -> int:
    if args.query is None:
        given = [f"--{name}" for name in ("layer", "part") if getattr(args, name) is not None]
        if given:
            raise InputError(
                f"{' and '.join(given)} choose{'s' if len(given) == 1 else ''} what --query prints: add --query WORD "
                "(to capture only some layers, use --layers)"
            )
    if args.out:
        _writable(args.out)
    _preflight(args, args.text, layer=args.layer, query=args.query, part=args.part or "encoder")
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


def _cmd_generate(args) -> int:
    from .workflows.generation import (
        generate,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    if args.out:
        _writable(args.out)
    sampling = {}
    if args.sample:
        sampling = {"do_sample": True, "temperature": args.temperature, "top_p": args.top_p}
    elif args.temperature is not None or args.top_p is not None:
        raise InputError("--temperature and --top-p apply to sampling: add --sample")
    if args.layer is not None and not args.steps:
        raise InputError(
            "--layer chooses the layer --steps prints: add --steps (to capture only some layers, use --layers)"
        )
    _preflight(args, args.prompt, layer=args.layer, part="decoder")
    gen = generate(
        args.model,
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        add_bos=args.add_bos,
        **_loading(args),
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


def _cmd_stats(args) -> int:
    from .workflows.corpus import (  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        corpus_stats,
        write_table,
    )

    if args.resume and not args.checkpoint:
        raise InputError("--resume continues from a checkpoint: give it with --checkpoint FILE")
    if args.out:
        _writable(args.out)
        if not args.out.endswith((".parquet", ".csv")):
            raise InputError(f"-o/--out {args.out!r}: give a .parquet or .csv path")
    _preflight(args, None)
    interrupted = False
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line  # restored by catch_warnings
            df = corpus_stats(
                args.model,
                args.corpus,
                batch_size=args.batch_size,
                max_length=args.max_length,
                device_map=args.device_map,
                **_loading(args),
                add_bos=args.add_bos,
                part=args.part,
                truncate=not args.no_truncate,
                checkpoint=args.checkpoint,
                resume=args.resume,
                checkpoint_every_texts=args.checkpoint_every_texts,
                checkpoint_every_seconds=args.checkpoint_every_seconds,
                progress=not args.quiet,
            )
        if df.attrs["rank"] != 0:
            return 0
        shares = " + ".join(f"{n:,}" for n in df.attrs["per_process"])
        print(
            f"{int(df['texts'].iloc[0]):,} texts, {int(df['tokens'].iloc[0]):,} tokens "
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
        return 0
    except Interrupted as err:
        interrupted = True  # every process stopped too (they agree before each batch): no barrier to wait at
        if err.rank == 0:
            print(_error_line(err), file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        _end_processes(barrier=not interrupted)


def _cmd_atlas(args) -> int:
    from .workflows.atlas import (  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        head_atlas,
    )

    if args.out:
        _writable(args.out)
        if not args.out.endswith((".parquet", ".csv", ".html")):
            raise InputError(f"-o/--out {args.out!r}: give a .csv, .parquet or .html path")
    _preflight(args, None)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line  # restored by catch_warnings
            df = head_atlas(
                args.model,
                args.corpus,
                batch_size=args.batch_size,
                probes=args.probes,
                seed=args.seed,
                roles=args.roles,
                layers=args.layers,
                max_length=args.max_length,
                add_bos=args.add_bos,
                device=args.device,
                dtype=args.dtype,
                progress=not args.quiet,
            )
        if df.attrs["rank"] != 0:
            return 0
        met = [r for cell in df["roles"] for r in cell.split(", ") if r]
        counts = ", ".join(f"{name} {met.count(name)}" for name in dict.fromkeys(met)) or "none"
        print(
            f"{df.attrs['texts']:,} texts, {df.attrs['tokens']:,} tokens, {len(df)} heads; heads per role: {counts}",
            file=sys.stderr,
        )
        if args.out:
            if args.out.endswith(".html"):
                from .views.atlas import atlas_page  # deferred: plotly loads only for a page

                atlas_page(df, args.out)
                print(f"wrote {args.out}", file=sys.stderr)
            else:
                from .workflows.corpus import write_table  # deferred with the rest of the workflows

                print(f"wrote {write_table(df, args.out)}", file=sys.stderr)
        else:
            shown = ["part", "layer", "head", "roles", "positional_offset", *(r for r in args.roles or [] if r)]
            print(df[[c for c in shown if c in df.columns]].to_string(index=False))
        return 0
    finally:
        _end_processes()


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr (``warning: …``), not Python's two-line form."""
    print(f"warning: {message}", file=sys.stderr)


def _end_processes(barrier: bool = True) -> None:
    """Close a process group torchrun or accelerate launch made (one left open can abort at exit);
    ``barrier=False`` where the others may have stopped already (a signal)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def _cmd_validate(args) -> int:
    if args.out:
        _writable(args.out)
    if args.capture:
        from .data.io import (
            load,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        )

        cap = load(args.capture)
    else:
        if not args.model or not args.text:
            raise InputError("attnviz validate: give MODEL TEXT, or --capture FILE")
        _preflight(args, args.text)
        cap = _capture(args)
    report = cap.validate()
    print(report)
    if args.out:
        report.to_pandas().to_csv(args.out, index=False)
        print(f"per layer/head errors written to {args.out}")
    return 0 if report.passed else 1


def _cmd_coref(args) -> int:
    from .analysis import (
        rank_heads,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    _preflight(args, args.text)
    cap = _capture(args)
    candidates = [c.strip() for c in args.candidates.split(",")] if args.candidates else None
    ranking = rank_heads(cap, args.pronoun, candidates, exclude_sinks=not args.keep_sinks, part=args.part)
    print(ranking)
    print(ranking.table.head(args.top).round(3).to_string(index=False))
    return 0


def _cmd_probes(args) -> int:
    if args.out:
        _writable(args.out)
    from .workflows.probing import (
        evaluate_probes,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    if args.resume and not args.checkpoint:
        raise InputError("--resume continues from a checkpoint: give it with --checkpoint FILE")
    if args.per_probe:
        _writable(args.per_probe)
    from .analysis.probes import load_probes  # deferred: a refused argument answers before pandas loads

    interrupted = False
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line  # restored by catch_warnings
            # read (and every unusable probe reported) before the model loads: a bad file costs no model
            probes = load_probes(args.probes, format=args.format, columns=_columns(args.columns), strict=args.strict)
            result = evaluate_probes(
                args.model,
                probes,
                batch_size=args.batch_size,
                exclude_sinks=not args.keep_sinks,
                add_bos=not args.no_bos,
                checkpoint=args.checkpoint,
                resume=args.resume,
                checkpoint_every_seconds=args.checkpoint_every_seconds,
            )
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return 0
    except Interrupted as err:
        interrupted = True  # every process stopped too (they agree before each batch): no barrier to wait at
        if err.rank == 0:
            print(_error_line(err), file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        _end_processes(barrier=not interrupted)
    print(result)
    print(result.ranked().head(args.top).round(3).to_string(index=False))
    if args.out:
        result.accuracy.to_csv(args.out, index=False)
        print(f"per-head accuracy written to {args.out}")
    if args.per_probe:
        result.picks_table(top=args.top).to_csv(args.per_probe, index=False)
        print(f"each probe with the picks of the top {args.top} heads written to {args.per_probe}")
    return 0


def _columns(pairs: list[str] | None) -> dict[str, str] | None:
    """``--column text=sentence --column pronoun=pron`` as load_probes' ``columns`` mapping."""
    if not pairs:
        return None
    mapping = {}
    for pair in pairs:
        field, sep, column = pair.partition("=")
        if not sep or not field.strip() or not column.strip():
            raise InputError(f"--column takes FIELD=COLUMN (e.g. text=sentence), got {pair!r}")
        mapping[field.strip()] = column.strip()
    return mapping


EXPORT_VIEWS = ("heatmap", "head", "model", "validation")


def _cmd_export(args) -> int:
    from . import figures  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    from .data.io import (
        load,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    _writable(args.out)
    views = [v.strip() for v in args.views.split(",") if v.strip()]
    unknown = [v for v in views if v not in EXPORT_VIEWS]
    if unknown or not views:
        raise InputError(f"--views takes a comma-separated list of {', '.join(EXPORT_VIEWS)}; got {args.views!r}")
    if args.capture:
        cap = load(args.capture)
    elif args.model and args.text:
        _preflight(args, args.text, layer=args.layer, head=args.head, part=args.part or "encoder")
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
            figures.comparison(cap, layer, args.head, part=part),
        ],
    }
    figs = [fig for view in views for fig in build[view]()]
    path = figures.to_html(figs, args.out, title=f"attnviz — {cap.model.get('name')}: {cap.text[:80]}")
    print(f"{len(figs)} figure(s) written to {path} (self-contained: opens offline)")
    return 0


def _cmd_app(args) -> int:
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


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (``error: … (see attnviz stats --help)``) like attnviz's own."""

    def error(self, message: str):
        self.exit(2, f"error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _error_line(err: BaseException) -> str:
    """An error as the one line the command line prints."""
    return "error: " + " ".join(str(err).split())


def build_parser() -> argparse.ArgumentParser:
    from . import __version__  # deferred: the package's __init__ loads torch; `attnviz --help` answers without it

    parser = _Parser(prog="attnviz", description="See what attention does in Hugging Face models.")
    parser.add_argument("--version", action="version", version=f"attnviz {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("capture", help="run a model on a text and record its attention")
    _add_model_args(p, text_required=True)
    _add_out(p, "save the capture to this file (.attnviz, safetensors; --output still works)")
    p.add_argument("--query", help="print, per head, where this word's attention goes (word level)")
    p.add_argument(
        "--layer", type=int, default=None, help="the layer --query reads (default: the first captured); needs --query"
    )
    p.add_argument(
        "--part",
        choices=["encoder", "decoder", "cross"],
        default=None,
        help="encoder-decoder models: the attention --query reads (default: encoder); needs --query",
    )
    p.set_defaults(func=_cmd_capture)

    p = sub.add_parser("generate", help="continue a text with the model and record every step's attention")
    p.add_argument("model", help="embedded alias (smollm2), hub name, or local folder of a model that generates")
    p.add_argument("prompt", help="the text to continue (encoder-decoder models: the source)")
    p.add_argument("--max-new-tokens", type=int, default=20, help="how many tokens to generate (default: 20)")
    p.add_argument("--sample", action="store_true", help="sample instead of the greedy choice")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (with --sample)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold (with --sample)")
    p.add_argument("--seed", type=int, default=None, help="seed for a repeatable sample")
    _add_bos(p)
    _add_loading_args(p)
    p.add_argument(
        "--check",
        choices=["sample", "full", "off"],
        default="sample",
        help="compare every generated row and a sample of the prompt's (default), every row, or none",
    )
    p.add_argument("--steps", action="store_true", help="print what each new token attended to most")
    p.add_argument(
        "--layer", type=int, default=None, help="the layer --steps prints (default: the last captured); needs --steps"
    )
    _add_out(p, "save the generation's capture to this file (opens in attnviz app; --output still works)")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser(
        "validate", help="compare attnviz's recomputation with the model's own attention (exit 1 on failure)"
    )
    _add_model_args(p, text_required=False, check=False)
    p.add_argument("--capture", help="validate a saved capture file instead of running a model")
    _add_out(p, "write the per layer/head errors to this CSV file (--csv still works)", alias="--csv")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("coref", help="rank heads by the attention from a pronoun to candidate antecedents")
    _add_model_args(p, text_required=True)
    p.add_argument("--pronoun", required=True, help="the pronoun (its last occurrence is used), e.g. it or 它")
    p.add_argument("--candidates", help="comma-separated candidates (default: proposed from the text)")
    p.add_argument("--keep-sinks", action="store_true", help="do not leave out the first/special tokens")
    p.add_argument("--top", type=int, default=10, help="how many heads to print")
    p.add_argument(
        "--part",
        choices=["encoder", "decoder"],
        default=None,
        help="encoder-decoder models: rank the encoder's (source) or the decoder's (target) heads",
    )
    p.set_defaults(func=_cmd_coref)

    p = sub.add_parser(
        "probes", help="score every head on a probe set (en, zh, or a JSONL/CSV/TSV/Parquet file of a known format)"
    )
    p.add_argument("model", help="embedded alias, hub name or local folder")
    p.add_argument(
        "probes",
        help="en, zh, or a file: attnviz JSONL {text, pronoun, candidates, gold}, or one of the --format presets",
    )
    p.add_argument(
        "--format",
        help="the file's layout: attnviz, gap, superglue-wsc, cluewsc, wsc, winograd (default: told by its columns)",
    )
    p.add_argument(
        "--column",
        dest="columns",
        action="append",
        metavar="FIELD=COLUMN",
        help="read a probe field from a column of another name (repeatable), e.g. --column text=sentence",
    )
    p.add_argument("--strict", action="store_true", help="refuse the file if any probe in it cannot be used")
    p.add_argument(
        "--batch-size",
        type=int,
        default=64,  # attnviz.workflows.probing.BATCH_SIZE (not imported: --help loads no torch)
        help="probes per forward, grouped by length, at most 4,096 padded tokens each (default: 64)",
    )
    p.add_argument("--per-probe", help="write each probe with the candidate each top head picked to this CSV file")
    p.add_argument("--keep-sinks", action="store_true", help="do not leave out the first/special tokens")
    p.add_argument("--no-bos", action="store_true", help="do not prepend a BOS token to each probe")
    p.add_argument("--top", type=int, default=5, help="how many heads to print")
    _add_out(p, "write the per-head accuracy to this CSV file (--csv still works)", alias="--csv")
    p.add_argument(
        "--checkpoint",
        help="save the run's place to this file (atomically; one per process under torchrun) every 100 probes or "
        f"--checkpoint-every-seconds, and on SIGTERM/SIGINT, which then stop the run with exit status {EXIT_INTERRUPTED}",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue from --checkpoint; with none there, start and say so"
    )
    p.add_argument(
        "--checkpoint-every-seconds",
        type=float,
        default=60.0,
        help="save after this many seconds at most (default: 60)",
    )
    p.set_defaults(func=_cmd_probes)

    p = sub.add_parser(
        "stats",
        help="head statistics over a corpus, each mass by weight and by norm (its *_moved twin: the share of what "
        "the head moves, α·‖f(x)‖), streamed and batched; under torchrun / accelerate launch, spread over the "
        "processes",
    )
    p.add_argument("model", help="embedded alias, hub name or local folder")
    p.add_argument("corpus", help='a .txt file (one text per line) or .jsonl file ({"text": ...} per line)')
    _add_out(p, "write the table here: .parquet or .csv (default: print it)")
    p.add_argument("--batch-size", type=int, default=8, help="texts per forward, grouped by length (default: 8)")
    p.add_argument("--max-length", type=int, default=None, help="truncate each text to this many tokens")
    _add_loading_args(p, backend=False)
    p.add_argument("--device-map", default=None, help="auto: spread a large model over GPUs, CPU and disk")
    p.add_argument("--add-bos", action="store_true", help="prepend a BOS token to each text")
    p.add_argument("--part", choices=["encoder", "decoder"], default=None, help="encoder-decoder models: which part")
    p.add_argument(
        "--no-truncate", action="store_true", help="refuse a text over the model's limit (default: cut and count it)"
    )
    p.add_argument(
        "--checkpoint",
        help="save the run's place to this file (atomically; under N processes each writes FILE.rank<i>-of-<N>) "
        "every --checkpoint-every-texts texts or --checkpoint-every-seconds, at the end, and on SIGTERM/SIGINT, "
        f"which then stop the run with exit status {EXIT_INTERRUPTED}",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from --checkpoint (same corpus, batch size and number of processes); with no checkpoint "
        "there, start at the first text and say so",
    )
    p.add_argument(
        "--checkpoint-every-texts",
        type=int,
        default=1000,
        help="save after this many texts per process at most (default: 1000)",
    )
    p.add_argument(
        "--checkpoint-every-seconds",
        type=float,
        default=60.0,
        help="save after this many seconds at most (default: 60)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_stats)

    p = sub.add_parser(
        "atlas",
        help="name each head's roles (previous/next-token, positional, broad/focused, sink, special-token, "
        "duplicate-token, induction, rare-word, coreference) with published criteria over a corpus; under "
        "torchrun / accelerate launch, spread over the processes",
    )
    p.add_argument("model", help="embedded alias, hub name or local folder")
    p.add_argument("corpus", help='a .txt file (one text per line) or .jsonl file ({"text": ...} per line)')
    _add_out(p, "write the atlas here: .csv, .parquet or .html (map and table) (default: print it)")
    p.add_argument("--batch-size", type=int, default=8, help="texts per forward, grouped by length (default: 8)")
    p.add_argument(
        "--probes",
        default=None,
        help="a probe file or a shipped set's name (as attnviz probes reads) for the coreference role",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the repeated random sequences (induction; default: 0)")
    p.add_argument(
        "--roles",
        type=lambda v: [r for r in v.split(",") if r],
        default=None,
        help="report only these roles, comma-separated (default: all)",
    )
    p.add_argument("--max-length", type=int, default=None, help="truncate each text to this many tokens")
    _add_loading_args(p, backend=False)
    p.add_argument("--add-bos", action="store_true", help="prepend a BOS token to each text")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_atlas)

    p = sub.add_parser("export", help="write figures as one self-contained HTML file that opens offline")
    _add_model_args(p, text_required=False)
    p.add_argument("--capture", help="export from a saved capture file instead of running a model")
    _add_out(p, "the HTML file to write (--output still works)", required=True)
    p.add_argument(
        "--views",
        default="heatmap,head,model",
        help=f"comma-separated, from {', '.join(EXPORT_VIEWS)} (default: heatmap,head,model)",
    )
    p.add_argument("--layer", type=int, default=None, help="the layer (default: the first captured)")
    p.add_argument("--head", type=int, default=0, help="the head (default: 0)")
    p.add_argument(
        "--part",
        choices=["encoder", "decoder", "cross"],
        default=None,
        help="encoder-decoder models: which attention (default: encoder)",
    )
    p.add_argument("--words", action="store_true", help="merge tokens into words")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("app", help="start the dashboard (http://127.0.0.1:8050 by default)")
    p.add_argument(
        "--model",
        action="append",
        default=None,
        help="a model the page offers (repeat for several; the first opens; default: the embedded smollm2 and "
        "minilm). The page loads no other",
    )
    p.add_argument("--capture", default=None, help="open a capture file saved with Capture.save()")
    p.add_argument("--stats", default=None, help="show a table of 'attnviz stats' in the head-statistics view")
    p.add_argument(
        "--corpus",
        default=None,
        help="texts (.txt, one per line, or .jsonl) the Q·K space view embeds beside the page's text",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1; others warn: no authentication)"
    )
    p.add_argument("--port", type=int, default=8050)
    p.set_defaults(func=_cmd_app)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValidationError as err:
        print(_error_line(err), file=sys.stderr)
        return 1
    except AttnvizError as err:
        print(_error_line(err), file=sys.stderr)
        return 2
    except OSError as err:  # a file that cannot be read or written
        print(_error_line(err), file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
