"""Where every view gets its capture: the server's models and its bounded capture cache, a long text's
capture by a background job, and what the views derive from a capture (memoised).

One :class:`Captures` is made per app (no module globals). The model runs once per (model, text,
BOS, target, generation): a second "Run model" on the same text is a cache hit. A long text is
captured by a background job in another process (run_view): the job writes the capture with
``Capture.save`` into ``folder`` (``capture_files.JobFolder``) and the server adopts the file into its
cache on first use. Beside it: what the page knows of a model before it runs it (``model_facts``), the
head a capture opens on (``opening``), the memo of derived results (``derived``).

The page's store names a capture by its key and holds what the user chose (model, BOS, new tokens),
never the text: the text reaches the server once, with the Run that tokenizes it (once) and captures
it. A key whose capture the cache let go is a message on the page, not a silent second run.

Keys are never paths: every key is a digest the server makes (``cache.digest_key``); a key the page sends
is used only when it has that form (``capture_files.check_key``), and a file is read — or removed — only
for a key whose background job this server started (``Captures.started``) or a capture file it was started
with (``Captures.files``). Anything else is the page's message (:class:`UnknownCapture`), never a file.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attnviz
from attnviz.models import max_positions, tokenize

from .cache import CaptureCache, is_key
from .capture_files import UNKNOWN, CaptureGone, JobFolder, Request, UnknownCapture, check_key, request_key
from .common import text_limit
from .derived import Derived
from .jobs import Jobs, Progress
from .model_facts import FILE_PREFIX, is_encoder_decoder, starts_with_special, wants_bos
from .opening import content_words_before, default_head, default_query

__all__ = [  # the model facts, the opening head and the request are imported from here too
    "BACKGROUND_FROM",
    "BACKGROUND_NEW_TOKENS",
    "FILE_PREFIX",
    "CaptureGone",
    "Captures",
    "Request",
    "UnknownCapture",
    "check_key",
    "content_words_before",
    "default_head",
    "default_query",
    "is_encoder_decoder",
    "starts_with_special",
    "wants_bos",
]

BACKGROUND_FROM = 1024  # a text of more tokens is captured, and its heavy views computed, by background jobs
BACKGROUND_NEW_TOKENS = 64  # a generation of more new tokens runs as a background job


class Captures:
    """The captures of one app: ``get`` runs a model at most once per request key; ``from_store`` reads
    the page's store; ``opening_head`` memoises the default head per (capture, query), ``derived`` any result of a capture."""

    def __init__(
        self,
        models: dict[str, str],
        *,
        cache_bytes: int = 1 << 30,
        max_tokens: int | None = None,
        files: dict[str, str] | None = None,
        folder: str | Path | None = None,
        background_from: int = BACKGROUND_FROM,
        workers: int = 2,
    ) -> None:
        self.models = models
        self.cache = CaptureCache(cache_bytes)
        self.max_tokens = max_tokens
        self.files = dict(files or {})  # the page's name of a capture file -> its path (never sent to the page)
        if folder is None:  # a folder of its own: removed with this object, at the latest when the server exits
            folder = tempfile.mkdtemp(prefix="attnviz-captures-")
            weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
        self.folder = Path(folder)
        self.job_files = JobFolder(self.folder)
        self._adopt = threading.Lock()
        self.started: set[str] = set()  # the keys of the background captures this server started (their files)
        self.results = Derived(cache_bytes // 4)  # derived results: at most a quarter of the captures' bound
        self.background_from = background_from  # a longer capture's heavy views are background jobs
        self.jobs = Jobs(workers)

    # -- keys and checks
    key = staticmethod(request_key)

    def check_model(self, model: str) -> None:
        """The browser may send anything: only the server's own models are loaded."""
        if not isinstance(model, str) or model not in self.models:
            raise attnviz.InputError(
                f"{str(model)[:80]!r} is not one of this dashboard's models; choose one in the list "
                "(start the dashboard with --model NAME to offer others)"
            )

    def job_file(self, key: str) -> Path:
        """Where a background job leaves the capture of ``key``."""
        return self.job_files.job_file(key)

    def request_file(self, key: str, run: str) -> Path:
        """Where the server leaves the request of one Run's background job."""
        return self.job_files.request_file(key, run)

    def request(
        self, model: str, text: str, bos: bool = False, target: str | None = None, new_tokens: int | None = None
    ) -> Request:
        """What one Run asks for, with its text tokenized once (the count that the page's limits and the
        choice of a background job read is the capture's own input): the page's limit is checked here."""
        self.check_model(model)
        request = Request(model, text, bos, target, new_tokens)
        if model.startswith(FILE_PREFIX):
            return request
        loaded, tokenizer = attnviz.load_model(model)
        if new_tokens:  # the prompt tokenized once: attnviz.generate reads these tokens (tokenized=)
            request.encoded = tokenize(tokenizer, [text], None, None, model, bos, what="prompt")[0]
            request.n_tokens = len(request.encoded[0]) + new_tokens
            # the model's own limit: attnviz.generate says how many new tokens fit
            if self.max_tokens is not None and request.n_tokens > self.max_tokens:
                raise attnviz.InputTooLongError(
                    f"The prompt and {new_tokens:,} new tokens make {request.n_tokens:,} tokens; this dashboard shows "
                    f"at most {self.max_tokens:,}. Ask for fewer new tokens or shorten the prompt, or generate in a "
                    "script (attnviz.generate) and open the saved file with --capture."
                )
            return request
        request.target = target if loaded.config.is_encoder_decoder else None
        request.encoded = tokenize(tokenizer, [text], None, None, model, bos)[0]
        request.n_tokens = len(request.encoded[0])
        limit, who = text_limit(loaded.config, self.max_tokens, model)
        counts = [("text", request.n_tokens)]
        if request.target and request.target.strip():
            counts.append(("target", len(tokenizer(text_target=request.target)["input_ids"])))
        for what, n in counts:
            if limit is not None and n > limit:
                raise attnviz.InputTooLongError(
                    f"The {what} has {n:,} tokens; {who} at most {limit:,}. Shorten the {what}"
                    + (
                        ", or capture it in a script (attnviz.capture) and open the file with --capture."
                        if who.startswith("this dashboard")
                        else " (a longer text needs a model with a longer context)."
                    )
                )
        return request

    def long_job(self, request: Request, background_from: int) -> bool:
        """Whether this run goes to a background job: more than ``background_from`` tokens, or more new
        tokens than a request should wait for — unless it cannot fit the model (then the request fails
        at once with the library's message)."""
        if request.model.startswith(FILE_PREFIX):
            return False
        limit = max_positions(attnviz.load_model(request.model)[0].config)
        if limit is not None and request.n_tokens > limit:
            return False
        return request.n_tokens > background_from or (request.new_tokens or 0) > BACKGROUND_NEW_TOKENS

    # -- getting a capture
    def held(self, key: object) -> attnviz.Capture | None:
        """The capture of ``key`` if the cache holds it (the Image tab's, which have no files): any value
        the page sends that is not a key of the server's form is a miss, never an error or a lookup."""
        return self.cache.get(key) if is_key(key) else None  # type: ignore[arg-type]

    def cached(self, key: str) -> attnviz.Capture | None:
        """The capture of ``key`` if the server holds it, or a background job this server started left its
        file (adopted into the cache then, the file removed). ``key``: checked (:func:`check_key`); a file is
        read, or removed, only for a key in :attr:`started` — never for a key the page made up."""
        cap = self.cache.get(check_key(key))
        if key not in self.started:
            return cap
        path = self.job_file(key)
        if cap is not None:
            if path.exists():  # a job saved a capture the server had by then (two pages ran the text)
                with contextlib.suppress(OSError):
                    path.unlink()
            return cap
        with self._adopt:
            cap = self.cache.get(key)
            if cap is None and path.exists():
                cap = attnviz.load(path)
                self.cache.put(key, cap)
                with contextlib.suppress(OSError):  # the tensors may map the file: where it cannot go yet, it stays
                    path.unlink()
        return cap

    def get(
        self,
        model: str,
        text: str,
        bos: bool = False,
        target: str | None = None,
        new_tokens: int | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> attnviz.Capture:
        """The capture of (model, text): one forward, or with ``new_tokens`` the generation that continues
        ``text`` (greedy). ``on_progress(done, total)``: the library's, as the model's attention calls are recorded."""
        self.check_model(model)
        cap = self.cached(self.key(model, text, bos, target, new_tokens))
        return cap if cap is not None else self.run(self.request(model, text, bos, target, new_tokens), on_progress)

    def run(self, request: Request, on_progress: Callable[[int, int], None] | None = None) -> attnviz.Capture:
        """The capture of ``request`` (computed unless the server holds it), put in the cache."""
        cap = self.cached(request.key)
        if cap is None:
            cap = self._compute(request, on_progress)
            self.cache.put(request.key, cap)
        return cap

    def _compute(self, request: Request, on_progress) -> attnviz.Capture:
        model, text = request.model, request.text
        if model.startswith(FILE_PREFIX):
            if request.new_tokens:
                raise attnviz.InputError(
                    "a capture file holds one text and no model; pick a model in the list to generate"
                )
            cap = attnviz.load(self.files[model])
            if cap.text != text:
                raise attnviz.InputError("a capture file holds one text; pick a model in the list to run another text")
            return cap
        tokenized = [request.encoded] if request.encoded is not None else None
        if request.new_tokens:
            return attnviz.generate(
                model,
                text,
                max_new_tokens=request.new_tokens,
                add_bos=request.bos,
                tokenized=tokenized,
                on_progress=on_progress,
            ).capture
        cap = attnviz.capture(
            model, text, add_bos=request.bos, target=request.target, tokenized=tokenized, on_progress=on_progress
        )
        assert isinstance(cap, attnviz.Capture)  # one text, one capture
        return cap

    # -- a long text's background capture
    def leave_request(self, request: Request) -> str:
        """Write ``request`` where a background job (another process) reads it, and return the Run's name
        for it (the page's job sends only the key and that name). What jobs that died left (their pid,
        half a file, a request no job will read) goes first."""
        for key in self.job_files.started():
            if key in self.started and self.job_state(key) == "stopped":
                self.clean_job(key)
        with self._adopt:
            self.started.add(request.key)  # its capture's file is one this server may read and remove
        return self.job_files.leave(request)

    def save_for_server(self, key: str, run: str, on_progress: Callable[[int, int], None] | None = None) -> None:
        """In a background job: capture the request the server left for ``run`` under ``key`` and leave the capture
        in ``folder`` for the server, written under a temporary name and renamed, so the server never
        reads half a file. ``on_progress(done, total)``: attnviz's, as the capture runs."""
        if self.job_file(key).exists():  # another page's job captured the same text first: its request goes too
            self.job_files.drop(key, run)
            return
        request = self.job_files.take(key, run)
        try:
            self.job_files.leave_capture(key, self.run(request, on_progress))
        finally:
            self.job_files.finished(key)

    def job_state(self, key: str) -> str:
        """Where the background capture of ``key`` is: ``"done"`` (its capture is here or in its file),
        ``"running"`` (its process is alive), ``"starting"`` (requested, not begun), or ``"stopped"``
        (its process ended without a capture: cancelled, killed, out of memory). A key whose job this
        server did not start is :class:`UnknownCapture` (the page's message): no file is looked at."""
        if self.cache.get(check_key(key)) is not None:
            return "done"
        if key not in self.started:
            raise UnknownCapture(
                "This page watches a background capture this server did not start; press Run model to capture the text."
            )
        if self.job_file(key).exists():
            return "done"
        return self.job_files.state(key)

    def clean_job(self, key: str) -> None:
        """Remove what a stopped background capture of ``key`` left: its request, its pid, half a file —
        only for a job this server started (any other key removes nothing)."""
        if check_key(key) in self.started:
            self.job_files.clean(key)

    # -- the page's capture
    def from_store(self, store: dict | None) -> attnviz.Capture | None:
        """The capture the page's store names by its key (None before the first run). The server does not
        hold the text, so it never runs the model again here: a capture file's capture comes back from
        the file; any other capture the cache let go is a message that asks for a new run."""
        if not store:
            return None
        if not isinstance(store, dict):
            raise UnknownCapture(UNKNOWN)
        key = check_key(store.get("key"))  # a key of the server's form, or the page's message: never a path
        cap = self.cached(key)
        if cap is not None:
            return cap
        model = store.get("model")  # a capture file the server was started with: its path is the server's own
        if isinstance(model, str) and model in self.files and not store.get("generate"):
            cap = attnviz.load(self.files[model])
            if self.key(model, cap.text) == key:
                self.cache.put(key, cap)
                return cap
        raise CaptureGone(
            "This page's capture is no longer on the server (it keeps the most recent captures, up to "
            f"{self.cache.max_bytes / 2**30:.2g} GB, and forgets them when it restarts). Press Run model to capture "
            "the text again."
        )

    def self_part(self, store: dict | None, part: str | None) -> attnviz.Capture | None:
        """The capture narrowed to one self-attention part (what the analyses read)."""
        cap = self.from_store(store)
        return None if cap is None else cap.select(part if len(cap.parts) > 1 else None)

    # -- what the views derive from a capture
    def known(self, store: dict, what: tuple) -> Any:
        """The derived result ``what`` of the store's capture if the server holds it, else None."""
        return self.results.known(store["key"], what)

    def in_background(
        self, store: dict, page: str, what: tuple, label: str, n_tokens: int, compute: Callable[[Progress], Any]
    ) -> Any:
        """The derived result ``what`` of the store's capture (as :meth:`derived`), where computing it
        reads every head of a capture of ``n_tokens``: computed in the request up to ``background_from``
        tokens; beyond, by a background job (:class:`Jobs`) that ``page`` waits for — None until it is
        done (the page's job bar shows its progress). ``compute(progress)`` calls ``progress(done, total,
        what)`` as it goes; ``label`` says what it computes. Raises :class:`JobStopped` when this page
        cancelled the job or saw it fail."""
        value = self.known(store, what)
        if value is not None:
            return value
        if n_tokens <= self.background_from:
            return self.derived(store, what, lambda: compute(_ignore))

        def work(progress: Progress) -> None:
            self.derived(store, what, lambda: compute(progress))

        self.jobs.ask((store["key"], *what), page, label, work)
        return self.known(store, what)  # a job that finished at once

    def opening_head(self, store: dict, part: str, view: attnviz.Capture, query: int) -> tuple[int, int]:
        """``default_head(view, query)``, computed once per (capture, part, query): running the same text
        again reuses it."""
        return self.derived(store, ("opening head", part, query), lambda: default_head(view, query))

    def derived(self, store: dict, what: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()``'s result for the capture the store names, computed once per ``what`` while it is
        among the last 256 results and the tensors among them hold at most ``cache_bytes / 4``."""
        return self.results.derived(store["key"], what, compute)


def _ignore(_done: int, _total: int, _what: str) -> None:  # progress nobody polls: a result inside the request
    return None
