"""The AttentionLab: click a token to make it the query, see its row of weights, and flip the causal
mask, the ÷√d_k scaling and the temperature — the row recomputed from the model's real Q and K. The
shared "Show" control (weights | moved) switches its bars to each key's share of what the head
moves into the query, ‖α·f(x)‖, drawn beside the weights, and two lines say the row's own numbers.
Other views add their panels to it through the panel registry (``panels.py``): a generation's step
slider in the slot ``"steps"`` (generation_view), "apply to the model" in ``"apply"`` (edit_view)."""

from __future__ import annotations

import math

from dash import ALL, Dash, Input, Output, State, dcc, html

import attnviz
import attnviz.analysis
from attnviz import figures
from attnviz.figures import message_figure
from attnviz.figures.helpers import new_start

from .background import on_screen
from .captures import Captures
from .common import chip, word_of
from .errors import only_on, shows_errors
from .ids import GID, ID
from .panels import slot_panels
from .registry import View, registers

_CONTROL = {"display": "inline-block", "marginRight": "18px", "verticalAlign": "top"}


def token_roles(start: int, stop: int, first_new: int | None, shown_to: int | None) -> list[str]:
    """CSS classes of a lab chip covering tokens ``start..stop-1``: "generated" when it holds a new token,
    "later" when it comes after the step slider's token (written after that step)."""
    if first_new is None:
        return []
    roles = ["generated"] if stop > first_new else []
    if shown_to is not None and start > shown_to:
        roles.append("later")
    return roles


CHIPS = 512  # token chips the lab shows at most: a window around the query (2.6 MB of buttons at 8,192 tokens)


