"""Where every view gets its capture: the server's models, its bounded capture cache, the folder where
background jobs leave long captures, and the opening head of a capture (memoised).

One :class:`Captures` is made per app (no module globals). The model runs once per (model, text,
BOS, target, generation): a second "Run model" on the same text is a cache hit. A long text is
captured by a background job in another process (run_view): the job writes the capture with
``Capture.save`` into ``folder`` and the server adopts the file into its cache on first use.

The page's store names a capture by its key and holds what the user chose (model, BOS, new tokens),
never the text: the text reaches the server once, with the Run that tokenizes it (once) and captures
it. A key whose capture the cache let go is a message on the page, not a silent second run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

import attnviz
from attnviz.analysis import STOP_WORDS
from attnviz.models import Encoded, describe_model, max_positions, tokenize, writes_text

from .cache import CaptureCache, capture_key
from .common import text_limit, word_of
from .jobs import Jobs, Progress

FILE_PREFIX = "file:"
BACKGROUND_FROM = 1024  # a text of more tokens is captured, and its heavy views computed, by background jobs
BACKGROUND_NEW_TOKENS = 64
STALE_REQUEST_S = 120  # a job reads its request within seconds of the Run: one left this long never will be  # a generation of more new tokens runs as a background job
PRONOUNS = {"it", "he", "she", "they", "him", "her", "them", "它", "他", "她", "它们", "他们", "她们"}


# ---------------------------------------------------------------- about a model
def wants_bos(model: str) -> bool:
    """Whether the page prepends a BOS by default: for a decoder whose tokenizer starts a text with
    no special token, so that its attention sink is not the text's first word."""
    if model.startswith(FILE_PREFIX):
        return False
    try:  # the config and tokenizer only: the weights load when the page runs the model
        config, tokenizer = describe_model(model)
    except attnviz.AttnvizError:
        return False
    if getattr(config, "is_encoder_decoder", False) or not writes_text(config):
        return False
    return not starts_with_special(tokenizer)


def starts_with_special(tokenizer) -> bool:
    """Whether ``tokenizer`` starts a text with a special token of its own (MiniLM's [CLS]): then a BOS box
    changes nothing; SmolLM2's starts with the text's first word."""
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] in set(getattr(tokenizer, "all_special_ids", []))


def is_encoder_decoder(model: str) -> bool:
    """Whether the page should offer a target text for this model (False when it cannot tell)."""
    if model.startswith(FILE_PREFIX) or model in attnviz.EMBEDDED_MODELS:
        return False
    try:
        return bool(getattr(describe_model(model)[0], "is_encoder_decoder", False))
    except attnviz.AttnvizError:
        return False


# ---------------------------------------------------------------- the opening head
def default_query(cap: attnviz.Capture) -> int:
    """The token the lab opens on: the last pronoun of the text (它, it …), else the last word."""
    words = [w for w in cap.words if w.token_stop > w.token_start and w.char_end > w.char_start]
    for w in reversed(words):
        if w.text.lower() in PRONOUNS:
            return w.token_start
    return (words[-1] if words else cap.words[-1]).token_start


def content_words_before(cap: attnviz.Capture, q: int) -> list[int]:
    """The words before word ``q`` that may be its antecedent: not the first (a decoder's sink), not a
    stop word, punctuation or a special token."""
    return [
        i
        for i, w in enumerate(cap.words[:q])
        if i > 0
        and w.text.lower() not in STOP_WORDS
        and any(ch.isalnum() for ch in w.text)
        and w.char_end > w.char_start
    ]


