"""What a report weighs: ``figures.report`` of SmolLM2-135M (30 layers × 9 heads) at ``--tokens`` (default 512).

The text is English prose cut to exactly ``--tokens`` tokens by SmolLM2's tokenizer (no BOS), captured with
the self-check on a sample of rows. The page's parts are measured in the same run: plotly.js, the CJK face
(the text ends with the Chinese seed, so the face is inlined), the precomputed maps by units and measure
(8-bit levels, deflated, base64) and the rest; the goal is the whole page at or under the 15 MB budget at
full resolution (every head's weights, in tokens and words, and what it moves between tokens), printed as a
ratio, and what the page left out to stay within it. The
time to build the page is printed against the capture's own time in the same run (the ratio a speed
goal would read).

    python bench/report_size.py                 # 512 tokens, ~1–2 minutes on 2 shared cores
    python bench/report_size.py --tokens 1024   # what a longer text costs (past the budget: chosen heads)
"""

from __future__ import annotations

import argparse
import json
import time

import plotly.offline

import attnviz
from attnviz import figures
from attnviz.views.html import cjk_font_face
from attnviz.views.report_data import REPORT_BUDGET_MB

PROSE = (
    "The cat chased the mouse through the kitchen because it was hungry, and the mouse hid in the box "
    "because it was small. Later the dog came home and looked for both of them in the garden. "
)
ZH = "我家的小猫很可爱，它很好动。"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()
    model, tok = attnviz.load_model("smollm2")
    ids = tok(PROSE * (args.tokens // 20 + 2), add_special_tokens=False)["input_ids"]
    tail = tok(ZH, add_special_tokens=False)["input_ids"]
    text = tok.decode(ids[: args.tokens - len(tail)]) + ZH
    t0 = time.perf_counter()
    cap = attnviz.capture(model, text, tok)
    t_capture = time.perf_counter() - t0
    t0 = time.perf_counter()
    page = figures.report(cap)
    t_report = time.perf_counter() - t0
    blob = page.split('<script type="application/json" id="attnviz-data">', 1)[1].split("</script>", 1)[0]
    data = json.loads(blob.replace("<\\/", "</"))
    by_kind: dict[str, int] = {}
    for key, (_, b64) in data["maps"].items():
        part, units, measure, *_ = key.split("/")
        by_kind[f"{units}/{measure}"] = by_kind.get(f"{units}/{measure}", 0) + len(b64)
    size = len(page.encode("utf-8"))
    plotly_js = len(plotly.offline.get_plotlyjs())
    face = len(cjk_font_face())
    print(
        f"SmolLM2-135M, {cap.n_tokens} tokens, {len(cap.word_labels)} words, {cap.n_layers} layers × {cap.n_heads} heads"
    )
    print(f"page: {size / 1e6:.2f} MB (budget {REPORT_BUDGET_MB:g} MB: ratio {size / 1e6 / REPORT_BUDGET_MB:.2f})")
    masks = sum(map(len, data["mask_data"]))
    norms = sum(len(b) for _, b in data["norms"].values())
    print(
        f"  plotly.js {plotly_js / 1e6:.2f} MB · CJK face {face / 1e6:.2f} MB · masks {masks / 1e6:.2f} MB · norms {norms / 1e6:.2f} MB"
    )
    for kind, n in sorted(by_kind.items()):
        print(f"  maps {kind}: {n / 1e6:.2f} MB")
    rest = size - plotly_js - face - masks - norms - sum(by_kind.values())
    print(f"  the rest (thumbnails, validation, labels, script): {rest / 1e6:.2f} MB")
    print(f"    of which the model view's thumbnails: {len(json.dumps(data['thumbnails'])) / 1e6:.2f} MB")
    for note in page.split("<b>Left out of this report:</b>", 1)[1:]:
        print("  left out:", note.split("</ul>", 1)[0].replace("<ul><li>", " ").replace("</li><li>", " | ")[:300])
    print(f"  every head's map kept: {data['chosen'] is None}")
    print(f"time: capture {t_capture:.1f} s, report {t_report:.1f} s (ratio {t_report / t_capture:.1f})")


if __name__ == "__main__":
    main()
