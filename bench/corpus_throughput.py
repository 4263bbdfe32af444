"""Corpus statistics' throughput, as ratios measured in the same run (issue #11; the machines are noisy).

1. Tokens per second of ``attnviz.analysis.corpus_stats(model, texts, tok, progress=False)`` against
   a plain batched forward over the same texts: the SAME batches (``length_batches`` with the
   model's tokenizer, ``--batch-size`` texts, padding ≤ 10 %), right-padded as attnviz pads them
   (zeros, ``attention_mask``), ``model(input_ids=..., attention_mask=...[, use_cache=False])`` under
   ``torch.no_grad``. The plain batches are built before the clock starts (the baseline is the
   forward alone); tokenizing and batching them is timed apart and shown as ``+tok`` (the ratio
   against forward + tokenizing). corpus_stats does everything itself: it tokenizes (once: the
   encoding that sorts a text by length is the one its batch uses), runs each batch under the taps
   and, as each layer returns, recomputes that layer's weights for the whole padded batch at once,
   checks the sampled rows against the kernel's output and adds the statistics to float64 sums
   (``attnviz.workflows.corpus.batched``); after the last layer's attention it stops the forward (what
   the model computes after it feeds no statistic; the plain forward runs whole, so the ratio
   counts that saving: ``--whole-forward`` makes corpus_stats run every forward to its end, to
   see the ratio without it). Both count the same real
   (unpadded) tokens, so the tokens/s ratio is the inverse of the time ratio. Time is process CPU
   time at ``--threads`` torch threads over ``--rounds`` interleaved rounds (the order alternates),
   after a warm-up of both on ``WARMUP_TEXTS`` texts; the goal is judged on the median of each
   round's own ratio (the ratio of the medians and of the minima, and the wall-time ratio, are
   shown next to it). That corpus_stats cut the same batches is checked (its texts, tokens and
   padding share against the plain batches'). Then one corpus_stats run per model under cProfile
   (``--no-profile`` skips it) says where its time goes: the model's own forward, the taps, the
   per-layer reduction (recomputed weights and entropy, the check's A·V of the sampled rows, the
   rest: key classes, positions, the detectors' keys, the check's comparison) and the per-batch work
   (tokenizing, the texts' features) —
   shares of the profiled total (the profiler inflates Python-heavy parts).
2. One process against ``--nproc`` processes on this machine: the wall time of
   ``python -m attnviz stats minilm corpus.txt --out a.csv --quiet`` (``OMP_NUM_THREADS`` =
   ``MKL_NUM_THREADS`` = all cores) against ``torchrun --standalone --nproc_per_node N -m attnviz
   stats minilm corpus.txt --out b.csv --quiet`` (cores / N threads each: the same cores in all).
   Each is also timed on a corpus of N texts (one per process): its import, model load and process
   group start, subtracted so that the ratio reflects the work. ``--process-rounds`` interleaved rounds;
   the CSVs must agree within ``CSV_TOLERANCE``. A control row (``--no-control`` drops it) runs
   the one process at 1 thread: how much a second thread gives one process (on a shared machine
   OpenMP threads that wait for a busy core spin, so the 2-thread process can be far slower).
   Its corpus: ``--process-texts`` texts (``--no-processes`` skips this part).

Corpus: ``--texts`` deterministic English-ish sentences (a word list, commas, a seeded RNG;
7–100 words, 10–120 tokens); SmolLM2 (30 layers) takes the first ``--smollm2-texts`` of them.

Goals (issue #11): corpus_stats ≥ 0.9× the plain forward's tokens/s (paired, CPU time) on every
model; the 1- and N-process tables agree within 1e-6. The process speed-up is reported, not judged.
Exit status 1 when a goal is missed (everything is printed first).

    python bench/corpus_throughput.py                                  # both models and the processes
    python bench/corpus_throughput.py --models minilm --rounds 5 --no-processes
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import os
import platform
import pstats
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import attnviz
from attnviz.analysis import corpus_stats
from attnviz.workflows.corpus.corpus import length_batches

GOAL_THROUGHPUT = 0.90
CSV_TOLERANCE = 1e-6
WARMUP_TEXTS = 16
WORDS = (
    "the a of and to in is was that for it with as his on be at by had this not are but from or have an "
    "they which one you were her all she there would their we him been has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may then do first "
    "any my now such like our over man me even most made after also did many before must through back years "
    "where much your way well down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day same another know "
    "while last might us great old year off come since against go came right used take three river garden "
    "lighthouse keeper winter morning letter window station teacher market village bridge mountain kitchen "
    "quietly suddenly carefully however although yesterday tomorrow"
).split()


def make_corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences of 7–100 words from WORDS (commas here and there, a closing mark), seeded."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(7, 100))]
        for j in range(1, len(words) - 1):
            if rng.random() < 0.08:
                words[j] += ","
        words[0] = words[0].capitalize()
        texts.append(" ".join(words) + rng.choice(".....?!"))
    return texts


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(CPU seconds, wall seconds, result)."""
    c0, w0 = time.process_time(), time.perf_counter()
    result = fn()
    return time.process_time() - c0, time.perf_counter() - w0, result


