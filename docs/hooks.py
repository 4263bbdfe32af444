"""MkDocs hook: the pages' numbers and the CLI reference are made at build time, never typed in.

- ``<!-- attnviz:cli -->`` becomes ``attnviz --help`` and each subcommand's help, from
  ``attnviz.cli.build_parser()``.
- Sphinx roles in the API reference's docstrings (``:func:`x```) show as the code alone.
- ``<!-- attnviz:concepts -->`` becomes the Concepts page's walk through self-attention's six steps,
  the causal mask, ÷√d_k and the n² cost, on SmolLM2 (a causal decoder) and MiniLM (a bidirectional
  encoder), both carried by pip packages, so the build needs no hub (``HF_HUB_OFFLINE=1``).
- After the build, the site's ``stylesheets/cjk.css`` gets the CJK face the dashboard ships
  (``attnviz.assets.CJK_FONT``) inlined, and its licence goes to ``assets/fonts/OFL.txt``: 它 and 小猫 read
  on a machine without a CJK font, from a served site or from ``site/index.html`` opened from disk.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import time
import warnings
from pathlib import Path

# The docs build only: the Concepts page's SmolLM2 loads transformers, which imports accelerate, whose SageMaker
# config imports boto3 → botocore → urllib3 2.x, and urllib3 warns at import that its 'urllib3[secure]' extra is
# deprecated (a DeprecationWarning, printed by mkdocs with its stack on every build). Nothing of attnviz's; its
# own warnings stay.
warnings.filterwarnings("ignore", message=r"'urllib3\[secure\]' extra is deprecated", category=DeprecationWarning)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TEXT = "我家的小猫很可爱，它很好动。"  # the seeds' sentence: "my cat is cute, it is lively"
PRONOUN, ANTECEDENT, RIGHT = "它", "小猫", "好动"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- attnviz:cli -->" in markdown:
        markdown = markdown.replace("<!-- attnviz:cli -->", cli_reference())
    if "<!-- attnviz:concepts -->" in markdown:
        markdown = markdown.replace("<!-- attnviz:concepts -->", concepts())
    return markdown


#: the font's address in docs/stylesheets/cjk.css, replaced by the font itself in the built copy
CJK_URL = 'url("../assets/fonts/attnviz-cjk.woff2")'


def on_post_build(config) -> None:
    embed_cjk_font(Path(config["site_dir"]))


def embed_cjk_font(site: Path) -> None:
    """The site's ``stylesheets/cjk.css`` with the face inlined (a data: URL: a page opened from disk loads no
    font file), and the face's licence beside where the site keeps its assets."""
    import base64

    from attnviz.assets import CJK_FONT

    css = site / "stylesheets" / "cjk.css"
    text = css.read_text(encoding="utf-8")
    if CJK_URL not in text:
        raise RuntimeError(f"{css} names no {CJK_URL}: docs/stylesheets/cjk.css and docs/hooks.py disagree")
    data = base64.b64encode(CJK_FONT.read_bytes()).decode("ascii")
    css.write_text(text.replace(CJK_URL, f"url(data:font/woff2;base64,{data})"), encoding="utf-8")
    (site / "assets" / "fonts").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CJK_FONT.parent / "OFL.txt", site / "assets" / "fonts" / "OFL.txt")


_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):(<code>)")


def on_page_content(html: str, page, config, files) -> str:
    # the docstrings cross-reference in Sphinx's roles (:func:`x`), which mkdocstrings leaves as text
    # before the code: keep the code, drop the role's name
    return _ROLE.sub(r"\1", html)


