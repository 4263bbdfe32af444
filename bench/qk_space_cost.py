"""How long one head's query–key space takes for 20,000 points (issue 22): ``attnviz.analysis.qk_space``
with PCA, t-SNE and UMAP, its WebGL figure, and the figure's JSON — against the capture of the same texts
in the same run (a ratio: these machines are noisy).

The texts: ``--tokens`` tokens (10,000 by default: 10,000 queries + 10,000 keys) of the deterministic
corpus of ``bench/corpus_throughput.py`` on MiniLM (texts of up to 512 tokens, captured ``--batch`` at a
time). UMAP's first call compiles numba's kernels: it is timed twice, and the second (warm) time is the
one a dashboard user waits for after the first head.

    python bench/qk_space_cost.py
    python bench/qk_space_cost.py --tokens 4000 --methods pca umap
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_throughput import make_corpus  # noqa: E402

import attnviz  # noqa: E402
from attnviz.analysis import qk_space  # noqa: E402
from attnviz.figures import qk_space_figure  # noqa: E402


def texts_of(tokenizer, tokens: int) -> list[str]:
    """Texts of about ``tokens`` tokens in all: the corpus's sentences joined into texts of ≤ 500 tokens."""
    texts, current, count, total = [], [], 0, 0
    for sentence in make_corpus(100_000):
        n = len(tokenizer(sentence, add_special_tokens=False)["input_ids"])
        if count + n > 480 and current:
            texts.append(" ".join(current))
            total += count + 2
            current, count = [], 0
            if total >= tokens:
                break
        current.append(sentence)
        count += n
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--methods", nargs="+", default=["pca", "tsne", "umap"])
    parser.add_argument("--layer", type=int, default=2)
    parser.add_argument("--head", type=int, default=5)
    args = parser.parse_args()

    model, tok = attnviz.load_model("minilm")
    texts = texts_of(tok, args.tokens)
    start = time.perf_counter()
    caps = []
    for i in range(0, len(texts), args.batch):
        caps += attnviz.capture(model, texts[i : i + args.batch], tok, layers=[args.layer])
    capture_s = time.perf_counter() - start
    points = 2 * sum(c.n_tokens for c in caps)
    print(f"MiniLM, {len(caps)} texts, {points:,} points (L{args.layer}·H{args.head}); capture {capture_s:.2f} s")
    print(f"{'step':<28}{'seconds':>10}{'× capture':>12}")
    for method in args.methods:
        rounds = 2 if method == "umap" else 1
        for r in range(rounds):
            start = time.perf_counter()
            df = qk_space(caps, args.layer, args.head, method=method, max_points=None)
            took = time.perf_counter() - start
            name = f"qk_space {method}" + (" (first: compiles)" if rounds == 2 and r == 0 else "")
            print(f"{name:<28}{took:>10.2f}{took / capture_s:>12.2f}")
        start = time.perf_counter()
        fig = qk_space_figure(df)
        built = time.perf_counter() - start
        start = time.perf_counter()
        size = len(fig.to_json())
        serialised = time.perf_counter() - start
        print(f"{'  figure (' + method + ')':<28}{built:>10.2f}{built / capture_s:>12.2f}")
        print(f"{'  its JSON':<28}{serialised:>10.2f}{serialised / capture_s:>12.2f}   {size / 1e6:.2f} MB")
        assert len(df) == points and [t.type for t in fig.data] == ["scattergl", "scattergl"]


if __name__ == "__main__":
    main()
