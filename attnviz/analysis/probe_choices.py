"""A batch of probes read at once: each probe's pronoun rows in every head of the rows a batch kept
(:func:`batch_candidate_weights`, the numbers :func:`attnviz.analysis.coref.candidate_weights` gives
each probe alone, to the last bit) and each probe's pick in every head and its best head
(:class:`HeadChoices`) — what :mod:`attnviz.workflows.corpus.probing` scores a batch with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["HeadChoices", "PronounRows", "batch_candidate_weights"]


@dataclass(frozen=True)
class PronounRows:
    """Where one probe's pronoun rows are read in a batch's kept rows (:func:`batch_candidate_weights`)."""

    text: int  # the probe's place in the batch
    rows: int  # the pronoun's tokens: its query rows (the first ``rows`` kept)
    keys: int  # the text's tokens
    exclude: tuple[int, ...]  # keys left out (the sinks), each row renormalised over the rest
    candidates: tuple[tuple[int, ...], ...]  # each candidate's tokens, those in exclude removed


def batch_candidate_weights(
    every: Tensor,  # [text, layer, head, row, key]: the rows a batch kept, 0 past each text's own
    readings: Sequence[PronounRows],
    renormalise: bool,
) -> Tensor:  # [reading, layer, head, candidate]; -inf past a probe's own candidates
    """What each probe's pronoun gives each of its candidates in every head of ``every``: the numbers
    :func:`~attnviz.analysis.coref.candidate_weights` gives for that probe's own rows
    (``every[text, :, :, :rows, :keys]``), to the last bit, for a whole batch in a few operations.

    Every step is the one ``candidate_weights`` takes on tensors of the same trailing shape, so each
    number is reduced by the same kernel over the same elements: the probes are grouped by
    (pronoun rows, text length, whether anything is left out) for the row sums and the mean over the
    pronoun's rows, and each candidate's tokens are gathered into rows of their own length (grouped by
    that length) for its sum. Nothing is ever summed over padding."""
    _, n_layers, n_heads = every.shape[:3]
    longest = max(r.keys for r in readings)
    width = max(len(r.candidates) for r in readings)
    means = every.new_zeros(len(readings), n_layers, n_heads, longest)  # [reading, layer, head, key]
    groups: dict[tuple[int, int, bool], list[int]] = {}
    for j, r in enumerate(readings):
        groups.setdefault((r.rows, r.keys, bool(r.exclude)), []).append(j)
    for (rows, keys, excluded), members in groups.items():
        texts = torch.tensor([readings[j].text for j in members])
        a = every[texts, :, :, :rows, :keys].contiguous()  # [member, layer, head, row, key], a copy
        if excluded:
            left_out = torch.zeros(len(members), keys, dtype=torch.bool)
            at = [(m, t) for m, j in enumerate(members) for t in readings[j].exclude]
            left_out[[m for m, _ in at], [t for _, t in at]] = True
            a.masked_fill_(left_out[:, None, None, None, :], 0.0)
            if renormalise:
                a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
        means[torch.tensor(members), :, :, :keys] = a.mean(-2)
    out = torch.full((len(readings), n_layers, n_heads, width), float("-inf"))
    by_length: dict[int, list[tuple[int, int, tuple[int, ...]]]] = {}
    for j, r in enumerate(readings):
        for c, tokens in enumerate(r.candidates):
            by_length.setdefault(len(tokens), []).append((j, c, tokens))
    for length, spans in by_length.items():
        which, column = torch.tensor([j for j, _, _ in spans]), torch.tensor([c for _, c, _ in spans])
        if length == 0:  # every token of the candidate left out: it gets nothing
            out[which, :, :, column] = 0.0
            continue
        index = torch.tensor([t for _, _, t in spans])[:, None, None, :].expand(-1, n_layers, n_heads, -1)
        out[which, :, :, column] = means.index_select(0, which).gather(-1, index).sum(-1)
    return out


@dataclass(frozen=True)
class HeadChoices:
    """One probe's pick in every head and its best head (the most weight given to a candidate)."""

    picks: Tensor  # [layer, head] int16: the candidate each head gives the most weight, -1 where not captured
    layer: int
    head: int
    weight: float  # the best head's weight on its pick
    pick: int  # the best head's pick

    @classmethod
    def of(cls, weights: Tensor, layers: list[int], n_layers: int) -> list[HeadChoices]:
        """Each probe's choices from ``weights`` ``[probe, layer of layers, head, candidate]``: in each head
        the first candidate of the most weight, and the first head (by layer, then head) of the most."""
        n, _, n_heads, _ = weights.shape
        picks = torch.full((n, n_layers, n_heads), -1, dtype=torch.int16)
        top = torch.full((n, n_layers, n_heads), -1.0)
        most, choice = weights.max(-1)  # the first candidate on a tie
        picks[:, layers], top[:, layers] = choice.to(torch.int16), most
        best = top.view(n, -1).argmax(-1, keepdim=True)  # the first head on a tie
        found = zip(
            best[:, 0].tolist(),
            top.view(n, -1).gather(1, best)[:, 0].tolist(),
            picks.view(n, -1).gather(1, best)[:, 0].tolist(),
        )
        return [
            cls(p, flat // n_heads, flat % n_heads, weight, pick)
            for p, (flat, weight, pick) in zip(picks.unbind(0), found)
        ]
