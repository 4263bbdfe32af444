"""What the Coreference view's probe-set section shows of a result, as plain functions (the view's
callbacks call them; tests call them without a page):

- :func:`table_page`: one page of the per-probe table — each probe's pronoun and gold antecedent, and
  the candidate each of the set's top heads picked, marked right (✓) or wrong (✗). Pages are cut on
  the server, so a set of thousands of probes sends ``PAGE`` rows at a time (and of each text the
  ``TEXT_CHARS`` characters around its pronoun, the pronoun in bold: the drill-down reads the whole
  text on the server);
- :func:`chosen_head`: the head a click in that table means (a head's column: that head; the probe's
  own best head: that one; anywhere else: the set's best head);
- :func:`pronoun_token`: the token of a capture that holds a character range of its text (the Lab's query);
- :func:`load_rows`: what a loaded probe file says about itself — its summary and the probes it could
  not use, each with its reason; :func:`skipped_lines`: the probes the evaluator could not score.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

import attnviz
from attnviz.analysis import ProbeResult, head_label

PAGE = 20  # probes per page of the table
TOP = 5  # heads whose picks the table shows (the set's best by accuracy)
TEXT_CHARS = 240  # characters of a probe's text in the table
PROBLEM_ROWS = 500  # unusable probes listed at most (the summary counts them all)
RIGHT, WRONG = "✓", "✗"


def top_heads(result: ProbeResult, top: int = TOP) -> list[tuple[int, int, float]]:
    """The ``top`` heads by accuracy (ties: lower layer, then head), as (layer, head, accuracy)."""
    ranked = result.ranked().head(top)
    return [(int(r.layer), int(r.head), float(r.accuracy)) for r in ranked.itertuples(index=False)]


def head_column(rank: int) -> str:
    """The table's column id of the ``rank``-th top head (``"h0"`` is the best)."""
    return f"h{rank}"


def table_columns(result: ProbeResult, top: int = TOP) -> list[dict]:
    """The per-probe table's columns: the probe, its text, pronoun and gold, each top head's pick (named
    by the head and its accuracy over the set), and the probe's own best head."""
    heads = [
        {"name": f"{head_label(layer, head)} ({accuracy:.0%})", "id": head_column(i)}
        for i, (layer, head, accuracy) in enumerate(top_heads(result, top))
    ]
    return [
        {"name": "probe", "id": "probe"},
        {"name": "text (the pronoun in bold)", "id": "text", "presentation": "markdown"},
        {"name": "pronoun", "id": "pronoun"},
        {"name": "gold", "id": "gold"},
        *heads,
        {"name": "its best head", "id": "best_head"},
    ]


def table_styles(result: ProbeResult, top: int = TOP) -> list[dict]:
    """The table's ``style_data_conditional``: a head's right pick green, a wrong one red."""
    styles = []
    for column in [head_column(i) for i in range(len(top_heads(result, top)))] + ["best_head"]:
        styles.append({"if": {"filter_query": f'{{{column}}} contains "{RIGHT}"', "column_id": column}, **_GREEN})
        styles.append({"if": {"filter_query": f'{{{column}}} contains "{WRONG}"', "column_id": column}, **_RED})
    return styles


_GREEN = {"backgroundColor": "#e3f4e6", "color": "#1b5e20"}
_RED = {"backgroundColor": "#fde4e4", "color": "#b00020"}


SHOW = {  # which probes the table lists
    "all": "every probe",
    "wrong": "the probes the best head gets wrong",
    "right": "the probes the best head gets right",
}


def shown_rows(result: ProbeResult, show: str | None) -> np.ndarray:
    """The result's rows the table lists for ``show`` (a key of ``SHOW``; anything else: every probe):
    for "wrong" / "right", the probes where the set's best head picks another candidate / the gold one
    (a probe whose layer it did not capture is neither)."""
    every = np.arange(len(result.per_probe))
    if show not in ("wrong", "right"):
        return every
    heads = top_heads(result, 1)
    if not heads:
        return every[:0]
    layer, head, _ = heads[0]
    picks = result.picks[:, layer, head].astype(np.int64)
    right = picks == result.gold.astype(np.int64)
    return every[right if show == "right" else (picks >= 0) & ~right]


