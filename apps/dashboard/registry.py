"""The dashboard's views, each registered once by its own module: its id, its tab's label, its layout, the
slots its layout offers other views' panels (``panels.py``) and how it registers its callbacks.

A view module ends with ``registers(View(...))``; :func:`views` imports every ``*_view`` module of the
package (found on disk, never listed by hand) and gives the views in their order: ``layout.py`` builds the
tabs from them, ``app.py`` registers their callbacks. Views still never import each other.

The registry is filled at import and only read afterwards: the same in every worker, no per-user state.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dash import Dash

    from .captures import Captures


@dataclass(frozen=True)
class Page:
    """What a view's layout reads of the page being built."""

    model_options: list[dict]  # the model list: [{"label": ..., "value": name}]
    default_model: str
    default_text: str
    bos: bool = False  # whether the BOS box starts ticked
    page: str = ""  # this page load's id (whose background jobs are whose)
    graph_config: dict = field(default_factory=dict)  # every dcc.Graph's config (the mode bar's buttons)


@dataclass(frozen=True)
class Server:
    """What a view's callbacks read of the server: its captures and the files it was started with."""

    captures: Captures
    table: Any = None  # the statistics table (``--stats``: a pandas DataFrame), or None
    table_name: str = ""
    texts: list[str] | None = None  # the corpus' texts (``--corpus``), or None
    corpus_name: str = ""
    startup_error: str = ""  # what could not be opened when the server started, said when the page opens


@dataclass(frozen=True)
class View:
    """One view of the dashboard. ``label``: its tab's (None: no tab of its own — a part of the page's frame,
    or panels in other views' slots); ``order``: where its tab sits (and when its callbacks register);
    ``layout(page)``: its tab's children; ``slots``: the slots its layout places (``panels.slot_panels``);
    ``register(app, server)``: its callbacks."""

    id: str
    label: str | None
    order: int
    register: Callable[[Dash, Server], None]
    layout: Callable[[Page], list] | None = None
    slots: tuple[str, ...] = ()


_VIEWS: dict[str, View] = {}


def registers(view: View) -> View:
    """Register ``view`` (a view module calls it once, at import). Registering an id again replaces it."""
    if (view.label is None) != (view.layout is None):
        raise ValueError(f"view {view.id!r}: a tab has a label and a layout, a view without a tab has neither")
    _VIEWS[view.id] = view
    return view


def view_modules() -> list[str]:
    """The names of the package's view modules (``*_view.py``), sorted."""
    folder = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(folder)]) if m.name.endswith("_view"))


def views() -> list[View]:
    """Every view, its module imported (so its panels are registered too), in order."""
    for name in view_modules():
        importlib.import_module(f"{__package__}.{name}")
    return sorted(_VIEWS.values(), key=lambda v: (v.order, v.id))


def tabs() -> list[View]:
    """The views with a tab, in the page's order."""
    return [v for v in views() if v.label is not None]
