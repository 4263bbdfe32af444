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

__all__ = ["html_of", "load_with", "register_html"]

_DRAWINGS: dict[type, Callable[[Any], str]] = {}  # a type → the function that draws its HTML
_LOADERS: list[Callable[[], object]] = []  # run once each, in order, until a type asked for has a drawing
_LOCK = threading.Lock()


def register_html(kind: type, draw: Callable[[Any], str]) -> None:
    """Make ``draw(obj) -> str`` the HTML of every ``kind`` (and of its subclasses without one of their own)."""
    _DRAWINGS[kind] = draw


def load_with(loader: Callable[[], object]) -> None:
    """Run ``loader()`` the first time an object asks for a drawing no module has registered yet: it
    imports the module that registers them (attnviz's ``__init__`` names :mod:`attnviz.views.html`)."""
    with _LOCK:
        _LOADERS.append(loader)


def _drawing(kind: type) -> Callable[[Any], str] | None:
    return next((_DRAWINGS[k] for k in kind.__mro__ if k in _DRAWINGS), None)


def html_of(obj: object) -> str:
    """The HTML registered for ``obj``'s type, the loaders run first if none is yet."""
    draw = _drawing(type(obj))
    while draw is None:
        with _LOCK:
            if not _LOADERS:
                break
            loader = _LOADERS.pop(0)
        loader()
        draw = _drawing(type(obj))
    if draw is None:
        raise LookupError(
            f"no HTML is registered for {type(obj).__name__}: register a drawing with "
            "attnviz.data.reprs.register_html, or import attnviz.figures"
        )
    return draw(obj)
