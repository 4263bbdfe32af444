"""Where every view gets its capture: the server's models, its bounded capture cache, the folder where
background jobs leave long captures, and the opening head of a capture (memoised).

One :class:`Captures` is made per app (no module globals). The model runs once per (model, text,
BOS, target, generation): a second "Run model" on the same text is a cache hit. A long text is
captured by a background job in another process (run_view): the job writes the capture with
``Capture.save`` into ``folder`` and the server adopts the file into its cache on first use.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import attnviz
from attnviz.analysis.coref import STOP_WORDS
from attnviz.workflows.runner import max_positions

from .cache import CaptureCache, capture_key
from .common import text_limit, word_of

FILE_PREFIX = "file:"
BACKGROUND_NEW_TOKENS = 64  # a generation of more new tokens runs as a background job
PRONOUNS = {"it", "he", "she", "they", "him", "her", "them", "它", "他", "她", "它们", "他们", "她们"}


# ---------------------------------------------------------------- about a model
def wants_bos(model: str) -> bool:
    """Whether the page prepends a BOS by default: for a decoder whose tokenizer starts a text with
    no special token, so that its attention sink is not the text's first word."""
    if model.startswith(FILE_PREFIX):
        return False
    try:
        loaded, tokenizer = attnviz.load_model(model)
    except attnviz.AttnvizError:
        return False
    if getattr(loaded.config, "is_encoder_decoder", False) or not loaded.can_generate():
        return False
    ids = tokenizer("a")["input_ids"]
    return not ids or ids[0] not in set(getattr(tokenizer, "all_special_ids", []))


def is_encoder_decoder(model: str) -> bool:
    """Whether the page should offer a target text for this model (False when it cannot tell)."""
    if model.startswith(FILE_PREFIX) or model in attnviz.EMBEDDED_MODELS:
        return False
    try:
        return bool(attnviz.load_model(model)[0].config.is_encoder_decoder)
    except attnviz.AttnvizError:
        return False


