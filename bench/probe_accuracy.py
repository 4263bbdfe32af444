"""What the carried models reach on the shipped probe sets, with what the numbers mean (issue #21).

For each model and set: ``attnviz.evaluate_probes(model, set, progress=False)`` (default sinks left out
and rows renormalised, a BOS prepended), then the README's table row — the best head on all probes with
its 95 % Wilson interval, the held-out estimate (seed 0: the head chosen on half the twin groups, scored
on the other half), the exact tests against chance and against both baselines (McNemar), the baselines,
and how many heads beat chance after Holm — plus how many probes were left out and why (MiniLM's
WordPiece vocabulary reads 它/他/她 as [UNK]: those probes are refused, not scored).

Reported, not judged: these are what the models do.

    python bench/probe_accuracy.py                      # minilm and smollm2, en and zh
    python bench/probe_accuracy.py --models smollm2 --sets zh
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import attnviz
from attnviz.errors import InputError


def row(result) -> str:
    b = result.best
    held = result.held_out(seed=0)
    tests = result.tests().set_index("comparison").p_value
    heads = len(result.accuracy)
    p = {name: tests[name] for name in tests.index}
    return (
        f"L{int(b['layer'])}·H{int(b['head'])} | {b['accuracy']:.1%} [{100 * b['low']:.1f}, {100 * b['high']:.1f}] | "
        f"L{held.layer}·H{held.head}: {held.accuracy_b:.1%} [{100 * held.low_b:.1f}, {100 * held.high_b:.1f}] "
        f"on {held.n_b} | "
        + " / ".join(f"{k.split(' vs ')[-1]} p = {v:.2f}" for k, v in p.items())
        + f" | {result.baselines['nearest']:.1%} / {result.baselines['first']:.1%} | "
        f"{int(result.accuracy.beats_chance.sum())} of {heads}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "minilm"])
    parser.add_argument("--sets", nargs="+", default=["en", "zh"])
    args = parser.parse_args(argv)
    print(
        "| model | set | scored | best head | its accuracy, 95 % Wilson | held out (seed 0) | tests of the best "
        "head | nearest / first | heads beating chance (Holm) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        model, tok = attnviz.load_model(name)
        for probe_set in args.sets:
            try:
                result = attnviz.evaluate_probes(model, probe_set, tok, progress=False)
            except InputError as err:
                print(f"| {name} | {probe_set} | 0 | — {str(err)[:160]} … |")
                continue
            n = len(result.per_probe)
            left = Counter(line.split(": ", 1)[1].split(":")[0] for line in result.skipped)
            why = "; ".join(f"{k}× {r}" for r, k in left.items())
            scored = f"{n}" + (f" ({len(result.skipped)} left out: {why})" if result.skipped else "")
            print(f"| {name} | {probe_set} | {scored} | {row(result)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
