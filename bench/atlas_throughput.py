"""The head atlas' throughput against a plain batched forward of the same corpus (issue #22), as ratios
measured in the same run (the machines are noisy).

Tokens per second of ``attnviz.analysis.head_atlas(model, texts, tokenizer=tok, progress=False)``
against a plain batched forward over the same texts: the same batches (``length_batches`` with the
model's tokenizer, ``--batch-size`` texts, padding ≤ 10 %), right-padded as attnviz pads them,
``model(input_ids=..., attention_mask=...[, use_cache=False])`` under ``torch.no_grad``, built before
the clock starts. ``corpus_stats`` over the same texts is timed in the same rounds, so the atlas' own
cost over the statistics shows: the per-row maxima it tallies in the same reduction (its examples kept
for every role and offset bin at once) and the forwards of its repeated random sequences
(``head_atlas``' default: 16 × 2 × 25 tokens, reduced to the induction role's sums alone; they are not
corpus tokens, so they count against it) — while it tokenizes the corpus once (the token counts and the
pass read the same encodings) and reads no statistic by norm, which ``corpus_stats`` computes. The same
real (unpadded) corpus tokens are counted for all three. Time is process CPU time at ``--threads``
torch threads over ``--rounds`` interleaved rounds (the order rotates), after a warm-up of each on
``WARMUP_TEXTS`` texts; the ratios are the median of each round's own ratio.

Corpus: ``--texts`` deterministic English-ish sentences (a word list, commas, a seeded RNG; 7–100
words): ``bench/corpus_throughput.py``'s own ``make_corpus``, the corpus the statistics' bench reads;
SmolLM2 (30 layers) takes the first ``--smollm2-texts``.

Goal (issue #22): head_atlas ≥ 0.8× the plain forward's tokens/s. It is reported, not tuned; exit
status 1 when it is missed (everything is printed first).

    python bench/atlas_throughput.py                       # MiniLM, BERT-base's shape and SmolLM2
    python bench/atlas_throughput.py --models minilm --rounds 3 --texts 100
    python bench/atlas_throughput.py --models bert-base    # BERT-base's shape, random weights
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_throughput import forward_all, make_corpus, plain_batches  # noqa: E402  the same corpus, batches, forward

import attnviz  # noqa: E402
from attnviz.analysis import corpus_stats, head_atlas  # noqa: E402

GOAL = 0.80
WARMUP_TEXTS = 8


def cpu(fn: Callable[[], Any]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def load(name: str) -> tuple[Any, Any]:
    """An embedded model by its alias, or ``bert-base``: BERT-base's shape (``BertConfig()``: 12 layers ×
    12 heads, d_model 768) with random weights — no hub here — and MiniLM's tokenizer (BERT's uncased
    vocabulary, the 30,522 tokens ``BertConfig()`` expects). Throughput depends on the shapes, not on
    what the weights learned."""
    if name != "bert-base":
        return attnviz.load_model(name)
    from transformers import BertConfig, BertModel

    _, tok = attnviz.load_model("minilm")
    torch.manual_seed(0)
    return BertModel(BertConfig()).eval(), tok


def bench_model(name: str, texts: list[str], rounds: int, batch_size: int) -> dict[str, float]:
    model, tok = load(name)
    batches = plain_batches(model, tok, texts, batch_size)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    runs: dict[str, Callable[[list[str]], Any]] = {
        "forward": lambda ts: forward_all(model, batches if ts is texts else plain_batches(model, tok, ts, batch_size)),
        "corpus_stats": lambda ts: corpus_stats(model, ts, tok, batch_size=batch_size, progress=False),
        "head_atlas": lambda ts: head_atlas(model, ts, tokenizer=tok, batch_size=batch_size, progress=False),
    }
    for run in runs.values():  # warm-up
        run(texts[:WARMUP_TEXTS])
    times: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for r in range(rounds):
        for k in order[r % 3 :] + order[: r % 3]:
            times[k].append(cpu(lambda k=k: runs[k](texts)))
    atlas = [f / a for f, a in zip(times["forward"], times["head_atlas"])]
    stats = [f / s for f, s in zip(times["forward"], times["corpus_stats"])]
    over = [s / a for s, a in zip(times["corpus_stats"], times["head_atlas"])]
    best = {k: min(v) for k, v in times.items()}
    print(
        f"{name}: {len(texts)} texts, {tokens:,} tokens, batch {batch_size}; CPU s (min of {rounds}): "
        + ", ".join(f"{k} {v:.2f}" for k, v in best.items())
    )
    print(
        f"  tokens/s vs the plain forward (median of the rounds' ratios): head_atlas {statistics.median(atlas):.2f}×, "
        f"corpus_stats {statistics.median(stats):.2f}×; head_atlas vs corpus_stats {statistics.median(over):.2f}×"
    )
    return {"atlas": statistics.median(atlas), "stats": statistics.median(stats)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="minilm,bert-base,smollm2")
    p.add_argument("--texts", type=int, default=200)
    p.add_argument("--smollm2-texts", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    corpus = make_corpus(args.texts)
    missed = []
    for name in [m for m in args.models.split(",") if m]:
        texts = corpus[: args.smollm2_texts] if name == "smollm2" else corpus
        ratio = bench_model(name, texts, args.rounds, args.batch_size)["atlas"]
        if ratio < GOAL:
            missed.append(f"{name} {ratio:.2f}×")
    print(
        f"goal: head_atlas ≥ {GOAL}× the plain forward's tokens/s — "
        + ("missed: " + ", ".join(missed) if missed else "met")
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
