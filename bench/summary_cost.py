"""What one fused pass saves: the heavy views' four computations one after another vs ``summarize``.

SmolLM2-135M (sdpa, random token ids, ``check="off"``) at each ``--sizes`` length (default 2,048):
the model view's thumbnails of every layer (``thumbnails``, 24 × 24), ``head_stats``,
``rollout_blocks`` at the rollout heatmap's block (``ceil(n / 512)``) and the full ``validate()`` —
each its own pass over every head of every layer — timed one after another, then
:func:`attnviz.analysis.summarize` computing all four in one pass, in the same run on the same
capture. One torch thread (``--threads``; with two, the idle worker spinning between the fused
loop's many small operations counts as CPU time) and process CPU time (on these shared machines it
moves far less than the wall clock), the two sides alternating over ``--repeats`` rounds (default 3; medians; at 8,192
one round takes several minutes). The ratio is the fused pass's time over the four's. The results
are checked equal (max differences printed).

    python bench/summary_cost.py                                # n = 2,048
    python bench/summary_cost.py --sizes 2048,8192 --repeats 1  # and 8,192 (minutes)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import attnviz
from attnviz.analysis import head_stats, rollout_blocks, summarize
from attnviz.analysis.overview import MODEL_VIEW_CELLS, thumbnails
from attnviz.analysis.rollout import ROLLOUT_CELLS


def timed(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def one_size(model, n: int, repeats: int) -> dict:
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    cap = attnviz.capture(model, input_ids=ids, check="off")
    size = (min(n, MODEL_VIEW_CELLS),) * 2
    block = -(-n // ROLLOUT_CELLS)
    times: dict[str, list[float]] = {k: [] for k in ("thumbnails", "head_stats", "rollout", "validate", "summarize")}

    def separate():
        thumbs, t = timed(lambda: {layer: thumbnails(cap, layer, size) for layer in cap.layer_indices()})
        times["thumbnails"].append(t)
        stats, t = timed(lambda: head_stats(cap))
        times["head_stats"].append(t)
        flow, t = timed(lambda: rollout_blocks(cap, block))
        times["rollout"].append(t)
        report, t = timed(cap.validate)
        times["validate"].append(t)
        return thumbs, stats, flow, report

    def fused():
        summary, t = timed(lambda: summarize(cap))
        times["summarize"].append(t)
        return summary

    for round in range(repeats):  # alternating: neither side always runs first
        if round % 2:
            summary = fused()
            thumbs, stats, flow, report = separate()
        else:
            thumbs, stats, flow, report = separate()
            summary = fused()
    med = {k: statistics.median(v) for k, v in times.items()}
    four = statistics.median(
        sum(r) for r in zip(*(times[k] for k in ("thumbnails", "head_stats", "rollout", "validate")))
    )
    numbers = stats.drop(columns=["layer", "head"]).to_numpy()
    fused_numbers = summary.head_stats().drop(columns=["layer", "head"]).to_numpy()
    assert summary.rollout is not None
    return {
        "n": n,
        **med,
        "separate": four,
        "diff_thumbs": max(float((summary.thumbnails[k] - v).abs().max()) for k, v in thumbs.items()),
        "diff_stats": float(abs(fused_numbers - numbers)[~(numbers != numbers)].max()),  # NaN cells skipped
        "diff_rollout": float((summary.rollout - flow).abs().max()),
        "diff_validation": max(
            abs(a["max_abs_error"] - b["max_abs_error"]) for a, b in zip(summary.validation.rows, report.rows)
        ),
        "passed": report.passed and summary.validation.passed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2048", help="comma-separated lengths (e.g. 2048,8192)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds per length (medians)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = attnviz.load_model("smollm2")
    print(
        f"SmolLM2-135M, sdpa, CPU, {torch.get_num_threads()} threads, process CPU time, "
        f"median of {args.repeats} alternating rounds"
    )
    print(
        f"{'n':>6} {'thumbnails s':>13} {'head_stats s':>13} {'rollout s':>10} {'validate s':>11} "
        f"{'four, one after another s':>26} {'summarize s':>12} {'ratio':>6}  max |difference| (thumbs, stats, rollout, validation)"
    )
    for n in [int(s) for s in args.sizes.split(",")]:
        r = one_size(model, n, args.repeats)
        print(
            f"{r['n']:>6} {r['thumbnails']:13.1f} {r['head_stats']:13.1f} {r['rollout']:10.1f} {r['validate']:11.1f} "
            f"{r['separate']:26.1f} {r['summarize']:12.1f} {r['summarize'] / r['separate']:6.2f}  "
            f"{r['diff_thumbs']:.1e}, {r['diff_stats']:.1e}, {r['diff_rollout']:.1e}, {r['diff_validation']:.1e}"
            f"{'' if r['passed'] else '  (validation FAILED)'}",
            flush=True,
        )


if __name__ == "__main__":
    main()