# ---------------------------------------------------------------------------------------------- CLI
@functools.cache
def cli_reference() -> str:
    os.environ.setdefault("COLUMNS", "100")  # argparse wraps its help at the terminal's width
    from attnviz.cli import build_parser

    parser = build_parser()
    out = ["## attnviz", "", "```text", parser.format_help().rstrip(), "```", ""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [f"## attnviz {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------- Concepts
def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _frame(df) -> str:
    return _table([str(c) for c in df.columns], df.astype(str).values.tolist())


def _shape(t) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _row(labels: list[str], values) -> str:
    pairs = [(label, float(v)) for label, v in zip(labels, values)]
    return " · ".join(f"{label} {v:.2f}" for label, v in pairs)


@functools.cache
def concepts() -> str:
    import torch

    import attnviz
    from attnviz.analysis import cost_tables

    start = time.perf_counter()
    model, tokenizer = attnviz.load_model("smollm2")
    cap = attnviz.capture(model, TEXT, tokenizer, add_bos=True)
    words = [w.text for w in cap.words]
    i, j, r = words.index(PRONOUN), words.index(ANTECEDENT), words.index(RIGHT)

    # the head that puts the most weight from 它 on 小猫, word level (the model's own mask and scaling)
    best = max(
        ((layer, head) for layer in range(cap.n_layers) for head in range(cap.n_heads)),
        key=lambda lh: float(cap.attention(lh[0], head=lh[1], words=True)[i, j]),
    )
    L, H = best
    kv = cap.kv_head_of(H)
    rec = cap.layer(L)
    attn = model.model.layers[L].self_attn
    wq, wk, wv = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight  # [out, in]
    d_model, d_k = wq.shape[1], cap.d_head
    q, k, v = cap.q(L), cap.k(L), cap.v(L)

    tok_i = cap.words[i].token_stop - 1  # the pronoun's last token: its row sees the whole word
    labels = cap.token_labels
    raw = cap.scores(L, head=H, scale=False)[tok_i]
    scaled = cap.scores(L, head=H)[tok_i]
    allowed = cap.allowed(L)
    a = cap.attention(L, head=H)
    a_flat = cap.attention(L, head=H, scale=False)
    a_open = cap.attention(L, head=H, causal=False)
    z = cap.output(L, head=H)
    by_hand = (
        torch.softmax((q[H].float() @ k[kv].float().T * rec.scaling).masked_fill(~allowed, float("-inf")), dim=-1)
        @ v[kv].float()
    )
    err = float((by_hand - z).abs().max())
    keys = slice(0, tok_i + 1)  # the keys the pronoun may see under the causal mask
    w_words = cap.attention(L, head=H, words=True)[i]

    n = cap.n_tokens
    n_allowed = int(allowed.sum())

    mini_model, mini_tokenizer = attnviz.load_model("minilm")
    mini = attnviz.capture(mini_model, TEXT, mini_tokenizer)
    m_allowed = mini.allowed(0)
    tables = cost_tables(cap)
    seconds = time.perf_counter() - start

    s = []
    s.append(
        f"Computed while this page was built, in {seconds:.0f} s on a CPU: SmolLM2-135M-Instruct "
        f"({cap.n_layers} layers × {cap.n_heads} query heads, {cap.n_kv_heads} key/value heads, "
        f"d_model = {d_model}, d_k = {d_k}, {cap.model.get('backend', 'sdpa')}) on 「{TEXT}」 with its BOS: "
        f"{n} tokens, {len(words)} words. The head shown is the one that puts the most weight from "
        f"{PRONOUN} on {ANTECEDENT}, found by trying all {cap.n_layers * cap.n_heads}: **L{L}·H{H}** "
        f"(0-based), reading key/value head {kv}."
    )
    s.append("")
    s.append("The tokens (byte-level pieces read as the characters they form):")
    s.append("")
    s.append("`" + "` `".join(labels) + "`")
    s.append("")
    s.append("## Step 1: learned projections")
    s.append("")
    s.append(
        f"Layer {L}'s projections, as stored by PyTorch (`[out, in]`, so W_Q of the seeds is the transpose): "
        f"`q_proj` {_shape(wq)}, `k_proj` {_shape(wk)}, `v_proj` {_shape(wv)}. The query projection makes "
        f"{wq.shape[0] // d_k} heads of {d_k}; the key and value projections only {wk.shape[0] // d_k} "
        f"(grouped-query attention: {cap.n_heads // cap.n_kv_heads} query heads share each key/value head)."
    )
    s.append("")
    s.append("## Step 2: Q, K and V")
    s.append("")
    s.append(
        _table(
            ["tensor", "attnviz", "shape", "what it is"],
            [
                ["Q", f"`cap.q({L})`", _shape(q), "[head, query_pos, d_k], after RoPE"],
                ["K", f"`cap.k({L})`", _shape(k), "[kv_head, key_pos, d_k], after RoPE"],
                ["V", f"`cap.v({L})`", _shape(v), "[kv_head, key_pos, d_v]"],
            ],
        )
    )
    s.append("")
    s.append(
        "They are what the model's attention kernel received on this forward: computed from this text, "
        "not stored in the model."
    )
    s.append("")
    s.append("## Step 3: scores Q·Kᵀ")
    s.append("")
    s.append(
        f"`cap.scores({L}, head={H}, scale=False)` is the n × n matrix {_shape(cap.scores(L, head=H, scale=False))}. "
        f"The row of {PRONOUN}'s last token ({labels[tok_i]}, position {tok_i}), over the keys up to itself:"
    )
    s.append("")
    s.append(_row(labels[keys], raw[keys]))
    s.append("")
    s.append("## Step 4: scaling by 1/√d_k")
    s.append("")
    s.append(
        f"The model's factor is `{rec.scaling:.4f}` = 1/√{d_k}. The same row, scaled "
        f"(`cap.scores({L}, head={H})`): standard deviation {float(raw[keys].std()):.2f} → "
        f"{float(scaled[keys].std()):.2f}."
    )
    s.append("")
    s.append(_row(labels[keys], scaled[keys]))
    s.append("")
    s.append("## Step 5: softmax")
    s.append("")
    s.append(f"`cap.attention({L}, head={H})` — each row sums to 1 (this one: {float(a[tok_i].sum()):.6f}):")
    s.append("")
    s.append(_row(labels[keys], a[tok_i, keys]))
    s.append("")
    s.append(
        f"Without the scaling (`scale=False`, the seeds' switch) the largest weight of the row goes from "
        f"{float(a[tok_i].max()):.2f} to {float(a_flat[tok_i].max()):.2f}: the row "
        + ("collapses toward one-hot" if float(a_flat[tok_i].max()) > float(a[tok_i].max()) else "changes")
        + ". That is why ÷√d_k is there: with d_k = "
        f"{d_k} the dot products' spread grows with √d_k, and an unscaled softmax saturates."
    )
    s.append("")
    s.append(
        f"At word level (`words=True`: attention *to* a word summed over its tokens, *from* a word averaged) "
        f"{PRONOUN} puts **{float(w_words[j]):.2f}** on {ANTECEDENT}:"
    )
    s.append("")
    s.append(_row(words[: i + 1], w_words[: i + 1]))
    s.append("")
    s.append("## Step 6: Z = A·V")
    s.append("")
    s.append(
        f"`cap.output({L}, head={H})` is {_shape(z)}: each token's new {d_k}-vector, a weighted mix of "
        f"the values. Recomputing it by hand from the captured Q, K and V — "
        f"`softmax(q @ k.T * {rec.scaling:.4f} + M) @ v` — differs from attnviz's by at most {err:.1e}, and "
        "attnviz's own recomputation was checked against the model's attention output when the capture "
        "was made:"
    )
    s.append("")
    s.append("```text")
    s.append(str(cap.validate()))
    s.append("```")
    s.append("")
    s.append("## The causal mask")
    s.append("")
    s.append(
        f"SmolLM2 is a decoder: `cap.allowed({L})` lets through {n_allowed} of the {n}² = {n * n} "
        f"(query, key) pairs, n(n+1)/2 = {n * (n + 1) // 2}. The keys to the right of {labels[tok_i]} "
        f"({'·'.join(labels[tok_i + 1 :])}) get {float(a[tok_i, tok_i + 1 :].sum()):.3f} of its weight; with the "
        f"mask lifted (`cap.attention({L}, head={H}, causal=False)`) they would get "
        f"{float(a_open[tok_i, tok_i + 1 :].sum()):.3f}, {RIGHT} alone "
        f"{float(a_open[tok_i, cap.words[r].token_start : cap.words[r].token_stop].sum()):.3f}."
    )
    s.append("")
    s.append(
        f"MiniLM is a bidirectional encoder (BERT): on the same text ({mini.n_tokens} tokens, with "
        f"[CLS] and [SEP]) `mini.allowed(0)` lets through {int(m_allowed.sum())} of {mini.n_tokens}² = "
        f"{mini.n_tokens**2} pairs: every token sees every token."
    )
    s.append("")
    s.append("## The n² cost")
    s.append("")
    s.append(
        f"`attnviz.analysis.cost_tables(cap)` gives the seeds' tables for this model at n = {n} "
        "(shapes for one layer; FLOPs for one layer and the whole model; the memory of A at this n, 4k and 128k tokens):"
    )
    for name in ("shapes", "flops", "memory"):
        s.append("")
        s.append(f"**{name}**")
        s.append("")
        s.append(_frame(tables[name]))
    s.append("")
    return "\n".join(s)
