"""Command line: ``attnviz capture | generate | validate | coref | explain | probes | stats | atlas | export | info | app``.

Exit status (:data:`EXIT_STATUS`, one table): 0 on success, 1 when validation fails (a head over tolerance, or a
capture's own check), 2 for usage, input and environment errors (an unsafe or broken weights file, a folder given
for a file, a file that is not UTF-8, a link out of a model folder, a full disk, a bad capture file), 75
(EX_TEMPFAIL: run it again) when SIGTERM or SIGINT stopped ``attnviz stats``, ``atlas`` or ``probes`` after it
wrote its checkpoint — each error one line on stderr.

Arguments are checked before the model runs: a hub name is asked of the hub once (an unknown or
unreachable name fails in seconds), and ``--layers``, ``--layer``, ``--head``, ``--query`` and the
text's length are checked against the model's config and the tokenized text before its weights load.
One option name and default per idea across the subcommands: every one that writes a file takes
``-o/--out`` (or ``--output``; the older ``--csv`` works for one release, with a deprecation line on
stderr), ``--add-bos`` is off by default, ``--top`` prints 10 heads, ``--seed`` is 0 and ``--part``
offers the attentions a capture can hold (a command refuses in one line those it cannot read)."""

from __future__ import annotations

import argparse
import pickle
import sys

from ..errors import AttnvizError, Interrupted, ValidationError
from .app_command import cmd_app
from .corpus_commands import cmd_atlas, cmd_probes, cmd_stats
from .options import (
    add_bos,
    add_corpus_args,
    add_heads,
    add_loading_args,
    add_model_args,
    add_no_bos,
    add_out,
    add_part,
    add_progress,
    add_quiet,
    add_seed,
    add_sinks,
    add_top,
    count,
    names,
    seconds,
)
from .runs import EXIT_INTERRUPTED, error_line
from .text_commands import (
    EXPORT_VIEWS,
    cmd_capture,
    cmd_coref,
    cmd_explain,
    cmd_export,
    cmd_generate,
    cmd_info,
    cmd_report,
    cmd_validate,
)

__all__ = ["EXIT_INTERRUPTED", "EXIT_STATUS", "build_parser", "exit_status", "main"]

#: the exit status of each error a command ends with — the first row that matches — said in one line on
#: stderr (``error: …``), never a traceback. 1 is a finding (the recomputation does not reproduce the model),
#: 2 a mistake in what was given or where it runs (an argument, a text, a file, a model folder, a full disk),
#: 75 a run a signal stopped after its checkpoint (run it again with --resume). argparse's usage errors are 2.
EXIT_STATUS: tuple[tuple[type[BaseException] | str, int], ...] = (
    (ValidationError, 1),
    (Interrupted, EXIT_INTERRUPTED),
    (AttnvizError, 2),  # arguments, texts, models, capture files, files that cannot be written
    (OSError, 2),  # a file that cannot be read or written
    (UnicodeError, 2),  # a file or a text that is not UTF-8
    (pickle.UnpicklingError, 2),  # a weights file torch will not load safely
    ("safetensors.SafetensorError", 2),  # a broken safetensors file, or one that could not be written
)

EXIT_HELP = (
    "exit status: 0 success; 1 validation failed (a head over tolerance, a capture's own check); 2 a usage, "
    f"input or environment error (an argument, a text, a file, a model folder, a full disk); {EXIT_INTERRUPTED} "
    "stopped by SIGTERM/SIGINT after writing its checkpoint (run again with --resume). Every error is one line on "
    "stderr."
)


