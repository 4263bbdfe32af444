"""One page of the load-and-soak bench (``bench/soak.py``): the texts it runs, the random interactions it
makes (``Session``), what it checks after each (its own capture: the store's key, the status line's token
count, the heatmap title's n; an empty message line) and what every page saw (``Stats``), and the RSS
sampler (``Memory``)."""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

import psutil
from dash_http import Call, Page

TABS = ["heatmap", "model", "stats", "rollout", "validation", "coref", "lab"]
HEAVY = ["model", "stats", "rollout", "validation"]
KINDS = ["run", "layer", "head", "units", "tab", "zoom", "cancel view job", "cancel capture"]
WEIGHTS = [4, 2, 2, 1, 5, 2, 2, 1]
ERROR_WORDS = ("Something went wrong", " failed: ", "stopped (", "Traceback")
GONE = "no longer on the server"
ALREADY = (
    "already captured — shown"  # a Run of a text the server holds: the page says so (run_outputs.ALREADY_CAPTURED)
)


# ---------------------------------------------------------------- the model and the texts
def tiny_folder(root: Path) -> str:
    """A tiny random Llama with 8,192 positions reading SmolLM2's tokenizer (as tests/conftest.py's
    llama_folder), saved as a folder the dashboard loads by name."""
    from transformers import AutoTokenizer  # deferred: as attnviz itself

    import attnviz  # deferred: the parent process never loads a model
    from attnviz.workflows.capture.models import embedded_source

    folder = root / "tiny-llama-8k"
    if not folder.exists():
        source, kwargs = embedded_source("smollm2")  # its tokenizer only, no weights
        tokenizer = AutoTokenizer.from_pretrained(str(source), **kwargs)
        model = attnviz.testing.tiny_model("llama", vocab_size=len(tokenizer), max_position_embeddings=8192)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return str(folder)


def text_of(tokenizer, n: int, variant: int = 0) -> str:
    """A text of ``n`` tokens (± the cut's merge), its words depending on ``variant`` so texts differ."""
    base = " ".join(
        f"In paragraph {i + 1000 * variant}, the cat chased the mouse because it was hungry, and the mouse hid in "
        f"the box because it was small. Chapter {i} of story {variant} ends here."
        for i in range(1, 500)
    )
    return tokenizer.decode(tokenizer(base)["input_ids"][:n])


class Text:
    def __init__(self, captures, model: str, text: str, bos: bool) -> None:
        request = captures.request(model, text, bos)  # the page's own tokenization: its token count
        self.text, self.key, self.n = text, request.key, request.n_tokens


