"""The HTML a notebook shows for a capture, a validation report and the analyses' results (their
``_repr_html_``), drawn by the views: a hook, so that ``data/`` and ``analysis/`` never import ``views/``.

The views fill it in: :mod:`attnviz.views.html` registers one drawing per type when it is imported
(:func:`register_html`; :mod:`attnviz.figures` imports it). The package's ``__init__`` names the loader
that imports it the first time an object asks (:func:`load_with`), so a notebook that never imported
:mod:`attnviz.figures` still shows the table. An object asks with :func:`html_of`::

    def _repr_html_(self) -> str:
        return html_of(self)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["html_of", "load_with", "register_html", "register_report", "report_of"]

_DRAWINGS: dict[type, Callable[[Any], str]] = {}  # a type → the function that draws its HTML
_REPORTS: dict[type, Callable[..., Any]] = {}  # a type → the function that writes its report page
_LOADERS: list[Callable[[], object]] = []  # run once each, in order, until a type asked for has a drawing
_LOCK = threading.Lock()


def register_html(kind: type, draw: Callable[[Any], str]) -> None:
    """Make ``draw(obj) -> str`` the HTML of every ``kind`` (and of its subclasses without one of their own)."""
    _DRAWINGS[kind] = draw


def register_report(kind: type, write: Callable[..., Any]) -> None:
    """Make ``write(obj, path, **kwargs)`` the report page of every ``kind`` (``Capture.report``;
    :mod:`attnviz.views.report_page` registers it)."""
    _REPORTS[kind] = write


def load_with(loader: Callable[[], object]) -> None:
    """Run ``loader()`` the first time an object asks for a drawing no module has registered yet: it
    imports the module that registers them (attnviz's ``__init__`` names :mod:`attnviz.views.html`)."""
    with _LOCK:
        _LOADERS.append(loader)


def _drawing(kind: type, table: dict[type, Callable[..., Any]] = _DRAWINGS) -> Callable[..., Any] | None:
    return next((table[k] for k in kind.__mro__ if k in table), None)


def _registered(obj: object, table: dict[type, Callable[..., Any]]) -> Callable[..., Any] | None:
    """The function ``table`` holds for ``obj``'s type, the loaders run first if none is yet."""
    draw = _drawing(type(obj), table)
    while draw is None:
        with _LOCK:
            if not _LOADERS:
                break
            loader = _LOADERS.pop(0)
        loader()
        draw = _drawing(type(obj), table)
    return draw


def html_of(obj: object) -> str:
    """The HTML registered for ``obj``'s type, the loaders run first if none is yet."""
    draw = _registered(obj, _DRAWINGS)
    if draw is None:
        raise LookupError(
            f"no HTML is registered for {type(obj).__name__}: register a drawing with "
            "attnviz.data.reprs.register_html, or import attnviz.figures"
        )
    return draw(obj)


def report_of(obj: object, path: Any, **kwargs: Any) -> Any:
    """``obj``'s report page written to ``path`` by the function registered for its type (what it returns)."""
    write = _registered(obj, _REPORTS)
    if write is None:
        raise LookupError(
            f"no report is registered for {type(obj).__name__}: register one with "
            "attnviz.data.reprs.register_report, or import attnviz.figures"
        )
    return write(obj, path, **kwargs)
