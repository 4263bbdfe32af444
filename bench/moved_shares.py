"""Weight vs what moves on the carried models (#20): does a large weight mean the head copies?

For each row *i* of each head, a key's share by weight is α_ij and its moved share is
α_ij·‖f(x_j)‖ / Σ_j' α_ij'·‖f(x_j')‖ (f(x) = W_O^h v: Kobayashi et al. 2020), from
``cap.attention`` and ``cap.moved``. Prints markdown (measured, nothing tuned):

- **MiniLM** (BERT, ``attnviz.load_model("minilm")``) over a handful of English sentences: the mean
  share of [CLS], [SEP] and punctuation by weight and moved — averaged over every row, head and
  layer, and per layer. Kobayashi et al. found that in BERT these take large weights but move little.
- **SmolLM2** (``add_bos=True``, so there is a BOS sink): the BOS's mean share by weight and moved
  (every row but the BOS's own, which sees only itself), over all and per layer; and the rows
  它 → 小猫 in 「我家的小猫很可爱，它很好动。」 and it → cat in "The cat sat on the mat because it was
  tired." in words (a word's weight summed over its tokens, what it moves the norm of their summed
  vectors): for the head with the largest weight on the antecedent and for L13·H8, the antecedent's
  and the BOS's share by weight and by what moves.

    python bench/moved_shares.py                   # a couple of minutes on a CPU
    python bench/moved_shares.py > findings.md
"""

from __future__ import annotations

import argparse
import os
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the carried models only

import attnviz  # noqa: E402
from attnviz.analysis.patterns import is_punct  # noqa: E402

ENGLISH = [
    "The cat sat on the mat because it was tired.",
    "The trophy doesn't fit into the brown suitcase because it is too big.",
    "Alice gave Bob the book, and he thanked her for it.",
    "When the rain stopped, the children ran outside to play.",
    "My sister, who lives in Paris, sent me a postcard last week.",
    "The engineers fixed the bridge before the storm arrived.",
]
ZH = "我家的小猫很可爱，它很好动。"
CAT = "The cat sat on the mat because it was tired."


def row_shares(cap: attnviz.Capture, layer: int) -> tuple[torch.Tensor, torch.Tensor]:  # [head, q, k] each
    """(share by weight, moved share) of every head's rows."""
    weight = cap.attention(layer)
    moved = cap.moved(layer)
    return weight, moved / moved.sum(-1, keepdim=True).clamp_min(1e-30)


def class_mass(cap: attnviz.Capture, layer: int, keys: list[int], rows: slice = slice(None)) -> tuple[float, float]:
    """The mean over rows and heads of the mass on ``keys``, by weight and moved (NaN without keys)."""
    if not keys:
        return float("nan"), float("nan")
    weight, norm = row_shares(cap, layer)
    index = torch.tensor(keys)
    return (
        float(weight[:, rows][..., index].sum(-1).mean()),
        float(norm[:, rows][..., index].sum(-1).mean()),
    )


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def minilm(texts: list[str]) -> list[str]:
    model, tokenizer = attnviz.load_model("minilm")
    caps = [attnviz.capture(model, text, tokenizer) for text in texts]
    n_layers = caps[0].n_layers
    classes = {
        "[CLS]": lambda cap: [i for i, t in enumerate(cap.token_labels) if t == "[CLS]"],
        "[SEP]": lambda cap: [i for i, t in enumerate(cap.token_labels) if t == "[SEP]"],
        "punctuation": lambda cap: [
            i for i, t in enumerate(cap.token_labels) if t not in ("[CLS]", "[SEP]") and is_punct(t)
        ],
    }
    # per class and layer: the mean over texts (each text's mean over its rows and heads)
    table = {
        name: [[class_mass(cap, layer, keys(cap)) for cap in caps] for layer in range(n_layers)]
        for name, keys in classes.items()
    }

    def mean(pairs, k):
        return sum(p[k] for p in pairs) / len(pairs)

    out = [
        "## MiniLM (BERT): [CLS], [SEP] and punctuation by weight and moved",
        "",
        f"{len(texts)} English sentences ({', '.join(repr(t[:24] + '…') for t in texts[:2])}, …); each key "
        "class's mass per row, averaged over rows, heads and texts (all layers: the mean of the layers).",
        "",
        "| layer | [CLS] weight | [CLS] norm | [SEP] weight | [SEP] norm | punct. weight | punct. norm |",
        "|---|---|---|---|---|---|---|",
    ]
    for layer in range(n_layers):
        cells = []
        for name in classes:
            pairs = table[name][layer]
            cells += [pct(mean(pairs, 0)), pct(mean(pairs, 1))]
        out.append(f"| L{layer} | " + " | ".join(cells) + " |")
    overall = {
        name: (
            sum(mean(table[name][layer], 0) for layer in range(n_layers)) / n_layers,
            sum(mean(table[name][layer], 1) for layer in range(n_layers)) / n_layers,
        )
        for name in classes
    }
    out.append("| **all** | " + " | ".join(f"**{pct(w)}** | **{pct(n)}**" for w, n in overall.values()) + " |")
    special_w = overall["[CLS]"][0] + overall["[SEP]"][0]
    special_n = overall["[CLS]"][1] + overall["[SEP]"][1]
    agrees = special_n < special_w
    out += [
        "",
        f"[CLS] + [SEP] take {pct(special_w)} of the weight and {pct(special_n)} of what moves "
        f"({special_n / special_w:.2f}×); punctuation {pct(overall['punctuation'][0])} → "
        f"{pct(overall['punctuation'][1])}. "
        + (
            "MiniLM agrees with Kobayashi et al.: the special tokens' weight is larger than what they move."
            if agrees
            else "MiniLM does not agree with Kobayashi et al. here: the special tokens move as much as their weight."
        )
        + (
            " Punctuation does not follow them: it moves more than its weight says."
            if overall["punctuation"][1] > overall["punctuation"][0]
            else " Punctuation too moves less than its weight."
        ),
        "",
    ]
    return out


