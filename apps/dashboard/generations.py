"""What the page knows about generations, shared by the views that read one: the page's bound on new
tokens, and the generation a capture holds (``generation_of``: pure, tested without a browser)."""

from __future__ import annotations

import attnviz

MAX_NEW_TOKENS = 512  # the page's bound; the model's own context bounds it too (the library says so)


def generation_of(cap: attnviz.Capture | None) -> attnviz.Generation | None:
    """The generation a capture holds, or None for a capture of one forward."""
    if cap is None or "generation" not in cap.model:
        return None
    return attnviz.Generation.of(cap)
