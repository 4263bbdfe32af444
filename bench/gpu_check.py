"""The GPU check: what has never run on a GPU, run in one command, in under 8 minutes, as one table.

Steps, in this order, each with its own time budget (a step that raises or runs past its budget is a
row with its error, and the check goes on; nothing starts after ``--total-s`` seconds, default 470):

  - ``tests``: ``pytest tests/test_gpu.py`` (in a subprocess);
  - ``capture-bench`` / ``generation-bench``: ``bench/capture_overhead.py`` and
    ``bench/generation_overhead.py`` in bfloat16 on sdpa, and again on flash-attention when
    ``flash_attn`` is importable (subprocesses; their whole output goes to the log);
  - ``smollm2``: a long capture, SmolLM2-135M (``attnviz.load_model("smollm2")``) at 8,192 tokens;
  - ``llama``: a random model shaped like Llama-3-8B (32 layers, d_model 4096, 32 heads, 8 KV heads,
    vocabulary 128,256; 8.0 B parameters, 16 GB in bfloat16), built on the GPU, captured at 4,096,
    16,384 and 32,768 tokens on three layers (``layers=[0, 16, 31]``).

A long capture keeps its tensors on the device (``keep_on_device=True``) and is validated there on
every query row; its row gives the capture's seconds, the peak GPU memory of the capture
(``torch.cuda.max_memory_allocated``), the overhead (capture ÷ the plain forward of the same ids)
and the validation's largest absolute error. A bench's row gives its step's seconds and the ratio it
reports (a goal it misses is noted, not a failure, unless its tokens differ from ``model.generate``).

Exit status: 0 every step ran, 1 a step failed (its error is in the table), 3 no CUDA here (nothing
ran; said in one line at once). ``--device cpu --quick`` runs the whole flow on the CPU at small sizes
(256 tokens, a tiny random Llama) as a smoke test.

    python bench/gpu_check.py --out gpu-check.md              # on a CUDA machine (make gpu-check)
    python bench/gpu_check.py --device cpu --quick --only smollm2,llama
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import platform
import signal
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


@dataclass
class Row:
    """One line of the table."""

    what: str
    tokens: int | None = None
    seconds: float | None = None
    peak_gb: float | None = None
    ratio: str = "-"
    max_error: float | None = None
    result: str = "ok"
    failed: bool = False


@dataclass
class Step:
    """``run()`` returns the row's measured fields (any of ``Row``'s but ``what``); ``seconds``
    defaults to the step's own wall time."""

    key: str
    what: str
    budget_s: float
    run: Callable[[], dict[str, Any]] = field(repr=False)


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
                    fields = step.run()
                row = Row(step.what, **fields)
            except StepTimeout:
                row = Row(step.what, result=f"ran past its budget of {budget:.3g} s", failed=True)
            except Exception as err:  # noqa: BLE001 - any error is this step's row; the check goes on
                row = Row(step.what, result=one_line(err), failed=True)
            if row.seconds is None:
                row.seconds = time.monotonic() - t0
        rows.append(row)
        echo(f"{'FAILED' if row.failed else 'done'} {step.what} ({time.monotonic() - t0:.1f} s): {row.result}")
        if after_each is not None:
            after_each()
    return rows


