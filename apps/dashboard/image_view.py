"""The Image tab: a picture uploaded (or one of two samples: scikit-image's cat and coffee cup, CC0), captured by the page's model — a vision
encoder (ViT, DeiT, DINOv2, the CLIP and SigLIP vision towers) — and one query's attention drawn over
the picture; a click on a patch makes it the query. A model of two towers (:mod:`.towers`): a
LLaVA-style vision-language model reads a prompt with the picture, and a word of the prompt is the query,
its row drawn over the picture beside its row over the text — and *Continue the text* has it generate
with the picture, each new token's row (as computed at its step) a word of the list; a joint CLIP /
SigLIP model's text tower and vision tower are the two parts.

The upload is checked before anything is decoded: at most :data:`MAX_UPLOAD_BYTES` bytes (the browser
refuses larger files too), written to the server's capture folder and read by the library's own
reader (Pillow; its pixel bound checked before decoding). A bad
file, or a text model chosen, is a message on the tab. The capture stays on the server (the
bounded cache, keyed by the model and the file's bytes); the page's store holds that key."""

from __future__ import annotations

import base64
import binascii
import json

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

import attnviz
from attnviz.figures import (
    heatmap,
    image_attention,
    image_heads,
    image_rollout,
    message_figure,
    text_attention,
)
from attnviz.figures.helpers import MARK, NEW_COLOUR

from .cache import digest_key
from .captures import Captures
from .errors import page_message, shows_errors
from .generations import new_tokens_input
from .ids import ID, IID
from .registry import View, registers
from .towers import (
    Towers,
    capture_towers,
    default_prompt,
    generate_towers,
    part_options,
    picture_bytes,
    readable,
    tower_kind,
    word_options,
)

DEFAULT_NEW_TOKENS = 8  # a VLM's "Continue the text": a short answer about the picture
MAX_UPLOAD_BYTES = 8 * 1024 * 1024  # 8 MB: a photo, not a scan
#: the sample pictures: scikit-image's photos, CC0 by their photographers (Stefan van der Walt, Rachel Michetti)
SAMPLES = {"chelsea": "Chelsea the cat", "coffee": "a coffee cup"}