def exit_status(err: BaseException) -> int | None:
    """The exit status :data:`EXIT_STATUS` gives ``err``; None for an error it does not name (a bug: its
    traceback is shown)."""
    for kind, status in EXIT_STATUS:
        if isinstance(kind, str):  # a library's error, looked up only if that library was loaded
            module, _, name = kind.rpartition(".")
            kind = getattr(sys.modules.get(module), name, None)  # type: ignore[assignment]
            if not isinstance(kind, type):
                continue
        if isinstance(err, kind):
            return status
    return None


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (``error: … (see attnviz stats --help)``) like attnviz's own."""

    def error(self, message: str):
        self.exit(2, f"error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__  # deferred: the package's __init__ loads torch; `attnviz --help` answers without it

    parser = _Parser(prog="attnviz", description="See what attention does in Hugging Face models.", epilog=EXIT_HELP)
    parser.add_argument("--version", action="version", version=f"attnviz {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("capture", help="run a model on a text and record its attention")
    add_model_args(p, text_required=True)
    add_out(p, "save the capture to this file (.attnviz, safetensors; --output still works)")
    add_heads(p)
    p.add_argument(
        "--keep",
        type=names,
        default=None,
        help="what each layer's record keeps once the self-check has run: a comma list of q,k,v,out,norms "
        "(q and k always; without v and out a long capture keeps under half, but cannot be validated again; "
        "default: all)",
    )
    p.add_argument("--query", help="print, per head, where this word's attention goes (word level)")
    p.add_argument(
        "--layer", type=int, default=None, help="the layer --query reads (default: the first captured); needs --query"
    )
    add_part(p, "encoder-decoder models: the attention --query reads (default: encoder); needs --query")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("generate", help="continue a text with the model and record every step's attention")
    p.add_argument("model", help="embedded alias (smollm2), hub name, or local folder of a model that generates")
    p.add_argument("prompt", help="the text to continue (encoder-decoder models: the source)")
    p.add_argument("--max-new-tokens", type=count, default=20, help="how many tokens to generate (default: 20)")
    p.add_argument("--sample", action="store_true", help="sample instead of the greedy choice")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (with --sample)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold (with --sample)")
    add_seed(p, "seed of the sampling draw (with --sample): the same seed, the same text")
    add_bos(p)
    add_loading_args(p)
    p.add_argument(
        "--check",
        choices=["sample", "full", "off"],
        default="sample",
        help="compare every generated row and a sample of the prompt's (default), every row, or none",
    )
    add_heads(p)
    p.add_argument("--steps", action="store_true", help="print what each new token attended to most")
    p.add_argument(
        "--layer", type=int, default=None, help="the layer --steps prints (default: the last captured); needs --steps"
    )
    add_out(p, "save the generation's capture to this file (opens in attnviz app; --output still works)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser(
        "validate", help="compare attnviz's recomputation with the model's own attention (exit 1 on failure)"
    )
    add_model_args(p, text_required=False, check=False)
    p.add_argument("--capture", help="validate a saved capture file instead of running a model")
    add_heads(p)
    add_out(p, "write the per layer/head errors to this CSV file", csv=True)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("coref", help="rank heads by the attention from a pronoun to candidate antecedents")
    add_model_args(p, text_required=True)
    p.add_argument("--pronoun", required=True, help="the pronoun (its last occurrence is used), e.g. it or 它")
    p.add_argument("--candidates", help="comma-separated candidates (default: proposed from the text)")
    add_sinks(p)
    add_top(p)
    add_part(p, "encoder-decoder models: rank the encoder's (source) or the decoder's (target) heads")
    p.set_defaults(func=cmd_coref)

    p = sub.add_parser(
        "explain", help="why a head looks there: one query-key score taken apart into what wrote the query and the key"
    )
    p.add_argument("model", help="embedded alias (smollm2, minilm), hub name, or local folder")
    p.add_argument("text", help="the text to run the model on")
    p.add_argument("--layer", type=int, required=True, help="the head's layer (0-based)")
    p.add_argument("--head", type=int, required=True, help="the head (0-based)")
    p.add_argument("--query", required=True, help="the query: a word of the text (its last token) or a token position")
    p.add_argument("--key", required=True, help="the key: a word of the text (its last token) or a token position")
    p.add_argument("--versus", default=None, help="another key: take apart s(query, key) - s(query, versus)")
    add_top(p, "how many pairs to print")
    add_bos(p)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: where the model loads)")
    p.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    p.set_defaults(func=cmd_explain, layers=None)

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
        type=count,
        default=64,  # attnviz.workflows.corpus.probing.BATCH_SIZE (not imported: --help loads no torch)
        help="probes per forward, grouped by length, at most 4,096 padded tokens each (default: 64)",
    )
    p.add_argument("--per-probe", help="write each probe with the candidate each top head picked to this CSV file")
    add_sinks(p)
    add_bos(
        p,
        "prepend a BOS token to each probe, so a decoder's attention sink is not a candidate; as evaluate_probes' "
        "add_bos, off unless given (this command prepended one until this release; --no-bos now does nothing)",
    )
    add_no_bos(p)
    add_top(p, "how many heads to print, and whose picks --per-probe writes")
    add_quiet(p)
    add_out(p, "write the per-head accuracy to this CSV file", csv=True)
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
        type=seconds,
        default=60.0,
        help="save after this many seconds at most, a number > 0 (default: 60)",
    )
    p.set_defaults(func=cmd_probes)

    p = sub.add_parser(
        "stats",
        help="head statistics over a corpus, each mass by weight and moved (its *_moved twin: the share of what "
        "the head moves, α·‖f(x)‖), streamed and batched; under torchrun / accelerate launch, spread over the "
        "processes",
    )
    add_corpus_args(
        p,
        out="write the table here: .parquet or .csv (default: print it)",
        after_loading=_stats_placement,
        after_add_bos=_stats_run_args,
    )
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser(
        "atlas",
        help="name each head's roles (previous/next-token, positional, broad/focused, sink, special-token, "
        "duplicate-token, induction, rare-word, coreference) with published criteria over a corpus; under "
        "torchrun / accelerate launch, spread over the processes",
    )
    add_corpus_args(
        p,
        out="write the atlas here: .csv, .parquet or .html (map and table) (default: print it)",
        after_batch_size=_atlas_role_args,
        after_add_bos=_atlas_timeline_args,
        model_optional="left out with --checkpoints",
    )
    p.set_defaults(func=cmd_atlas)

    p = sub.add_parser("export", help="write figures as one self-contained HTML file that opens offline")
    add_model_args(p, text_required=False)
    p.add_argument("--capture", help="export from a saved capture file instead of running a model")
    add_out(p, "the HTML file to write (--output still works)", required=True)
    p.add_argument(
        "--views",
        default="heatmap,head,model",
        help=f"comma-separated, from {', '.join(EXPORT_VIEWS)} (default: heatmap,head,model); validation is two "
        "figures: every layer and head's error, and --layer/--head's model numbers, attnviz's and their difference",
    )
    add_heads(p)
    p.add_argument("--layer", type=int, default=None, help="the layer (default: the first captured)")
    p.add_argument(
        "--head", type=int, default=None, help="the head, by the model's number (default: 0, or the first kept)"
    )
    add_part(p, "encoder-decoder models: which attention (default: encoder)")
    p.add_argument("--words", action="store_true", help="merge tokens into words")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "info", help="print what a saved capture holds and where it came from (model, weights' hash, versions, check)"
    )
    p.add_argument("file", help="a capture file saved with Capture.save() or attnviz capture -o")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser(
        "report", help="a capture as one self-contained HTML report: every view, chosen in the page, offline"
    )
    p.add_argument(
        "model", help="a saved capture (CAPTURE.attnviz), or a model (embedded alias, hub name, folder) with TEXT"
    )
    p.add_argument("text", nargs="?", help="the text to run the model on (with a model)")
    add_loading_args(p)
    p.add_argument("--max-length", type=count, default=None, help="truncate the text to this many tokens")
    add_bos(p)
    p.add_argument("--target", default=None, help="encoder-decoder models: the decoder's text, teacher-forced")
    p.add_argument(
        "--check", choices=["sample", "full", "off"], default="sample", help="the capture's self-check (with a model)"
    )
    add_out(p, "the HTML file to write (--output still works)", required=True)
    p.add_argument("--layer", type=int, default=None, help="the layer the page opens on (default: the first)")
    p.add_argument(
        "--head",
        type=int,
        default=None,
        help="the head the page opens on (default: the first kept — 0 unless the capture kept some heads)",
    )
    p.add_argument(
        "--heads",
        dest="report_heads",
        default=None,
        help="LAYER:HEAD pairs (e.g. 3:4,10:0) whose maps the page keeps when every head's would pass --budget-mb",
    )
    p.add_argument(
        "--budget-mb", type=float, default=15.0, help="the page's size budget in MB (default 15): past it, --heads only"
    )
    p.set_defaults(func=cmd_report)

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
        help='texts (.txt, one per line, or .jsonl {"text": ...}; its first 500 are read) for the Q·K space view, '
        "which embeds them beside the page's text, and the Head atlas (without one it reads the shipped English "
        "probe sentences); a file attnviz atlas would refuse is refused before the page serves",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1; others warn: no authentication)"
    )
    p.add_argument("--port", type=_port, default=8050, help="port to serve on, 1–65535 (default 8050)")
    p.set_defaults(func=cmd_app)
    for name, command in sub.choices.items():  # every command that loads a model
        if name not in ("app", "info"):  # the dashboard loads its models later, in the server; info reads a file
            add_progress(command)
    return parser