# ------------------------------------------------------------------ part 1: corpus_stats vs forward
def machine() -> str:
    """The CPU these ratios were measured on: the atlas' and the statistics' own work (small operations over
    the weights) and the model's (its GEMMs) do not scale alike from one processor to another, so the same
    code's ratio moves with the CPU (docs/benchmarks.md: 0.76–0.78× and 0.89× on two)."""
    name = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        name = names[0] if names else name
    except OSError:
        pass
    return (
        f"CPU: {name}, {os.cpu_count()} cores; torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} thread(s)"
    )


def plain_batches(model, tok, texts: list[str], batch_size: int) -> list[dict[str, Any]]:
    """The batches corpus_stats cuts (length_batches, the tokenizer's lengths), right-padded as
    attnviz pads them, with the keyword arguments attnviz's capture passes to forward."""
    use_cache = "use_cache" in inspect.signature(model.forward).parameters
    out = []
    for pool in length_batches(iter(texts), lambda t: len(tok(t)["input_ids"]), batch_size):
        for batch in pool:
            rows = [tok(text)["input_ids"] for text, _ in batch]
            n = max(len(r) for r in rows)
            ids = torch.zeros(len(rows), n, dtype=torch.long)
            mask = torch.zeros(len(rows), n, dtype=torch.long)
            for b, row in enumerate(rows):
                ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
                mask[b, : len(row)] = 1
            out.append({"input_ids": ids, "attention_mask": mask, **({"use_cache": False} if use_cache else {})})
    return out


def forward_all(model, batches: list[dict[str, Any]]) -> None:
    with torch.no_grad():
        for inputs in batches:
            model(**inputs)


