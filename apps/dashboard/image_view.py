"""The Image tab: a picture uploaded (or one of two samples: scikit-image's cat and coffee cup, CC0), captured by the page's model — a vision
encoder (ViT, DeiT, DINOv2, the CLIP and SigLIP vision towers) — and one query's attention drawn over
the picture; a click on a patch makes it the query.

The upload is checked before anything is decoded: at most :data:`MAX_UPLOAD_BYTES` bytes (the browser
refuses larger files too), written to the server's capture folder and read by the library's own
reader (Pillow; :data:`attnviz.workflows.images.MAX_IMAGE_PIXELS` checked before decoding). A bad
file, or a text model chosen, is a message on the tab. The capture stays on the server (the
bounded cache, keyed by the model and the file's bytes); the page's store holds that key."""

from __future__ import annotations

import base64
import binascii
import hashlib
import tempfile
from pathlib import Path

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

import attnviz
from attnviz.figures import image_attention, image_heads, image_rollout, message_figure

from .captures import Captures
from .errors import page_message, shows_errors
from .ids import ID, IID

VIEWS = [("image", "Image")]
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
            "the layers up to this one. The AttentionLab's switches (a causal mask, ÷√d_k) recompute one head's row.",
        ),
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
        dcc.Store(id=IID.query),
        dcc.Loading(dcc.Graph(id=IID.graph, config={"displaylogo": False}, style={"height": "560px"})),
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
    raw = picture if isinstance(picture, bytes) else picture.tobytes()
    key = "image:" + hashlib.sha256(model.encode() + b"\x00" + raw).hexdigest()
    cap = captures.cache.get(key)
    if cap is not None:
        return key, cap
    if isinstance(picture, bytes):
        with tempfile.NamedTemporaryFile(dir=captures.folder, suffix=".upload", delete=False) as f:
            f.write(picture)
        path = Path(f.name)
        try:
            made = attnviz.capture(model, path)
        finally:
            path.unlink(missing_ok=True)
    else:
        made = attnviz.capture(model, picture)
    assert isinstance(made, attnviz.Capture)  # one picture, one capture
    if made.image is None:
        raise attnviz.InputError(f"{model} is not a vision encoder; pick a vision model in the model list")
    captures.cache.put(key, made)
    return key, made


def register(app: Dash, captures: Captures) -> None:
    @app.callback(
        Output(IID.store, "data"),
        Output(IID.query, "data"),
        Output(IID.message, "children"),
        Output(IID.layer, "options"),
        Output(IID.layer, "value"),
        Output(IID.head, "options"),
        Output(IID.head, "value"),
        Input(IID.upload, "contents"),
        Input(IID.sample, "value"),
        State(ID.model, "value"),
        prevent_initial_call=True,
    )
    def take_picture(contents, sample, model):
        try:
            if ctx.triggered_id == IID.sample:
                if not sample:
                    return (no_update,) * 7
                picture = sample_picture(sample)
                if picture is None:
                    raise attnviz.InputError("the sample needs scikit-image (pip install scikit-image)")
            else:
                if not contents:
                    return (no_update,) * 7
                picture = decoded_upload(contents)
            key, cap = capture_picture(captures, model, picture)
        except Exception as err:  # noqa: BLE001 - a bad file or model is the tab's message
            return None, None, page_message(err), [], None, [], None
        layers = cap.layer_indices()
        n_heads = cap.model["parts"][cap.parts[0]]["n_heads"]
        heads = [{"label": "mean", "value": -1}] + [{"label": f"H{h}", "value": h} for h in range(n_heads)]
        layer_options = [{"label": f"L{layer}", "value": layer} for layer in layers]
        return {"key": key, "model": model}, None, "", layer_options, layers[-1], heads, -1

    @app.callback(
        Output(IID.query, "data", allow_duplicate=True),
        Input(IID.graph, "clickData"),
        State(IID.store, "data"),
        prevent_initial_call=True,
    )
    def click_patch(click, store):
        cap = captures.cache.get(store["key"]) if store else None
        if cap is None or cap.image is None or not click or not click.get("points"):
            return no_update
        point = click["points"][0]
        (ph, pw), (rows, cols) = cap.image.patch, cap.image.grid
        row, col = int(point["y"] // ph), int(point["x"] // pw)
        if not (0 <= row < rows and 0 <= col < cols):
            return no_update
        return [row, col]

    @app.callback(
        Output(IID.graph, "figure"),
        Input(IID.store, "data"),
        Input(IID.query, "data"),
        Input(IID.layer, "value"),
        Input(IID.head, "value"),
        Input(IID.mode, "value"),
        Input(IID.switches, "value"),
    )
    @shows_errors(message_figure)
    def draw(store, query, layer, head, mode, switches):
        if not store:
            return message_figure("Pick a vision model, then upload a picture (or pick a sample).")
        cap = captures.cache.get(store["key"])
        if cap is None:
            return message_figure("The server let this picture's capture go; upload it again.")
        if layer is None:
            layer = cap.layer_indices()[-1]
        patch = None if query is None else tuple(query)
        if mode == "heads":  # every head of the layer as a thumbnail (DINO's picture)
            return image_heads(cap, layer, query=patch)
        if mode == "rollout":
            fig = image_rollout(cap, query=patch, layer=cap.layer_indices().index(layer))
        else:
            switches = switches or []
            fig = image_attention(
                cap,
                layer,
                None if head in (None, -1) else head,
                query=patch,
                causal=True if "causal" in switches else None,  # a vision encoder's own mask is none
                scale="scale" in switches,
            )
        fig.update_xaxes(range=[-0.5, cap.image.pixels.shape[1] - 0.5], constrain="domain")
        fig.update_yaxes(range=[cap.image.pixels.shape[0] - 0.5, -0.5], constrain="domain")
        return fig


__all__ = [
    "MAX_UPLOAD_BYTES",
    "SAMPLES",
    "VIEWS",
    "capture_picture",
    "decoded_upload",
    "layout",
    "register",
    "sample_picture",
]
