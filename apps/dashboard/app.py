"""The attnviz dashboard: ``create_app(...) -> Dash`` and ``run(...)``.

Per-session state (the capture's key, selections) lives in ``dcc.Store`` in the browser; captures
live server-side in :class:`Captures` (a cache bounded in bytes, created per app: no module globals).
The model runs once per (model, text); every other control recomputes only the visible view from
the cached Q/K/V, and each callback ships just that view's numbers.

Each view is one module holding its layout and its callbacks (``*_view.py``); component ids are in
``ids.py``; a callback's failure becomes a page message through ``errors.shows_errors``. This module
only builds the app: the captures, the layout, and each view's callbacks.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import shutil
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import flask
from dash import Dash, Input, Output

import attnviz
from attnviz.assets import FONTS

from . import space_view, url_state
from .captures import BACKGROUND_FROM, FILE_PREFIX, Captures, wants_bos
from .ids import ID, view_id
from .layout import VIEWS, build_layout
from .registry import Server, views

DEFAULT_MODELS = {
    "smollm2": "SmolLM2-135M-Instruct — Llama-style decoder, GQA (embedded)",
    "minilm": "all-MiniLM-L6-v2 — BERT encoder (embedded)",
}
DEFAULT_TEXT = "我家的小猫很可爱，它很好动。"


def background_manager(folder: str | None = None):
    """Where long jobs (a probe set, a long text's capture, head importance, "Apply to the model") run
    beside the server: Dash's background callbacks on a diskcache, so the page stays usable and the job
    can be cancelled. A job is a fork of the threaded server: :mod:`.forking` makes that safe."""
    from .forking import ForkSafeManager  # deferred: diskcache and multiprocess, for a served app only

    if folder is None:  # a folder of its own, removed when the server exits (a job's process does not run atexit)
        folder = tempfile.mkdtemp(prefix="attnviz-jobs-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return ForkSafeManager(folder)


def few_malloc_arenas() -> None:
    """At most two glibc malloc arenas in this process. The server answers each request in a thread of
    its own, and glibc gives threads arenas that keep what they freed: 8 sessions grew the server by
    ~530 MB outside its caches (bench/soak.py), 16 MB with two arenas. Elsewhere than glibc: nothing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, 2)


M_ARENA_MAX = -8  # glibc's mallopt parameter


def serve_fonts(app: Dash) -> None:
    """Serve the library's fonts (:data:`attnviz.assets.FONTS`, the one copy of the CJK face) at the page's
    ``assets/fonts/``, where ``assets/fonts.css`` and ``assets/figure_image.js`` fetch them."""

    def font(name: str):
        return flask.send_from_directory(FONTS, name, mimetype="font/woff2" if name.endswith(".woff2") else None)

    route = app.config.routes_pathname_prefix + app.config.assets_url_path.strip("/") + "/fonts/<name>"
    app.server.add_url_rule(route, endpoint="attnviz_fonts", view_func=font)


