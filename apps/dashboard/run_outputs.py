"""What a run sets on the page (``VIEW_OUTPUTS``: the store every view reads, the messages, the selectors),
as the run callbacks of ``run_view`` and the background capture job of ``run_job`` both set it: the
outputs for a capture the server holds (:func:`opened`) or for a run that failed (:func:`failed`), and
the status line's words."""

from __future__ import annotations

from dash import no_update

import attnviz
from attnviz.figures.helpers import MARK

from .captures import Captures, default_query
from .generations import MAX_NEW_TOKENS, generation_of
from .ids import ID

PART_LABELS = {
    "encoder": "encoder (source × source)",
    "decoder": "decoder (target × target)",
    "cross": "cross (target × source)",
}

VIEW_OUTPUTS = [  # what a run sets: the store every view reads, the messages, and the selectors
    (ID.store, "data"),
    (ID.message, "children"),
    (ID.status, "children"),
    (ID.layer, "options"),
    (ID.layer, "value"),
    (ID.head, "options"),
    (ID.head, "value"),
    (ID.heads_multi, "options"),
    (ID.heads_multi, "value"),
    (ID.lab_query, "data"),
    (ID.lab_switches, "value"),
    (ID.part, "options"),
    (ID.part, "value"),
    (ID.part_box, "style"),
]


def checked_new_tokens(value) -> int:
    """The number typed in "new tokens", as a whole number in 1..MAX_NEW_TOKENS (else a message saying so)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise attnviz.InputError(f"How many new tokens? Type a whole number from 1 to {MAX_NEW_TOKENS}.")
    if not 1 <= value <= MAX_NEW_TOKENS:
        raise attnviz.InputError(
            f"{int(value)} new tokens: the page generates from 1 to {MAX_NEW_TOKENS}; "
            "generate longer texts in a script (attnviz.generate) and open the saved file with --capture."
        )
    return int(value)


def generation_status(gen: attnviz.Generation) -> str:
    """The status line's start for a generation: the continuation, quoted (long ones shortened)."""
    text = gen.text if len(gen.text) <= 300 else gen.text[:300] + "…"
    stopped = ", stopped at the end-of-text token" if gen.info.get("stopped") == "eos" else ""
    before = "the decoder's start token" if gen.capture.target is not None else f"{gen.prompt_length} prompt"
    return f"generated {len(gen)} new tokens{stopped}: “{text}” — {before} + {len(gen)} new {MARK} in every view; "


def status_line(cap: attnviz.Capture) -> str:
    """What the status line says about a capture."""
    gen = generation_of(cap)
    status = f"{cap.model.get('name')}: " + (generation_status(gen) if gen is not None else "")
    status += f"{cap.n_tokens} tokens, {len(cap.words)} words"
    if cap.target is not None:
        status += f", target {len(cap.target.tokens)} tokens"
    status += ", " + ", ".join(
        f"{p} {i['n_layers']} layers × {i['n_heads']} heads ({i['n_kv_heads']} KV)"
        if len(cap.parts) > 1
        else f"{i['n_layers']} layers × {i['n_heads']} heads ({i['n_kv_heads']} KV)"
        for p, i in cap.model["parts"].items()
    )
    kept = {p: cap.kept_heads(p) for p in cap.parts}
    if any(len(heads) < cap.info(p)["n_heads"] for p, heads in kept.items()):  # capture(heads=): say which
        status += ", kept heads " + ", ".join(f"H{h}" for h in sorted({h for heads in kept.values() for h in heads}))
    return status + f", {cap.model.get('backend')}"


def failed(message: str) -> tuple:
    """The outputs of a run that failed: only its message."""
    # the page keeps showing the last capture, and the status line keeps describing it
    return (no_update, message) + (no_update,) * (len(VIEW_OUTPUTS) - 2)


#: the message of a Run (or Generate) whose capture the server holds already: shown at once, the model not run
ALREADY_CAPTURED = "This text is already captured — shown (the server holds its capture; the model did not run again)."


def opened(captures: Captures, store: dict, cap: attnviz.Capture, *, message: str = "") -> tuple:
    """The selectors' outputs for a capture the server holds (its opening head memoised by ``captures``);
    ``message``: the page's message line (empty: cleared)."""
    gen = generation_of(cap)
    # the encoder of an encoder-decoder (the text the user typed); the decoder of a generation
    part = "decoder" if gen is not None else cap.parts[0]
    layers = cap.layer_indices(part)
    heads = cap.kept_heads(part)  # the selectors offer only the heads kept (capture(heads=)), by the model's numbers
    view = cap.select(part)
    query = gen.prompt_length if gen is not None else default_query(view)  # a generation: its first new token
    best_layer, best_head = captures.opening_head(store, part, view, query)
    return (
        store,
        message,
        status_line(cap),
        [{"label": f"L{i}", "value": i} for i in layers],
        best_layer,
        [{"label": f"H{h}", "value": h} for h in heads],
        best_head,
        [{"label": f"H{h} ", "value": h} for h in heads],
        [best_head],
        query,
        ["causal", "scale"] if any(r.causal for r in view.records.values()) else ["scale"],
        [{"label": PART_LABELS[p], "value": p} for p in cap.parts],
        part,
        {"display": "none"} if len(cap.parts) == 1 else {"display": "flex"},
    )