def page_count(result: ProbeResult, rows: np.ndarray | None = None) -> int:
    """How many pages the table has for ``rows`` (default: every probe), at least one."""
    n = len(result.per_probe) if rows is None else len(rows)
    return max(1, math.ceil(n / PAGE))


def table_page(result: ProbeResult, page: int | None, top: int = TOP, rows: np.ndarray | None = None) -> list[dict]:
    """Page ``page`` (0-based; out of range: the last) of the per-probe table over ``rows`` (default: every
    probe; :func:`shown_rows`): ``PAGE`` rows of :meth:`ProbeResult.picks_table`, each with ``id`` its
    probe's row in the result (the table's row id, which the drill-down reads)."""
    rows = np.arange(len(result.per_probe)) if rows is None else np.asarray(rows, dtype=np.int64)
    pages = page_count(result, rows)
    page = page if isinstance(page, int) and 0 <= page < pages else (0 if not isinstance(page, int) else pages - 1)
    chosen = rows[page * PAGE : (page + 1) * PAGE]
    picks = result.picks_table(top).iloc[chosen]
    names = [head_label(layer, head) for layer, head, _ in top_heads(result, top)]
    out = []
    for i, probe in zip(chosen.tolist(), picks.to_dict("records"), strict=True):
        text = str(probe["text"])
        row = {
            "id": i,
            "probe": str(probe.get("id", "")),
            "text": text_cell(text, probe.get("pronoun_start"), probe.get("pronoun_end")),
            "pronoun": str(probe["pronoun"]),
            "gold": str(probe["gold"]),
            "best_head": own_best(probe),
        }
        for rank, name in enumerate(names):
            picked = probe[name]
            row[head_column(rank)] = (
                "— (layer not captured)" if picked is None else f"{RIGHT if probe[f'{name} gold'] else WRONG} {picked}"
            )
        out.append(row)
    return out


def own_best(probe: dict) -> str:
    """The "its best head" cell: the head that gives its pick the most weight on this probe, and that
    pick, marked (``L3·H1: ✗ dog``); the head alone where the row has no pick."""
    head, pick = str(probe.get("best_head", "")), probe.get("best_head_pick")
    if pick is None or pick != pick:
        return head
    return f"{head}: {RIGHT if pick == probe['gold'] else WRONG} {pick}"


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~])")


def markdown_text(text: str) -> str:
    """``text`` as literal markdown: its punctuation escaped, its line breaks spaces."""
    return _MARKDOWN.sub(r"\\\1", re.sub(r"\s*[\r\n]+\s*", " ", text))


