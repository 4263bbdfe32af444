"""What an edited forward and a head-importance map cost, as ratios to plain forwards in the same run.

SmolLM2 (embedded, float32, CPU) on a ``--tokens``-token text (default 512):
  - ``plain``:    ``model(input_ids)`` (the baseline, 1.00),
  - ``knockout``: the same forward inside ``attnviz.edits.editing`` with one head's knockout in one
                  layer (layer 15, head 3: every query may not see the first 16 tokens) — that layer's
                  call computed by attnviz's SDPA with the edit, every other call the model's kernel,
  - ``all 30``:   every layer through attnviz's SDPA (a temperature of 1: no change), for information,
  - ``ablate``:   one head zero-ablated (the model's kernel, then the head's output set to 0).
Time is process CPU time at ``--threads`` torch threads over ``--rounds`` interleaved rounds (the
order rotates) after a warm-up; the goal is judged on the median of the rounds' own ratios.

Then ``head_importance`` for all 270 heads of SmolLM2 on a ~30-token text (batches of
``--batch-size`` heads per forward), in seconds, against the same ablations one head per forward.

Goal (issue #12): ``knockout`` ≤ 1.2× ``plain`` at 512 tokens. Exit status 1 when it is missed.

    python bench/intervention_cost.py                      # 512 tokens, 5 rounds, head importance
    python bench/intervention_cost.py --tokens 256 --rounds 3 --no-importance
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import attnviz
from attnviz import edits
from attnviz.edits import editing, plan

GOAL = 1.2
PARAGRAPH = (
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk. When he reached the lamp "
    "room, he wiped the glass, trimmed the wick and watched the ships pass the rocks below. "
)
SHORT = "The trophy did not fit into the brown suitcase because it was too big, so the keeper said that it"


def cpu_time(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--no-importance", action="store_true", help="skip the head-importance timing")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tok = attnviz.load_model("smollm2")
    ids = tok(PARAGRAPH * (args.tokens // 30 + 2))["input_ids"][: args.tokens]
    input_ids = torch.tensor([ids])
    cap = attnviz.capture(model, input_ids=input_ids, layers=[0], check="off")
    assert isinstance(cap, attnviz.Capture)
    plans = {
        "knockout": plan([edits.knockout(layer=15, head=3, key=list(range(16)))], cap),
        "all 30": plan([edits.temperature(1.0)], cap),
        "ablate": plan([edits.ablate(layer=15, head=3)], cap),
    }

    def forward(name: str):
        def run():
            with torch.no_grad():
                if name == "plain":
                    model(input_ids, use_cache=False)
                else:
                    with editing(model, plans[name]):
                        model(input_ids, use_cache=False)

        return run

    names = ["plain", *plans]
    for name in names:  # warm-up
        forward(name)()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(cpu_time(forward(name)))
    print(f"SmolLM2, {len(ids)} tokens, {args.threads} thread(s), {args.rounds} rounds, CPU time per forward")
    print(f"{'':10} {'median s':>9} {'ratio (median of rounds)':>25} {'min ratio':>10}")
    ratios = {}
    for name in names:
        per_round = [t / p for t, p in zip(times[name], times["plain"])]
        ratios[name] = statistics.median(per_round)
        print(
            f"{name:10} {statistics.median(times[name]):9.3f} {ratios[name]:25.3f} "
            f"{min(times[name]) / min(times['plain']):10.3f}"
        )
    ok = ratios["knockout"] <= GOAL
    print(f"goal: knockout ≤ {GOAL}× plain — {'met' if ok else 'MISSED'} ({ratios['knockout']:.3f}×)")

    if not args.no_importance:
        n = len(tok(SHORT)["input_ids"])
        start = time.perf_counter()
        df = attnviz.head_importance(model, SHORT, " was", tok, batch_size=args.batch_size, progress=False)
        batched = time.perf_counter() - start
        start = time.perf_counter()
        attnviz.head_importance(model, SHORT, " was", tok, batch_size=1, progress=False)
        single = time.perf_counter() - start
        top = df.iloc[0]
        print(
            f"head_importance: {len(df)} heads on a {n}-token text — {batched:.1f} s in batches of "
            f"{args.batch_size}, {single:.1f} s one head per forward ({single / batched:.1f}× slower); "
            f"log P(' was') {df.attrs['logprob']:.2f}, most needed head L{int(top['layer'])}·H{int(top['head'])} (log P drops by {top['logprob_drop']:.2f})"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
