"""The dashboard's first zoom into a long map, as a ratio to the second zoom, measured in the same run.

A tiny Llama (4 heads, d_head 8) at ``--tokens`` (default 8,192): the overview of one head (what the page
draws first), then, in each of ``--bands`` row bands not zoomed before, two zooms into a 256 × 256 window
(``analysis.overview.window``, what the page's zoom calls). The second zoom reads each row's log-sum-exp
from the record, O(tile). The first:

- ``filled`` (now): the overview pass keeps every row's log-sum-exp of the head on the record
  (``lse_from_weights``), so the first zoom is O(tile) too — goal: ratio ≈ 1;
- ``unfilled`` (before): the record's log-sum-exp cleared after the overview, as it was, so the first zoom
  runs a key-tiled pass over every key of its 256 rows first.

Wall-clock medians over the bands of ``--repeats`` alternating runs, one process; the ratio is what the\ngoal reads.

    python bench/zoom_cost.py                 # 8,192 tokens
    python bench/zoom_cost.py --tokens 2048
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import attnviz
from attnviz.analysis.overview import overview, window


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(cap: attnviz.Capture, layer: int, head: int, fill: bool, n: int, bands: int) -> list[tuple[float, float]]:
    """(first zoom s, second zoom s) into each of ``bands`` row bands never zoomed before, after one overview."""
    rec = cap.layer(layer)
    rec.lse = None
    overview(cap, layer, head, size=512)
    if not fill:
        rec.lse = None  # as before: the overview kept nothing
    out = []
    for b in range(bands):
        start = (b + 1) * n // (bands + 2)
        rows, keys = (start, start + 256), (start // 2, start // 2 + 256)
        first = timed(lambda: window(cap, layer, head, rows, keys))  # noqa: B023 - called at once
        second = timed(lambda: window(cap, layer, head, rows, (keys[0] + 256, keys[1] + 256)))  # noqa: B023
        out.append((first, second))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2, help="overviews per state (each ~10 s at 8,192)")
    parser.add_argument("--bands", type=int, default=9, help="first/second zoom pairs after each overview")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared machine a second thread's "
        "wake-up costs 10–20 ms, more than a zoom)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = attnviz.testing.tiny_model("llama", max_position_embeddings=args.tokens)
    ids = torch.randint(3, 100, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    cap = attnviz.capture(model, input_ids=ids, layers=[1])
    results: dict[str, list[tuple[float, float]]] = {"filled": [], "unfilled": []}
    for _ in range(args.repeats):
        for how in results:  # alternating: the machine's drift falls on both
            results[how] += run(cap, 1, 2, how == "filled", args.tokens, args.bands)
    print(
        f"tiny llama, {args.tokens:,} tokens, {torch.get_num_threads()} threads, "
        f"medians of {args.repeats} × {args.bands} zooms"
    )
    print(f"{'':>10} {'1st zoom ms':>12} {'2nd zoom ms':>12} {'1st / 2nd':>10}")
    for how, runs in results.items():
        a, b = (statistics.median(x) for x in zip(*runs))
        print(f"{how:>10} {a * 1e3:>12.1f} {b * 1e3:>12.1f} {a / b:>10.2f}")


if __name__ == "__main__":
    main()
