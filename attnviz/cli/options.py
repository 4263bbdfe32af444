"""The options the subcommands share (``-o/--out``, ``--layers``, ``--device`` …) and their parsing."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError


def names(value: str) -> list[str]:
    """A comma-separated option (``--roles``, ``--statistics``, ``--layers``, ``--views``) as its items,
    each stripped of the spaces around it (``"previous_token, sink"``); empty items (a trailing comma) left out."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _layers(value: str) -> list[int]:
    try:
        return [int(part) for part in names(value)]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--layers takes comma-separated integers like 0,3,5, got {value!r}") from err


def _heads(value: str) -> list[int]:
    try:
        return [int(part) for part in names(value)]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--heads takes comma-separated integers like 3,7, got {value!r}") from err


def add_heads(p: argparse.ArgumentParser) -> None:
    """``--heads``: the query heads a capture keeps (``capture(heads=)``), checked against the config
    before the weights load (:func:`attnviz.cli.preflight.preflight`)."""
    p.add_argument(
        "--heads",
        type=_heads,
        default=None,
        help="keep only these query heads of each layer, by the model's numbers, e.g. 3,7 (and the key/value heads "
        "they read); the self-check still runs over every head (default: every head)",
    )


def count(value: str) -> int:
    """A count the library needs at least one of (``--max-length``, ``--batch-size``, ``--top``,
    ``--max-new-tokens`` …): a whole number ≥ 1, or argparse's one-line error before anything loads."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"a whole number ≥ 1, got {value!r}")
    return number


#: the attentions a capture can hold (attnviz.engine.specs.PARTS, not imported: --help loads no torch; a
#: test checks they agree): every ``--part`` offers them all, and a command refuses those it cannot read
PARTS = ("encoder", "decoder", "cross", "text", "vision")
TOP = 10  # the heads ``--top`` prints by default, in every subcommand
SEED = 0  # ``--seed``'s default, in every subcommand: a run is repeatable unless told otherwise


def deprecated(option: str, instead: str) -> str:
    """The one line on stderr an option kept for one release prints (a DeprecationWarning's CLI form)."""
    return f"warning: {option} is deprecated and will be removed in the next release; {instead}"


class _Deprecated(argparse.Action):
    """An old option that still works for one release: its one :func:`deprecated` line on stderr, then
    what it always did (store its value under the new option's ``dest``; a flag, ``nargs=0``, stores nothing)."""

    def __init__(self, option_strings, dest, *, instead: str, **kwargs):
        self.instead = instead
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(deprecated(option_string or self.option_strings[0], self.instead), file=sys.stderr)
        if self.nargs != 0:
            setattr(namespace, self.dest, values)
        elif self.const is not None:  # an old flag: the value its new spelling stores
            setattr(namespace, self.dest, self.const)


def add_sinks(p: argparse.ArgumentParser) -> None:
    """``--exclude-sinks`` / ``--no-exclude-sinks``, the API's ``exclude_sinks`` (on by default); the older
    ``--keep-sinks`` works for one release as ``--no-exclude-sinks``, with a deprecation line."""
    p.add_argument(
        "--exclude-sinks",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="leave out the first and the special tokens (attention sinks) when scoring the candidates "
        "(default; --no-exclude-sinks keeps them)",
    )
    p.add_argument(
        "--keep-sinks",
        dest="exclude_sinks",
        action=_Deprecated,
        nargs=0,
        const=False,
        instead="use --no-exclude-sinks",
        help=argparse.SUPPRESS,
    )


def add_out(p: argparse.ArgumentParser, help: str, *, required: bool = False, csv: bool = False) -> None:
    """``-o/--out`` (``--output`` too) of a subcommand that writes a file; ``csv``: the older ``--csv``
    works for one release, with a deprecation line."""
    p.add_argument("-o", "--out", "--output", dest="out", required=required, metavar="FILE", help=help)
    if csv:
        p.add_argument(
            "--csv", dest="out", action=_Deprecated, instead="use -o/--out", metavar="FILE", help=argparse.SUPPRESS
        )


def add_bos(p: argparse.ArgumentParser, help: str = "prepend a BOS token so a decoder's sink is not a word") -> None:
    """``--add-bos`` (off by default, as the library's ``add_bos=False``)."""
    p.add_argument("--add-bos", action="store_true", help=f"{help} (default: off)")


def add_no_bos(p: argparse.ArgumentParser) -> None:
    """``--no-bos``, kept for one release: off is the default now, so it does nothing but say so."""
    p.add_argument(
        "--no-bos",
        action=_Deprecated,
        nargs=0,
        instead="it does nothing: no BOS token is prepended unless --add-bos is given",
        default=argparse.SUPPRESS,  # nothing of its own in the parsed arguments
        help=argparse.SUPPRESS,
    )


def add_quiet(p: argparse.ArgumentParser) -> None:
    """``--quiet``: no progress bar (a long command's: ``stats``, ``atlas``, ``probes``)."""
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_progress(p: argparse.ArgumentParser) -> None:
    """``--progress``: the libraries' loading bars even when stderr is not a terminal (:func:`~.runs.loading_bars`)."""
    p.add_argument(
        "--progress",
        action="store_true",
        help="draw the libraries' progress bars while the model loads (transformers', a GGUF file's conversion) "
        "even when stderr is not a terminal (default: only on a terminal; --quiet: never)",
    )


def add_part(p: argparse.ArgumentParser, help: str) -> None:
    """``--part``: one of :data:`PARTS` (the command refuses those it cannot read: :func:`check_part`)."""
    p.add_argument("--part", choices=PARTS, default=None, help=help)


def check_part(args, command: str, readable: tuple[str, ...]) -> None:
    """``--part`` refused in one line where ``attnviz command`` cannot read that attention."""
    if args.part is not None and args.part not in readable:
        named = ", ".join(readable[:-1]) + " or " + readable[-1]
        raise InputError(f"--part {args.part}: attnviz {command} reads the {named} attention; give one of them")


def add_top(p: argparse.ArgumentParser, help: str = "how many heads to print") -> None:
    """``--top``: how many heads (default :data:`TOP`)."""
    p.add_argument("--top", type=count, default=TOP, help=f"{help} (default: {TOP})")


def add_seed(p: argparse.ArgumentParser, help: str) -> None:
    """``--seed`` (default :data:`SEED`: the same result each run)."""
    p.add_argument("--seed", type=int, default=SEED, help=f"{help} (default: {SEED})")


def seconds(value: str) -> float:
    """A time between two checkpoints (``--checkpoint-every-seconds``): a number > 0, or argparse's one-line error."""
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"a number of seconds > 0, got {value!r}")
    return number


