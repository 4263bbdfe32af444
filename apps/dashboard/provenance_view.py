"""Where the page's capture came from: a "Provenance" panel in the Recomputed-vs-model tab, one row per field of
``Capture.provenance`` (the model and its revision, the sha256 of its weights and tokenizer, the versions,
device, dtype, backend, BOS, any edits and the self-check's verdict), as ``attnviz info`` prints them. A
capture file saved before attnviz recorded them says so."""

from __future__ import annotations

from dash import Dash, Input, Output, html

from .captures import Captures
from .errors import only_on, shows_errors
from .ids import ID
from .panels import adds_panel
from .registry import View, registers
from .ui import MONO

OLD_FILE = "Not recorded: this capture file was saved before attnviz recorded where a capture came from."


@adds_panel("validation", "provenance")
def provenance_panel() -> html.Div:
    """The panel: a heading and the table its callback fills."""
    return html.Div(
        [html.H4("Provenance", style={"margin": "12px 0 4px"}), html.Div(id=ID.provenance)],
        className="av-provenance",
    )


def provenance_rows(provenance: dict) -> list:
    """The table's rows: each field and its value (``-`` for None)."""
    return [
        html.Tr([html.Td(key, style={"paddingRight": "12px"}), html.Td("-" if value is None else str(value))])
        for key, value in provenance.items()
    ]


def register(app: Dash, captures: Captures) -> None:
    @app.callback(
        Output(ID.provenance, "children"),
        Input(ID.store, "data"),
        Input(ID.tabs, "value"),
    )
    @shows_errors(lambda m: m)
    def provenance(store, tab):
        only_on(tab, "validation")
        cap = captures.from_store(store)
        if cap is None:
            return "Run the model first."
        found = cap.provenance
        if not found:
            return OLD_FILE
        return html.Table(provenance_rows(found), style={"fontFamily": MONO, "fontSize": "12px"})


registers(
    View(
        "provenance",
        None,
        order=51,
        register=lambda app, server: register(app, server.captures),
    )
)
