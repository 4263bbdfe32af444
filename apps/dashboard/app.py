"""The attnviz dashboard: ``create_app(...) -> Dash`` and ``run(...)``.

Per-session state (the capture's key, selections) lives in ``dcc.Store`` in the browser; captures
live server-side in a :class:`CaptureCache` bounded in bytes, created per app (no module globals).
The model runs once per (model, text); every other control recomputes only the visible view from
the cached Q/K/V, and each callback ships just that view's numbers.
"""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch
from dash import ALL, Dash, Input, Output, State, ctx, dcc, html, no_update

import attnviz
from attnviz import figures
from attnviz.analysis.coref import STOP_WORDS
from attnviz.cost import cost_tables

from . import analysis_views, compare_view, generation_view, head_view, overview_view
from .cache import CaptureCache, capture_key
from .common import chip, error_text, message_figure, text_limit, word_of
from .generation_view import GID, MARK, MAX_NEW_TOKENS, MODEL_VIEW_CELLS, generation_of, mark_view, new_start
from .layout import ID, VIEWS, build_layout

DEFAULT_MODELS = {
    "smollm2": "SmolLM2-135M-Instruct — Llama-style decoder, GQA (embedded)",
    "minilm": "all-MiniLM-L6-v2 — BERT encoder (embedded)",
}
DEFAULT_TEXT = "我家的小猫很可爱，它很好动。"
PRONOUNS = {"it", "he", "she", "they", "him", "her", "them", "它", "他", "她", "它们", "他们", "她们"}
FILE_PREFIX = "file:"
PART_LABELS = {
    "encoder": "encoder (source × source)",
    "decoder": "decoder (target × target)",
    "cross": "cross (target × source)",
}


def background_manager():
    """Where long jobs (a probe set: one forward per probe) run beside the server: Dash's background
    callbacks on a diskcache in a temporary folder, so the page stays usable and the job can be cancelled."""
    import diskcache
    from dash import DiskcacheManager

    return DiskcacheManager(diskcache.Cache(tempfile.mkdtemp(prefix="attnviz-jobs-")))


def wants_bos(model: str) -> bool:
    """Whether the page prepends a BOS by default: for a decoder whose tokenizer starts a text with
    no special token, so that its attention sink is not the text's first word."""
    if model.startswith(FILE_PREFIX):
        return False
    try:
        loaded, tokenizer = attnviz.load_model(model)
    except attnviz.AttnvizError:
        return False
    if getattr(loaded.config, "is_encoder_decoder", False) or not loaded.can_generate():
        return False
    ids = tokenizer("a")["input_ids"]
    return not ids or ids[0] not in set(getattr(tokenizer, "all_special_ids", []))


def is_encoder_decoder(model: str) -> bool:
    """Whether the page should offer a target text for this model (False when it cannot tell)."""
    if model.startswith(FILE_PREFIX) or model in attnviz.EMBEDDED_MODELS:
        return False
    try:
        return bool(attnviz.load_model(model)[0].config.is_encoder_decoder)
    except attnviz.AttnvizError:
        return False


def default_query(cap: attnviz.Capture) -> int:
    """The token the lab opens on: the last pronoun of the text (它, it …), else the last word."""
    words = [w for w in cap.words if w.token_stop > w.token_start and w.char_end > w.char_start]
    for w in reversed(words):
        if w.text.lower() in PRONOUNS:
            return w.token_start
    return (words[-1] if words else cap.words[-1]).token_start


def _table(df: pd.DataFrame, title: str) -> html.Div:
    return html.Div(
        [
            html.H4(title),
            html.Table(
                [html.Tr([html.Th(c) for c in df.columns])]
                + [html.Tr([html.Td(str(v)) for v in row]) for row in df.itertuples(index=False)],
                className="cost-table",
            ),
        ],
        style={"marginBottom": "14px"},
    )