def add_model_args(p: argparse.ArgumentParser, *, text_required: bool, check: bool = True) -> None:
    """MODEL and TEXT, loading, ``--max-length``, ``--add-bos``, ``--target`` and ``--check``."""
    p.add_argument(
        "model",
        nargs=None if text_required else "?",
        help="embedded alias (smollm2, minilm), hub name, or local folder",
    )
    p.add_argument("text", nargs=None if text_required else "?", help="the text to run the model on")
    add_loading_args(p)
    p.add_argument("--max-length", type=count, default=None, help="truncate the text to this many tokens")
    add_bos(p)
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


def add_loading_args(p: argparse.ArgumentParser, *, backend: bool = True) -> None:
    """Which layers, and where and how the model loads."""
    p.add_argument("--layers", type=_layers, default=None, help="capture only these layers, e.g. 0,3,5 (0-based)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: where the model loads)")
    p.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    if backend:
        p.add_argument(
            "--attn-implementation", default=None, help="eager, sdpa, flash_attention_2 … (default: the model's)"
        )


#: a subcommand's own options, added in their place among :func:`add_corpus_args`'s
Options = Callable[[argparse.ArgumentParser], None]


def add_corpus_args(
    p: argparse.ArgumentParser,
    *,
    out: str,
    after_batch_size: Options | None = None,
    after_loading: Options | None = None,
    after_add_bos: Options | None = None,
    model_optional: str | None = None,
) -> None:
    """MODEL and CORPUS, ``-o/--out`` (``out``: its help), ``--batch-size``, ``--max-length``, where the
    model loads, ``--add-bos`` and ``--quiet`` of a subcommand over a corpus (``attnviz stats``,
    ``attnviz atlas``); its own options go in after the shared one each ``after_*`` names, so its
    ``--help`` lists them there. ``model_optional``: MODEL may be left out, and this says when (its help)."""
    if model_optional is None:
        p.add_argument("model", help="embedded alias, hub name or local folder")
    else:
        p.add_argument(
            "model", nargs="?", default=None, help=f"embedded alias, hub name or local folder ({model_optional})"
        )
    p.add_argument("corpus", help='a .txt file (one text per line) or .jsonl file ({"text": ...} per line)')
    add_out(p, out)
    p.add_argument("--batch-size", type=count, default=8, help="texts per forward, grouped by length (default: 8)")
    if after_batch_size is not None:
        after_batch_size(p)
    p.add_argument("--max-length", type=count, default=None, help="truncate each text to this many tokens")
    add_loading_args(p, backend=False)
    if after_loading is not None:
        after_loading(p)
    add_bos(p, "prepend a BOS token to each text")
    if after_add_bos is not None:
        after_add_bos(p)
    add_quiet(p)