def _port(value: str) -> int:
    """A TCP port: a whole number from 1 to 65535 (argparse says so in one line otherwise)."""
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 1 to 65535, got {value!r}")
    return port


def _stats_placement(p: argparse.ArgumentParser) -> None:
    """``attnviz stats``' ``--device-map``."""
    p.add_argument("--device-map", default=None, help="auto: spread a large model over GPUs, CPU and disk")


def _stats_run_args(p: argparse.ArgumentParser) -> None:
    """``attnviz stats``' part, statistics, truncation and checkpoints."""
    add_part(p, "encoder-decoder models: which part")
    p.add_argument(
        "--statistics",
        default=None,
        help="comma-separated: compute only these (e.g. entropy,previous), by weight; the other columns and every "
        "*_moved one are left empty (NaN). One-stack models, no --checkpoint (default: every statistic)",
    )
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
        type=count,
        default=1000,
        help="save after this many texts per process at most (default: 1000)",
    )
    p.add_argument(
        "--checkpoint-every-seconds",
        type=seconds,
        default=60.0,
        help="save after this many seconds at most, a number > 0 (default: 60)",
    )


def _atlas_timeline_args(p: argparse.ArgumentParser) -> None:
    """``attnviz atlas --checkpoints``: the atlas of every checkpoint of a training run, as one long table."""
    p.add_argument(
        "--checkpoints",
        default=None,
        help="the atlas of every checkpoint of a training run, one long table (step, checkpoint, weights_hash, "
        "same_weights_as, layer, head, role, score, threshold, passes; .csv or .parquet): a run folder (its "
        "checkpoint-*/ in step order) or comma-separated checkpoint folders; MODEL is left out",
    )
    p.add_argument(
        "--revisions",
        default=None,
        help="with MODEL a hub name: the timeline of these comma-separated revisions (e.g. step1000,step3000)",
    )
    p.add_argument(
        "--checkpoint",
        help="--checkpoints / --revisions: save the table so far to this file after each checkpoint; SIGTERM/SIGINT "
        f"stop the run there with exit status {EXIT_INTERRUPTED}",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue from --checkpoint, skipping the checkpoints it holds"
    )


def _atlas_role_args(p: argparse.ArgumentParser) -> None:
    """``attnviz atlas``' coreference probes, induction seed and roles."""
    p.add_argument(
        "--probes",
        default=None,
        help="a probe file or a shipped set's name (as attnviz probes reads) for the coreference role",
    )
    add_seed(p, "seed of the repeated random sequences (induction)")
    p.add_argument(
        "--no-truncate",
        action="store_true",
        help="refuse a text over the model's limit, before the pass (default: cut and count it)",
    )
    p.add_argument(
        "--roles",
        type=names,
        default=None,
        help="report only these roles, comma-separated (default: all)",
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as err:  # noqa: BLE001 - mapped by one table; what it does not name is a bug, raised
        status = exit_status(err)
        if status is None:
            raise
        print(error_line(err), file=sys.stderr)
        return status
