"""What a long command does around its run: over processes (torchrun, accelerate launch), each warning on
one line, the report on rank 0 only, a signal's stop as exit status 75, the libraries' loading bars only on a
terminal (:func:`loading_bars`)."""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..errors import InputError, Interrupted
from .options import check_writable
from .preflight import preflight

EXIT_INTERRUPTED = 75  # sysexits' EX_TEMPFAIL: stopped by a signal after checkpointing; resubmit with --resume
R = TypeVar("R")  # what a run over processes returns (a table, a probe set's result)


def error_line(err: BaseException) -> str:
    """An error as the one line the command line prints."""
    return "error: " + " ".join(str(err).split())


def shown(value: object) -> str:
    """A capture's text, token or model name as the terminal may print it: control characters (an escape
    sequence that would recolour or rewrite the screen, a carriage return, a bidirectional override) written
    as their escapes (``\\x1b``, ``\\u202e``), the rest as it is."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in text)


def written_as_csv(frame: Any, path: str, **kwargs: Any) -> str:
    """``frame.to_csv(path)`` written atomically (:func:`attnviz.files.atomic_path`): a failed write leaves the
    previous file as it was, a folder or a missing folder is one line."""
    from ..files import atomic_path  # deferred with the rest of the library

    with atomic_path(path, what="the table") as tmp:
        frame.to_csv(tmp, **kwargs)
    return path


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
    with loading_bars(args):
        return in_processes(run, report, rank=lambda df: df.attrs["rank"])


def loading_bars(args) -> contextlib.AbstractContextManager:
    """The libraries' progress bars while a command loads its model (transformers' "Loading weights", a GGUF
    file's "Converting and de-quantizing GGUF tensors"): drawn only where someone watches — stderr a
    terminal — or asked for with ``--progress``; off with ``--quiet``. Entered after :func:`preflight`, so an
    argument refused early imports no transformers for it. A log or a pipe gets no carriage-return bars."""
    if getattr(args, "quiet", False) or not (getattr(args, "progress", False) or sys.stderr.isatty()):
        return quiet_loading()
    return contextlib.nullcontext()


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


def in_processes(run: Callable[[], R], report: Callable[[R], None], *, rank: Callable[[R], int] | None = None) -> int:
    """A run that may be spread over processes (torchrun, accelerate launch): ``run()`` with each
    warning on one line, then ``report`` of its result on the process of rank 0 only (``rank``: the
    result's own, else :func:`~attnviz.processes.process_rank`). A run stopped by a signal
    (:class:`Interrupted`, its checkpoint written) is one line and exit status :data:`EXIT_INTERRUPTED`;
    the process group, if any, is ended whatever happens
    (:func:`~attnviz.processes.end_processes`)."""
    interrupted = False
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line  # restored by catch_warnings
            result = run()
        if rank is None:
            from ..processes import process_rank  # deferred: torch loads with the run

            mine = process_rank()
        else:
            mine = rank(result)
        if mine == 0:
            report(result)
        return 0
    except Interrupted as err:
        interrupted = True  # every process stopped too (they agree before each batch): no barrier to wait at
        if err.rank == 0:
            print(error_line(err), file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        from ..processes import end_processes  # deferred: torch loads with the run

        end_processes(barrier=not interrupted)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr (``warning: …``), not Python's two-line form."""
    print(f"warning: {message}", file=sys.stderr)
