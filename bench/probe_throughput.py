"""Probe scoring's throughput, as a ratio measured in the same run (issue #21; the machines are noisy).

Probes per second of ``attnviz.evaluate_probes(model, probes, batch_size=B, progress=False)`` against
a plain batched forward of the same texts: the SAME batches (the probes tokenized as the evaluator
tokenizes them — a BOS prepended — sorted by length and cut by ``length_batches`` into at most ``B``
texts (default: the library's ``BATCH_SIZE``, 64) of at most ``BATCH_TOKENS`` padded tokens, with
padding ≤ 10 %), right-padded with the keyword arguments attnviz's capture passes
(``attnviz.workflows.capture.pipeline.forward_inputs``), ``model(**kwargs)`` under ``torch.no_grad``. The
plain batches are built before its clock starts (the baseline is the forward alone); the evaluator
does everything itself: it tokenizes, runs each batch under the taps, checks the sampled rows
against the kernel's output (``check="sample"``), recomputes each pronoun's rows in every head and
picks a candidate per head, and builds the result with its statistics.

Time is process CPU time at ``--threads`` torch threads over ``--rounds`` interleaved rounds (the
order alternates), after a warm-up of both; the goal is judged on the median of each round's own
ratio (the ratio of the medians and the wall-time ratio are shown next to it). The probe set: the
shipped English set (42 Winograd-style probes) repeated ``--copies`` times (4: 168 probes, about the
size of a public Winograd collection), each copy its own ids.

Then the batched result is compared with the one-at-a-time path (``batch_size=1``): every head's pick on
every probe must be the same (reported; a difference fails the run).

Goal (issue #21): evaluate_probes ≥ 0.8× the plain batched forward's probes/s on every model.
Exit status 1 when a goal is missed (everything is printed first).

    python bench/probe_throughput.py                         # minilm and smollm2
    python bench/probe_throughput.py --models minilm --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_throughput import machine  # noqa: E402  the CPU line every throughput bench prints

import attnviz  # noqa: E402
from attnviz.analysis import load_probes  # noqa: E402
from attnviz.workflows.capture.inputs import tokenize  # noqa: E402
from attnviz.workflows.capture.pipeline import forward_inputs, resolve  # noqa: E402
from attnviz.workflows.corpus.corpus import length_batches  # noqa: E402
from attnviz.workflows.corpus.probing import BATCH_SIZE, BATCH_TOKENS  # noqa: E402

GOAL = 0.80


def probe_set(copies: int) -> list:
    base = list(load_probes("en"))
    return [replace(p, id=f"{p.id}-copy{c}") for c in range(copies) for p in base]


def plain_batches(resolved, probes, batch_size: int) -> list[dict]:
    """The evaluator's batches: its tokenizing (BOS prepended), its sort by length, its cut."""
    encoded = tokenize(resolved.tokenizer, [p.text for p in probes], None, resolved.limit, resolved.name, True)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    [cut] = length_batches(order, lambda i: len(encoded[i][0]), batch_size, pool=len(order), max_tokens=BATCH_TOKENS)
    return [forward_inputs(resolved, [encoded[i] for i, _ in batch])[0] for batch in cut]


def forward_all(model, batches: list[dict]) -> None:
    with torch.no_grad():
        for kwargs in batches:
            model(**kwargs)


def timed(fn) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def bench_model(family: str, copies: int, rounds: int, batch_size: int) -> dict:
    model, tok = attnviz.load_model(family)
    resolved = resolve(model, tok)
    probes = probe_set(copies)
    batches = plain_batches(resolved, probes, batch_size)
    padded = sum(b["input_ids"].numel() for b in batches)
    real = sum(int(b["attention_mask"].sum()) for b in batches)

    def evaluate():
        return attnviz.evaluate_probes(model, probes, tok, batch_size=batch_size, progress=False)

    forward_all(model, batches[:2])  # warm-up
    attnviz.evaluate_probes(model, probes[:batch_size], tok, batch_size=batch_size, progress=False)
    ratios, cpu_plain, cpu_eval, wall_plain, wall_eval = [], [], [], [], []
    for r in range(rounds):
        order = ("plain", "eval") if r % 2 == 0 else ("eval", "plain")
        got = {}
        for which in order:
            got[which] = timed(lambda: forward_all(model, batches)) if which == "plain" else timed(evaluate)
        cpu_plain.append(got["plain"][0])
        cpu_eval.append(got["eval"][0])
        wall_plain.append(got["plain"][1])
        wall_eval.append(got["eval"][1])
        ratios.append(got["plain"][0] / got["eval"][0])  # probes/s ratio = inverse time ratio
    batched = evaluate()
    one = attnviz.evaluate_probes(model, probes, tok, batch_size=1, progress=False)
    same = np.array_equal(batched.picks, one.picks) and batched.per_probe.id.tolist() == one.per_probe.id.tolist()
    differing = int((batched.picks != one.picks).sum()) if batched.picks.shape == one.picks.shape else -1
    return {
        "model": family,
        "probes": len(probes),
        "batches": len(batches),
        "padding": 1 - real / padded,
        "ratio": statistics.median(ratios),
        "ratio_of_medians": statistics.median(cpu_plain) / statistics.median(cpu_eval),
        "wall_ratio": statistics.median(wall_plain) / statistics.median(wall_eval),
        "plain_s": statistics.median(cpu_plain),
        "eval_s": statistics.median(cpu_eval),
        "same_picks": same,
        "differing": differing,
        "best": str(batched.best.get("layer")) + "·" + str(batched.best.get("head")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["minilm", "smollm2"])
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--batch-size", type=int, default=BATCH_SIZE, help=f"probes per batch (default {BATCH_SIZE}, the library's)"
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine())
    print(f"evaluate_probes vs a plain batched forward of the same batches — {args.threads} thread(s), CPU time")
    print(
        f"{'model':10} {'probes':>6} {'batches':>7} {'pad':>5} {'plain s':>8} {'eval s':>8} {'ratio':>6} "
        f"{'(of medians)':>12} {'(wall)':>7} {'same picks as 1-by-1':>21}"
    )
    ok = True
    for family in args.models:
        r = bench_model(family, args.copies, args.rounds, args.batch_size)
        met = r["ratio"] >= GOAL and r["same_picks"]
        ok &= met
        same = "yes" if r["same_picks"] else f"NO ({r['differing']} picks differ)"
        print(
            f"{r['model']:10} {r['probes']:>6} {r['batches']:>7} {r['padding']:>5.1%} {r['plain_s']:>8.2f} "
            f"{r['eval_s']:>8.2f} {r['ratio']:>5.2f}× {r['ratio_of_medians']:>11.2f}× {r['wall_ratio']:>6.2f}× "
            f"{same:>21}  {'goal met' if met else f'MISSED (goal ≥ {GOAL}× and the same picks)'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