def format_table(rows: list[Row]) -> str:
    """The rows as a Markdown table (so that it goes into the README as printed)."""

    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    lines = [
        "| step | tokens | seconds | peak GPU GB | overhead × | validation max error | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tokens = "-" if r.tokens is None else f"{r.tokens:,}"
        result = ("FAILED: " if r.failed else "") + r.result.replace("|", "/")
        lines.append(
            f"| {r.what} | {tokens} | {num(r.seconds, '.1f')} | {num(r.peak_gb, '.2f')} | {r.ratio} | "
            f"{num(r.max_error, '.1e')} | {result} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- subprocess steps
class Log:
    """Every subprocess's whole output, appended to one file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.write_text("")

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(f"$ {' '.join(cmd)}  (exit {proc.returncode})\n{proc.stdout}{proc.stderr}\n")
        return proc


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def tests_step(log: Log) -> dict[str, Any]:
    proc = log.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py"])
    summary = last_line(proc.stdout).strip("= ")
    return {"result": summary or f"pytest exit {proc.returncode}", "failed": proc.returncode != 0}


def parse_capture_bench(stdout: str) -> tuple[int, str]:
    """(the largest n, 'capture ×r') from capture_overhead.py's table: rows "n plain× attnviz× eager× | …"."""
    rows = [line.split() for line in stdout.splitlines()]
    rows = [r for r in rows if len(r) > 4 and r[0].isdigit() and r[4] == "|"]
    if not rows:
        raise ValueError("no table row in bench/capture_overhead.py's output (see the log)")
    n, _, ratio, eager = rows[-1][:4]
    return int(n), f"{ratio} (eager+oa {eager})"


def parse_generation_bench(stdout: str) -> dict[str, tuple[int, str, bool]]:
    """{model: (positions, 'off ×paired (wall ×w)', same tokens)} from generation_overhead.py's table:
    rows "model prompt new same plain_s | off_paired med min wall | …"."""
    found = {}
    for line in stdout.splitlines():
        r = line.split()
        if len(r) > 9 and r[1].isdigit() and r[2].isdigit() and r[5] == "|":
            found[r[0]] = (int(r[1]) + int(r[2]), f"{r[6]} (wall {r[9]})", r[3] == "yes")
    if not found:
        raise ValueError("no table row in bench/generation_overhead.py's output (see the log)")
    return found


def bench_args(device: str, dtype: str, attn: str) -> list[str]:
    return ["--device", device, "--dtype", dtype, "--attn", attn]


def capture_bench_step(log: Log, device: str, dtype: str, attn: str, quick: bool) -> dict[str, Any]:
    small = ["--sizes", "32", "--repeats", "1"] if quick else []
    proc = log.run([sys.executable, "bench/capture_overhead.py", *bench_args(device, dtype, attn), *small])
    if proc.returncode != 0:
        return {"result": f"exit {proc.returncode}: {last_line(proc.stderr)}", "failed": True}
    n, ratio = parse_capture_bench(proc.stdout)
    return {"tokens": n, "ratio": ratio, "result": "GPT-2 small, all layers; the whole table in the log"}


def generation_bench_step(log: Log, device: str, dtype: str, attn: str, quick: bool) -> dict[str, Any]:
    small = ["--models", "gpt2", "--new-tokens", "4", "--rounds", "1"] if quick else ["--rounds", "3"]
    cmd = [sys.executable, "bench/generation_overhead.py", *bench_args(device, dtype, attn), "--no-peak", *small]
    proc = log.run(cmd)
    missed = [line.removeprefix("MISSED ") for line in proc.stdout.splitlines() if line.startswith("MISSED ")]
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not missed):
        return {"result": f"exit {proc.returncode}: {last_line(proc.stderr)}", "failed": True}
    found = parse_generation_bench(proc.stdout)
    differ = [m for m in missed if "tokens differ" in m]
    ratios = "; ".join(f"{model} {ratio}" for model, (_, ratio, _) in found.items())
    note = "; ".join(missed) if missed else "goals met"
    return {"tokens": max(n for n, _, _ in found.values()), "ratio": ratios, "result": note, "failed": bool(differ)}


# ---------------------------------------------------------------- in-process long captures
class Built:
    """A model built by the first step that needs it and shared by the later ones; a failed build is
    remembered, not tried again."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build, self.model, self.error = build, None, ""

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


def smollm2(device: str, dtype: str) -> Any:
    import attnviz

    model, _ = attnviz.load_model("smollm2", device=device, dtype=dtype, attn_implementation="sdpa")
    return model


def llama_8b_shape(device: str, dtype: str, quick: bool) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    if quick:  # a tiny random Llama: the same code path at a size a CPU runs in seconds
        config = LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            vocab_size=1000,
        )
    else:
        config = LlamaConfig(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=32768,
            vocab_size=128256,
        )
    torch.manual_seed(0)
    with torch.device(device):  # the weights are made where they run (16 GB of bfloat16: no host copy)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    return model.eval()


def long_capture_step(model: Built, n: int, layers: list[int] | None) -> dict[str, Any]:
    import torch

    import attnviz

    m = model.get()
    on_gpu = m.device.type == "cuda"

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(m.device)

    ids = torch.randint(0, m.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n)).to(m.device)
    with torch.no_grad():
        m(input_ids=ids, use_cache=False)  # warm up the kernels and the allocator at this size
        sync()
        t0 = time.perf_counter()
        m(input_ids=ids, use_cache=False)
        sync()
        plain_s = time.perf_counter() - t0
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(m.device)
    t0 = time.perf_counter()
    cap = attnviz.capture(m, input_ids=ids, layers=layers, keep_on_device=True)
    sync()
    cap_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(m.device) / 2**30 if on_gpu else None
    assert isinstance(cap, attnviz.Capture)
    report = cap.validate()
    worst = max((r["max_abs_error"] for r in report.rows), default=None)
    kept = cap.nbytes / 2**30
    return {
        "tokens": n,
        "seconds": cap_s,
        "peak_gb": peak,
        "ratio": f"{cap_s / plain_s:.2f}",
        "max_error": worst,
        "result": f"plain forward {plain_s:.2f} s; {len(cap.layer_indices())} layers kept, {kept:.2f} GB; "
        + ("validation passed" if report.passed else f"validation FAILED: {str(report).splitlines()[0]}"),
        "failed": not report.passed,
    }


def build_step(model: Built, device: str) -> dict[str, Any]:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)  # the peak of the build alone
    m = model.get()
    params = sum(p.numel() for p in m.parameters())
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    count = f"{params / 1e9:.2f} B" if params >= 1e8 else f"{params / 1e6:.2f} M"
    return {"peak_gb": peak, "result": f"{count} parameters, {m.dtype}, on {m.device}"}


# ---------------------------------------------------------------- the check
def build_steps(args: argparse.Namespace, log: Log) -> list[Step]:
    dev, dt, quick = args.device, args.dtype, args.quick
    backends = ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])
    steps = [Step("tests", "pytest tests/test_gpu.py", 300 if quick else 120, lambda: tests_step(log))]
    for attn in backends:
        steps.append(
            Step(
                "capture-bench",
                f"capture_overhead.py {dt} {attn}",
                240 if quick else 60,
                partial(capture_bench_step, log, dev, dt, attn, quick),
            )
        )
        steps.append(
            Step(
                "generation-bench",
                f"generation_overhead.py {dt} {attn}",
                120,
                partial(generation_bench_step, log, dev, dt, attn, quick),
            )
        )
    smol = Built(lambda: smollm2(dev, dt))
    steps.append(
        Step(
            "smollm2",
            "SmolLM2-135M long capture",
            120 if quick else 60,
            lambda: long_capture_step(smol, 256 if quick else 8192, None),
        )
    )
    llama = Built(lambda: llama_8b_shape(dev, dt, quick))
    name = "tiny random Llama" if quick else "random Llama-3-8B shape"
    steps.append(Step("llama", f"{name}: build", 60, lambda: build_step(llama, dev)))
    layers = [0, 3] if quick else [0, 16, 31]
    for n, budget in ((256, 60),) if quick else ((4096, 30), (16384, 40), (32768, 60)):
        steps.append(Step("llama", f"{name}, layers {layers}", budget, partial(long_capture_step, llama, n, layers)))
    wanted = {k.strip() for k in args.only.split(",")} if args.only else None
    return [s for s in steps if wanted is None or s.key in wanted]


STEP_KEYS = ["tests", "capture-bench", "generation-bench", "smollm2", "llama"]


def machine(device: str) -> str:
    import torch
    import transformers

    where = (
        torch.cuda.get_device_name(device) if device.startswith("cuda") else f"CPU ({platform.processor() or 'cpu'})"
    )
    flash = (
        "flash-attn " + importlib.import_module("flash_attn").__version__
        if importlib.util.find_spec("flash_attn")
        else "no flash-attn"
    )
    return f"{where}; torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, {flash}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu_check.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:1 …, or cpu with --quick")
    parser.add_argument(
        "--dtype", choices=["float32", "float16", "bfloat16"], help="default: bfloat16 on a GPU, float32 on the CPU"
    )
    parser.add_argument("--out", type=Path, help="also write the table to this file (and the log beside it, .log)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the flow")
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
    head = f"attnviz GPU check{' (quick)' if args.quick else ''}, {args.dtype}, on {machine(args.device)}"
    print(head, flush=True)
    rows = run_steps(build_steps(args, log), args.total_s, after_each=release, echo=lambda s: print(s, flush=True))
    failed = sum(r.failed for r in rows)
    foot = f"{len(rows)} steps, {failed} failed, {time.monotonic() - t0:.0f} s in all"
    text = f"{head}\n\n{format_table(rows)}\n\n{foot}\n"
    print("\n" + text)
    if args.out:
        args.out.write_text(text)
    return FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
