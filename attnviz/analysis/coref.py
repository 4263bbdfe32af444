"""Coreference: rank heads by how much attention a pronoun gives each candidate antecedent (what a
probe set is, and its scores per head, are in :mod:`attnviz.analysis.probes`).

Attention is read at span level: *from* a span averaged over its tokens, *to* a span summed over
its tokens. Attention sinks — the first token (where decoders park most attention) and special
tokens ([CLS], [SEP]) — are left out and each query row renormalised over the remaining keys by
default, as Clark et al. (2019) did; every result says whether that was done.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..data.reprs import html_of
from ..errors import ArgumentTypeError, InputError

if TYPE_CHECKING:
    import pandas as pd

    from ..data.capture import Capture

__all__ = [
    "CorefRanking",
    "Span",
    "candidate_weights",
    "covering_tokens",
    "find_span",
    "propose_candidates",
    "refuse_later_candidates",
    "rank_heads",
    "sink_positions",
]

STOP_WORDS = {
    "the",
    "a",
    "an",
    "and",
    "or",
    "but",
    "of",
    "to",
    "in",
    "on",
    "at",
    "by",
    "for",
    "with",
    "was",
    "is",
    "are",
    "be",
    "been",
    "it",
    "its",
    "this",
    "that",
    "because",
    "so",
    "too",
    "very",
    "not",
    "do",
    "does",
    "doesn't",
    "didn't",
    "he",
    "she",
    "they",
    "him",
    "her",
    "them",
    "his",
    "their",
    "had",
    "has",
    "have",
    "的",
    "了",
    "很",
    "是",
    "在",
    "和",
    "也",
    "都",
    "就",
    "把",
    "给",
    "因为",
    "所以",
    "但",
    "我",
    "你",
    "它",
    "他",
    "她",
}
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


@dataclass(frozen=True)
class Span:
    """A piece of the text and the tokens that cover it."""

    text: str
    char_start: int
    char_end: int
    tokens: tuple[int, ...]


def covering_tokens(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, ...]:
    """The tokens whose characters overlap ``start:end`` (a token that covers no character never does)."""
    return tuple(i for i, (s, e) in enumerate(offsets) if s < end and e > start and e > s)


def _span(cap: Capture, start: int, end: int) -> Span:
    tokens = covering_tokens(cap.offsets, start, end)
    if not tokens:
        raise InputError(f"no token covers characters {start}..{end} ({cap.text[start:end]!r}) of the text")
    return Span(cap.text[start:end], start, end, tokens)


def find_span(cap: Capture, what: str | int | tuple[int, int] | Span, *, last: bool = False) -> Span:
    """A span from a word's text (its first occurrence, or ``last``), a word index, or a character range.

    Text is matched against the capture's words first (case-insensitive), then as a substring
    (whole words only for Latin script; any place for CJK, so 小猫 is found inside 我家的小猫).
    """
    if isinstance(what, Span):
        return what
    if isinstance(what, bool):
        raise ArgumentTypeError("a span is a text, a word index or a (start, end) character range")
    if isinstance(what, int):
        w = cap.words[cap.word_index(what)]
        return Span(w.text, w.char_start, w.char_end, tuple(w.tokens))
    if isinstance(what, tuple) and len(what) == 2:
        return _span(cap, int(what[0]), int(what[1]))
    if not isinstance(what, str) or not what.strip():
        raise ArgumentTypeError(f"a span is a text, a word index or a (start, end) range, got {what!r}")
    matches = [w for w in cap.words if w.text.lower() == what.lower()]
    if matches:
        w = matches[-1] if last else matches[0]
        return Span(w.text, w.char_start, w.char_end, tuple(w.tokens))
    pattern = re.escape(what) if _CJK.search(what) else rf"(?<!\w){re.escape(what)}(?!\w)"
    found = list(re.finditer(pattern, cap.text, flags=re.IGNORECASE))
    if not found:
        raise InputError(f"{what!r} is not in the text; its words are {cap.word_labels}")
    m = found[-1] if last else found[0]
    return _span(cap, m.start(), m.end())


def sink_tokens(cap: Capture) -> list[int]:
    """The first token and every special token: where heads park attention."""
    return sink_positions(cap.offsets)


def sink_positions(offsets: Sequence[tuple[int, int]], keep: Sequence[int] = ()) -> list[int]:
    """:func:`sink_tokens` from a text's token offsets — the first token and every token that covers no
    character ([CLS], [SEP], a BOS) — leaving out the tokens ``keep`` (a pronoun's own)."""
    return [t for t in sorted({0, *(i for i, (s, e) in enumerate(offsets) if s == e)}) if t not in keep]


def refuse_later_candidates(causal: bool, pronoun: Span, candidates: Sequence[Span]) -> None:
    """In a causal model a pronoun cannot attend to a later word: an :class:`InputError` naming any such
    candidate (its weight would be 0 by construction)."""
    unseen = [c.text for c in candidates if causal and c.tokens[0] > max(pronoun.tokens)]
    if unseen:
        raise InputError(
            f"{', '.join(map(repr, unseen))} {'comes' if len(unseen) == 1 else 'come'} after {pronoun.text!r}: in a "
            "causal decoder the pronoun cannot attend to a later word, so its weight would be 0 by construction; "
            f"leave {'it' if len(unseen) == 1 else 'them'} out"
        )


def propose_candidates(cap: Capture, pronoun: str | int | Span, *, limit: int = 6) -> list[Span]:
    """Content words before the pronoun (no stop words, punctuation or special tokens), nearest last."""
    p = find_span(cap, pronoun, last=True)
    seen: dict[str, Span] = {}
    for w in cap.words:
        if w.char_end > p.char_start or w.char_end <= w.char_start:
            continue
        if w.text.lower() in STOP_WORDS or not any(ch.isalnum() for ch in w.text):
            continue
        seen.pop(w.text.lower(), None)
        seen[w.text.lower()] = Span(w.text, w.char_start, w.char_end, tuple(w.tokens))
    spans = list(seen.values())
    return spans[-limit:]


def _rows(cap: Capture, layer: int, exclude: Sequence[int], renormalise: bool) -> Tensor:  # [head, query, key]
    a = cap.attention(layer).cpu()
    if exclude:
        a = a.clone()
        a[..., list(exclude)] = 0.0
        if renormalise:
            a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
    return a


def _to_spans(a: Tensor, keys: Sequence[Span], exclude: Sequence[int]) -> Tensor:  # [..., key span]
    return torch.stack([a[..., [t for t in k.tokens if t not in exclude]].sum(-1) for k in keys], dim=-1)


def span_attention(
    cap: Capture,
    layer: int,
    query: Span,
    keys: Sequence[Span],
    *,
    exclude: Sequence[int] = (),
    renormalise: bool = True,
) -> Tensor:  # [head, key span]
    """Attention from ``query`` (averaged over its tokens) to each key span (summed over its tokens), the
    tokens ``exclude`` left out and (``renormalise``) each row renormalised over the rest.

    Only the query's rows are recomputed (:meth:`Capture.attention_rows`): what :func:`rank_heads`
    ranks by, at a probe set's scale."""
    a = cap.attention_rows(layer, list(query.tokens)).cpu()  # [head, query token, key]
    return candidate_weights(a, [k.tokens for k in keys], exclude, renormalise)


def candidate_weights(
    rows: Tensor, keys: Sequence[Sequence[int]], exclude: Sequence[int], renormalise: bool
) -> Tensor:  # [..., key span]
    """A query span's rows of weights ``[..., query token, key]`` as what it gives each key span: the tokens
    ``exclude`` left out (and, ``renormalise``, each row renormalised over the rest), the rows averaged,
    each span's tokens summed — the number :func:`rank_heads` and the probe sets rank by."""
    a = rows
    if exclude:
        a = a.clone()
        a[..., list(exclude)] = 0.0
        if renormalise:
            a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
    a = a.mean(-2)
    return torch.stack([a[..., [t for t in k if t not in exclude]].sum(-1) for k in keys], dim=-1)


def _from_others(
    a: Tensor, pronoun: Span, keys: Sequence[Span], exclude: Sequence[int], causal: bool
) -> Tensor:  # [head, key span]
    """What the same head gives each key span from the text's other tokens (mean over them): the
    tokens that are neither the pronoun, nor the span, nor a sink, and (causal) come after the span."""
    per_query = _to_spans(a, keys, exclude)  # [head, query, key span]
    n = a.shape[1]
    out = torch.full((a.shape[0], len(keys)), float("nan"))
    for j, k in enumerate(keys):
        skip = set(pronoun.tokens) | set(k.tokens) | set(exclude)
        others = [i for i in range(n) if i not in skip and (not causal or i > max(k.tokens))]
        if others:
            out[:, j] = per_query[:, others, j].mean(1)
    return out


@dataclass
class CorefRanking:
    """Heads ranked by the attention from a pronoun to candidate antecedents."""

    pronoun: Span
    candidates: list[Span]
    table: (
        pd.DataFrame
    )  # layer, head, one column per candidate, preferred, margin, "<candidate> from others"; best first
    excluded: list[str]  # the tokens left out as sinks
    renormalised: bool
    model: str = ""
    notes: list[str] = field(default_factory=list)  # e.g. a candidate that holds a sink token

    @property
    def best(self) -> dict:
        return self.table.iloc[0].to_dict()

    @property
    def names(self) -> list[str]:
        """The candidates as the table's columns name them (made unique)."""
        columns = list(self.table.columns)
        return columns[columns.index("head") + 1 : columns.index("preferred")]

    def for_candidate(self, candidate: str) -> pd.DataFrame:
        """The heads sorted by the weight they give ``candidate``."""
        if candidate not in self.table.columns:
            raise InputError(f"{candidate!r} is not a candidate; candidates are {[c.text for c in self.candidates]}")
        return self.table.sort_values(candidate, ascending=False, kind="stable").reset_index(drop=True)

    def weight(self, candidate: str, layer: int, head: int) -> float:
        row = self.table[(self.table["layer"] == layer) & (self.table["head"] == head)]
        return float(row[candidate].iloc[0])

    def how(self) -> str:
        if not self.excluded:
            return "raw attention (no token left out)"
        left = ", ".join(repr(t) for t in self.excluded)
        return f"leaving out {left}" + (" and renormalising each row" if self.renormalised else " (not renormalised)")

    def __str__(self) -> str:
        b = self.best
        names = [c.text for c in self.candidates]
        votes = self.table.preferred.value_counts()
        tally = ", ".join(f"{name}: {int(votes.get(name, 0))}" for name in names)
        return (
            f"{self.pronoun.text!r} → {' / '.join(names)} over {len(self.table)} heads of {self.model or 'the model'} "
            f"({self.how()}): best head L{b['layer']}·H{b['head']} puts {b[b['preferred']]:.2f} on "
            f"{b['preferred']!r}{self._others(b)}; heads preferring each candidate — {tally}"
            + "".join(f". Note: {note}" for note in self.notes)
        )

    def _others(self, row: dict) -> str:
        value = row.get(f"{row['preferred']} from others")
        if value is None or value != value:  # no other token could attend to it
            return ""
        return f" (the same head gives it {value:.2f} from the text's other tokens)"

    def specific(self, candidate: str) -> pd.DataFrame:
        """The heads by how much more the pronoun gives ``candidate`` than the text's other tokens give
        it in the same head (``lift``): attention specific to the pronoun, not a habit of the head."""
        if candidate not in self.table.columns:
            raise InputError(f"{candidate!r} is not a candidate; candidates are {[c.text for c in self.candidates]}")
        t = self.table[["layer", "head", candidate, f"{candidate} from others"]].copy()
        t["lift"] = t[candidate] - t[f"{candidate} from others"]
        return t.sort_values("lift", ascending=False, kind="stable").reset_index(drop=True)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return html_of(self)  # drawn by attnviz.views.html, which registers it (data.reprs)


def rank_heads(
    cap: Capture,
    pronoun: str | int | Span,
    candidates: Iterable[str | int | Span] | None = None,
    *,
    exclude_sinks: bool = True,
    renormalise: bool = True,
    part: str | None = None,
) -> CorefRanking:
    """Rank every captured head by the attention from ``pronoun`` to each candidate antecedent.

    ``pronoun``/``candidates`` are words, word indices, character ranges or :class:`Span`; the
    pronoun's *last* occurrence is used, each candidate's first. Without ``candidates`` they are
    proposed (:func:`propose_candidates`). Heads are sorted by the largest candidate weight.
    ``part`` picks the encoder or the decoder of an encoder-decoder capture.
    """
    import pandas as pd

    cap = cap.select(part)
    p = find_span(cap, pronoun, last=True)
    spans = [find_span(cap, c) for c in candidates] if candidates is not None else propose_candidates(cap, p)
    if not spans:
        raise InputError(
            f"no candidate antecedents for {p.text!r}: pass candidates=[...] (--candidates on the command line)"
        )
    refuse_later_candidates(any(r.causal for r in cap.records.values()), p, spans)
    names = _unique([s.text for s in spans])
    exclude = sink_positions(cap.offsets, p.tokens) if exclude_sinks else []
    notes = [
        f"{s.text!r} holds the sink token {cap.token_labels[t]!r}, left out of its weight"
        + ("" if set(s.tokens) - set(exclude) else " (so it gets 0)")
        + "; prepend a BOS (add_bos=True, --add-bos on the command line) to keep the sink off the text"
        for s in spans
        for t in s.tokens
        if t in exclude
    ]
    causal = any(r.causal for r in cap.records.values())
    rows = []
    for layer in cap.layer_indices():
        a = _rows(cap, layer, exclude, renormalise)
        w = span_attention(cap, layer, p, spans, exclude=exclude, renormalise=renormalise)  # [head, candidate]
        others = _from_others(a, p, spans, exclude, causal)
        for i, head in enumerate(cap.layer(layer).head_numbers):  # the model's numbers (capture(heads=))
            values = w[i].tolist()
            order = sorted(range(len(values)), key=lambda i: -values[i])
            row: dict[str, Any] = {"layer": layer, "head": head}
            row.update(dict(zip(names, values)))
            row["preferred"] = names[order[0]]
            row["margin"] = values[order[0]] - (values[order[1]] if len(order) > 1 else 0.0)
            row.update({f"{name} from others": v for name, v in zip(names, others[i].tolist())})
            rows.append(row)
    table = pd.DataFrame(rows)
    table["_top"] = table[names].max(axis=1)
    table = table.sort_values("_top", ascending=False, kind="stable").drop(columns="_top").reset_index(drop=True)
    labels = cap.token_labels
    return CorefRanking(
        p,
        spans,
        table,
        [labels[t] for t in exclude],
        renormalise and bool(exclude),
        str(cap.model.get("name", "")),
        notes,
    )


def _unique(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        candidate, k = name, 2
        while candidate in out:
            candidate, k = f"{name}#{k}", k + 1
        out.append(candidate)
    return out
