"""The head timeline's cost against its parts (issue #45), as a ratio measured in the same run.

``attnviz.head_timeline(run, texts)`` over ``K`` checkpoints against what it must cost at most: ``K`` ×
``head_atlas(checkpoint, texts)`` of one checkpoint loaded alone (each tokenizing the corpus itself) + one
tokenization of the corpus. The timeline tokenizes once and hashes each checkpoint's weights; the goal is
``timeline ≤ K × atlas + tokenization`` (ratio ≤ 1). Time is process CPU time at ``--threads`` torch threads over
``--rounds`` interleaved rounds (the order alternates), after a warm-up of each; the ratio is the median of each
round's own. The run is ``examples/train_induction.py``'s (trained here, ``--steps`` steps, a checkpoint every
``--every``), the corpus ``--texts`` texts of its kind (random halves repeated, 32 tokens).

    python bench/timeline.py                 # 5 checkpoints, 64 texts, 3 rounds
    python bench/timeline.py --texts 200 --rounds 5

Exit status 1 when the goal is missed (everything is printed first).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import attnviz
from attnviz.analysis import head_atlas
from attnviz.models import tokenize
from attnviz.workflows.corpus.timeline import find_checkpoints

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("train_induction", ROOT / "examples" / "train_induction.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cpu(fn) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    script = _script()
    with tempfile.TemporaryDirectory() as folder:
        script.train(folder, steps=args.steps, save_every=args.every, log=lambda line: None)
        points = [c.folder for c in find_checkpoints(folder)]
        texts = script.corpus_texts(args.texts)
        tokenizer = script.tokenizer_for()
        kwargs = dict(progress=False, random_length=script.HALF)

        def timeline():
            attnviz.head_timeline(folder, texts, **kwargs)

        def atlases():
            for point in points:
                head_atlas(str(point), texts, **kwargs)

        def tokenization():
            tokenize(tokenizer, texts, None, None, "run")

        timeline(), atlases()  # warm-up: the loads cached, the kernels chosen
        ratios, rows = [], []
        for r in range(args.rounds):
            order = [timeline, atlases] if r % 2 == 0 else [atlases, timeline]
            seconds = {fn.__name__: _cpu(fn) for fn in order}
            seconds["tokenization"] = _cpu(tokenization)
            bound = seconds["atlases"] + seconds["tokenization"]
            ratios.append(seconds["timeline"] / bound)
            rows.append(seconds)
            print(
                f"round {r + 1}: timeline {seconds['timeline']:.2f} s, {len(points)} × atlas {seconds['atlases']:.2f} s, "
                f"tokenization {seconds['tokenization'] * 1000:.1f} ms → {ratios[-1]:.3f}×"
            )
    ratio = statistics.median(ratios)
    print(
        f"{len(points)} checkpoints, {len(texts)} texts: timeline / (K × atlas + tokenization) = {ratio:.3f}× (goal ≤ 1)"
    )
    return 0 if ratio <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
