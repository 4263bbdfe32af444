"""One way a callback's failure reaches the page: a message, never a traceback.

``shows_errors(fallback)`` wraps a callback. A library error (``attnviz.AttnvizError`` and its
subclasses: an empty text, a text over the model's limit, an unknown model …) shows its own message;
anything else shows one short line (never the exception's class or text, which may name server paths) and is logged with its traceback on the
server (logger ``attnviz.dashboard``). ``fallback(message)`` gives the callback's outputs for the
message — a figure that carries it, a text, or (the default) nothing changed but the page's message
line. ``PreventUpdate`` passes through.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from dash import no_update, set_props
from dash.exceptions import PreventUpdate

import attnviz

from .ids import ID

log = logging.getLogger("attnviz.dashboard")


def page_message(err: BaseException) -> str:
    """What the page says about ``err``: the library's own message, or a short line for anything else
    (whose traceback goes to the server's log, never to the page)."""
    if isinstance(err, attnviz.AttnvizError):
        return str(err)
    log.error("dashboard callback failed", exc_info=err)
    return "Something went wrong on the server; its log has the details."


def on_page(message: str) -> Any:
    """The default fallback: the message in the page's message line, every output left as it was."""
    set_props(ID.message, {"children": message})
    return no_update


def quiet(_message: str) -> Any:
    """A fallback for callbacks that follow the run: the run callback already reports the failure."""
    return no_update


def shows_errors(fallback: Callable[[str], Any] = on_page) -> Callable[[Callable], Callable]:
    """Decorate a callback so that an exception becomes ``fallback(page_message(err))``."""

    def decorate(callback: Callable) -> Callable:
        @functools.wraps(callback)
        def guarded(*args, **kwargs):
            try:
                return callback(*args, **kwargs)
            except PreventUpdate:
                raise
            except Exception as err:  # noqa: BLE001 - the one place a callback's failure becomes a message
                return fallback(page_message(err))

        return guarded

    return decorate


def only_on(tab: str | None, wanted: str) -> None:
    """Stop a view's callback while its tab is hidden (its outputs stay as they are)."""
    if tab != wanted:
        raise PreventUpdate
