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
pass read the same encodings) and reads no moved statistic, which ``corpus_stats`` computes. The same
real (unpadded) corpus tokens are counted for all three. Time is process CPU time at ``--threads``
torch threads over ``--rounds`` interleaved rounds (the order rotates), after a warm-up of each on
``WARMUP_TEXTS`` texts; the ratios are the median of each round's own ratio.

Corpus: ``--texts`` deterministic English-ish sentences (a word list, commas, a seeded RNG; 7–100
words): ``bench/corpus_throughput.py``'s own ``make_corpus``, the corpus the statistics' bench reads;
SmolLM2 (30 layers) takes the first ``--smollm2-texts``.

Goal (issue #22): head_atlas ≥ 0.8× the plain forward's tokens/s. It is reported, not tuned; exit
status 1 when it is missed (everything is printed first).

``--stages`` also times, in the same rounds, what the atlas' pass is made of, each stage adding to the one
before over the same batches (``BatchReducer``, the moved statistics off as the atlas has them): the
weights recomputed and checked alone (``statistics=False``: the capture, the early stop, each layer's
GEMM, mask and softmax, the sampled rows' A·V against the kernel), then the statistics its table reads
(``corpus_stats(statistics=ATLAS_STATISTICS)``: no product over every weight), then the atlas' tally
(``HeadTally``); ``head_atlas`` adds the random sequences and its table.

    python bench/atlas_throughput.py                       # MiniLM, BERT-base's shape and SmolLM2
    python bench/atlas_throughput.py --models minilm --rounds 3 --texts 100
    python bench/atlas_throughput.py --models bert-base    # BERT-base's shape, random weights
    python bench/atlas_throughput.py --models gpt2         # GPT-2's shape, random weights
    python bench/atlas_throughput.py --models minilm --rounds 5 --stages
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

from corpus_throughput import forward_all, machine, make_corpus, plain_batches  # noqa: E402  the same corpus, batches, forward

import attnviz  # noqa: E402
from attnviz.analysis import corpus_stats, head_atlas  # noqa: E402
from attnviz.analysis.head_tally import HeadTally  # noqa: E402
from attnviz.workflows.corpus.atlas import ATLAS_STATISTICS  # noqa: E402
from attnviz.workflows.corpus.batched import BatchReducer  # noqa: E402
from attnviz.workflows.corpus.corpus import length_batches  # noqa: E402

GOAL = 0.80
WARMUP_TEXTS = 8


def cpu(fn: Callable[[], Any]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def load(name: str) -> tuple[Any, Any]:
    """An embedded model by its alias; ``bert-base``: BERT-base's shape (``BertConfig()``: 12 layers ×
    12 heads, d_model 768) with random weights — no hub here — and MiniLM's tokenizer (BERT's uncased
    vocabulary, the 30,522 tokens ``BertConfig()`` expects); ``gpt2``: GPT-2's (``GPT2Config()``: 12 layers
    × 12 heads, d_model 768, causal) with random weights and SmolLM2's byte-level BPE tokenizer (49,152
    ids, under GPT-2's 50,257; read without SmolLM2's weights). Throughput depends on the shapes, not on
    what the weights learned."""
    if name == "gpt2":
        from transformers import GPT2Config, GPT2Model

        from attnviz.workflows.capture.models import describe_model

        _, tok = describe_model("smollm2")
        torch.manual_seed(0)
        return GPT2Model(GPT2Config()).eval(), tok
    if name != "bert-base":
        return attnviz.load_model(name)
    from transformers import BertConfig, BertModel

    _, tok = attnviz.load_model("minilm")
    torch.manual_seed(0)
    return BertModel(BertConfig()).eval(), tok


def stage(model: Any, tok: Any, batch_size: int, *, statistics: bool, tally: bool) -> Callable[[list[str]], None]:
    """The atlas' pass up to a stage (``--stages``): the batches ``corpus_stats`` cuts, through one
    ``BatchReducer`` without the moved statistics, with the statistics the atlas reads
    (``ATLAS_STATISTICS``) or none, and a tally or not."""

    def run(texts: list[str]) -> None:
        reducer = BatchReducer(model, tok, moved=False, statistics=ATLAS_STATISTICS if statistics else False)
        layers = sorted(reducer.layers) if reducer.layers is not None else list(range(model.config.num_hidden_layers))
        vocab = model.get_input_embeddings().num_embeddings
        counts = torch.ones(vocab, dtype=torch.float64)
        kept = HeadTally(layers, model.config.num_attention_heads, counts, {t: i for i, t in enumerate(texts)})
        sums = None
        for pool in length_batches(iter(texts), lambda t: len(tok(t)["input_ids"]), batch_size):
            for batch in pool:
                sums, _ = reducer.add(sums, [t for t, _ in batch], tally=kept if tally else None)

    return run


def bench_model(name: str, texts: list[str], rounds: int, batch_size: int, stages: bool = False) -> dict[str, float]:
    model, tok = load(name)
    batches = plain_batches(model, tok, texts, batch_size)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    runs: dict[str, Callable[[list[str]], Any]] = {
        "forward": lambda ts: forward_all(model, batches if ts is texts else plain_batches(model, tok, ts, batch_size)),
        "corpus_stats": lambda ts: corpus_stats(model, ts, tok, batch_size=batch_size, progress=False),
        "head_atlas": lambda ts: head_atlas(model, ts, tokenizer=tok, batch_size=batch_size, progress=False),
    }
    if stages:
        runs["weights+check"] = stage(model, tok, batch_size, statistics=False, tally=False)
        runs["+statistics"] = stage(model, tok, batch_size, statistics=True, tally=False)
        runs["+tally"] = stage(model, tok, batch_size, statistics=True, tally=True)
    for run in runs.values():  # warm-up
        run(texts[:WARMUP_TEXTS])
    times: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for r in range(rounds):
        for k in order[r % len(order) :] + order[: r % len(order)]:
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
    if stages:
        parts = ["weights+check", "+statistics", "+tally", "head_atlas"]
        print(
            "  the atlas' pass by stage, each adding to the one before (vs the forward, median of the rounds): "
            + ", ".join(
                f"{k} {statistics.median(f / t for f, t in zip(times['forward'], times[k])):.2f}×" for k in parts
            )
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
    p.add_argument("--stages", action="store_true", help="also time the atlas' pass stage by stage")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(machine(), flush=True)
    corpus = make_corpus(args.texts)
    missed = []
    for name in [m for m in args.models.split(",") if m]:
        texts = corpus[: args.smollm2_texts] if name == "smollm2" else corpus
        ratio = bench_model(name, texts, args.rounds, args.batch_size, args.stages)["atlas"]
        if ratio < GOAL:
            missed.append(f"{name} {ratio:.2f}×")
    print(
        f"goal: head_atlas ≥ {GOAL}× the plain forward's tokens/s — "
        + ("missed: " + ", ".join(missed) if missed else "met")
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
