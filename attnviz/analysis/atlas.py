"""The head atlas: each head's role, named with the published criteria, from sums over a corpus.

:func:`atlas_table` scores every head for each role of :data:`ROLES` from what one pass over a corpus
summed (:func:`~attnviz.analysis.corpus_stats`' statistics, and :class:`AtlasSums`: where each row's
maximum fell), the prefix-matching scores of repeated random sequences, and a probe set's
:class:`~attnviz.analysis.ProbeResult` when one is given. Each role carries its threshold and what
the paper it comes from says; where a paper gives no number, its source says so and names the one
attnviz uses. A head may meet several roles. :func:`attnviz.analysis.head_atlas` runs the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError

if TYPE_CHECKING:
    import pandas as pd

    from .probe_result import ProbeResult

__all__ = ["OFFSETS", "ROLES", "TABLE_STATISTICS", "AtlasSums", "Role", "atlas_table", "offset_bins"]

#: the statistics of corpus_stats' table that atlas_table reads (the head atlas' pass computes these alone)
TABLE_STATISTICS = ("previous", "next", "first", "special", "entropy", "duplicate_token")
OFFSETS = 8  # the relative offsets -8..8 of the positional role (a maximum farther away counts for none)


def offset_bins() -> list[int | None]:
    """The offset of each bin of :attr:`AtlasSums.offsets`: -8..8, then None (farther)."""
    return [*range(-OFFSETS, OFFSETS + 1), None]


@dataclass(frozen=True)
class Role:
    """A head role: its score (``what``), the threshold and the side it must be on (``above``:
    score > threshold, or ≥ where ``inclusive``; else score < threshold, ≤ where ``inclusive``), and
    the threshold's source: the paper and what it says."""

    what: str
    threshold: float
    above: bool
    inclusive: bool
    source: str

    def met(self, score: float) -> bool:
        if not np.isfinite(score):
            return False
        if self.above:
            return score >= self.threshold if self.inclusive else score > self.threshold
        return score <= self.threshold if self.inclusive else score < self.threshold

    @property
    def side(self) -> str:
        """The comparison a score must pass: ``>``, ``≥``, ``<`` or ``≤`` (its threshold after it)."""
        return ("≥" if self.inclusive else ">") if self.above else ("≤" if self.inclusive else "<")

    def text(self, score: float, digits: int = 3) -> str:
        """``score`` with ``digits`` decimals — or as many more as it takes for the number written to be on
        the same side of the threshold as the score (0.79965 against ≥ 0.8 is "0.7996", not "0.800", which
        would read as met); "—" where there is no score (NaN)."""
        if not np.isfinite(score):
            return "—"
        for places in range(digits, 17):
            written = f"{score:.{places}f}"
            if self.met(float(written)) == self.met(score):
                return written
        return repr(float(score))


_HALF = "attnviz counts a head when more than half of its attention goes there (> 0.5)"
ROLES: dict[str, Role] = {
    "previous_token": Role(
        "mean attention on the token just before the query",
        0.5,
        True,
        False,
        "Clark et al. 2019, 'What Does BERT Look At?': heads that specialise in attending heavily to the previous "
        "token (no numeric threshold found in the paper's text): " + _HALF,
    ),
    "next_token": Role(
        "mean attention on the token just after the query (0 under a causal mask)",
        0.5,
        True,
        False,
        "Clark et al. 2019, 'What Does BERT Look At?': heads that specialise in attending heavily to the next "
        "token (no numeric threshold found in the paper's text): " + _HALF,
    ),
    "positional": Role(
        "share of rows whose maximum falls on the head's most frequent relative offset (-8..8; column "
        "positional_offset)",
        0.9,
        True,
        True,
        "Voita et al. 2019, 'Analyzing Multi-Head Self-Attention': a head is positional if at least 90 % of "
        "the time its maximum attention weight is on one specific relative position",
    ),
    "broad": Role(
        "mean row entropy over the entropy of uniform attention on the keys each row sees",
        0.8,
        True,
        True,
        "Clark et al. 2019 describe broad heads by their entropy but give no threshold: attnviz calls a "
        "head broad at ≥ 0.8 of the uniform entropy",
    ),
    "focused": Role(
        "mean row entropy over the entropy of uniform attention on the keys each row sees",
        0.2,
        False,
        True,
        "Clark et al. 2019 compare heads' entropies but give no threshold for focused heads: attnviz calls "
        "a head focused at ≤ 0.2 of the uniform entropy",
    ),
    "sink": Role(
        "mean attention on the first token",
        0.3,
        True,
        False,
        "Gu et al. 2024, 'When Attention Sink Emerges in Language Models': a head sinks on the first token "
        "when its mean attention there (over the queries) exceeds ε; they use ε = 0.3",
    ),
    "special_token": Role(
        "mean attention on special tokens after the first ([SEP], </s>); NaN where no text has one",
        0.5,
        True,
        False,
        "Clark et al. 2019 find much of BERT's attention on [SEP] but set no per-head threshold: " + _HALF,
    ),
    "duplicate_token": Role(
        "mean attention on earlier copies of the query's token (rows that have one)",
        0.5,
        True,
        False,
        "no published numeric threshold (the pattern as TransformerLens detects it): " + _HALF,
    ),
    "induction": Role(
        "prefix-matching score: mean attention from each token of a repeated random sequence's second copy to "
        "the token after its earlier copy",
        0.5,
        True,
        False,
        "Olsson et al. 2022, 'In-context Learning and Induction Heads': prefix matching on repeated random "
        "tokens, with no numeric threshold: " + _HALF,
    ),
    "rare_word": Role(
        "share of rows whose maximum falls on the rarest token the row sees (the lowest corpus count among its "
        "keys); rows whose keys hold two or more tokens of that count are left out",
        0.5,
        True,
        False,
        "Voita et al. 2019: a head that points to the least frequent token of the sentence, with no "
        "numeric threshold: attnviz counts a head when its maximum is there in more than half the rows (> 0.5)",
    ),
    "coreference": Role(
        "accuracy at picking a probe's gold antecedent (p_holm: its Holm-corrected exact test against chance)",
        0.05,
        False,
        True,
        "Clark et al. 2019 score coreference heads by antecedent accuracy with no threshold: attnviz "
        "counts a head whose accuracy beats chance with Holm-corrected p ≤ 0.05 (attnviz.evaluate_probes)",
    ),
}


