"""The page's address holds its view: ``?capture=KEY&model=…&bos=0&tab=lab&part=decoder&layer=3&head=2&units=words
&query=7&measure=moved`` — so reload, back/forward and a copied link (on the same server) open the same view.

Two callbacks, guarded against each other (Dash's pattern for ``dcc.Location``):

- :func:`register`'s ``write``: the controls → the address's query string, whenever the capture, tab, part,
  layer, head, units, query or measure change; written with ``refresh=False`` (a history entry, no reload),
  and only when it says something new.
- ``read``: the query string → the controls, when the page opens (the ``dcc.Location`` sets its ``search``
  when it mounts), and on back/forward (its ``popstate``). A link to the capture the page already shows
  moves only the selectors that differ; one to another capture opens it as a run does (:func:`opened`),
  then takes the link's part, layer, head and query where the capture has them. The server never runs a
  model for a link: the key names a capture it holds (or a capture file's, read again), else the page shows
  the capture-gone message (:class:`~.captures.CaptureGone`).

At the page's first load the run callback opens the default text; it stands aside when the address names a
capture (:func:`link_opens_a_view`), so the two never race for the page.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from dash import Dash, Input, Output, State, dcc, no_update
from dash.exceptions import PreventUpdate

from .captures import Captures
from .errors import shows_errors
from .ids import ID
from .registry import tabs as view_tabs
from .run_outputs import PART_LABELS, VIEW_OUTPUTS, failed, opened

__all__ = ["location", "link_opens_a_view", "parse", "register", "search_of"]

#: the controls the address holds, with the query-string name of each
CONTROLS = (
    (ID.tabs, "value", "tab"),
    (ID.part, "value", "part"),
    (ID.layer, "value", "layer"),
    (ID.head, "value", "head"),
    (ID.words, "value", "units"),
    (ID.lab_query, "data", "query"),
    (ID.measure, "value", "measure"),
)
UNITS = ("tokens", "words")
MEASURES = ("weights", "moved")


def location() -> dcc.Location:
    """The page's address as a component: changed by :func:`register`'s callbacks without a reload."""
    return dcc.Location(id=ID.url, refresh=False)


def search_of(store: dict | None, tab, part, layer, head, units, query, measure) -> str:
    """The query string of a view: the store's capture (key, model, BOS, a generation's length) and the
    selections ("" before the page holds a capture)."""
    if not store or not isinstance(store.get("key"), str):
        return ""
    fields: dict[str, Any] = {"capture": store["key"], "model": store.get("model"), "bos": int(bool(store.get("bos")))}
    if store.get("generate"):
        fields["generate"] = store["generate"]
    for name, value in zip(
        ("tab", "part", "layer", "head", "units", "query", "measure"),
        (tab, part, layer, head, units, query, measure),
        strict=True,
    ):
        if value is not None:
            fields[name] = value
    return "?" + urlencode(fields)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def parse(search: str | None) -> dict | None:
    """What a query string says: ``{"store": {...}, "tab": …, "part": …, "layer": int, "head": int, "units": …,
    "query": int, "measure": …}`` (a value it cannot read is None), or None when it names no capture."""
    fields = {k: v[-1] for k, v in parse_qs((search or "").lstrip("?")).items()}
    if not fields.get("capture") or not fields.get("model"):
        return None
    store: dict[str, Any] = {"key": fields["capture"], "model": fields["model"], "bos": fields.get("bos") == "1"}
    if _int(fields.get("generate")):
        store["generate"] = _int(fields.get("generate"))
    tabs = {view.id for view in view_tabs()}
    return {
        "store": store,
        "tab": fields.get("tab") if fields.get("tab") in tabs else None,
        "part": fields.get("part")
        if fields.get("part") in PART_LABELS or fields.get("part") in ("text", "vision")
        else None,
        "layer": _int(fields.get("layer")),
        "head": _int(fields.get("head")),
        "units": fields.get("units") if fields.get("units") in UNITS else None,
        "query": _int(fields.get("query")),
        "measure": fields.get("measure") if fields.get("measure") in MEASURES else None,
    }


def link_opens_a_view() -> bool:
    """Whether the page making this request was opened at an address that names a capture (a link, a reload):
    the request's ``Referer``, which the browser sets to the page's address on the page's own requests."""
    import flask  # deferred: only inside a request

    if not flask.has_request_context():
        return False
    referrer = flask.request.referrer or ""
    return parse(urlsplit(referrer).query) is not None


