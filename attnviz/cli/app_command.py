"""``attnviz app``: the dashboard, its files checked before the page serves."""

from __future__ import annotations

import itertools
import os
import sys

from ..errors import AttnvizError, InputError

#: the texts of ``attnviz app --corpus FILE`` the dashboard reads (apps/dashboard/space_view.py's
#: CORPUS_TEXTS, not imported: the checks answer before dash loads)
APP_CORPUS_TEXTS = 500


def _check_app_corpus(path: str) -> None:
    """``attnviz app --corpus FILE`` read as ``attnviz atlas`` reads a corpus, as far as the dashboard
    reads it (its first :data:`APP_CORPUS_TEXTS` texts): a file with no text, a bad JSONL line among
    them or a table's suffix is refused before the page serves, in the corpus commands' words."""
    from ..analysis import check_corpus, read_texts  # deferred with the rest of the library

    try:
        check_corpus(path)  # not there, no text in it, a bad first line
        for _ in itertools.islice(read_texts(path), APP_CORPUS_TEXTS):
            pass  # a bad line among the texts the dashboard reads
    except InputError as err:  # a file that is not UTF-8 too: read_texts says so
        raise InputError(f"attnviz app --corpus: {err}") from err


def _check_app_capture(path: str) -> None:
    """``attnviz app --capture FILE`` opened as the page will open it: a file that is no readable capture
    is refused in one line before the page serves (not a traceback at start-up)."""
    from .. import load  # deferred with the rest of the library

    try:
        load(path)
    except AttnvizError as err:  # CaptureFileError: not a capture, a broken one, a newer format
        raise InputError(f"attnviz app --capture: {err}") from err


def cmd_app(args) -> int:
    """``attnviz app``: start the dashboard."""
    for option, path in (("--capture", args.capture), ("--stats", args.stats), ("--corpus", args.corpus)):
        if path is not None and not os.path.isfile(path):
            raise InputError(f"attnviz app {option}: no file {path!r}; give the path of one (or leave {option} out)")
    if args.capture is not None:
        _check_app_capture(args.capture)
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