def layout() -> list:
    return [
        html.P(
            id=IID.intro,
            children="Pick a vision model (ViT, DeiT, DINOv2, a CLIP or SigLIP vision tower) in the model list, then "
            "upload a picture (or pick a sample): it goes through the model's own image processor, and each patch is a token. "
            "Click a patch to make it the query; [CLS] (where the model has one) is the first query. "
            "Every head: each head of the layer over the picture (DINO's picture); rollout: the flow through "
            "the layers up to this one. The AttentionLab's switches (a causal mask, ÷√d_k) recompute one head's row. "
            "A vision-language model (LLaVA, Idefics3) reads the prompt with the picture: pick a word of the prompt, and "
            "its row is drawn over the picture beside its row over the text (Continue the text: the model writes on, "
            "and each new word's row joins the list); a joint CLIP or SigLIP model shows its text "
            "tower and its vision tower as the two parts.",
        ),
        html.Div(
            id=IID.towers,
            style={"display": "none"},
            children=[
                html.Span("prompt "),
                dcc.Input(id=IID.prompt, type="text", debounce=True, style={"width": "420px"}),
                dcc.RadioItems(id=IID.part, inline=True, style={"marginLeft": "12px"}, options=[]),
                html.Span(" word ", style={"marginLeft": "8px"}),
                dcc.Dropdown(id=IID.word, clearable=False, style={"width": "190px", "display": "inline-block"}),
                html.Span(
                    id=IID.continue_box,
                    style={"display": "none"},
                    children=[
                        new_tokens_input(IID.new_tokens, DEFAULT_NEW_TOKENS, marginLeft="12px"),
                        html.Button(
                            "Continue the text",
                            id=IID.generate,
                            n_clicks=0,
                            className="av-button",
                            title="the model continues the prompt with the picture (greedy); each new token's row, "
                            f"as computed at its step, joins the word list, marked {MARK}",
                        ),
                    ],
                ),
            ],
        ),
        html.Div(id=IID.note, className="av-dim", style={"margin": "6px 0"}),
        html.Div(id=IID.generated, style={"color": NEW_COLOUR, "margin": "6px 0"}),
        html.Div(
            [
                dcc.Upload(
                    id=IID.upload,
                    children=html.Button("Upload a picture (PNG, JPEG…, at most 8 MB)"),
                    max_size=MAX_UPLOAD_BYTES,
                    accept="image/*",
                    multiple=False,
                ),
                dcc.Dropdown(
                    id=IID.sample,
                    options=[{"label": label, "value": name} for name, label in SAMPLES.items()],
                    placeholder="or a sample picture",
                    style={"width": "190px", "display": "inline-block", "marginLeft": "8px"},
                ),
                html.Span(" layer ", style={"marginLeft": "12px"}),
                dcc.Dropdown(id=IID.layer, clearable=False, style={"width": "90px", "display": "inline-block"}),
                html.Span(" head ", style={"marginLeft": "8px"}),
                dcc.Dropdown(id=IID.head, clearable=False, style={"width": "120px", "display": "inline-block"}),
                dcc.RadioItems(
                    id=IID.mode,
                    value="head",
                    inline=True,
                    style={"marginLeft": "12px"},
                    options=[
                        {"label": " this head ", "value": "head"},
                        {"label": " every head ", "value": "heads"},
                        {"label": " rollout to this layer", "value": "rollout"},
                    ],
                ),
                dcc.Checklist(
                    id=IID.switches,
                    value=["scale"],
                    inline=True,
                    style={"marginLeft": "12px"},
                    options=[
                        {"label": " causal mask ", "value": "causal"},
                        {"label": " ÷√d_k", "value": "scale"},
                    ],
                ),
            ],
            style={"display": "flex", "alignItems": "center", "flexWrap": "wrap", "gap": "4px"},
        ),
        html.Div(id=IID.message, style={"color": "#b00020", "margin": "6px 0"}),
        dcc.Store(id=IID.store),
        # the picture's capture's provenance, for the tab's images (export_view's ID.provenance_json is the text's)
        html.Div(id=IID.provenance_json, hidden=True, style={"display": "none"}),
        dcc.Store(id=IID.query),
        html.Div(
            [
                html.Div(
                    dcc.Loading(dcc.Graph(id=IID.graph, config={"displaylogo": False}, style={"height": "560px"})),
                    style={"flex": "3 1 420px", "minWidth": "0"},
                ),
                html.Div(
                    dcc.Graph(id=IID.strip, config={"displaylogo": False}, style={"height": "560px"}),
                    id=f"{IID.strip}-box",
                    style={"display": "none"},
                ),
            ],
            style={"display": "flex", "gap": "8px", "alignItems": "flex-start"},
        ),
    ]


def sample_picture(name: str):
    """A sample picture of :data:`SAMPLES` (scikit-image's ``data.chelsea()``, ``data.coffee()``), or None
    without scikit-image."""
    if name not in SAMPLES:
        raise attnviz.InputError(f"no sample {str(name)[:40]!r}; the samples are {', '.join(SAMPLES)}")
    try:
        from skimage import data  # deferred: an optional package, for the samples only
    except ImportError:
        return None
    return getattr(data, name)()


def decoded_upload(contents: str) -> bytes:
    """The bytes of a ``dcc.Upload``'s ``data:…;base64,…`` contents, size-limited."""
    head, _, data = contents.partition(",")
    if not head.startswith("data:") or ";base64" not in head:
        raise attnviz.ImageFileError("the upload is not a file the browser sent as base64; upload it again")
    if len(data) > MAX_UPLOAD_BYTES * 4 // 3 + 4:
        raise attnviz.ImageFileError(f"the file is over {MAX_UPLOAD_BYTES // 2**20} MB; upload a smaller picture")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as err:
        raise attnviz.ImageFileError("the upload is not valid base64; upload the file again") from err