def profile_breakdown(model, tok, texts: list[str], batch_size: int) -> list[tuple[str, int, float]]:
    """One corpus_stats run under cProfile: (label, indent, profiled seconds) rows."""
    from attnviz.analysis import batch_texts, layer_reduction
    from attnviz.attention import weighted_values
    from attnviz.engine.taps import Recorder
    from attnviz.workflows.corpus import batched

    profiler = cProfile.Profile()
    profiler.enable()
    corpus_stats(model, texts, tok, batch_size=batch_size, progress=False)
    profiler.disable()
    stats: dict = pstats.Stats(profiler).stats  # type: ignore[attr-defined]

    def where(fn) -> tuple:
        code = inspect.unwrap(fn).__code__
        return code.co_filename, code.co_firstlineno, code.co_name

    def cum(fn) -> float:
        return stats[where(fn)][3] if where(fn) in stats else 0.0

    def cum_from(fn, caller) -> float:
        if where(fn) not in stats:
            return 0.0
        return sum(v[3] for c, v in stats[where(fn)][4].items() if c == where(caller))

    import attnviz.workflows.corpus.corpus as corpus_module

    total = cum(corpus_module.corpus_stats)
    count = sum(v[3] for k, v in stats.items() if k[0] == where(corpus_module.corpus_stats)[0] and k[2] == "count")
    add = cum(batched.BatchReducer.add)
    forward = cum(type(model).forward)
    record = cum(Recorder.record)  # the taps, and the reductions they run as each layer returns
    reduce = cum(layer_reduction.reduce_layer)
    weights = cum(layer_reduction._weights_and_entropy) + cum(layer_reduction._weights_then_entropy)
    av = cum_from(weighted_values, layer_reduction.reduce_layer)
    texts_s = (
        cum(batch_texts.BatchTexts.__init__) + cum(batch_texts.BatchTexts.chunk) + cum(batch_texts.BatchTexts.rows)
    )
    check = cum(batched._raise_on_mismatch)
    return [
        ("corpus_stats", 0, total),
        ("lengths: tokenize once (count)", 1, count),
        ("BatchReducer.add (per batch)", 1, add),
        ("model forward, without the taps", 2, forward - record),
        ("attnviz taps (Recorder.record), own", 2, record - reduce),
        ("reduce_layer (in the forward, per layer)", 2, reduce),
        ("recomputed weights and entropy", 3, weights),
        ("check: A·V of the sampled rows", 3, av),
        ("keys, positions, detectors, check", 3, reduce - weights - av),
        ("BatchTexts: offsets, punctuation, pairs", 2, texts_s),
        ("tokenize, pad, sums, verdict, other", 2, add - forward - texts_s - check),
        ("select, reduce, frame, other", 1, total - count - add),
    ]


def bench_model(family: str, n_texts: int, rounds: int, batch_size: int, profile: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    model, tok = attnviz.load_model(family)
    assert callable(tok)
    load_s = time.perf_counter() - t0
    texts = make_corpus(n_texts)
    lengths = [len(tok(t)["input_ids"]) for t in texts]
    batches = plain_batches(model, tok, texts, batch_size)
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["input_ids"].numel() for b in batches)

    def stats_run(which: list[str]):
        return lambda: corpus_stats(model, which, tok, batch_size=batch_size, progress=False)

    warm = texts[:WARMUP_TEXTS]
    forward_all(model, plain_batches(model, tok, warm, batch_size))
    stats_run(warm)()

    modes: dict[str, Callable[[], Any]] = {
        "forward": lambda: forward_all(model, batches),
        "stats": stats_run(texts),
    }
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    tok_cpu: list[float] = []
    frame = None
    for r in range(rounds):
        c, _, _ = timed(lambda: plain_batches(model, tok, texts, batch_size))
        tok_cpu.append(c)
        for mode in list(modes) if r % 2 == 0 else list(modes)[::-1]:
            c, w, result = timed(modes[mode])
            cpu[mode].append(c)
            wall[mode].append(w)
            if mode == "stats":
                frame = result
    assert frame is not None
    same = (
        int(frame["texts"].iloc[0]) == len(texts)
        and int(frame["tokens"].iloc[0]) == real
        and abs(frame.attrs["padding"] - (1 - real / padded)) < 1e-9
    )
    breakdown = profile_breakdown(model, tok, texts, batch_size) if profile else None
    med_cpu = {m: statistics.median(v) for m, v in cpu.items()}
    return {
        "family": family,
        "layers": len(frame["layer"].unique()),
        "heads": int(frame["head"].max()) + 1,
        "load_s": load_s,
        "texts": len(texts),
        "tokens": real,
        "min_len": min(lengths),
        "max_len": max(lengths),
        "batches": len(batches),
        "padding": 1 - real / padded,
        "same": same,
        "cpu": med_cpu,
        "cpu_all": cpu,
        "wall_all": wall,
        "tok_cpu": statistics.median(tok_cpu),
        # tokens/s ratio stats : forward = forward time / stats time, per round
        "paired": statistics.median(f / s for f, s in zip(cpu["forward"], cpu["stats"])),
        "paired_tok": statistics.median((f + t) / s for f, t, s in zip(cpu["forward"], tok_cpu, cpu["stats"])),
        "med": med_cpu["forward"] / med_cpu["stats"],
        "min": min(cpu["forward"]) / min(cpu["stats"]),
        "wall": statistics.median(wall["forward"]) / statistics.median(wall["stats"]),
        "breakdown": breakdown,
    }


