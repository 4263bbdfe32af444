"""Panels one view adds to another view's layout, without either importing the other.

The guest registers a function that builds its panel under the host view's name and a slot
(``@adds_panel("lab", "apply")``); the host's layout places whatever its slots hold
(``*slot_panels("lab", "apply")``). Views register when their module is imported; the page is built
after every view module is imported (``layout.py`` imports them all), and a slot's panels come in
the order of their builders' names, so the order the modules were imported in never shows on the page.

The registry is filled at import and only read afterwards: the same in every worker, no per-user state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from dash.development.base_component import Component

Build = TypeVar("Build", bound=Callable[[], Component])

_PANELS: dict[tuple[str, str], dict[str, Callable[[], Component]]] = {}


def adds_panel(host: str, slot: str) -> Callable[[Build], Build]:
    """Decorator: the decorated function (no arguments, returns one Dash component) builds a panel
    placed in the view ``host``'s ``slot``. Registering the same function again replaces it."""

    def register(build: Build) -> Build:
        _PANELS.setdefault((host, slot), {})[f"{build.__module__}.{build.__qualname__}"] = build
        return build

    return register


def slot_panels(host: str, slot: str) -> list[Component]:
    """The panels registered for ``host``'s ``slot``, freshly built, ordered by their builders' names."""
    builds = _PANELS.get((host, slot), {})
    return [builds[name]() for name in sorted(builds)]


def registered() -> list[tuple[str, str, str]]:
    """Every registration as ``(host, slot, builder name)``, sorted (for tests and for a reader)."""
    return sorted((host, slot, name) for (host, slot), builds in _PANELS.items() for name in builds)