@dataclass
class AtlasSums:
    """What the atlas reads of one pass over a corpus besides the statistics, per layer and head:
    ``offsets`` ``[layer, head, bin]`` rows whose maximum fell on each offset bin (:func:`offset_bins`),
    ``rare`` ``[layer, head]`` rows whose maximum fell on the rarest token they see, ``rows`` ``[layer]``
    the rows scored (real rows seeing ≥ 2 keys), ``rare_rows`` ``[layer]`` those whose keys hold one token
    of the lowest corpus count alone (the rare-word role's rows; None: every scored row), ``log_keys``
    ``[layer]`` Σ log(keys seen) over every real row and ``tokens`` those rows. ``examples[name]``
    ``[layer, head, 3]`` (value, text, position) of the row where a role fires most (``previous``, ``next``, ``first``, ``special``, ``rare``,
    ``broad``, ``focused``, ``duplicate_token``, ``induction``), ``offset_examples`` ``[layer, bin,
    head, 3]`` per offset bin (text -1: none)."""

    part: str
    layers: list[int]
    n_heads: int
    offsets: np.ndarray
    rare: np.ndarray
    rows: np.ndarray
    log_keys: np.ndarray
    tokens: int
    examples: dict[str, np.ndarray] = field(default_factory=dict)
    offset_examples: np.ndarray | None = None
    rare_rows: np.ndarray | None = None


# the example each role reads (AtlasSums.examples)
_EXAMPLE_OF = {
    "previous_token": "previous",
    "next_token": "next",
    "broad": "broad",
    "focused": "focused",
    "sink": "first",
    "special_token": "special",
    "duplicate_token": "duplicate_token",
    "rare_word": "rare",
}