def capture_picture(captures: Captures, model: str, picture) -> tuple[str, attnviz.Capture]:
    """(the cache key, the capture) of ``picture`` (a file's bytes, or the sample array) by ``model``."""
    captures.check_model(model)
    key = digest_key(b"image", model.encode(), picture_bytes(picture))  # the server's key: never a name
    cap = captures.cache.get(key)
    if cap is not None:
        return key, cap
    refused = (
        f"{model} is not a vision encoder, so it cannot read a picture: pick a vision model in the model list, or "
        "start the server with one, e.g. attnviz app --model google/vit-base-patch16-224 (ViT, DeiT, DINOv2, "
        "a CLIP or SigLIP model, a LLaVA; a local folder works too)"
    )
    with readable(captures, picture) as source:
        try:
            made = attnviz.capture(model, source)
        except attnviz.NotAVisionModelError as err:  # the library's advice is a Python call; the page's a flag
            raise attnviz.NotAVisionModelError(refused) from err
    assert isinstance(made, attnviz.Capture)  # one picture, one capture
    if made.image is None:
        raise attnviz.NotAVisionModelError(refused)
    captures.cache.put(key, made)
    return key, made


STRIP_SHOWN = {"flex": "2 1 320px", "minWidth": "0"}


def _heads(cap: attnviz.Capture, part: str) -> list[dict]:
    kept = cap.kept_heads(part)  # the heads kept (capture(heads=)), by the model's numbers
    return [{"label": "mean", "value": -1}] + [{"label": f"H{h}", "value": h} for h in kept]


def _picture(trigger, contents, sample, store):
    """The picture to capture: the upload or the sample that changed, or — the prompt changed — the one
    the store says was last taken; None where there is none yet."""
    source = {IID.upload: "upload", IID.sample: "sample"}.get(trigger) or (store or {}).get("source")
    if source == "sample":
        if not sample:
            return None, source
        picture = sample_picture(sample)
        if picture is None:
            raise attnviz.InputError("the sample needs scikit-image (pip install scikit-image)")
        return picture, source
    if source == "upload" and contents:
        return decoded_upload(contents), source
    return None, source