def default_head(cap: attnviz.Capture, query: int) -> tuple[int, int]:
    """Open on the head where the query word puts the most weight on one earlier content word
    (not the first word, which decoders use as a sink, nor a stop word or punctuation): for a
    pronoun, usually a coreference head.

    Only the query word's rows are computed (``Capture.attention_rows``: from a word averaged over its
    tokens), and each layer's ``[head, key token]`` rows are summed into ``[head, candidate word]`` by one
    ``index_add`` over a token→candidate index built once — no Python loop over words per layer."""
    q = word_of(cap, query)
    keys = content_words_before(cap, q)
    layers = cap.layer_indices()
    if not keys:
        return min(layers), 0
    word = cap.words[q]
    rows = list(range(word.token_start, word.token_stop))
    column = torch.full((cap.layer(layers[0]).n_keys,), len(keys), dtype=torch.long)  # len(keys): no candidate
    for j, i in enumerate(keys):
        column[cap.words[i].token_start : cap.words[i].token_stop] = j
    best = []
    for layer in layers:
        weights = cap.attention_rows(layer, rows).mean(1).cpu().float()  # [head, key token]
        per_word = torch.zeros(weights.shape[0], len(keys) + 1).index_add_(1, column, weights)
        best.append(per_word[:, :-1].max(-1).values)  # the head's weight on its strongest candidate
    scores = torch.stack(best)  # [layer, head]
    flat = int(scores.flatten().argmax())  # the first maximum in (layer, head) order
    return layers[flat // scores.shape[1]], flat % scores.shape[1]


# ---------------------------------------------------------------- the server's captures
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
        self._adopt = threading.Lock()
        self._derived: OrderedDict[tuple, Any] = OrderedDict()
        self.background_from = background_from  # a longer capture's heavy views are background jobs
        self.jobs = Jobs(workers)

    # -- keys and checks
    @staticmethod
    def key(model: str, text: str, bos: bool = False, target: str | None = None, new_tokens: int | None = None) -> str:
        return capture_key(
            model
            + ("\x00bos" if bos else "")
            + (f"\x00target\x00{target}" if target else "")
            + (f"\x00generate\x00{new_tokens}" if new_tokens else ""),
            text,
        )

    def check_model(self, model: str) -> None:
        """The browser may send anything: only the server's own models are loaded."""
        if model not in self.models:
            raise attnviz.InputError(
                f"{str(model)[:80]!r} is not one of this dashboard's models; choose one in the list "
                "(start the dashboard with --model NAME to offer others)"
            )

    def job_file(self, key: str) -> Path:
        """Where a background job leaves the capture of ``key``."""
        return self.folder / f"{key}.attnviz"

    def request_file(self, key: str, run: str) -> Path:
        """Where the server leaves the request of one Run's background job (the text stays on the server):
        one file per Run, so that two pages running the same text each have their own."""
        return self.folder / f"{key}.{run}.request.json"

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
    def cached(self, key: str) -> attnviz.Capture | None:
        """The capture of ``key`` if the server holds it, or a background job left its file (adopted
        into the cache then, the file removed)."""
        cap = self.cache.get(key)
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

    def leave_request(self, request: Request) -> str:
        """Write ``request`` where a background job (another process) reads it, and return the Run's name
        for it (the page's job sends only the key and that name). What jobs that died left (their pid,
        half a file, a request no job will read) goes first."""
        for pid_file in self.folder.glob("*.job.pid"):
            key = pid_file.name.removesuffix(".job.pid")
            if self.job_state(key) == "stopped":
                self.clean_job(key)
        for stale in self.folder.glob("*.request.json"):  # a job cancelled before it began: none reads it now
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > STALE_REQUEST_S:
                    stale.unlink()
        run = uuid.uuid4().hex[:12]
        partial = self.folder / f"{request.key}.{run}.request.partial"
        partial.write_text(json.dumps(request.to_json()))
        partial.replace(self.request_file(request.key, run))
        return run

    def save_for_server(self, key: str, run: str, on_progress: Callable[[int, int], None] | None = None) -> None:
        """In a background job: capture the request the server left for ``run`` under ``key`` and leave the capture
        in ``folder`` for the server, written under a temporary name and renamed, so the server never
        reads half a file."""
        if self.job_file(key).exists():
            return
        pid_file = self.folder / f"{key}.job.pid"  # the server's watch: is the job's process still alive?
        pid_file.write_text(str(os.getpid()))  # before the request goes: the job is never neither
        try:
            request = Request.from_json(json.loads(self.request_file(key, run).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as err:
            pid_file.unlink()
            raise CaptureGone(f"the background job's request is gone ({type(err).__name__}); press Run again") from err
        with contextlib.suppress(OSError):  # read: a job cancelled or killed from here on leaves no request
            self.request_file(key, run).unlink()
        try:
            cap = self.run(request, on_progress)
            partial = self.folder / f"{key}.{os.getpid()}.{threading.get_ident()}.partial"
            cap.save(partial)
            partial.replace(self.job_file(key))
        finally:
            with contextlib.suppress(OSError):
                pid_file.unlink()

    def job_state(self, key: str) -> str:
        """Where the background capture of ``key`` is: ``"done"`` (its capture is here or in its file),
        ``"running"`` (its process is alive), ``"starting"`` (requested, not begun), or ``"stopped"``
        (its process ended without a capture: cancelled, killed, out of memory)."""
        if self.cache.get(key) is not None or self.job_file(key).exists():
            return "done"
        pid_file = self.folder / f"{key}.job.pid"
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            return "starting" if any(self.folder.glob(f"{key}.*.request.json")) else "stopped"
        try:
            alive = psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        except psutil.Error:
            alive = False
        return "running" if alive else "stopped"

    def clean_job(self, key: str) -> None:
        """Remove what a stopped background capture of ``key`` left: its request, its pid, half a file."""
        left = [*self.folder.glob(f"{key}.*.request.json"), *self.folder.glob(f"{key}.*.partial")]
        for path in [self.folder / f"{key}.job.pid", *left]:
            with contextlib.suppress(OSError):
                path.unlink()

    def from_store(self, store: dict | None) -> attnviz.Capture | None:
        """The capture the page's store names by its key (None before the first run). The server does not
        hold the text, so it never runs the model again here: a capture file's capture comes back from
        the file; any other capture the cache let go is a message that asks for a new run."""
        if not store:
            return None
        key = store.get("key")
        cap = self.cached(key) if isinstance(key, str) else None
        if cap is not None:
            return cap
        model = store.get("model")
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

    def known(self, store: dict, what: tuple) -> Any:
        """The derived result ``what`` of the store's capture if the server holds it, else None."""
        with self._adopt:
            value = self._derived.get((store["key"], *what))
            if value is not None:
                self._derived.move_to_end((store["key"], *what))
            return value

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
        memo = (store["key"], *what)
        value = self.known(store, what)
        if value is None:
            value = compute()
        with self._adopt:
            self._derived[memo] = value
            self._derived.move_to_end(memo)
            while len(self._derived) > 256 or (
                len(self._derived) > 1 and sum(_nbytes(v) for v in self._derived.values()) > self.cache.max_bytes // 4
            ):
                self._derived.popitem(last=False)
        return value


class CaptureGone(attnviz.AttnvizError):
    """The page names a capture the server no longer holds (the page says so; the model is not run again)."""


@dataclass
class Request:
    """What one Run asks for: it stays on the server (the page holds its ``key``). ``encoded``: the text
    tokenized once, as the capture reads it; ``n_tokens``: what the page's limits count."""

    model: str
    text: str
    bos: bool = False
    target: str | None = None
    new_tokens: int | None = None
    encoded: Encoded | None = None
    n_tokens: int = 0

    @property
    def key(self) -> str:
        return Captures.key(self.model, self.text, self.bos, self.target, self.new_tokens)

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict) -> Request:
        request = cls(**data)
        if request.encoded is not None:
            ids, offsets, tokens = request.encoded
            request.encoded = (list(ids), [tuple(o) for o in offsets], list(tokens))  # type: ignore[misc]
        return request


def _nbytes(value: Any) -> int:  # a tensor's bytes, or what a result says it holds (a Summary's .nbytes)
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return int(getattr(value, "nbytes", 0) or 0)


def _ignore(_done: int, _total: int, _what: str) -> None:  # progress nobody polls: a result inside the request
    return None