@contextlib.contextmanager
def layer_progress(model: torch.nn.Module, on_layer: Callable[[int, int], None] | None) -> Iterator[None]:
    """Call ``on_layer(done, layers)`` as each transformer layer of ``model`` finishes a forward (the
    layers: every element of a ModuleList of ``…Layer``/``…Block`` modules); the hooks go afterwards."""
    if on_layer is None:
        yield
        return
    layers = [
        child
        for module in model.modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0
        for child in module
        if type(child).__name__.endswith(("Layer", "Block"))
    ]
    done = [0]

    def hook(*_args) -> None:
        done[0] += 1
        on_layer(done[0], len(layers))

    handles = [layer.register_forward_hook(hook) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


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

    def n_tokens(self, model: str, text: str, new_tokens: int | None = None) -> int:
        """How many tokens the capture of ``text`` (and ``new_tokens`` more) will hold (0 for a capture file)."""
        self.check_model(model)
        if model.startswith(FILE_PREFIX):
            return 0
        _, tokenizer = attnviz.load_model(model)
        return len(tokenizer(text)["input_ids"]) + (new_tokens or 0)

    def long_job(self, model: str, text: str, new_tokens: int | None, background_from: int) -> bool:
        """Whether this run goes to a background job: more than ``background_from`` tokens, or more new
        tokens than a request should wait for — unless it cannot fit the model (then the request fails
        at once with the library's message)."""
        if model.startswith(FILE_PREFIX):
            return False
        n = self.n_tokens(model, text, new_tokens)
        limit = max_positions(attnviz.load_model(model)[0].config)
        if limit is not None and n > limit:
            return False
        return n > background_from or (new_tokens or 0) > BACKGROUND_NEW_TOKENS

    # -- getting a capture
    def cached(self, key: str) -> attnviz.Capture | None:
        """The capture of ``key`` if the server holds it, or a background job left its file (adopted
        into the cache then, the file removed)."""
        cap = self.cache.get(key)
        if cap is not None:
            return cap
        path = self.job_file(key)
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
        on_layer: Callable[[int, int], None] | None = None,
    ) -> attnviz.Capture:
        """The capture of (model, text): one forward, or with ``new_tokens`` the generation that continues
        ``text`` (greedy, so a capture dropped from the cache comes back the same). ``on_layer(done, layers)``
        follows the model's layers as they run."""
        self.check_model(model)
        key = self.key(model, text, bos, target, new_tokens)
        cap = self.cached(key)
        if cap is None:
            cap = self._compute(model, text, bos, target, new_tokens, on_layer)
            self.cache.put(key, cap)
        return cap

    def _compute(self, model, text, bos, target, new_tokens, on_layer) -> attnviz.Capture:
        max_tokens = self.max_tokens
        if model.startswith(FILE_PREFIX):
            if new_tokens:
                raise attnviz.InputError(
                    "a capture file holds one text and no model; pick a model in the list to generate"
                )
            cap = attnviz.load(self.files[model])
            if cap.text != text:
                raise attnviz.InputError("a capture file holds one text; pick a model in the list to run another text")
            return cap
        loaded, tokenizer = attnviz.load_model(model)
        if new_tokens:
            n = len(tokenizer(text)["input_ids"]) + new_tokens
            # the model's own limit: attnviz.generate says how many new tokens fit
            if max_tokens is not None and n > max_tokens:
                raise attnviz.InputTooLongError(
                    f"The prompt and {new_tokens:,} new tokens make {n:,} tokens; this dashboard shows at most "
                    f"{max_tokens:,}. Ask for fewer new tokens or shorten the prompt, or generate in a script "
                    "(attnviz.generate) and open the saved file with --capture."
                )
            with layer_progress(loaded, on_layer):
                return attnviz.generate(model, text, max_new_tokens=new_tokens, add_bos=bos).capture
        target = target if loaded.config.is_encoder_decoder else None
        limit, who = text_limit(loaded.config, max_tokens, model)
        for what, piece in (("text", text), ("target", target or "")):
            n = len(tokenizer(piece)["input_ids"]) if piece.strip() else 0
            if limit is not None and n > limit:
                raise attnviz.InputTooLongError(
                    f"The {what} has {n:,} tokens; {who} at most {limit:,}. Shorten the {what}"
                    + (
                        ", or capture it in a script (attnviz.capture) and open the file with --capture."
                        if who.startswith("this dashboard")
                        else " (a longer text needs a model with a longer context)."
                    )
                )
        with layer_progress(loaded, on_layer):
            return attnviz.capture(model, text, add_bos=bos, target=target)

    def save_for_server(self, request: dict, on_layer: Callable[[int, int], None] | None = None) -> None:
        """In a background job: capture ``request`` (the page's store) and leave it in ``folder`` for the
        server, written under a temporary name and renamed, so the server never reads half a file."""
        key = self.key(*self.request_args(request))
        if self.job_file(key).exists():
            return
        cap = self.get(*self.request_args(request), on_layer=on_layer)
        partial = self.folder / f"{key}.{threading.get_ident()}.partial"
        cap.save(partial)
        partial.replace(self.job_file(key))

    @staticmethod
    def request_args(store: dict) -> tuple:
        return store["model"], store["text"], bool(store.get("bos")), store.get("target"), store.get("generate")

    def from_store(self, store: dict | None) -> attnviz.Capture | None:
        """The capture the page's store names (None before the first run)."""
        return None if not store else self.get(*self.request_args(store))

    def self_part(self, store: dict | None, part: str | None) -> attnviz.Capture | None:
        """The capture narrowed to one self-attention part (what the analyses read)."""
        cap = self.from_store(store)
        return None if cap is None else cap.select(part if len(cap.parts) > 1 else None)

    def opening_head(self, store: dict, part: str, view: attnviz.Capture, query: int) -> tuple[int, int]:
        """``default_head(view, query)``, computed once per (capture, part, query): running the same text
        again reuses it."""
        return self.derived(store, ("opening head", part, query), lambda: default_head(view, query))

    def derived(self, store: dict, what: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()``'s result for the capture the store names, computed once per ``what`` while it is
        among the last 256 results and the tensors among them hold at most ``cache_bytes / 4``."""
        memo = (self.key(*self.request_args(store)), *what)
        with self._adopt:
            value = self._derived.get(memo)
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


def _nbytes(value: Any) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0