def create_app(
    models: dict[str, str] | None = None,
    *,
    default_model: str | None = None,
    capture_file: str | None = None,
    stats_file: str | None = None,
    cache_bytes: int = 1 << 30,
    max_tokens: int | None = None,
) -> Dash:
    """Build the dashboard.

    - ``models``: ``{name: label}`` offered in the page (names go to ``attnviz.load_model``).
    - ``default_model``: the one selected at start (added to ``models`` if missing).
    - ``capture_file``: a capture saved with ``Capture.save()``, opened at start.
    - ``stats_file``: a table of ``attnviz stats`` (.parquet/.csv) the head-statistics view shows.
    - ``cache_bytes``: bound on the server-side captures (least recently used go first).
    - ``max_tokens``: longest text the page accepts; None: the model's own limit (its position table).
      Long texts stay browsable: the heatmap shows a pooled overview and zooms to exact windows.
    """
    models = dict(models or DEFAULT_MODELS)
    cache = CaptureCache(cache_bytes)
    startup_error = ""
    default_text = DEFAULT_TEXT
    if default_model is not None and default_model not in models:
        models = {default_model: default_model, **models}
    selected = default_model or next(iter(models))
    corpus = None
    if stats_file is not None:
        from attnviz.analysis.corpus import read_table

        try:
            corpus = read_table(stats_file)
        except attnviz.AttnvizError as err:
            startup_error = f"Could not open the statistics file: {err}"
    files: dict[str, str] = {}  # the page's name of a capture file -> its path, which stays on the server
    if capture_file is not None:
        value = FILE_PREFIX + Path(capture_file).name
        files[value] = str(Path(capture_file).resolve())
        try:
            cap = attnviz.load(capture_file)
            cache.put(capture_key(value, cap.text), cap)
            models = {value: f"capture file: {Path(capture_file).name} ({cap.model.get('name')})", **models}
            selected, default_text = value, cap.text
        except attnviz.AttnvizError as err:
            startup_error = f"Could not open the capture file: {err}"

    def get_capture(
        model: str, text: str, bos: bool = False, target: str | None = None, new_tokens: int | None = None
    ) -> attnviz.Capture:
        """The capture of (model, text): one forward, or with ``new_tokens`` the generation that continues
        ``text`` (greedy, so a capture dropped from the cache comes back the same)."""
        key = capture_key(
            model
            + ("\x00bos" if bos else "")
            + (f"\x00target\x00{target}" if target else "")
            + (f"\x00generate\x00{new_tokens}" if new_tokens else ""),
            text,
        )
        if model not in models:  # the browser may send anything: only the server's own models are loaded
            raise attnviz.InputError(
                f"{str(model)[:80]!r} is not one of this dashboard's models; choose one in the list "
                "(start the dashboard with --model NAME to offer others)"
            )
        cap = cache.get(key)
        if cap is not None:
            return cap
        if model.startswith(FILE_PREFIX):
            if new_tokens:
                raise attnviz.InputError(
                    "a capture file holds one text and no model; pick a model in the list to generate"
                )
            cap = attnviz.load(files[model])
            if cap.text != text:
                raise attnviz.InputError("a capture file holds one text; pick a model in the list to run another text")
        elif new_tokens:
            _, tokenizer = attnviz.load_model(model)
            n = len(tokenizer(text)["input_ids"]) + new_tokens
            # the model's own limit: attnviz.generate says how many new tokens fit
            if max_tokens is not None and n > max_tokens:
                raise attnviz.InputTooLongError(
                    f"The prompt and {new_tokens:,} new tokens make {n:,} tokens; this dashboard shows at most "
                    f"{max_tokens:,}. Ask for fewer new tokens or shorten the prompt, or generate in a script "
                    "(attnviz.generate) and open the saved file with --capture."
                )
            cap = attnviz.generate(model, text, max_new_tokens=new_tokens, add_bos=bos).capture
        else:
            loaded, tokenizer = attnviz.load_model(model)
            target = target if loaded.config.is_encoder_decoder else None
            limit, who = text_limit(loaded.config, max_tokens, model)
            for what, piece in (("text", text), ("target", target or "")):
                n = len(tokenizer(piece)["input_ids"]) if piece.strip() else 0
                if limit is not None and n > limit:
                    raise attnviz.InputTooLongError(
                        f"The {what} has {n:,} tokens; {who} at most {limit:,}. Shorten the {what}"
                        + (
                            ", or capture it in a script (attnviz.capture) and open the file with --capture."
                            if who.startswith("this dashboard")
                            else " (a longer text needs a model with a longer context)."
                        )
                    )
            cap = attnviz.capture(model, text, add_bos=bos, target=target)
        cache.put(key, cap)
        return cap

    def from_store(store: dict | None) -> attnviz.Capture | None:
        if not store:
            return None
        return get_capture(
            store["model"], store["text"], bool(store.get("bos")), store.get("target"), store.get("generate")
        )

    def self_part(store: dict | None, part: str | None) -> attnviz.Capture | None:
        """The capture narrowed to one self-attention part (what the analyses read)."""
        cap = from_store(store)
        return None if cap is None else cap.select(part if len(cap.parts) > 1 else None)

    app = Dash(
        __name__,
        title="attnviz",
        suppress_callback_exceptions=True,
        background_callback_manager=background_manager(),
    )
    app.layout = build_layout(
        [{"label": label, "value": name} for name, label in models.items()],
        selected,
        default_text,
        bos=wants_bos(selected) if selected in models else False,
    )
    graphs = [
        *(ID.heatmap, ID.head_view, ID.model_view, ID.lab_graph, ID.validation_map, ID.comparison),
        compare_view.CID.graph,
    ]

    analysis_views.register(
        app, ID, self_part, corpus=corpus, corpus_name=Path(stats_file).name if stats_file is not None else ""
    )
    generation_view.register(app, ID, from_store)

    @app.callback(Output(ID.target_box, "style"), Input(ID.model, "value"))
    def show_target(model):
        return {"display": "block"} if model in models and is_encoder_decoder(model) else {"display": "none"}

    @app.callback(Output(ID.bos, "value"), Input(ID.model, "value"), prevent_initial_call=True)
    def default_bos(model):
        return ["bos"] if model in models and wants_bos(model) else []

    @app.callback(Output(ID.text, "value"), Input(ID.example, "value"), prevent_initial_call=True)
    def use_example(example):
        return example if example else no_update

    @app.callback(
        Output(ID.store, "data"),
        Output(ID.message, "children"),
        Output(ID.status, "children"),
        Output(ID.layer, "options"),
        Output(ID.layer, "value"),
        Output(ID.head, "options"),
        Output(ID.head, "value"),
        Output(ID.heads_multi, "options"),
        Output(ID.heads_multi, "value"),
        Output(ID.lab_query, "data"),
        Output(ID.lab_switches, "value"),
        Output(ID.part, "options"),
        Output(ID.part, "value"),
        Output(ID.part_box, "style"),
        Output(GID.progress, "children"),
        Input(ID.run, "n_clicks"),
        Input(GID.generate, "n_clicks"),
        State(ID.text, "value"),
        State(ID.model, "value"),
        State(ID.bos, "value"),
        State(ID.target, "value"),
        State(GID.new_tokens, "value"),
        running=[(Output(ID.run, "disabled"), True, False), (Output(GID.generate, "disabled"), True, False)],
    )
    def run_model(_clicks, _generate_clicks, text, model, bos_switch, target, new_tokens):
        if startup_error and not ctx.triggered_id:
            return (no_update, startup_error) + (no_update,) * 12 + ("",)
        generate = ctx.triggered_id == GID.generate
        try:
            if not isinstance(text, str) or not text.strip():
                raise attnviz.EmptyTextError("The text is empty: type a sentence or pick an example.")
            bos = "bos" in (bos_switch or [])
            target = target.strip() if isinstance(target, str) and target.strip() else None
            if generate:
                new_tokens, target = checked_new_tokens(new_tokens), None
            else:
                new_tokens = None
            cap = get_capture(model, text, bos, target, new_tokens)
        except Exception as err:  # noqa: BLE001 - every failure becomes a message in the page
            # the page keeps showing the last capture, and the status line keeps describing it
            return (no_update, error_text(err)) + (no_update,) * 12 + ("",)
        gen = generation_of(cap)
        # the encoder of an encoder-decoder (the text the user typed); the decoder of a generation
        part = "decoder" if gen is not None else cap.parts[0]
        layers = cap.layer_indices(part)
        heads = list(range(cap.info(part)["n_heads"]))
        store = {"model": model, "text": text, "bos": bos, "target": target if cap.target is not None else None}
        if new_tokens:
            store["generate"] = new_tokens
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
        status += f", {cap.model.get('backend')}"
        view = cap.select(part)
        query = gen.prompt_length if gen is not None else default_query(view)  # a generation: its first new token
        best_layer, best_head = _default_head(view, query)
        return (
            store,
            "",
            status,
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
            {"display": "none"}
            if len(cap.parts) == 1
            else {"display": "inline-block", "marginRight": "18px", "verticalAlign": "top"},
            "",
        )

    @app.callback(
        Output(ID.layer, "options", allow_duplicate=True),
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "options", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Output(ID.heads_multi, "options", allow_duplicate=True),
        Output(ID.heads_multi, "value", allow_duplicate=True),
        Input(ID.part, "value"),
        State(ID.store, "data"),
        State(ID.layer, "value"),
        State(ID.head, "value"),
        State(ID.heads_multi, "value"),
        prevent_initial_call=True,
    )
    def choose_part(part, store, layer, head, heads):
        try:
            cap = from_store(store)
        except Exception:  # noqa: BLE001 - the run callback reports it
            cap = None
        if cap is None or part not in cap.parts:
            return (no_update,) * 6
        layers, n_heads = cap.layer_indices(part), cap.info(part)["n_heads"]
        head = head if head is not None and head < n_heads else 0
        return (
            [{"label": f"L{i}", "value": i} for i in layers],
            layer if layer in layers else layers[0],
            [{"label": f"H{h}", "value": h} for h in range(n_heads)],
            head,
            [{"label": f"H{h} ", "value": h} for h in range(n_heads)],
            [h for h in (heads or [head]) if h < n_heads] or [head],
        )

    @app.callback(*[Output(f"view-{key}", "style") for key, _ in VIEWS], Input(ID.tabs, "value"))
    def show_view(tab):
        return [{"display": "block"} if key == tab else {"display": "none"} for key, _ in VIEWS]

    def guarded(tab: str, wanted: str, build, on_error, n_outputs: int = 1):
        """Build a view only when it is visible; errors become a message, never a frozen view."""
        if tab != wanted:
            return (no_update,) * n_outputs if n_outputs > 1 else no_update
        try:
            return build()
        except Exception as err:  # noqa: BLE001
            return on_error(error_text(err))

    # the heatmap (its long-text overview and zoom), the head view (its top-k, mass and query range), Compare
    overview_view.register(app, ID, from_store)
    head_view.register(app, ID, from_store)
    compare_view.register(app, ID, from_store, get_capture)

    @app.callback(
        Output(ID.model_view, "figure"),
        Input(ID.store, "data"),
        Input(ID.words, "value"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
    )
    def model_view(store, units, layer, head, tab, part):
        def build():
            cap = from_store(store)
            if cap is None:
                return message_figure("Run the model to see its attention.")
            selected = (layer, head) if layer is not None and head is not None else None
            fig = figures.model_view(cap, words=units == "words", selected=selected, part=part, cells=MODEL_VIEW_CELLS)
            return mark_view(fig, cap, "model", words=units == "words", part=part)

        return guarded(tab, "model", build, message_figure)

    @app.callback(
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Output(ID.tabs, "value"),
        Input(ID.model_view, "clickData"),
        Input(ID.validation_map, "clickData"),
        State(ID.store, "data"),
        State(ID.words, "value"),
        State(ID.part, "value"),
        prevent_initial_call=True,
    )
    def select_head(model_click, validation_click, store, units, part):
        click = model_click if ctx.triggered_id == ID.model_view else validation_click
        point = (click or {}).get("points", [{}])[0]
        if "x" not in point or "y" not in point:
            return no_update, no_update, no_update
        if ctx.triggered_id == ID.validation_map:
            return int(point["y"]), int(point["x"]), no_update
        cap = from_store(store)
        cell = (
            figures.model_view_cell(
                cap, point["x"], point["y"], words=units == "words", part=part, cells=MODEL_VIEW_CELLS
            )
            if cap
            else None
        )
        if cell is None:
            return no_update, no_update, no_update
        return cell[0], cell[1], "heatmap"

    @app.callback(
        Output(ID.lab_tokens, "children"),
        Input(ID.store, "data"),
        Input(ID.words, "value"),
        Input(ID.lab_query, "data"),
        Input(ID.part, "value"),
        Input(GID.step, "value"),
        Input(ID.tabs, "value"),
    )
    def lab_tokens(store, units, query, part, step, tab):
        if tab != "lab":  # thousands of chips for a long text: built only where they are seen
            return no_update
        try:
            cap = from_store(store)
            part = part if cap is not None and len(cap.parts) > 1 else None
            queries, _ = cap.sequences(part) if cap else (None, None)
        except Exception:  # noqa: BLE001 - the run callback reports it
            return []
        if cap is None:
            return []
        first_new = new_start(cap, part, False, "query")  # None unless the chips are a generation's tokens
        shown_to = None if first_new is None or step is None else first_new + int(step)  # the step slider's token
        chips = []
        if units == "words":
            items = [
                (w.token_start, w.token_stop, w.text, w.token_start <= (query or 0) < w.token_stop)
                for w in queries.words
            ]
        else:
            items = [(i, i + 1, label, i == query) for i, label in enumerate(queries.token_labels)]
        for start, stop, label, chosen in items:
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
    )
    def lab(store, layer, head, units, query, switches, log_temperature, tab, part):
        def build():
            cap = from_store(store)
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
            fig = mark_view(figures.query_row(cap, layer, head, index, **kwargs), cap, "bars", words=words, part=part)
            row = cap.attention(
                layer,
                head,
                causal=kwargs["causal"],
                scale=kwargs["scale"],
                temperature=temperature,
                words=words,
                part=part,
            )[index]
            stats = figures.row_stats(row)
            q_names, names = figures.labels(cap, words, part, "query"), figures.labels(cap, words, part, "key")
            text = (
                f"query {q_names[index]!r} (#{index}) → top weight {stats['top_weight']:.2f} on "
                f"{names[stats['top_index']]!r}; entropy {stats['entropy']:.2f} nats "
                f"({100 * stats['entropy_share']:.0f}% of the uniform row over {stats['support']} visible "
                f"{'words' if words else 'tokens'}); temperature {temperature:.2g}"
            )
            return fig, html.Div([html.Div(text), *_lab_lessons(cap, layer, head, index, words, kwargs)])

        return guarded(tab, "lab", build, lambda m: (message_figure(m), m), 2)

    @app.callback(
        Output(ID.validation_summary, "children"),
        Output(ID.validation_map, "figure"),
        Output(ID.comparison, "figure"),
        Input(ID.store, "data"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
    )
    def validation(store, layer, head, tab, part):
        def build():
            cap = from_store(store)
            if cap is None or layer is None or head is None:
                return "", message_figure("Run the model first."), message_figure("")
            report = cap.validate()
            part_ = cap._part(part if len(cap.parts) > 1 else None)
            quantity = "weights" if any(r["quantity"] == "weights" for r in report.rows) else "output"
            return (
                str(report),
                figures.validation_map(report, quantity, part_),
                mark_view(figures.comparison(cap, layer, head, part=part_), cap, "comparison", part=part_),
            )

        return guarded(tab, "validation", build, lambda m: (m, message_figure(m), message_figure("")), 3)

    @app.callback(
        Output(ID.cost, "children"), Input(ID.store, "data"), Input(ID.tabs, "value"), Input(ID.part, "value")
    )
    def cost(store, tab, part):
        if tab != "cost":
            return no_update
        try:
            cap = self_part(store, part)
            if cap is None:
                return "Run the model first."
            tables = cost_tables(cap)
        except Exception as err:  # noqa: BLE001
            return error_text(err)
        n = cap.n_tokens
        first_new = new_start(cap)
        return html.Div(
            [
                html.P(
                    f"{cap.model.get('name')} on this text: n = {n} tokens"
                    + (f" ({first_new} prompt + {n - first_new} generated {MARK})" if first_new is not None else "")
                    + f", d_model = {cap.model.get('d_model')}, "
                    f"{cap.n_heads} heads of d_k = {cap.d_head}, {cap.n_layers} layers. attnviz keeps Q, K, V "
                    f"(O(n·d)) and recomputes A (O(n²)) one head at a time."
                ),
                _table(tables["shapes"], "Shapes (one layer)"),
                _table(tables["flops"], "FLOPs (multiply-add = 2)"),
                _table(tables["memory"], "Memory to store A (float32) — the n² wall"),
            ]
        )

    @app.callback(*[Output(g, "config") for g in graphs], Input(ID.export_format, "value"))
    def export_format(fmt):
        return [
            {"displaylogo": False, "toImageButtonOptions": {"format": fmt, "filename": f"attnviz-{g}"}} for g in graphs
        ]

    @app.callback(
        Output(ID.download, "data"),
        Output(ID.message, "children", allow_duplicate=True),
        Input(ID.csv_button, "n_clicks"),
        Input(ID.capture_button, "n_clicks"),
        Input(ID.html_button, "n_clicks"),
        State(ID.store, "data"),
        State(ID.layer, "value"),
        State(ID.head, "value"),
        State(ID.words, "value"),
        State(ID.part, "value"),
        State(ID.tabs, "value"),
        State(ID.heads_multi, "value"),
        State(ID.lab_query, "data"),
        prevent_initial_call=True,
    )
    def download(_csv, _file, _html, store, layer, head, units, part, tab, heads, query):
        try:
            cap = from_store(store)
            if cap is None or layer is None or head is None:
                return no_update, "Run the model first."
            part = part if len(cap.parts) > 1 else None
            words = units == "words"
            if ctx.triggered_id == ID.capture_button:
                with tempfile.TemporaryDirectory() as tmp:
                    path = cap.save(Path(tmp) / "capture.attnviz")
                    return dcc.send_bytes(path.read_bytes(), "capture.attnviz"), ""
            if ctx.triggered_id == ID.html_button:
                figs = view_figures(cap, tab, layer, head, words=words, part=part, heads=heads, query=query)
                name = f"attnviz-{tab}-{part + '-' if part else ''}L{layer}-H{head}.html"
                page = figures.to_html(figs, title=f"attnviz — {cap.model.get('name')}: {cap.text[:80]}")
                return dcc.send_string(page, name), ""
            df = matrix_frame(cap, layer, head, words=words, part=part)
            return dcc.send_data_frame(
                df.to_csv, f"attention-{part + '-' if part else ''}L{layer}-H{head}-{units}.csv"
            ), ""
        except Exception as err:  # noqa: BLE001 - a message in the page, never a traceback
            return no_update, error_text(err)

    return app


def _lab_lessons(cap: attnviz.Capture, layer: int, head: int, index: int, words: bool, kwargs: dict) -> list:
    """What the switches teach (the seeds' points), said with this row's own numbers."""
    lessons = []
    part = kwargs.get("part")
    names = figures.labels(cap, words, part, "key")
    rec = cap.layer(layer, part)
    if not kwargs["scale"]:
        scaled = figures.row_stats(cap.attention(layer, head, part=part, causal=kwargs["causal"], words=words)[index])
        lessons.append(
            f"Without ÷√d_k the scores are {1 / rec.scaling:.3g}× larger (d_k = {cap.info(part)['d_head']}), so the softmax "
            f"saturates: entropy {scaled['entropy']:.2f} → the one above, top weight {scaled['top_weight']:.2f} "
            "→ closer to one-hot. That is why the scaling exists."
        )
    if rec.causal and not kwargs["causal"]:
        future = cap.attention(layer, head, part=part, causal=False, words=words)[index, index + 1 :].sum()
        lessons.append(
            f"Without the causal mask {names[index]!r} puts {float(future):.2f} on tokens to its right — "
            "weights this decoder never computes: it only ever sees the past."
        )
    if not rec.causal and kwargs["causal"]:
        lessons.append("This encoder is bidirectional: the causal mask is not how it was trained.")
    return [
        html.Div(lesson, className="lab-lesson", style={"color": "#555", "fontSize": "0.9em"}) for lesson in lessons
    ]


def view_figures(
    cap: attnviz.Capture,
    tab: str,
    layer: int,
    head: int,
    *,
    words: bool,
    part: str | None,
    heads: list[int] | None = None,
    query: int | None = None,
) -> list:
    """The figures of a view, for the self-contained HTML export (tables' views give the heatmap), with
    a generation's new tokens marked as in the page."""
    marks = dict(words=words, part=part)
    if tab == "head":
        return [mark_view(figures.head_view(cap, layer, heads or [head], words=words, part=part), cap, "head", **marks)]
    if tab == "model":
        fig = figures.model_view(cap, words=words, part=part, selected=(layer, head), cells=MODEL_VIEW_CELLS)
        return [mark_view(fig, cap, "model", **marks)]
    if tab == "lab" and query is not None:
        queries, _ = cap.sequences(part)
        token = min(query, queries.n_tokens - 1)
        index = word_of(queries, token) if words else token
        return [mark_view(figures.query_row(cap, layer, head, index, words=words, part=part), cap, "bars", **marks)]
    if tab == "validation":
        return [
            figures.validation_map(cap.validate(), part=cap._part(part)),
            mark_view(figures.comparison(cap, layer, head, part=part), cap, "comparison", part=part),
        ]
    return [mark_view(figures.heatmap(cap, layer, head, words=words, part=part), cap, "matrix", **marks)]


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


def token_roles(start: int, stop: int, first_new: int | None, shown_to: int | None) -> list[str]:
    """CSS classes of a lab chip covering tokens ``start..stop-1``: "generated" when it holds a new token,
    "later" when it comes after the step slider's token (written after that step)."""
    if first_new is None:
        return []
    roles = ["generated"] if stop > first_new else []
    if shown_to is not None and start > shown_to:
        roles.append("later")
    return roles


def matrix_frame(
    cap: attnviz.Capture, layer: int, head: int, *, words: bool = False, part: str | None = None
) -> pd.DataFrame:
    """The shown matrix as a table: one row per query, one column per key, labelled."""
    matrix = cap.attention(layer, head, words=words, part=part).numpy()
    return pd.DataFrame(
        matrix,
        index=pd.Index(figures.labels(cap, words, part, "query"), name="query"),
        columns=figures.labels(cap, words, part, "key"),
    )


def content_words_before(cap: attnviz.Capture, q: int) -> list[int]:
    """The words before word ``q`` that may be its antecedent: not the first (a decoder's sink), not a
    stop word, punctuation or a special token."""
    return [
        i
        for i, w in enumerate(cap.words[:q])
        if i > 0
        and w.text.lower() not in STOP_WORDS
        and any(ch.isalnum() for ch in w.text)
        and w.char_end > w.char_start
    ]


def _default_head(cap: attnviz.Capture, query: int) -> tuple[int, int]:
    """Open on the head where the query word puts the most weight on one earlier content word
    (not the first word, which decoders use as a sink, nor a stop word or punctuation): for a
    pronoun, usually a coreference head."""
    q = word_of(cap, query)
    keys = content_words_before(cap, q)
    best, best_score = (min(cap.layer_indices()), 0), -math.inf
    if not keys:
        return best
    word = cap.words[q]
    for layer in cap.layer_indices():
        # only the query word's rows (from a word: averaged over its tokens; to a word: summed) — at 512
        # tokens this is milliseconds where the layer's n×n maps took seconds
        w = cap.attention_rows(layer, list(range(word.token_start, word.token_stop))).mean(1).cpu()  # [head, key]
        rows = torch.stack([w[:, cap.words[i].token_start : cap.words[i].token_stop].sum(-1) for i in keys], -1)
        scores = rows.max(dim=-1).values
        head = int(scores.argmax())
        if float(scores[head]) > best_score:
            best, best_score = (layer, head), float(scores[head])
    return best


LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def run(
    *,
    models: Sequence[str] | None = None,
    capture_file: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8050,
    model: str | None = None,
    stats_file: str | None = None,
) -> None:
    """Start the dashboard (debug off), loading the first model so the page opens ready.

    The page offers exactly ``models`` (default: the embedded ones; ``model`` is one more way to name
    one): a name the browser sends that is not among them is refused, never loaded. A host other
    than this machine's loopback prints a warning — the dashboard has no authentication."""
    names = list(models or []) + ([model] if model is not None and model not in (models or []) else [])
    offered = {name: DEFAULT_MODELS.get(name, name) for name in names} if names else dict(DEFAULT_MODELS)
    app = create_app(offered, capture_file=capture_file, stats_file=stats_file)
    if host not in LOCAL_HOSTS:
        print(
            f"attnviz: WARNING: serving on {host}, reachable from other machines. The dashboard has no "
            "authentication: anyone who reaches this address can run the models it offers on this machine. "
            "Prefer the default 127.0.0.1 with an SSH tunnel (ssh -L 8050:127.0.0.1:8050 host).",
            file=sys.stderr,
            flush=True,
        )
    if capture_file is None:
        name = next(iter(offered))
        print(f"attnviz: loading {name} …", flush=True)
        try:
            attnviz.load_model(name)
        except attnviz.AttnvizError as err:
            print(f"attnviz: {err} (the page will say so too)", flush=True)
    print(f"attnviz dashboard: http://{host}:{port}/", flush=True)
    app.run(host=host, port=port, debug=False)