def corpus_kwargs(args) -> dict:
    """The keyword arguments :func:`add_corpus_args` gathered (but MODEL and CORPUS), as ``corpus_stats`` and
    ``head_atlas`` take them: the batch, the length, the BOS, where the model loads, the progress bar."""
    return {
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "add_bos": args.add_bos,
        "progress": not args.quiet,
        **loading_kwargs(args),
    }


def loading_kwargs(args) -> dict:
    """The keyword arguments :func:`add_loading_args` gathered."""
    names = ("layers", "device", "dtype", "attn_implementation")
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


def check_writable(path: str) -> None:
    """Refuse a folder given for a file, or a path whose folder does not exist, before any model runs."""
    if Path(path).is_dir():
        raise InputError(f"cannot write {path!r}: it is a folder; give a file name (e.g. {str(Path(path) / 'out')!r})")
    if not Path(path).parent.is_dir():
        raise InputError(f"cannot write {path!r}: the folder {str(Path(path).parent)!r} does not exist")


# suffixes of other formats: a capture written there would be a safetensors file under a wrong name
_NOT_A_CAPTURE = {
    ".txt": "text",
    ".csv": "a table",
    ".tsv": "a table",
    ".parquet": "a table",
    ".json": "JSON",
    ".jsonl": "JSON lines",
    ".html": "a page",
    ".png": "a picture",
    ".svg": "a picture",
    ".pdf": "a document",
    ".npz": "NumPy arrays",
    ".npy": "a NumPy array",
    ".pt": "a torch pickle",
    ".pkl": "a pickle",
}


def check_capture_out(path: str) -> None:
    """:func:`check_writable`, and refuse a suffix of another format (``-o x.txt``, ``-o x.csv``): what
    ``capture`` and ``generate`` write is a safetensors file, ``.attnviz`` by convention."""
    check_writable(path)
    suffix = Path(path).suffix.lower()
    if suffix in _NOT_A_CAPTURE:
        raise InputError(
            f"-o/--out {path!r}: a capture is one safetensors file, not {_NOT_A_CAPTURE[suffix]}; name it "
            f"{str(Path(path).with_suffix('.attnviz'))!r} (or .safetensors). For a table use attnviz stats or "
            "atlas -o FILE.csv; for figures, attnviz export -o FILE.html"
        )


def column_mapping(pairs: list[str] | None) -> dict[str, str] | None:
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