# ------------------------------------------------------------------ part 2: 1 process vs N
def torchrun_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def run_cli(cmd: list[str], threads: int, cwd: Path) -> tuple[float, float, str]:
    """(wall seconds, children's CPU seconds, the summary line) of one CLI run."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    summary = next((line for line in done.stderr.splitlines() if " texts, " in line and " tokens (" in line), "?")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, summary


def csv_difference(a: Path, b: Path) -> tuple[float, str]:
    """(largest absolute difference over the numeric columns, what else differs or '')."""
    import numpy as np
    import pandas as pd

    x, y = pd.read_csv(a), pd.read_csv(b)
    if list(x.columns) != list(y.columns) or x.shape != y.shape:
        return float("inf"), f"shapes/columns differ: {x.shape} {list(x.columns)} vs {y.shape} {list(y.columns)}"
    if not (
        x[["layer", "head"]].equals(y[["layer", "head"]]) and x[["texts", "tokens"]].equals(y[["texts", "tokens"]])
    ):
        return float("inf"), "layer/head rows or texts/tokens differ"
    xv, yv = x.to_numpy(dtype=float), y.to_numpy(dtype=float)
    if not np.array_equal(np.isnan(xv), np.isnan(yv)):
        return float("inf"), "NaN in different places"
    diff = np.abs(np.nan_to_num(xv) - np.nan_to_num(yv))
    return float(diff.max()), ""


def bench_processes(n_texts: int, nproc: int, rounds: int, control: bool) -> dict[str, Any]:
    """Wall seconds of the CLI: ``one`` (1 process, all cores' threads), ``many`` (torchrun, cores / N
    threads each) and, with ``control``, ``one1`` (1 process, 1 thread: not the fair comparison, it
    tells how well one process uses its second thread); each on the corpus and on N texts (the start)."""
    cores = os.cpu_count() or 1
    per_process = max(1, cores // nproc)
    work = Path(tempfile.mkdtemp(prefix="attnviz-corpus-bench-"))
    try:
        (work / "corpus.txt").write_text("\n".join(make_corpus(n_texts)) + "\n", encoding="utf-8")
        (work / "tiny.txt").write_text("\n".join(make_corpus(nproc, seed=1)) + "\n", encoding="utf-8")
        one = [sys.executable, "-m", "attnviz", "stats", "minilm"]
        many = [*torchrun_cmd(), "--standalone", "--nproc_per_node", str(nproc), "-m", "attnviz", "stats", "minilm"]
        runs = {
            ("one", "corpus"): (one + ["corpus.txt", "--out", "a.csv", "--quiet"], cores),
            ("many", "corpus"): (many + ["corpus.txt", "--out", "b.csv", "--quiet"], per_process),
            ("one", "tiny"): (one + ["tiny.txt", "--out", "a_tiny.csv", "--quiet"], cores),
            ("many", "tiny"): (many + ["tiny.txt", "--out", "b_tiny.csv", "--quiet"], per_process),
        }
        if control:
            runs[("one1", "corpus")] = (one + ["corpus.txt", "--out", "c.csv", "--quiet"], 1)
            runs[("one1", "tiny")] = (one + ["tiny.txt", "--out", "c_tiny.csv", "--quiet"], 1)
        wall: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
        cpu: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
        summary: dict[tuple[str, str], str] = {}
        diffs: list[float] = []
        problems: list[str] = []
        order = list(runs)
        pairs = [("a.csv", "b.csv"), ("a_tiny.csv", "b_tiny.csv")] + ([("a.csv", "c.csv")] if control else [])
        for r in range(rounds):
            for key in order[r % len(order) :] + order[: r % len(order)]:
                cmd, threads = runs[key]
                w, c, summary[key] = run_cli(cmd, threads, work)
                wall[key].append(w)
                cpu[key].append(c)
            for a, b in pairs:
                d, why = csv_difference(work / a, work / b)
                diffs.append(d)
                if why:
                    problems.append(f"{a} vs {b}: {why}")
        start = {k: (k, "tiny") for k in ("one", "many", "one1")}
        med = {k: statistics.median(v) for k, v in wall.items()}
        labels = [k for k in ("one", "many", "one1") if (k, "corpus") in runs]
        work_s = {k: med[(k, "corpus")] - med[start[k]] for k in labels}

        def paired(k: str) -> float:
            return statistics.median(
                (wall[("many", "corpus")][i] - wall[("many", "tiny")][i]) / (wall[(k, "corpus")][i] - wall[start[k]][i])
                for i in range(rounds)
            )

        return {
            "texts": n_texts,
            "nproc": nproc,
            "cores": cores,
            "threads": {"one": cores, "many": per_process, "one1": 1},
            "cmd": {
                "one": " ".join(["python", *runs[("one", "corpus")][0][1:]]),
                "many": " ".join(["torchrun", *runs[("many", "corpus")][0][len(torchrun_cmd()) :]]),
            },
            "labels": labels,
            "start": start,
            "wall": med,
            "wall_all": wall,
            "cpu": {k: statistics.median(v) for k, v in cpu.items()},
            "work": work_s,
            "ratio_work": {k: work_s["many"] / work_s[k] if work_s[k] > 0 else float("nan") for k in labels},
            "paired": {k: paired(k) for k in labels},
            "ratio_raw": {k: med[("many", "corpus")] / med[(k, "corpus")] for k in labels},
            "summary": summary,
            "max_diff": max(diffs),
            "problems": problems,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------ main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=200, help="MiniLM's corpus (default 200)")
    parser.add_argument("--smollm2-texts", type=int, default=24, help="SmolLM2's corpus: the first N (default 24)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="minilm,smollm2")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in part 1 (default 1)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--process-texts", type=int, default=200, help="part 2's corpus (default 200)")
    parser.add_argument("--process-rounds", type=int, default=2, help="part 2's rounds (default 2)")
    parser.add_argument("--nproc", type=int, default=2, help="processes in part 2 (default 2)")
    parser.add_argument("--no-processes", action="store_true", help="skip part 2 (1 process vs --nproc)")
    parser.add_argument("--no-control", action="store_true", help="part 2 without the 1-process 1-thread control")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile breakdown")
    parser.add_argument("--verbose", action="store_true", help="print every round's seconds")
    parser.add_argument(
        "--whole-forward", action="store_true", help="corpus_stats runs every forward to its end (no early stop)"
    )
    args = parser.parse_args()
    if args.whole_forward:
        import attnviz.workflows.corpus.corpus as corpus_module
        from attnviz.workflows.corpus.batched import BatchReducer

        class WholeForward(BatchReducer):
            def __init__(self, *a: Any, **kw: Any) -> None:
                super().__init__(*a, **kw)
                self.stop_after = None

        corpus_module.BatchReducer = WholeForward  # type: ignore[misc]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    started = time.perf_counter()
    print(machine(), flush=True)

    results = []
    for family in (f.strip() for f in args.models.split(",") if f.strip()):
        if family not in ("minilm", "smollm2"):
            raise SystemExit(f"unknown model {family!r}: choose minilm, smollm2")
        t0 = time.perf_counter()
        n = args.texts if family == "minilm" else args.smollm2_texts
        res = bench_model(family, n, args.rounds, args.batch_size, not args.no_profile)
        results.append(res)
        print(
            f"{family}: {res['layers']} layers × {res['heads']} heads; {res['texts']} texts of {res['min_len']}–"
            f"{res['max_len']} tokens; load {res['load_s']:.1f} s, bench {time.perf_counter() - t0:.1f} s",
            flush=True,
        )

    procs = None
    if not args.no_processes:
        t0 = time.perf_counter()
        procs = bench_processes(args.process_texts, args.nproc, args.process_rounds, not args.no_control)
        print(f"processes: bench {time.perf_counter() - t0:.1f} s", flush=True)

    missed: list[str] = []
    if results:
        how = "runs every forward whole" if args.whole_forward else "stops each forward after the last layer it reduces"
        print()
        print(
            f"corpus_stats vs a plain batched forward over the same batches (batch size {args.batch_size}, "
            f"padding ≤ 10 %), CPU, {args.threads} torch thread(s), process CPU time over {args.rounds} "
            f"interleaved rounds; corpus_stats {how}.\nRatios are stats tokens/s ÷ forward tokens/s: 'paired' = median of each "
            "round's own ratio (judged), 'med' = ratio of the medians, 'min' = ratio of the minima, 'wall' = "
            "ratio of the median wall times, '+tok' = paired, against forward + tokenizing and batching."
        )
        print(
            f"{'model':>8} {'texts':>5} {'tokens':>7} {'batches':>7} {'pad':>5} {'same':>4} | {'fwd s':>6} "
            f"{'tok s':>5} {'stats s':>7} | {'fwd tok/s':>9} {'stats tok/s':>11} | {'paired':>6} {'med':>5} "
            f"{'min':>5} {'wall':>5} {'+tok':>5}"
        )
        for r in results:
            c = r["cpu"]
            print(
                f"{r['family']:>8} {r['texts']:>5} {r['tokens']:>7,} {r['batches']:>7} {r['padding']:>5.1%} "
                f"{'yes' if r['same'] else 'NO':>4} | {c['forward']:6.2f} {r['tok_cpu']:5.2f} {c['stats']:7.2f} | "
                f"{r['tokens'] / c['forward']:9,.0f} {r['tokens'] / c['stats']:11,.0f} | {r['paired']:6.3f} "
                f"{r['med']:5.3f} {r['min']:5.3f} {r['wall']:5.3f} {r['paired_tok']:5.3f}"
            )
            if args.verbose:
                for m, v in r["cpu_all"].items():
                    walls = " ".join(f"{x:.2f}" for x in r["wall_all"][m])
                    print(f"{'':>8} {m:>7} CPU s per round: {' '.join(f'{x:.2f}' for x in v)}; wall s: {walls}")
            if not r["same"]:
                missed.append(f"{r['family']}: corpus_stats did not cut the plain batches (texts, tokens or padding)")
            if r["paired"] < GOAL_THROUGHPUT:
                missed.append(
                    f"{r['family']}: corpus_stats makes {r['paired']:.3f}× the plain forward's tokens/s "
                    f"(goal ≥ {GOAL_THROUGHPUT:.2f}×)"
                )
        profiled = [r for r in results if r["breakdown"]]
        if profiled:
            print()
            print(
                "Where corpus_stats' time goes: one run per model under cProfile, profiled seconds and share of "
                "its total (the profiler inflates Python-heavy parts)"
            )
            labels = [(label, indent) for label, indent, _ in profiled[0]["breakdown"]]
            print(f"{'':<44}" + "".join(f" {r['family'] + ' s':>11} {'%':>5}" for r in profiled))
            for i, (label, indent) in enumerate(labels):
                cells = ""
                for r in profiled:
                    total = r["breakdown"][0][2]
                    s = r["breakdown"][i][2]
                    cells += f" {s:11.2f} {s / total:5.0%}"
                print(f"{'  ' * indent + label:<44}{cells}")
            for r in profiled:
                b = {label: s for label, _, s in r["breakdown"]}
                own = b["model forward, without the taps"]
                if own > 0:
                    beyond = b["corpus_stats"] - own
                    print(
                        f"{r['family']}: beyond the model's own forward (as far as it ran) corpus_stats spends {beyond:.2f} profiled s "
                        f"({beyond / own:.0%} of it); {GOAL_THROUGHPUT:.2f}× allows {1 / GOAL_THROUGHPUT - 1:.0%}"
                    )

    if procs is not None:
        p = procs
        w, cpu, threads = p["wall"], p["cpu"], p["threads"]
        names = {"one": "1 process", "many": f"{p['nproc']} procs", "one1": "1 proc 1 t"}
        print()
        print(
            f"1 process vs {p['nproc']} (torchrun, gloo) on {p['cores']} cores, the CLI on MiniLM, {p['texts']} texts; "
            f"wall seconds, median of {args.process_rounds} interleaved rounds.\n"
            f"  1 process:   OMP_NUM_THREADS={threads['one']} MKL_NUM_THREADS={threads['one']}  {p['cmd']['one']}\n"
            f"  {p['nproc']} procs:     OMP_NUM_THREADS={threads['many']} MKL_NUM_THREADS={threads['many']} each  "
            f"{p['cmd']['many']}\n"
            + (
                "  1 proc 1 t:  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1, the 1-process command (a control, not the fair "
                "comparison)\n"
                if "one1" in p["labels"]
                else ""
            )
            + f"'start' = the same command on a {p['nproc']}-text corpus (imports, model load, process group), "
            "subtracted: 'work' = corpus − start. CPU = the children's CPU seconds (all processes)."
        )
        print(
            f"{'':>11} {'corpus s':>8} {'start s':>7} {'work s':>6} | {'CPU corpus':>10} {'CPU start':>9} | summary line"
        )
        for key in p["labels"]:
            st = p["start"][key]
            print(
                f"{names[key]:>11} {w[(key, 'corpus')]:8.2f} {w[st]:7.2f} {p['work'][key]:6.2f} | "
                f"{cpu[(key, 'corpus')]:10.2f} {cpu[st]:9.2f} | {p['summary'][(key, 'corpus')]}"
            )
            if args.verbose:
                for k in ((key, "corpus"), (key, "tiny")):
                    if k in p["wall_all"]:
                        print(f"{'':>11} {k[1]:>6} wall s per round: {' '.join(f'{x:.2f}' for x in p['wall_all'][k])}")
        for key in p["labels"]:
            if key == "many":
                continue
            ratio = p["ratio_work"][key]
            print(
                f"{names['many']} ÷ {names[key]}: work {ratio:.3f} (paired per round {p['paired'][key]:.3f}; "
                f"speed-up {f'{1 / ratio:.2f}×' if ratio > 0 else 'n/a: no work left after the start'}), "
                f"whole command {p['ratio_raw'][key]:.3f}"
            )
        print(f"largest CSV difference {p['max_diff']:.2e} (tolerance {CSV_TOLERANCE:g})")
        for problem in p["problems"]:
            missed.append(f"processes: {problem}")
        if not p["max_diff"] <= CSV_TOLERANCE:
            missed.append(f"processes: the 1- and {p['nproc']}-process CSVs differ by {p['max_diff']:.2e}")

    print()
    print(
        f"goals: corpus_stats ≥ {GOAL_THROUGHPUT:.2f}× the plain forward's tokens/s (paired, CPU time) on every "
        f"model; 1- and N-process tables within {CSV_TOLERANCE:g}; the process speed-up is reported, not judged "
        f"(total {time.perf_counter() - started:.0f} s)"
    )
    for m in missed:
        print(f"MISSED {m}")
    print("all goals met" if not missed else f"{len(missed)} goal(s) missed")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