def row_report(cap: attnviz.Capture, query: str, antecedent: str, fixed: tuple[int, int]) -> list[str]:
    """The query word's row: the head with the largest weight on the antecedent, and ``fixed``."""
    words = cap.word_labels
    q, a = words.index(query), words.index(antecedent)
    weight_on = torch.stack([cap.attention(layer, words=True)[:, q, a] for layer in range(cap.n_layers)])
    best = divmod(int(weight_on.argmax()), weight_on.shape[1])
    heads = [("the largest weight on the antecedent", best), ("the Lab's example", fixed)]
    if best == fixed:
        heads = [("the largest weight on the antecedent, and the Lab's example", best)]
    lines = []
    for label, (layer, head) in heads:
        table = attnviz.analysis.moved_shares(cap, layer, head, q, words=True)
        bos, ant = table.iloc[0], table.iloc[a]
        lines.append(
            f"| {query} → {antecedent} | L{layer}·H{head} ({label}) | {pct(ant.weight)} | {pct(ant.moved_share)} "
            f"| {pct(bos.weight)} | {pct(bos.moved_share)} |"
        )
    return lines


def smollm2() -> list[str]:
    model, tokenizer = attnviz.load_model("smollm2")
    zh, cat = (attnviz.capture(model, text, tokenizer, add_bos=True) for text in (ZH, CAT))
    out = [
        "## SmolLM2-135M (decoder, with a BOS): the sink by weight and moved",
        "",
        "The BOS's mean share per row (every row but its own, which sees only itself), over heads and the two texts.",
        "",
        "| layer | BOS weight | BOS norm | layer | BOS weight | BOS norm |",
        "|---|---|---|---|---|---|",
    ]
    per_layer = []
    for layer in range(zh.n_layers):
        pairs = [class_mass(cap, layer, [0], rows=slice(1, None)) for cap in (zh, cat)]
        per_layer.append((sum(p[0] for p in pairs) / 2, sum(p[1] for p in pairs) / 2))
    half = (len(per_layer) + 1) // 2
    for i in range(half):
        cells = [f"L{i} | {pct(per_layer[i][0])} | {pct(per_layer[i][1])}"]
        j = i + half
        cells.append(f"L{j} | {pct(per_layer[j][0])} | {pct(per_layer[j][1])}" if j < len(per_layer) else " | | ")
        out.append("| " + " | ".join(cells) + " |")
    w = sum(p[0] for p in per_layer) / len(per_layer)
    n = sum(p[1] for p in per_layer) / len(per_layer)
    sinkiest = max(range(len(per_layer)), key=lambda i: per_layer[i][0])
    out += [
        "",
        f"Over all layers the BOS takes **{pct(w)}** of the weight and **{pct(n)}** of what moves "
        f"({n / w:.2f}×); in L{sinkiest}, where it takes most weight, {pct(per_layer[sinkiest][0])} → "
        f"{pct(per_layer[sinkiest][1])}.",
        "",
        "### 它 → 小猫 and it → cat (words)",
        "",
        "| row | head | antecedent weight | antecedent moved | BOS weight | BOS moved |",
        "|---|---|---|---|---|---|",
        *row_report(zh, "它", "小猫", (13, 8)),
        *row_report(cat, "it", "cat", (13, 8)),
        "",
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    lines = ["# Weight vs what moves on the carried models (bench/moved_shares.py)", ""]
    lines += minilm(ENGLISH)
    lines += smollm2()
    lines.append(f"_{time.time() - t0:.0f} s, attnviz {attnviz.__version__}, torch {torch.__version__}, CPU_")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