def register(app: Dash, captures: Captures) -> None:
    towers = Towers()  # the models of two towers this app loaded (no module globals)

    @app.callback(
        Output(IID.towers, "style"),
        Output(IID.prompt, "value"),
        Output(IID.continue_box, "style"),
        Output(IID.note, "children"),
        Input(ID.model, "value"),
    )
    def show_towers(model):
        """The prompt row, with the model's default prompt, for a model of two towers (*Continue the
        text* for a vision-language model), and what the page reads differently from its processor;
        hidden otherwise."""
        hidden = {"display": "none"}
        try:
            captures.check_model(model)
            kind = tower_kind(model)
            if kind == "vision":
                return hidden, no_update, hidden, ""
            _, processor = towers.get(model)
        except attnviz.AttnvizError:  # said on the tab when a picture is taken
            return hidden, no_update, hidden, ""
        row = {"display": "flex", "alignItems": "center", "flexWrap": "wrap", "gap": "4px", "margin": "6px 0"}
        shown = {"display": "inline-flex", "gap": "4px"} if kind == "vlm" else hidden
        return row, default_prompt(kind, processor), shown, towers.note(model)

    @app.callback(
        Output(IID.store, "data"),
        Output(IID.query, "data"),
        Output(IID.message, "children"),
        Output(IID.part, "options"),
        Output(IID.part, "value"),
        Input(IID.upload, "contents"),
        Input(IID.sample, "value"),
        Input(IID.prompt, "value"),
        State(ID.model, "value"),
        State(IID.store, "data"),
        State(IID.part, "value"),
        prevent_initial_call=True,
    )
    def take_picture(contents, sample, prompt, model, store, part):
        try:
            picture, source = _picture(ctx.triggered_id, contents, sample, store)
            if picture is None:
                return (no_update,) * 5
            captures.check_model(model)
            kind = tower_kind(model)
            if kind == "vision":
                if ctx.triggered_id == IID.prompt:
                    return (no_update,) * 5
                key, cap = capture_picture(captures, model, picture)
            else:
                key, cap = capture_towers(captures, towers, model, kind, prompt, picture)
        except Exception as err:  # noqa: BLE001 - a bad file, prompt or model is the tab's message
            return None, None, page_message(err), [], None
        options = part_options(kind)
        parts = [o["value"] for o in options]
        chosen = part if part in parts else parts[0] if parts else None
        return {"key": key, "model": model, "kind": kind, "source": source}, None, "", options, chosen

    @app.callback(Output(IID.provenance_json, "children"), Input(IID.store, "data"))
    @shows_errors(lambda _m: "")  # the tab says what failed; its images then carry none
    def provenance_json(store):
        """The picture's ``cap.provenance`` as ``figures.write_image`` writes it (ASCII JSON), or ""."""
        cap = captures.held(store["key"]) if store else None
        return json.dumps(cap.provenance, ensure_ascii=True) if cap is not None and cap.provenance else ""

    @app.callback(
        Output(IID.store, "data", allow_duplicate=True),
        Output(IID.message, "children", allow_duplicate=True),
        Input(IID.generate, "n_clicks"),
        State(IID.new_tokens, "value"),
        State(IID.prompt, "value"),
        State(IID.upload, "contents"),
        State(IID.sample, "value"),
        State(ID.model, "value"),
        State(IID.store, "data"),
        prevent_initial_call=True,
    )
    def continue_text(clicks, new_tokens, prompt, contents, sample, model, store):
        """*Continue the text*: the VLM generates from the prompt and the picture last taken; the tab then
        shows that generation's capture (the word list ends with the new tokens, the last chosen)."""
        if not clicks:
            return no_update, no_update
        try:
            picture, source = _picture(None, contents, sample, store)
            if picture is None:
                raise attnviz.InputError(
                    "upload a picture (or pick a sample) first; the model continues the text with it"
                )
            key, _, new = generate_towers(captures, towers, model, prompt, picture, new_tokens)
        except Exception as err:  # noqa: BLE001 - a bad number, prompt or model is the tab's message
            return no_update, page_message(err)
        return {"key": key, "model": model, "kind": "vlm", "source": source, "new": new}, ""

    @app.callback(
        Output(IID.layer, "options"),
        Output(IID.layer, "value"),
        Output(IID.head, "options"),
        Output(IID.head, "value"),
        Output(IID.word, "options"),
        Output(IID.word, "value"),
        Output(f"{IID.strip}-box", "style"),
        Output(IID.generated, "children"),
        Input(IID.store, "data"),
        Input(IID.part, "value"),
        State(IID.word, "value"),
        prevent_initial_call=True,
    )
    def part_controls(store, part, word):
        """The chosen part's layers, heads and words (the prompt's tokens; the last by default, a
        generation's last new token when it arrives), and what a generation wrote."""
        cap = captures.held(store["key"]) if store else None
        if cap is None:
            return [], None, [], None, [], None, {"display": "none"}, ""
        part = part if part in cap.parts else cap.parts[0]
        layers = cap.layer_indices(part)
        words = word_options(cap, part)
        values = [o["value"] for o in words]
        new = store.get("new")
        keep = word in values and not (new and ctx.triggered_id == IID.store)
        chosen = (word if keep else values[-1]) if values else None
        strip = STRIP_SHOWN if values else {"display": "none"}
        layer_options = [{"label": f"L{layer}", "value": layer} for layer in layers]
        wrote = (
            f"The model wrote {len(new)} new tokens (greedy), marked {MARK} in the word list: {' '.join(new)}"
            if new
            else ""
        )
        return layer_options, layers[-1], _heads(cap, part), -1, words, chosen, strip, wrote

    @app.callback(
        Output(IID.query, "data", allow_duplicate=True),
        Input(IID.graph, "clickData"),
        State(IID.store, "data"),
        State(IID.part, "value"),
        prevent_initial_call=True,
    )
    def click_patch(click, store, part):
        cap = captures.held(store["key"]) if store else None
        grid = cap.image_of(part if part in cap.parts else None) if cap is not None and cap.image is not None else None
        if grid is None or not click or not click.get("points"):
            return no_update
        point = click["points"][0]
        (ph, pw), (rows, cols) = grid.patch, grid.grid
        row, col = int(point["y"] // ph), int(point["x"] // pw)
        if not (0 <= row < rows and 0 <= col < cols):
            return no_update
        return [row, col]

    @app.callback(
        Output(IID.graph, "figure"),
        Output(IID.strip, "figure"),
        Input(IID.store, "data"),
        Input(IID.query, "data"),
        Input(IID.layer, "value"),
        Input(IID.head, "value"),
        Input(IID.mode, "value"),
        Input(IID.switches, "value"),
        Input(IID.part, "value"),
        Input(IID.word, "value"),
    )
    @shows_errors(lambda message: (message_figure(message), message_figure("")))
    def draw(store, query, layer, head, mode, switches, part, word):
        blank = message_figure("")
        if not store:
            return message_figure("Pick a vision model, then upload a picture (or pick a sample)."), blank
        cap = captures.held(store["key"])
        if cap is None:
            return message_figure("The server let this picture's capture go; upload it again."), blank
        part = part if part in cap.parts else cap.parts[0]
        layers = cap.layer_indices(part)
        layer = layer if layer in layers else layers[-1]
        head = None if head in (None, -1) or head not in cap.kept_heads(part) else head
        switches = switches or []
        lab = dict(
            causal=True if "causal" in switches else None, scale="scale" in switches
        )  # the model's own mask: None
        grid = cap.image_of(part)
        texts = word_options(cap, part)
        # the query: the chosen word of the prompt where the part has text, else the clicked patch ([CLS] first)
        if texts:
            q = word if word in [o["value"] for o in texts] else texts[-1]["value"]
        else:
            q = None if query is None else tuple(query)
        strip = text_attention(cap, layer, head, query=q, part=part, **lab) if texts else blank
        if grid is None:  # a joint model's text tower: its map over its tokens (one head), beside the word's row
            if head is None:
                return message_figure(
                    "Pick a head to see the text tower's map; the bars are the heads' mean row."
                ), strip
            return heatmap(cap, layer, head, part=part, **lab), strip
        if mode == "heads":  # every head of the layer as a thumbnail (DINO's picture)
            return image_heads(cap, layer, query=q, part=part), strip
        if mode == "rollout":
            fig = image_rollout(cap, query=q, layer=layers.index(layer), part=part)
        else:
            fig = image_attention(cap, layer, head, query=q, part=part, **lab)
        fig.update_xaxes(range=[-0.5, grid.pixels.shape[1] - 0.5], constrain="domain")
        fig.update_yaxes(range=[grid.pixels.shape[0] - 0.5, -0.5], constrain="domain")
        return fig, strip


__all__ = [
    "MAX_UPLOAD_BYTES",
    "SAMPLES",
    "capture_picture",
    "decoded_upload",
    "layout",
    "register",
    "sample_picture",
]


registers(
    View(
        "image",
        "Image",
        order=120,
        register=lambda app, server: register(app, server.captures),
        layout=lambda page: layout(),
    )
)