def create_app(
    models: dict[str, str] | None = None,
    *,
    default_model: str | None = None,
    capture_file: str | None = None,
    stats_file: str | None = None,
    corpus_file: str | None = None,
    cache_bytes: int = 1 << 30,
    max_tokens: int | None = None,
    background_from: int = BACKGROUND_FROM,
) -> Dash:
    """Build the dashboard.

    - ``models``: ``{name: label}`` offered in the page (names go to ``attnviz.load_model``).
    - ``default_model``: the one selected at start (added to ``models`` if missing).
    - ``capture_file``: a capture saved with ``Capture.save()``, opened at start.
    - ``stats_file``: a table of ``attnviz stats`` (.parquet/.csv) the head-statistics view shows.
    - ``corpus_file``: texts (.txt, one per line, or .jsonl) the Q·K space view embeds beside this text
      and the head atlas reads (without one, the atlas reads the shipped English probe sentences).
    - ``cache_bytes``: bound on the server-side captures (least recently used go first).
    - ``max_tokens``: longest text the page accepts; None: the model's own limit (its position table).
      Long texts stay browsable: the heatmap shows a pooled overview and zooms to exact windows.
    - ``background_from``: texts of more tokens are captured, and their heavy views (model view, head
      statistics, rollout, validation) computed, by background jobs (progress, Cancel).
    """
    models = dict(models or DEFAULT_MODELS)
    startup_errors: list[str] = []  # each file that could not be opened, said together when the page opens
    default_text = DEFAULT_TEXT
    if default_model is not None and default_model not in models:
        models = {default_model: default_model, **models}
    selected = default_model or next(iter(models))
    corpus = None
    if stats_file is not None:
        from attnviz.analysis import read_table  # deferred: pandas, for a server started with a statistics table

        try:
            corpus = read_table(stats_file)
        except attnviz.AttnvizError as err:
            startup_errors.append(f"Could not open the statistics file: {err}")
    texts = None
    if corpus_file is not None:
        try:
            texts = space_view.read_corpus(corpus_file)
        except (attnviz.AttnvizError, OSError) as err:
            startup_errors.append(f"Could not open the corpus file: {err}")
    files: dict[str, str] = {}  # the page's name of a capture file -> its path, which stays on the server
    opened = None
    if capture_file is not None:
        value = FILE_PREFIX + Path(capture_file).name
        files[value] = str(Path(capture_file).resolve())
        try:
            opened = attnviz.load(capture_file)
            models = {value: f"capture file: {Path(capture_file).name} ({opened.model.get('name')})", **models}
            selected, default_text = value, opened.text
        except attnviz.AttnvizError as err:
            startup_errors.append(f"Could not open the capture file: {err}")
    few_malloc_arenas()
    captures = Captures(
        models, cache_bytes=cache_bytes, max_tokens=max_tokens, files=files, background_from=background_from
    )
    if opened is not None:
        captures.cache.put(captures.key(selected, opened.text), opened)

    app = Dash(
        __name__,
        title="attnviz",
        suppress_callback_exceptions=True,
        background_callback_manager=background_manager(),
    )
    serve_fonts(app)
    options = [{"label": label, "value": name} for name, label in models.items()]
    bos = wants_bos(selected) if selected in models else False
    # a function: each page load gets its own id, which says whose background jobs are whose
    app.layout = lambda: build_layout(options, selected, default_text, bos=bos, page=uuid.uuid4().hex)

    @app.callback(*[Output(view_id(key), "style") for key, _ in VIEWS], Input(ID.tabs, "value"))
    def show_view(tab):
        return [{"display": "block"} if key == tab else {"display": "none"} for key, _ in VIEWS]

    server = Server(
        captures,
        table=corpus,
        table_name=Path(stats_file).name if stats_file is not None else "",
        texts=texts,
        corpus_name=Path(corpus_file).name if corpus_file is not None else "",
        startup_error=" ".join(startup_errors),
    )
    for view in views():  # each view's callbacks, as it registered itself
        view.register(app, server)
    url_state.register(app, captures)  # the view in the address: reload, back/forward and links open it
    return app


LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def run(
    *,
    models: Sequence[str] | None = None,
    capture_file: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8050,
    model: str | None = None,
    stats_file: str | None = None,
    corpus_file: str | None = None,
) -> None:
    """Start the dashboard (debug off), loading the first model so the page opens ready.

    The page offers exactly ``models`` (default: the embedded ones; ``model`` is one more way to name
    one): a name the browser sends that is not among them is refused, never loaded. A host other
    than this machine's loopback prints a warning — the dashboard has no authentication."""
    names = list(models or []) + ([model] if model is not None and model not in (models or []) else [])
    offered = {name: DEFAULT_MODELS.get(name, name) for name in names} if names else dict(DEFAULT_MODELS)
    app = create_app(offered, capture_file=capture_file, stats_file=stats_file, corpus_file=corpus_file)
    if host not in LOCAL_HOSTS:
        print(
            f"attnviz: WARNING: serving on {host}, reachable from other machines. The dashboard has no "
            "authentication: anyone who reaches this address can run the models it offers on this machine. "
            "Prefer the default 127.0.0.1 with an SSH tunnel (ssh -L 8050:127.0.0.1:8050 host).",
            file=sys.stderr,
            flush=True,
        )
    if capture_file is None:
        name = next(iter(offered))
        print(f"attnviz: loading {name} …", flush=True)
        try:
            attnviz.load_model(name)
        except attnviz.AttnvizError as err:
            print(f"attnviz: {err} (the page will say so too)", flush=True)
    print(f"attnviz dashboard: http://{host}:{port}/", flush=True)
    app.run(host=host, port=port, debug=False)