# ---------------------------------------------------------------- one session
class Session:
    """One page driven through ``steps`` random interactions; what it saw goes to ``stats``."""

    def __init__(
        self, name: str, base: str, texts: list[Text], seed: int, stats: Stats, timeout: float, initial: Text | None
    ) -> None:
        self.name, self.texts, self.rng, self.stats, self.initial = name, texts, random.Random(seed), stats, initial
        self.page = Page(base, on_call=lambda call: stats.call(self, call), timeout=timeout, job_timeout=timeout)
        self.text: Text | None = None  # the text whose capture the page shows
        self.expect_stopped = False  # a job of this page was killed: its "stopped" message is expected
        self.kind = "load"
        self.timeout = timeout
        self.fresh: list[Text] = []  # long texts of its own, for "cancel capture"

    # -- the steps
    def start(self) -> None:
        """Load the page: it runs its default text (``initial``) as it opens."""
        self.page.start()
        self.text = self.initial
        self.check()

    def step(self) -> None:
        self.kind = kind = self.rng.choices(KINDS, WEIGHTS)[0] if self.text is not None else "run"
        t0 = time.perf_counter()
        getattr(self, kind.replace(" ", "_"))()
        self.stats.step(kind, time.perf_counter() - t0)
        self.check()

    def run(self, text: Text | None = None) -> None:
        text = text or self.rng.choice(self.texts)
        self.page.props[("text-input", "value")] = text.text
        self.page.click("run-button")
        self.opened(text)
        self.poll_view_jobs()

    def opened(self, text: Text) -> None:
        """After a run of ``text``: the page shows it, or (a failed or cancelled run, reported as such) still
        its previous capture; any other capture is cross-talk, which ``check`` reports."""
        key = (self.page.get("capture-store", "data") or {}).get("key")
        if key == text.key or self.text is None or key != self.text.key:
            self.text = text
        else:
            self.stats.count("runs that kept the previous capture (failed or cancelled)")

    def choose(self, cid: str) -> None:
        options = [o["value"] for o in self.page.get(cid, "options") or []]
        if options:
            self.page.set_props({(cid, "value"): self.rng.choice(options)})
            self.poll_view_jobs()

    def layer(self) -> None:
        self.choose("layer-select")

    def head(self) -> None:
        self.choose("head-select")

    def units(self) -> None:
        now = self.page.get("word-level", "value")
        self.page.set_props({("word-level", "value"): "words" if now == "tokens" else "tokens"})
        self.poll_view_jobs()

    def tab(self, tab: str | None = None) -> None:
        self.page.set_props({("view-tabs", "value"): tab or self.rng.choice(TABS)})
        self.poll_view_jobs()

    def zoom(self) -> None:
        if self.page.get("view-tabs", "value") != "heatmap":
            self.tab("heatmap")
        view = self.page.get("overview-view", "data") or {}
        rows = view.get("rows") or [0, 64, 1]
        cells = max(2, (rows[1] - rows[0]) // max(rows[2], 1))
        lo = self.rng.randrange(0, cells - 1)
        hi = self.rng.randrange(lo + 1, cells)
        zoom = {"xaxis.range[0]": lo - 0.5, "xaxis.range[1]": hi + 0.5, "yaxis.range[0]": hi + 0.5}
        zoom["yaxis.range[1]"] = lo - 0.5
        self.page.set_props({("overview-zoom", "data"): zoom})  # what the page's clientside filter passes on
        self.poll_view_jobs()

    def cancel_view_job(self) -> None:
        """Open a heavy tab; if its job runs for this page, cancel it at once, then press Compute."""
        self.page.set_props({("view-tabs", "value"): self.rng.choice(HEAVY)})
        if self.page.get("view-job-poll", "disabled") is False:
            self.page.click("view-job-cancel")
            said = str(self.page.get("view-job-text", "children") or "")
            self.stats.count("view jobs cancelled")
            if "Cancelled" not in said and "Nothing was running" not in said:
                self.stats.error(self, f"after Cancel the job bar says {said[:120]!r}")
            self.page.click("view-job-start")
        self.poll_view_jobs()

    def cancel_capture(self) -> None:
        """Run a long text; if it is a background capture, cancel it after a moment."""
        # a text no page ran yet (else the server holds its capture and it opens at once)
        text = self.fresh.pop() if self.fresh else self.rng.choice(self.texts)
        self.page.props[("text-input", "value")] = text.text
        self.page.click("run-button", wait_background=False)
        if self.page.jobs:
            time.sleep(self.rng.uniform(0.0, 0.3))
            self.page.click("capture-cancel")
            self.stats.count("captures cancelled")
        self.page.wait_jobs()
        self.opened(text)  # a job that finished before the Cancel opens its capture
        self.poll_view_jobs()

    def poll_view_jobs(self) -> None:
        """The page's dcc.Interval: while it is on, tick it (the job bar's poll) until the jobs end."""
        deadline = time.monotonic() + self.timeout
        while self.page.get("view-job-poll", "disabled") is False:
            if time.monotonic() > deadline:
                self.stats.error(self, "a view job did not finish in time")
                return
            time.sleep(0.5)
            ticks = (self.page.get("view-job-poll", "n_intervals") or 0) + 1
            self.page.set_props({("view-job-poll", "n_intervals"): ticks})

    # -- the checks
    def check(self) -> None:
        message = str(self.page.get("message", "children") or "")
        if GONE in message:
            self.stats.count("captures evicted (Run again)")
            self.page.props[("message", "children")] = ""
            if self.text is not None:
                self.run(self.text)
            return
        if ALREADY in message:  # a run of a text the page already shows: said, not an error
            self.stats.count("runs of a text already captured (said on the page)")
            self.page.props[("message", "children")] = ""
            message = ""
        if message:
            self.stats.error(self, f"message line: {message[:160]!r}")
        if self.text is None:
            return
        key = (self.page.get("capture-store", "data") or {}).get("key")
        if key != self.text.key:
            self.stats.cross(self, f"the store holds {key}, not its own {self.text.key}")
        status = str(self.page.get("status", "children") or "")
        if f" {self.text.n} tokens" not in status:
            self.stats.cross(self, f"status line {status[:100]!r} does not say {self.text.n} tokens")
        if self.page.get("view-tabs", "value") == "heatmap":  # a hidden view keeps the figure it last drew
            title = figure_title(self.page.get("heatmap-graph", "figure"))
            named = token_counts(title)
            if named and named != {self.text.n}:
                self.stats.cross(self, f"heatmap title {title[:110]!r} names {sorted(named)}, not {self.text.n}")


def figure_title(figure) -> str:
    layout = (figure or {}).get("layout", {}) if isinstance(figure, dict) else {}
    title = layout.get("title")
    return str(title.get("text", "") if isinstance(title, dict) else title or "")


def token_counts(title: str) -> set[int]:
    """The text's token counts a title names: an overview's or a window's "of N × N tokens"."""
    return {int(m.replace(",", "")) for pair in re.findall(r"of ([\d,]+) × ([\d,]+) tokens", title) for m in pair}


# ---------------------------------------------------------------- what every session saw
class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.polls = 0
        self.errors: list[str] = []
        self.crosstalk: list[str] = []
        self.counts: dict[str, int] = {}
        self.seconds: dict[str, list[float]] = {}

    def call(self, session: Session, call: Call) -> None:
        with self.lock:
            self.requests += 1 + call.polls
            self.polls += call.polls
        if call.status == 599:
            self.error(
                session, f"a background job still ran after {session.timeout:.0f} s (its process stuck?): cancelled"
            )
        elif call.status not in (200, 204):
            self.error(session, f"{call.output[:60]} answered HTTP {call.status}")
        words = [w for w in ERROR_WORDS if w in call.body]
        if words and not (session.expect_stopped and words == ["stopped ("]):
            self.error(session, f"{call.output[:60]} answered {words}: {call.body[:200]!r}")

    def step(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.seconds.setdefault(kind, []).append(seconds)

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def error(self, session: Session, what: str) -> None:
        with self.lock:
            self.errors.append(f"{session.name} ({session.kind}): {what}")

    def cross(self, session: Session, what: str) -> None:
        with self.lock:
            self.crosstalk.append(f"{session.name} ({session.kind}): {what}")


class Memory(threading.Thread):
    """Samples this process's RSS (the server's: it runs in a thread here) every ``every`` seconds."""

    def __init__(self, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.every, self.peak, self.stop = every, 0, threading.Event()
        self.process = psutil.Process()

    def rss(self) -> int:
        return self.process.memory_info().rss

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.peak = max(self.peak, self.rss())


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")