def text_cell(text: str, start: Any, end: Any) -> str:
    """A probe's text for the table (markdown): the pronoun at ``start..end`` in bold — the occurrence the
    evaluator scored, where the text says it twice — and, for a long text, the ``TEXT_CHARS`` characters
    around it (… where cut). Without a place (NaN, None): the text's start, unmarked."""
    if start is None or end is None or start != start or end != end:
        cut = text[:TEXT_CHARS]
        return markdown_text(cut) + ("…" if len(text) > TEXT_CHARS else "")
    start, end = int(start), int(end)
    lo = max(0, min(start - TEXT_CHARS // 2, len(text) - TEXT_CHARS))
    hi = min(len(text), lo + TEXT_CHARS)
    return (
        ("…" if lo > 0 else "")
        + markdown_text(text[lo:start])
        + f"**{markdown_text(text[start:end])}**"
        + markdown_text(text[end:hi])
        + ("…" if hi < len(text) else "")
    )


_HEAD = re.compile(r"L(\d+)·H(\d+)")


def chosen_head(result: ProbeResult, row: int, column: str | None, top: int = TOP) -> tuple[int, int]:
    """The head a click on probe ``row``'s cell in ``column`` opens: a top head's column, that head; the
    "its best head" column, the probe's own best head; any other, the set's best head."""
    heads = top_heads(result, top)
    for rank, (layer, head, _) in enumerate(heads):
        if column == head_column(rank):
            return layer, head
    if column == "best_head":
        found = _HEAD.fullmatch(str(result.per_probe.iloc[row].get("best_head", "")))  # the head alone
        if found:
            return int(found[1]), int(found[2])
    if not heads:
        raise attnviz.InputError("this probe set's result has no head with an accuracy; run the probe set again")
    return heads[0][0], heads[0][1]


def pronoun_range(result: ProbeResult, row: int) -> tuple[int, int]:
    """The character range of probe ``row``'s pronoun in its text, where the evaluator found it."""
    probe = result.per_probe.iloc[row]
    start, end = probe.get("pronoun_start"), probe.get("pronoun_end")
    if start is None or end is None or start != start or end != end:  # NaN: a row without the place
        raise attnviz.InputError(
            f"probe {probe.get('id', row)!r}: this result does not say where its pronoun is; run the probe set again"
        )
    return int(start), int(end)


def lab_text(text: str, start: int, end: int) -> tuple[str, int, int]:
    """The text as the page's text box will hold it (a browser's textarea turns ``\\r\\n`` and ``\\r`` into
    ``\\n``), with the character range ``start..end`` moved to match."""

    def plain(part: str) -> str:
        return re.sub("\r\n?", "\n", part)

    return plain(text), len(plain(text[:start])), len(plain(text[:end]))


def pronoun_token(cap: attnviz.Capture | attnviz.TokenSequence, start: int, end: int) -> int:
    """The first token of ``cap`` (a capture, or one of its token sequences: an encoder-decoder's target)
    whose characters overlap ``start..end`` of its text (special tokens, which cover no character, never)."""
    for token, (lo, hi) in enumerate(cap.offsets):
        if hi > lo and lo < end and hi > start:
            return token
    raise attnviz.InputError(
        f"no token of this capture covers characters {start}–{end} ({cap.text[start:end]!r}); run the probe set again"
    )


def skipped_lines(result: ProbeResult, at_most: int = PROBLEM_ROWS) -> list[str]:
    """The probes the evaluator could not score, each "id: reason" (at most ``at_most``, then how many
    more)."""
    lines = [str(s) for s in result.skipped[:at_most]]
    if len(result.skipped) > at_most:
        lines.append(f"… and {len(result.skipped) - at_most:,} more")
    return lines


def load_rows(loaded: Any) -> tuple[str, list[dict], int]:
    """A loaded probe set's summary line, its unusable probes as table rows (at most ``PROBLEM_ROWS``), and
    how many there are. Reads the set's ``summary`` and ``problems`` where it has them."""
    summary = getattr(loaded, "summary", None)
    summary = summary() if callable(summary) else summary
    problems = getattr(loaded, "problems", None)
    if summary is None:
        summary = f"{len(loaded):,} probes"
    if problems is None:
        return str(summary), [], 0
    if hasattr(problems, "to_dict"):  # a DataFrame
        total = len(problems)
        rows = problems.head(PROBLEM_ROWS).to_dict("records")
    else:
        items = list(problems)
        total = len(items)
        rows = [_problem_row(item) for item in items[:PROBLEM_ROWS]]
    return str(summary), [{k: _cell(v) for k, v in row.items()} for row in rows], total


def _problem_row(item: Any) -> dict:
    if isinstance(item, dict):
        return item
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return dataclasses.asdict(item)
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return {"where": item[0], "reason": item[1]}
    return {"problem": item}


def _cell(value: Any) -> Any:
    """A table cell: numbers and text as they are, anything else as text."""
    return value if isinstance(value, (int, float, str)) or value is None else str(value)
