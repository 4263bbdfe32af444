"""What the page knows about generations, shared by the views that read one: the page's bound on new
tokens and its number box (``new_tokens_input``: the side panel's *Continue the text* and the Image
tab's), and the generation a capture holds (``generation_of``: pure, tested without a browser)."""

from __future__ import annotations

from dash import dcc

import attnviz

MAX_NEW_TOKENS = 512  # the page's bound; the model's own context bounds it too (the library says so)


def generation_of(cap: attnviz.Capture | None) -> attnviz.Generation | None:
    """The generation a capture holds, or None for a capture of one forward."""
    if cap is None or "generation" not in cap.model:
        return None
    return attnviz.Generation.of(cap)


def new_tokens_input(component_id: str, value: int, **style) -> dcc.Input:
    """The number of new tokens to generate: 1 to :data:`MAX_NEW_TOKENS`, ``value`` to start."""
    return dcc.Input(
        id=component_id,
        type="number",
        min=1,
        max=MAX_NEW_TOKENS,
        step=1,
        value=value,
        className="av-number",
        style=style or None,
    )