def _selectors(captures: Captures, link: dict) -> dict[tuple[str, str], Any]:
    """The run's outputs (``VIEW_OUTPUTS``) for the capture a link names, with the link's part, layer, head
    and query where that capture has them."""
    store = link["store"]
    cap = captures.from_store(store)  # CaptureGone: the page's message
    if cap is None:  # pragma: no cover - a store with a key always names a capture or raises
        raise PreventUpdate
    out = dict(zip(VIEW_OUTPUTS, opened(captures, store, cap), strict=True))
    part = link["part"] if link["part"] in cap.parts else out[(ID.part, "value")]
    if part != out[(ID.part, "value")]:
        view = cap.select(part) if part != "cross" else cap
        n_heads = cap.info(part)["n_heads"]
        out[(ID.part, "value")] = part
        out[(ID.layer, "options")] = [{"label": f"L{i}", "value": i} for i in cap.layer_indices(part)]
        out[(ID.layer, "value")] = cap.layer_indices(part)[0]
        out[(ID.head, "options")] = [{"label": f"H{h}", "value": h} for h in range(n_heads)]
        out[(ID.head, "value")] = 0
        out[(ID.heads_multi, "options")] = [{"label": f"H{h} ", "value": h} for h in range(n_heads)]
        out[(ID.heads_multi, "value")] = [0]
        out[(ID.lab_switches, "value")] = (
            ["causal", "scale"] if any(r.causal for r in view.records.values()) else ["scale"]
        )
    if link["layer"] in cap.layer_indices(part):
        out[(ID.layer, "value")] = link["layer"]
    if link["head"] is not None and 0 <= link["head"] < cap.info(part)["n_heads"]:
        out[(ID.head, "value")] = link["head"]
        out[(ID.heads_multi, "value")] = [link["head"]]
    queries, _ = cap.sequences(part)
    if link["query"] is not None and 0 <= link["query"] < len(queries.tokens):
        out[(ID.lab_query, "data")] = link["query"]
    return out


def register(app: Dash, captures: Captures) -> None:
    """The two callbacks between the controls and the address (the module's docstring)."""

    @app.callback(
        Output(ID.url, "search"),
        Input(ID.store, "data"),
        *[Input(i, prop) for i, prop, _ in CONTROLS],
        State(ID.url, "search"),
        prevent_initial_call=True,
    )
    def write(store, tab, part, layer, head, units, query, measure, search):
        wanted = search_of(store, tab, part, layer, head, units, query, measure)
        if not wanted or wanted == (search or ""):
            return no_update
        return wanted

    outputs = [*VIEW_OUTPUTS, *[(i, prop) for i, prop, name in CONTROLS if name in ("tab", "units", "measure")]]

    @app.callback(
        *[Output(i, prop, allow_duplicate=True) for i, prop in outputs],
        Input(ID.url, "search"),
        State(ID.store, "data"),
        *[State(i, prop) for i, prop, _ in CONTROLS],
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: (*failed(m), no_update, no_update, no_update))
    def read(search, store, *shown):
        link = parse(search)
        if link is None:
            raise PreventUpdate
        current = dict(zip([name for _, _, name in CONTROLS], shown, strict=True))
        same = bool(store) and store.get("key") == link["store"]["key"]
        if same:
            out: dict[tuple[str, str], Any] = {key: no_update for key in VIEW_OUTPUTS}
            for i, prop, name in CONTROLS:
                if name in ("tab", "units", "measure"):
                    continue
                value = link[name]
                if value is not None and value != current[name]:
                    out[(i, prop)] = value
            if out[(ID.head, "value")] is not no_update:
                out[(ID.heads_multi, "value")] = [link["head"]]
        else:
            out = _selectors(captures, link)
            out[(ID.message, "children")] = ""
        extra = []
        for name in ("tab", "units", "measure"):
            value = link[name]
            extra.append(value if value is not None and value != current[name] else no_update)
        return (*[out[key] for key in VIEW_OUTPUTS], *extra)