def atlas_table(
    stats: pd.DataFrame,
    sums: AtlasSums,
    *,
    induction: np.ndarray | None = None,
    induction_examples: np.ndarray | None = None,
    probes: ProbeResult | None = None,
    describe: Callable[[int, int], str] | None = None,
    describe_random: Callable[[int, int], str] | None = None,
    roles: list[str] | None = None,
) -> pd.DataFrame:
    """One row per part, layer and head: each role's score (a column named for the role), its
    ``<role>_threshold`` and ``<role>_source``, ``positional_offset``, ``roles`` (the roles met, joined by
    ", "; "" for none) and, for each role met, ``<role>_text`` / ``<role>_position`` (where it fires
    most; -1 for none) and ``<role>_example`` (``describe(text, position)``, or the numbers).

    ``stats``: :func:`~attnviz.analysis.corpus_stats`' table of the same pass (``previous``, ``next``,
    ``first``, ``special``, ``entropy``, ``duplicate_token``). ``induction`` ``[layer, head]``: the
    prefix-matching scores (None: NaN, no head meets it), ``induction_examples`` ``[layer, head, 3]``
    its rows in the random sequences (``describe_random`` names them). ``probes``: a probe set's result
    (None: coreference NaN). ``roles``: the roles reported (default: all of :data:`ROLES`)."""
    import pandas as pd

    chosen = list(ROLES) if roles is None else roles
    unknown = [r for r in chosen if r not in ROLES]
    if unknown:
        raise InputError(f"unknown role {unknown[0]!r}; choose from {', '.join(ROLES)}")

    needed = {"layer", "head", *TABLE_STATISTICS}
    missing = needed - set(stats.columns)
    if missing:
        raise InputError(
            f"the statistics lack {', '.join(sorted(missing))}: give corpus_stats' table with its detectors "
            "(detectors=True)"
        )
    n_layers, n_heads = len(sums.layers), sums.n_heads
    if sums.offsets.shape != (n_layers, n_heads, 2 * OFFSETS + 2):
        raise InputError(
            f"offset counts of shape {sums.offsets.shape} do not fit {n_layers} layers × {n_heads} heads × "
            f"{2 * OFFSETS + 2} offsets"
        )
    # each head's statistics as plain numbers, looked up by (layer, head) once (not a pandas row per head)
    values = stats[list(TABLE_STATISTICS)].to_numpy(float).tolist()
    by_head = dict(zip(zip(stats["layer"].tolist(), stats["head"].tolist()), values))
    rows = np.asarray(sums.rows, dtype=np.float64)[:, None]  # [layer, 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = sums.offsets[..., :-1] / rows[..., None]  # [layer, head, offsets -8..8]
        rare_rows = rows if sums.rare_rows is None else np.asarray(sums.rare_rows, dtype=np.float64)[:, None]
        rare = sums.rare / rare_rows  # NaN where no row has one rarest token
        uniform = np.asarray(sums.log_keys, dtype=np.float64) / max(sums.tokens, 1)  # [layer]: mean log(keys)
    best_bin = shares.argmax(-1)  # [layer, head]
    tested: dict[tuple[int, int], tuple[float, float]] = {}  # (layer, head) -> (accuracy, p_holm)
    if probes is not None:
        acc = probes.accuracy
        keys = zip(acc["layer"].tolist(), acc["head"].tolist())
        tested = dict(zip(keys, zip(acc["accuracy"].astype(float).tolist(), acc["p_holm"].astype(float).tolist())))
    records = []
    for li, layer in enumerate(sums.layers):
        for head in range(n_heads):
            previous, following, first, special, entropy, duplicate = by_head[(layer, head)]
            ratio = entropy / uniform[li] if uniform[li] > 0 else float("nan")
            scores = {
                "previous_token": previous,
                "next_token": following,
                "positional": float(shares[li, head, best_bin[li, head]]) if rows[li, 0] > 0 else float("nan"),
                "broad": ratio,
                "focused": ratio,
                "sink": first,
                "special_token": special,
                "duplicate_token": duplicate,
                "induction": float(induction[li, head]) if induction is not None else float("nan"),
                "rare_word": float(rare[li, head]) if rare_rows[li, 0] > 0 else float("nan"),
                "coreference": float("nan"),
            }
            accuracy, p_holm = tested.get((layer, head), (float("nan"), float("nan")))
            scores["coreference"] = accuracy
            row: dict = {"part": sums.part, "layer": layer, "head": head}
            met = []
            for name in chosen:
                role = ROLES[name]
                row[name] = scores[name]
                row[f"{name}_threshold"] = role.threshold
                row[f"{name}_source"] = role.source
                if role.met(p_holm if name == "coreference" else scores[name]):
                    met.append(name)
            row["positional_offset"] = int(best_bin[li, head]) - OFFSETS
            if "coreference" in chosen:  # the role's own test; none without the role (roles=["sink", "broad"])
                row["coreference_p_holm"] = p_holm
            row["roles"] = ", ".join(met)
            for name in chosen:
                text, position, example = -1, -1, ""
                if name in met:
                    text, position, example = _example(
                        name,
                        sums,
                        li,
                        head,
                        int(best_bin[li, head]),
                        induction_examples,
                        probes,
                        describe,
                        describe_random,
                    )
                row[f"{name}_text"], row[f"{name}_position"], row[f"{name}_example"] = text, position, example
            records.append(row)
    return pd.DataFrame(records)


def _example(
    name: str,
    sums: AtlasSums,
    li: int,
    head: int,
    bin_: int,
    induction_examples: np.ndarray | None,
    probes: ProbeResult | None,
    describe: Callable[[int, int], str] | None,
    describe_random: Callable[[int, int], str] | None,
) -> tuple[int, int, str]:
    """(text, position, words) of the row where a head's role fires most."""
    if name == "coreference":
        assert probes is not None
        layer = sums.layers[li]
        right = np.flatnonzero(probes.right(layer, head)) if probes.has_picks else np.zeros(0, dtype=int)
        if not len(right):
            return -1, -1, ""
        i = int(right[0])
        probe = probes.per_probe.iloc[i]
        return i, -1, f"probe {probe.get('id', i)}: {probe['text']} (pronoun {probe['pronoun']!r})"
    if name == "induction":
        found = None if induction_examples is None else induction_examples[li, head]
        words = describe_random
    elif name == "positional":
        found = None if sums.offset_examples is None else sums.offset_examples[li, bin_, head]
        words = describe
    else:
        kept = sums.examples.get(_EXAMPLE_OF[name])
        found = None if kept is None else kept[li, head]
        words = describe
    if found is None or not np.isfinite(found[0]) or found[1] < 0:
        return -1, -1, ""
    text, position = int(found[1]), int(found[2])
    return text, position, words(text, position) if words is not None else f"text {text}, token {position}"
