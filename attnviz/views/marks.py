"""The marks of a generation's new tokens, drawn by every figure with token axes.

A capture made by :func:`attnviz.generate` (``"generation" in cap.model``) holds the prompt and the
tokens the model wrote. Each figure function takes ``mark_new: bool = True`` and, for such a capture,
writes :data:`MARK` before the new tokens' labels (in :data:`NEW_COLOUR`), draws a dotted line where
they start and ends its title with "— ▸ generated". A capture of one forward is drawn unmarked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = ["MARK", "NEW_COLOUR", "boundary", "mark_labels", "marked", "marked_title", "new_start", "new_starts"]

MARK = "▸"  # before the label of every generated token, in every figure
NEW_COLOUR = "#e6550d"  # generated tokens' labels and the prompt boundary


def new_start(cap: Capture, part: str | None = None, words: bool = False, axis: str = "query") -> int | None:
    """Where the generated tokens (or words) start on one axis of a part's matrix; None when that axis
    holds none (a capture of one forward, an encoder's source, cross-attention's keys, or an
    encoder-decoder's capture with no part named)."""
    info = cap.model.get("generation")
    if not info:
        return None
    if len(cap.parts) == 1:
        name = cap.parts[0]
    elif part in cap.parts:
        name = part
    else:  # an encoder-decoder's views always say which part they show
        return None
    generated = {"decoder": ("query", "key"), "cross": ("query",)}.get(name, ())
    if axis not in generated:
        return None
    queries, keys = cap.sequences(name)
    seq = queries if axis == "query" else keys
    first = int(info["prompt_length"])
    if first >= seq.n_tokens:
        return None
    if not words:
        return first
    return next((i for i, w in enumerate(seq.words) if w.token_stop > first), None)


def new_starts(
    cap: Capture, part: str | None = None, words: bool = False, mark_new: bool = True
) -> tuple[int | None, int | None]:
    """(queries, keys): where the new tokens start on each axis of a figure, (None, None) when the
    figure draws no marks (``mark_new=False``, or a capture of one forward)."""
    if not mark_new:
        return None, None
    return new_start(cap, part, words, "query"), new_start(cap, part, words, "key")


def marked(label: str) -> str:
    """A generated token's tick label: the mark, in the generated colour."""
    return f'<span style="color:{NEW_COLOUR}">{MARK}{label}</span>'


def mark_labels(names: list[str], start: int | None, positions: list[int] | None = None) -> list[str]:
    """``names`` with those at ``positions`` (default 0, 1, …) ≥ ``start`` :func:`marked`; blanks stay blank."""
    if start is None:
        return list(names)
    at = range(len(names)) if positions is None else positions
    return [marked(t) if p >= start and t else t for p, t in zip(at, names)]


def boundary(
    *,
    x: float | None = None,
    y: float | None = None,
    xref: str = "x",
    yref: str = "y",
    span: tuple[float, float] = (0, 1),
    width: float = 1.5,
) -> dict:
    """The dotted line (a layout shape) where the generated tokens start: vertical at ``x``, or
    horizontal at ``y``, over ``span`` of the other axis (in ``xref``/``yref`` units: "paper", "x domain"…)."""
    line = dict(color=NEW_COLOUR, width=width, dash="dot")
    if x is not None:
        return dict(type="line", xref=xref, yref=yref, x0=x, x1=x, y0=span[0], y1=span[1], line=line, layer="above")
    return dict(type="line", xref=xref, yref=yref, x0=span[0], x1=span[1], y0=y, y1=y, line=line, layer="above")


def marked_title(title: str, *starts: int | None) -> str:
    """``title`` and "— ▸ generated" when any of ``starts`` is set (a figure that marks new tokens)."""
    if all(s is None for s in starts) or MARK in title:
        return title
    return f"{title} — {MARK} generated"
