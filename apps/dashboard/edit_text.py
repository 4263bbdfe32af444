"""What the edit panels compute and say, apart from their callbacks (``edit_view``): the model a page's
capture can be edited on, the AttentionLab's state as edits (``attnviz.edits``), tokens named as the
words they make up, and an intervention's result as the page's lines and the edited row."""

from __future__ import annotations

from dash import html

import attnviz
from attnviz import edits, figures

from .captures import FILE_PREFIX


def model_of(store: dict | None) -> str:
    """The model of the page's run, which edits start from with the page's capture as it is (its tokens,
    BOS and target: ``attnviz.intervene(model, cap, …)`` tokenizes nothing); a capture file has no model."""
    if not store:
        raise attnviz.InputError("Run the model first.")
    model = store["model"]
    if model.startswith(FILE_PREFIX):
        raise attnviz.InputError("A capture file holds no model to edit; pick a model in the list and run the text.")
    if store.get("generate"):
        raise attnviz.InputError(
            "Edits run one forward of a text: run the prompt with its continuation as the text (Run model), then apply."
        )
    return model


def continuation_of(value: str | None) -> str | None:
    """The continuation box's text, or None when it is empty."""
    return value if value and value.strip() else None


def tokens_of(seq: attnviz.TokenSequence, index: int, words: bool) -> list[int]:
    """The tokens of item ``index`` of ``seq``: a word's pieces, or the one token."""
    return list(seq.words[index].tokens) if words else [index]


def named(seq: attnviz.TokenSequence, tokens: list[int]) -> list[int | str]:
    """Tokens as the words they make up where each is a whole word that occurs once (the edit then reads
    "它 ↛ 小猫"), else as positions."""
    wanted = set(tokens)
    counts: dict[str, int] = {}
    for w in seq.words:
        counts[w.text] = counts.get(w.text, 0) + 1
    named: list[int | str] = []
    covered: set[int] = set()
    for w in seq.words:
        span = set(w.tokens)
        if span and span <= wanted and counts[w.text] == 1 and w.text.strip():
            named.append(w.text)
            covered |= span
    return named + sorted(wanted - covered)


def lab_edits(
    cap: attnviz.Capture, layer: int, head: int, part: str | None, query: list[int], switches, log_t, scope, knocked
) -> tuple[list[edits.Edit], list[str]]:
    """(the lab's state as edits, what of it could not be applied to the model)."""
    where = {"head": {"layer": layer, "head": head}, "layer": {"layer": layer}, "all": {}}[scope or "head"]
    chosen: list[edits.Edit] = []
    notes = []
    switches = switches or []
    causal_model = cap.layer(layer, part).causal
    if "causal" not in switches and causal_model:
        chosen.append(edits.no_causal_mask(part=part, **where))
    if "causal" in switches and not causal_model:
        notes.append("The causal switch adds a mask this bidirectional attention never had: not applied to the model.")
    if "scale" not in switches:
        chosen.append(edits.no_scaling(part=part, **where))
    temperature = 10 ** (log_t or 0)
    if abs(temperature - 1) > 1e-9:
        chosen.append(edits.temperature(temperature, part=part, **where))
    if knocked:
        queries, keys = cap.sequences(part)
        chosen.append(edits.knockout(query=named(queries, query), key=named(keys, sorted(knocked)), part=part, **where))
    return chosen, notes


def check_line(out: attnviz.Intervention) -> str:
    """The line that says why the change on the page is the edit's (the no-edit check, or the kernel kept)."""
    if out.check_error == 0.0 and all(e.kind == "ablate" for e in out.edits):
        return "Ablation keeps the model's own kernel."
    return (
        f"attnviz's SDPA without an edit reproduces the model on the edited layers: max |Δ| {out.check_error:.1e} "
        f"(tolerance {out.check_tolerance:.0e}), so the change is the edit's."
    )


def result_lines(out: attnviz.Intervention, continuation: str | None, notes: list[str]) -> html.Div:
    """What "Apply to the model" says: the edits, the next token before → after, the continuation's Δ log P."""
    lines = [html.Div("; ".join(str(e) for e in out.edits), style={"fontWeight": "bold"})]
    if out.before is not None and out.after is not None:
        b, a = out.before.top_tokens(1)[0], out.after.top_tokens(1)[0]
        lines.append(html.Div(f"next token {b.token!r} {b.probability:.2f} → {a.token!r} {a.probability:.2f}"))
        if continuation is not None:
            before, after = out.logprob(continuation)
            lines.append(html.Div(f"log P({continuation!r}): {before:.2f} → {after:.2f} (Δ {after - before:+.2f})"))
    else:
        lines.append(
            html.Div(
                f"no language-model head: final hidden states, cosine to the unedited ≥ {float(out.similarity.min()):.4f}"
            )
        )
    lines.append(html.Div(check_line(out), style={"color": "#555", "fontSize": "0.9em"}))
    lines.extend(html.Div(note, style={"color": "#8a6d3b"}) for note in notes)
    return html.Div(lines)


def edited_row(out: attnviz.Intervention, layer: int, head: int, index: int, words: bool, part: str | None):
    """The query\'s row of one head as the edited model computed it."""
    fig = figures.query_row(out.capture_after, layer, head, index, words=words, part=part)
    names = figures.helpers.labels(out.capture_after, words, part, "query")
    fig.update_layout(title=f"{names[index]!r} → L{layer}·H{head} as the edited model computed it")
    return fig
