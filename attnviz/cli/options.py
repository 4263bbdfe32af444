"""The options the subcommands share (``-o/--out``, ``--layers``, ``--device`` …) and their parsing."""

from __future__ import annotations

import argparse
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


def add_out(p: argparse.ArgumentParser, help: str, *, required: bool = False, alias: str = "--output") -> None:
    """``-o/--out`` of a subcommand that writes a file; ``alias`` (its older spelling) still works."""
    p.add_argument("-o", "--out", alias, dest="out", required=required, metavar="FILE", help=help)


def add_bos(p: argparse.ArgumentParser) -> None:
    """``--add-bos``."""
    p.add_argument("--add-bos", action="store_true", help="prepend a BOS token so a decoder's sink is not a word")


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
) -> None:
    """MODEL and CORPUS, ``-o/--out`` (``out``: its help), ``--batch-size``, ``--max-length``, where the
    model loads, ``--add-bos`` and ``--quiet`` of a subcommand over a corpus (``attnviz stats``,
    ``attnviz atlas``); its own options go in after the shared one each ``after_*`` names, so its
    ``--help`` lists them there."""
    p.add_argument("model", help="embedded alias, hub name or local folder")
    p.add_argument("corpus", help='a .txt file (one text per line) or .jsonl file ({"text": ...} per line)')
    add_out(p, out)
    p.add_argument("--batch-size", type=count, default=8, help="texts per forward, grouped by length (default: 8)")
    if after_batch_size is not None:
        after_batch_size(p)
    p.add_argument("--max-length", type=count, default=None, help="truncate each text to this many tokens")
    add_loading_args(p, backend=False)
    if after_loading is not None:
        after_loading(p)
    p.add_argument("--add-bos", action="store_true", help="prepend a BOS token to each text")
    if after_add_bos is not None:
        after_add_bos(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


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
    """Refuse a path whose folder does not exist, before any model runs."""
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
