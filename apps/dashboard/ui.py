"""The page's look: the dash-mantine-components theme and the small pieces every part of the layout
is built from — a labelled control (its label says what it is, the tooltip what it does), a card with
a title, a toolbar row.

dash-mantine-components carries its CSS inside its JavaScript bundle, which Dash serves from the
installed package: the page needs no CDN and no web font of its own (the CJK face, "attnviz CJK",
comes from ``assets/fonts.css``). The plain ``dcc`` and ``html`` controls the views keep are given the
same colours, radii and spacing by ``assets/attnviz.css``, through Mantine's CSS variables.
"""

from __future__ import annotations

import dash_mantine_components as dmc
from dash import html
from dash.development.base_component import Component

FONT = '"attnviz CJK", system-ui, -apple-system, "Segoe UI", Roboto, sans-serif'
MONO = 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, "attnviz CJK", monospace'  # CJK from the page's face
THEME = {
    "fontFamily": FONT,
    "headings": {"fontFamily": FONT},
    "primaryColor": "indigo",
    "defaultRadius": "sm",
}


def field(label: str, control: Component | list, help: str, *, id: str | None = None, **div) -> html.Div:
    """One control with its label above it; hovering the label explains what the control does."""
    children = control if isinstance(control, list) else [control]
    name = dmc.Tooltip(
        html.Span(label, className="av-label"),
        label=help,
        multiline=True,
        w=320,
        withArrow=True,
        openDelay=250,
        position="top-start",
    )
    extra = {"id": id} if id is not None else {}
    return html.Div([name, *children], className="av-field", **extra, **div)


def card(title: str | None, children: list, *, id: str | None = None, **paper) -> dmc.Paper:
    """A bordered card; ``title`` (if any) names what it holds."""
    head = [dmc.Text(title, fw=600, size="sm", c="dimmed", tt="uppercase", className="av-card-title")] if title else []
    extra = {"id": id} if id is not None else {}
    return dmc.Paper([*head, *children], withBorder=True, radius="md", p="sm", className="av-card", **extra, **paper)


def toolbar(children: list, extra_class: str = "", **div) -> html.Div:
    """Controls side by side, wrapping on a narrow window, aligned on their bottoms."""
    return html.Div(children, className=f"av-toolbar {extra_class}".strip(), **div)


def page(children: list) -> dmc.MantineProvider:
    """The whole page inside Mantine's provider (its theme, its CSS variables for the plain controls)."""
    return dmc.MantineProvider(children, theme=THEME, forceColorScheme="light")