def chip_window(n: int, chosen: int, size: int = CHIPS) -> tuple[int, int]:
    """``[lo, hi)``: the chips shown, at most ``size`` of ``n``, centred on the chosen one where they fit."""
    if n <= size:
        return 0, n
    lo = min(max(0, chosen - size // 2), n - size)
    return lo, lo + size


def lessons(cap: attnviz.Capture, layer: int, head: int, index: int, words: bool, kwargs: dict) -> list:
    """What the switches teach (the seeds' points), said with this row's own numbers."""
    said = []
    part = kwargs.get("part")
    names = figures.helpers.labels(cap, words, part, "key")
    rec = cap.layer(layer, part)
    if not kwargs["scale"]:
        scaled = figures.helpers.row_stats(
            cap.attention(layer, head, part=part, causal=kwargs["causal"], words=words, rows=[index])[0]
        )  # the row alone (in words: its word's token rows), not the head's whole map
        said.append(
            f"Without ÷√d_k the scores are {1 / rec.scaling:.3g}× larger (d_k = {cap.info(part)['d_head']}), so the softmax "
            f"saturates: entropy {scaled['entropy']:.2f} → the one above, top weight {scaled['top_weight']:.2f} "
            "→ closer to one-hot. That is why the scaling exists."
        )
    if rec.causal and not kwargs["causal"]:
        future = cap.attention(layer, head, part=part, causal=False, words=words, rows=[index])[0, index + 1 :].sum()
        said.append(
            f"Without the causal mask {names[index]!r} puts {float(future):.2f} on tokens to its right — "
            "weights this decoder never computes: it only ever sees the past."
        )
    if not rec.causal and kwargs["causal"]:
        said.append("This encoder is bidirectional: the causal mask is not how it was trained.")
    return [html.Div(line, className="lab-lesson", style={"color": "#555", "fontSize": "0.9em"}) for line in said]


def temperature_text(log_temperature: float | None) -> str:
    """What the temperature slider (which moves log10 T) reads as: T itself, two significant digits."""
    return f"{10 ** (log_temperature or 0):.2g}"


def head_label(cap: attnviz.Capture, layer: int, head: int, part: str | None) -> str:
    """ "L13·H8", with its part before it ("decoder L3·H1") when the capture has several."""
    return f"{cap.resolve_part(part) + ' ' if len(cap.parts) > 1 else ''}L{layer}·H{head}"


def percent(share: float) -> str:
    """A share as the lab says it: "28 %", or "0.4 %" below one per cent."""
    return f"{100 * share:.0f} %" if share >= 0.01 or share == 0 else f"{100 * share:.1f} %"


def moved_lines(
    cap: attnviz.Capture, layer: int, head: int, index: int, kwargs: dict, shares: tuple | None = None
) -> list[str]:
    """What moves, said with this row's own numbers: for the key with the largest weight (and the first
    key — the BOS, [CLS] — when it is not that one), its share of the weight and of what the head
    writes into the query, then one line on why the two differ. Empty when the layer holds no value
    norms. ``kwargs``: the lab's switches (``words``, ``causal``, ``scale``, ``temperature``, ``part``);
    ``shares``: the row's :func:`attnviz.analysis.row_shares`, when the caller has computed them."""
    part = kwargs.get("part")
    if cap.layer(layer, part).value_dots is None:
        return []
    weight, _, share = shares or attnviz.analysis.row_shares(cap, layer, head, index, **kwargs)
    words = kwargs.get("words", False)
    q_names, names = figures.helpers.labels(cap, words, part, "query"), figures.helpers.labels(cap, words, part, "key")
    head_name = head_label(cap, layer, head, part)
    top = int(weight.argmax())
    keys = [top] if top == 0 else [top, 0]
    said = [
        f"{names[j]!r} takes {percent(float(weight[j]))} of the weight and {percent(float(share[j]))} of what "
        f"{head_name} writes into {q_names[index]!r}."
        for j in keys
    ]
    ratios = {j: float(share[j] / weight[j]) for j in keys if float(weight[j]) > 0}
    if not ratios or float(share.sum()) == 0:
        return said
    far = max(ratios, key=lambda j: abs(math.log(max(ratios[j], 1e-12))))
    ratio = ratios[far]
    why = (
        "Why they differ: a key moves its weight times the length of the vector the head writes from it, "
        f"‖f(x)‖ = ‖W_O·v‖. The vector of {names[far]!r} is {ratio:.2g}× the row's weight-averaged length, so "
    )
    if ratio < 0.8:
        why += "its weight moves little: a large weight on a key whose value the head barely projects is no copy."
    elif ratio > 1.25:
        why += "it moves more than its weight says: a smaller weight on a long vector can carry more."
    else:
        why = (
            f"Here weight and moved agree (the vector of {names[far]!r} is {ratio:.2g}× the row's weight-averaged "
            "length ‖f(x)‖ = ‖W_O·v‖); they need not: a large weight on a key whose value the head barely "
            "projects moves little."
        )
    return [*said, why]


def stats_line(
    cap: attnviz.Capture, layer: int, head: int, index: int, measure: str, kwargs: dict, shares: tuple | None = None
) -> str:
    """The lab's first line: the row's top weight and entropy, or (``measure="moved"``) where most of
    what the head writes into the query comes from (``shares`` as in :func:`moved_lines`)."""
    words, part = kwargs.get("words", False), kwargs.get("part")
    q_names, names = figures.helpers.labels(cap, words, part, "query"), figures.helpers.labels(cap, words, part, "key")
    unit = "words" if words else "tokens"
    if measure == "moved":
        weight, _, share = shares or attnviz.analysis.row_shares(cap, layer, head, index, **kwargs)
        top = int(share.argmax())
        return (
            f"query {q_names[index]!r} (#{index}) → {percent(float(share[top]))} of what "
            f"{head_label(cap, layer, head, part)} writes into it comes from {names[top]!r} "
            f"(weight {float(weight[top]):.2f}), over {int((weight > 0).sum())} visible {unit}; "
            f"temperature {kwargs['temperature']:.2g}"
        )
    row = shares[0] if shares else cap.attention(layer, head, **kwargs)[index]
    stats = figures.helpers.row_stats(row)
    return (
        f"query {q_names[index]!r} (#{index}) → top weight {stats['top_weight']:.2f} on "
        f"{names[stats['top_index']]!r}; entropy {stats['entropy']:.2f} nats "
        f"({100 * stats['entropy_share']:.0f}% of the uniform row over {stats['support']} visible "
        f"{unit}); temperature {kwargs['temperature']:.2g}"
    )


def layout(graph_config: dict) -> list:
    return [
        html.P(
            "Click a token to make it the query, and see its row of weights. Switch the causal mask "
            "and the ÷√d_k scaling, or change the temperature: the row is recomputed with attnviz's "
            "own SDPA from this model's real Q and K. Show \"moved\" to see, beside each key's "
            "weight, its share of what the head moves into the query (‖α·f(x)‖)."
        ),
        *slot_panels("lab", "steps"),  # a generation's step slider (generation_view)
        html.Div(id=ID.lab_tokens, style={"lineHeight": "2.1em", "margin": "6px 0"}),
        html.Div(
            [
                dcc.Checklist(
                    id=ID.lab_switches,
                    inline=True,
                    value=["causal", "scale"],
                    options=[
                        {"label": " causal mask (see only the left) ", "value": "causal"},
                        {"label": " ÷√d_k scaling", "value": "scale"},
                    ],
                    style=_CONTROL,
                ),
                html.Div(
                    [
                        html.Label(
                            ["temperature ", html.B(temperature_text(0), id=ID.lab_temperature_value)],
                            title="the scores are divided by this before the softmax: below 1 sharper, above 1 flatter",
                        ),
                        # the slider moves log10(T): its own number box would show the logarithm (0 for T = 1)
                        dcc.Slider(
                            id=ID.lab_temperature,
                            min=-1,
                            max=1,
                            step=0.05,
                            value=0,
                            allow_direct_input=False,
                            marks={-1: "0.1", -0.5: "0.32", 0: "1", 0.5: "3.2", 1: "10"},
                        ),
                    ],
                    style={**_CONTROL, "width": "360px"},
                ),
            ]
        ),
        html.Div(id=ID.lab_stats, style={"fontSize": "1.1em", "margin": "6px 0"}),
        dcc.Graph(id=ID.lab_graph, config=graph_config),
        # apply the switches, the temperature and knocked-out keys to the model (edit_view)
        *slot_panels("lab", "apply"),
    ]


def register(app: Dash, captures: Captures) -> None:
    @app.callback(Output(ID.lab_temperature_value, "children"), Input(ID.lab_temperature, "value"))
    def show_temperature(log_temperature):
        return temperature_text(log_temperature)

    @app.callback(
        Output(ID.lab_tokens, "children"),
        Input(ID.store, "data"),
        Input(ID.words, "value"),
        Input(ID.lab_query, "data"),
        Input(ID.part, "value"),
        Input(GID.step, "value"),
        Input(ID.tabs, "value"),
    )
    @shows_errors(lambda _m: [])  # the run callback reports a capture that fails
    def lab_tokens(store, units, query, part, step, tab):
        only_on(tab, "lab")  # thousands of chips for a long text: built only where they are seen
        cap = captures.from_store(store)
        if cap is None:
            return []
        part = part if len(cap.parts) > 1 else None
        queries, _ = cap.sequences(part)
        first_new = new_start(cap, part, False, "query")  # None unless the chips are a generation's tokens
        shown_to = None if first_new is None or step is None else first_new + int(step)  # the step slider's token
        if units == "words":
            items = [
                (w.token_start, w.token_stop, w.text, w.token_start <= (query or 0) < w.token_stop)
                for w in queries.words
            ]
        else:
            items = [(i, i + 1, label, i == query) for i, label in enumerate(queries.token_labels)]
        chosen_at = next((i for i, item in enumerate(items) if item[3]), 0)
        lo, hi = chip_window(len(items), chosen_at)
        chips: list = []
        if lo > 0:
            chips.append(html.Span(f"… {lo:,} earlier (click the first chip to move back) ", className="lab-more"))
        for start, stop, label, chosen in items[lo:hi]:
            roles = token_roles(start, stop, first_new, shown_to)
            chips.append(
                chip(
                    label,
                    {"type": ID.lab_token, "index": start},
                    " ".join(["lab-token", *roles, *(["selected"] if chosen else [])]),
                    "#d62728" if chosen else None,
                    title=f"generated at step {start - first_new}" if "generated" in roles else None,
                )
            )
        if hi < len(items):
            chips.append(
                html.Span(f" … {len(items) - hi:,} later (click the last chip to move on)", className="lab-more")
            )
        return chips

    # A clicked chip becomes the query (and moves the step slider to it, if it is a new token); the step
    # slider makes its new token the query. In the browser: arrow keys fire one step after another, and
    # overlapping server calls could land out of order and leave the query a step behind the slider.
    app.clientside_callback(
        """(clicks, step, first) => {
            const noUpdate = window.dash_clientside.no_update;
            const trigger = window.dash_clientside.callback_context.triggered_id;
            const steps = first !== null && first !== undefined;
            if (trigger === "STEP") {
                return steps && step !== null && step !== undefined ? [first + step, noUpdate] : [noUpdate, noUpdate];
            }
            if (!trigger || !clicks.some(Boolean)) {
                return [noUpdate, noUpdate];
            }
            return [trigger.index, steps && trigger.index >= first ? trigger.index - first : noUpdate];
        }""".replace("STEP", GID.step),
        Output(ID.lab_query, "data", allow_duplicate=True),
        Output(GID.step, "value", allow_duplicate=True),
        Input({"type": ID.lab_token, "index": ALL}, "n_clicks"),
        Input(GID.step, "value"),
        State(GID.first_new, "data"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output(ID.lab_graph, "figure"),
        Output(ID.lab_stats, "children"),
        Input(ID.store, "data"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        Input(ID.words, "value"),
        Input(ID.lab_query, "data"),
        Input(ID.lab_switches, "value"),
        Input(ID.lab_temperature, "value"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
        Input(ID.measure, "value"),
        Input(ID.lab_key, "data"),
        State(ID.page, "data"),
    )
    @shows_errors(lambda m: (message_figure(m), m))
    def lab(store, layer, head, units, query, switches, log_temperature, tab, part, measure, key, page):
        only_on(tab, "lab")
        on_screen(captures, store, page)  # the jobs of a capture the page left stop
        cap = captures.from_store(store)
        if cap is None or layer is None or head is None or query is None:
            return message_figure("Run the model, then click a token."), ""
        words = units == "words"
        queries, _ = cap.sequences(part if len(cap.parts) > 1 else None)
        token = min(query, queries.n_tokens - 1)  # the query store may hold another part's position
        index = word_of(queries, token) if words else token
        switches_ = switches or []
        temperature = 10 ** (log_temperature or 0)
        kwargs = dict(
            words=words,
            causal="causal" in switches_,
            scale="scale" in switches_,
            temperature=temperature,
            part=part,
        )
        measure = measure or "weights"
        _, key_seq = cap.sequences(part if len(cap.parts) > 1 else None)
        marked = None  # the key the Q·K space highlighted, on its own capture only
        if key and key.get("key") == store.get("key") and 0 <= int(key["position"]) < key_seq.n_tokens:
            marked = word_of(key_seq, int(key["position"])) if words else int(key["position"])
        fig = figures.query_row(cap, layer, head, index, measure=measure, highlight=marked, **kwargs)
        has_norms = cap.layer(layer, part).value_dots is not None
        shares = attnviz.analysis.row_shares(cap, layer, head, index, **kwargs) if has_norms else None  # once
        text = stats_line(cap, layer, head, index, measure, kwargs, shares)
        moved = [  # the row's numbers, then (brown) why weight and moved differ
            html.Div(line, className="lab-moved", style={"color": "#333" if " takes " in line else "#8c4a00"})
            for line in moved_lines(cap, layer, head, index, kwargs, shares)
        ]
        return fig, html.Div(
            [html.Div(text, className="lab-row"), *moved, *lessons(cap, layer, head, index, words, kwargs)]
        )


registers(
    View(
        "lab",
        "AttentionLab",
        order=40,
        register=lambda app, server: register(app, server.captures),
        layout=lambda page: layout(page.graph_config),
        slots=("steps", "apply"),
    )
)
