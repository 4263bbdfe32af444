"""The result of scoring a probe set: every head's pick on every probe, and what follows from the picks —
per-head accuracy with its 95 % Wilson interval, each head against chance (exact, Holm-corrected over
the heads), the best head against chance and both baselines (nearest and first candidate), and a
held-out estimate of the best head.

:func:`attnviz.evaluate_probes` fills the picks and builds the result with
:meth:`ProbeResult.from_picks`; nothing here runs a model. The formulas are in
:mod:`attnviz.analysis.probe_stats`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ..data.reprs import html_of
from ..errors import InputError
from .probe_stats import (
    TWIN_GROUP,
    TWIN_SHARE,
    TWIN_TOKENS,
    holm,
    max_statistic,
    mcnemar_exact,
    poisson_binomial_pmf,
    twin_groups,
    wilson,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ALPHA", "BASELINES", "HeldOut", "ProbeResult", "head_label"]

ALPHA = 0.05  # family-wise error rate of "beats chance" (Holm over every scored head)
BASELINES = ("nearest", "first")  # the candidate nearest before the pronoun; the candidate first in the text


def head_label(layer: int, head: int) -> str:
    """``L15·H4``: how a head is named in tables, texts and figures."""
    return f"L{int(layer)}·H{int(head)}"


def _pct(x: float) -> str:  # 0.525 → '52.5 %'
    return f"{100 * x:.1f} %"


def _interval(low: float, high: float) -> str:  # '[45.2, 59.7]'
    return f"[{100 * low:.1f}, {100 * high:.1f}]"


def _p(p: float) -> str:  # 'p = 0.28', 'p = 0.0031', 'p < 1e-10'
    if p < 1e-10:
        return "p < 1e-10"
    return f"p = {p:.2g}" if p < 0.01 else f"p = {p:.2f}"


@dataclass(frozen=True)
class HeldOut:
    """The best head chosen on one split of the probes (A) and scored on the other (B).

    The split is seeded (``numpy.random.default_rng(seed)`` permutes the groups; groups are added to A
    until it holds ``fraction`` of the probes) and keeps each group whole — by default a probe and its
    Winograd twins (:func:`~attnviz.analysis.probe_stats.twin_groups`), so a twin never carries the
    answer across. ``accuracy_b`` with its Wilson interval ``low_b``–``high_b`` is an honest estimate of
    what the chosen head does on probes it was not chosen on; ``baselines_b`` gives each baseline's
    ``(accuracy, low, high)`` on the same B probes.
    """

    seed: int
    fraction: float
    grouped_by: str
    n_groups: int
    ids_a: tuple[str, ...]
    ids_b: tuple[str, ...]
    layer: int
    head: int
    accuracy_a: float
    correct_b: int
    n_b: int
    accuracy_b: float
    low_b: float
    high_b: float
    baselines_b: dict[str, tuple[float, float, float]]

    @property
    def n_a(self) -> int:
        return len(self.ids_a)

    @property
    def label(self) -> str:
        return head_label(self.layer, self.head)

    def __str__(self) -> str:
        baselines = ", ".join(
            f"{name} {_pct(acc)} {_interval(lo, hi)}" for name, (acc, lo, hi) in self.baselines_b.items()
        )
        return (
            f"{self.label} chosen on {self.n_a} probes (A, {_pct(self.accuracy_a)}) scores "
            f"{_pct(self.accuracy_b)} {_interval(self.low_b, self.high_b)} on the other {self.n_b} (B); "
            f"baselines on B: {baselines}; split seed {self.seed}, {self.n_groups} groups ({self.grouped_by})"
        )


@dataclass
class ProbeResult:
    """Per-head accuracy at picking the gold antecedent, with two baselines and the statistics that say
    what an accuracy means.

    The picks themselves are kept (``picks[probe, layer, head]``: the index, in the probe's own
    candidate order, of the candidate that head gives the most attention; -1 where the layer was not
    captured), beside each probe's ``gold``, ``nearest`` and ``first`` candidate index and its number of
    candidates (``n_candidates``): every statistic is computed from them. Row ``i`` of ``per_probe`` is
    probe ``i`` of the arrays.

    ``accuracy`` has a row per scored head: ``layer, head, accuracy, correct, n`` and, when built by
    :meth:`from_picks`, ``low, high`` (its 95 % Wilson interval), ``p_chance`` (the exact one-sided
    p-value of ``correct`` or more hits if the head picked a candidate at random), ``p_holm`` (Holm's
    adjustment over every head) and ``beats_chance`` (``p_holm ≤ 0.05``).

    What follows from the picks: :meth:`tests` (the best head against chance and each baseline),
    :meth:`held_out` (the best head chosen on one seeded split, scored on the other), :meth:`max_statistic`
    (a permutation test of every head against chance), :meth:`picks_table` (which candidate each top
    head picked), :attr:`chance` and :attr:`beating_chance`; ``str(result)`` says them in one paragraph.
    """

    accuracy: pd.DataFrame  # layer, head, accuracy, correct, n, low, high, p_chance, p_holm, beats_chance
    per_probe: pd.DataFrame  # id, text, pronoun, gold, nearest, first, best_head, best_head_pick, best_head_weight, …
    baselines: dict[str, float]  # nearest candidate, first candidate
    model: str
    how: str = ""
    n_layers: int = 0
    n_heads: int = 0
    skipped: list[str] = field(default_factory=list)
    picks: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), dtype=np.int16))  # [probe, layer, head]
    gold: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))  # [probe]
    nearest: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))  # [probe]
    first: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))  # [probe]
    n_candidates: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))  # [probe]

    @classmethod
    def from_picks(
        cls,
        picks: np.ndarray,
        gold: np.ndarray,
        nearest: np.ndarray,
        first: np.ndarray,
        n_candidates: np.ndarray,
        per_probe: pd.DataFrame | Sequence[dict[str, Any]],
        *,
        model: str,
        how: str = "",
        skipped: Iterable[str] = (),
    ) -> ProbeResult:
        """The result of a probe set from its picks — what :func:`attnviz.evaluate_probes` calls once it
        has filled the arrays.

        ``picks``: ``[probe, layer, head]`` integers, the index (in the probe's candidate order) of the
        candidate each head gives the most attention, -1 where the layer was not captured (a layer with
        no pick is left out of ``accuracy``); ``gold``, ``nearest``, ``first``: ``[probe]`` candidate
        indices; ``n_candidates``: ``[probe]``; ``per_probe``: one row (a dict, or a DataFrame row) per
        probe, in the arrays' order. ``n_layers`` and ``n_heads`` come from ``picks.shape``.

        Computes ``accuracy`` (``layer, head, accuracy, correct, n, low, high, p_chance, p_holm,
        beats_chance``) and ``baselines`` (``{"nearest", "first"}``: the share of probes each gets right).
        Raises :class:`~attnviz.errors.InputError` when the arrays disagree in shape or hold an index
        outside a probe's candidates.
        """
        import pandas as pd  # deferred: pandas is heavy and only tables need it

        picks = np.asarray(picks)
        if picks.ndim != 3:
            raise InputError(f"picks must be [probe, layer, head], got shape {picks.shape}")
        n = picks.shape[0]
        arrays = {"gold": gold, "nearest": nearest, "first": first, "n_candidates": n_candidates}
        arrays = {name: np.asarray(a) for name, a in arrays.items()}
        for name, a in arrays.items():
            if a.shape != (n,):
                raise InputError(f"{name} must hold one entry per probe ({n}), got shape {a.shape}")
        table = per_probe if isinstance(per_probe, pd.DataFrame) else pd.DataFrame(list(per_probe))
        if len(table) != n:
            raise InputError(f"per_probe has {len(table)} rows for {n} probes; row i must describe probe i")
        if n == 0:
            raise InputError("no probe was scored: a result needs at least one probe")
        counts = arrays["n_candidates"].astype(np.int64)
        if (counts < 2).any():
            raise InputError(
                f"every probe needs at least 2 candidates; probe(s) {np.flatnonzero(counts < 2).tolist()} have fewer"
            )
        for name in ("gold", "nearest", "first"):
            bad = np.flatnonzero((arrays[name] < 0) | (arrays[name] >= counts))
            if bad.size:
                raise InputError(f"{name} index outside the probe's candidates at probe(s) {bad[:10].tolist()}")
        bad = np.flatnonzero(((picks < -1) | (picks >= counts[:, None, None])).any(axis=(1, 2)))
        if bad.size:
            raise InputError(f"picks hold an index outside the probe's candidates at probe(s) {bad[:10].tolist()}")

        gold_ = arrays["gold"].astype(np.int64)
        valid = picks >= 0  # [probe, layer, head]
        hits = (picks == gold_[:, None, None]) & valid
        correct = hits.sum(axis=0)  # [layer, head]
        scored = valid.sum(axis=0)
        layers, heads = np.nonzero(scored > 0)
        chance = 1.0 / counts
        tails: dict[bytes, np.ndarray] = {}  # the chance distribution per set of scored probes (one in practice)
        p_chance = np.empty(layers.size)
        for i, (layer, head) in enumerate(zip(layers, heads, strict=True)):
            mask = valid[:, layer, head]
            key = np.packbits(mask).tobytes()
            if key not in tails:
                pmf = poisson_binomial_pmf(chance[mask])
                tails[key] = np.clip(np.cumsum(pmf[::-1])[::-1], 0.0, 1.0)  # tails[k] = P(X ≥ k)
            p_chance[i] = float(tails[key][correct[layer, head]])
        k, m = correct[layers, heads], scored[layers, heads]
        low, high = wilson(k, m)
        adjusted = holm(p_chance)
        accuracy = pd.DataFrame(
            {
                "layer": layers.astype(np.int64),
                "head": heads.astype(np.int64),
                "accuracy": k / m,
                "correct": k.astype(np.int64),
                "n": m.astype(np.int64),
                "low": low,
                "high": high,
                "p_chance": p_chance,
                "p_holm": adjusted,
                "beats_chance": adjusted <= ALPHA,
            }
        )
        baselines = {name: float((arrays[name] == arrays["gold"]).mean()) for name in BASELINES}
        return cls(
            accuracy,
            table.reset_index(drop=True),
            baselines,
            model,
            how,
            picks.shape[1],
            picks.shape[2],
            list(skipped),
            picks.astype(np.int16),
            arrays["gold"].astype(np.int16),
            arrays["nearest"].astype(np.int16),
            arrays["first"].astype(np.int16),
            counts.astype(np.int16),
        )

    # --- what the picks say -------------------------------------------------------------------

    @property
    def best(self) -> dict:
        return self.ranked().iloc[0].to_dict()

    @property
    def has_picks(self) -> bool:
        """Whether the per-probe picks are here (a result from :meth:`from_picks`): the intervals, tests
        and held-out estimate need them."""
        return self.picks.ndim == 3 and self.picks.shape[0] > 0 and self.picks.shape[0] == len(self.gold)

    @property
    def chance(self) -> float:
        """The accuracy expected of a head that picks a candidate at random: the mean of ``1 / n_candidates``."""
        self._need_picks("chance")
        return float((1.0 / self.n_candidates.astype(float)).mean())

    @property
    def beating_chance(self) -> int:
        """How many heads beat chance after Holm's correction over every scored head (α = 0.05)."""
        self._need_picks("beating_chance")
        return int(self.accuracy.beats_chance.sum())

    def right(self, layer: int, head: int) -> np.ndarray:  # [probe] bool
        """Whether head ``layer``·``head`` picked the gold candidate, per probe (False where not captured)."""
        self._need_picks("right")
        if not (0 <= layer < self.n_layers and 0 <= head < self.n_heads):
            raise InputError(f"no head L{layer}·H{head}: the result has {self.n_layers} layers of {self.n_heads} heads")
        return self.picks[:, layer, head].astype(np.int64) == self.gold.astype(np.int64)

    def accuracy_map(self) -> Tensor:  # [layer, head]
        grid = torch.full((self.n_layers, self.n_heads), float("nan"))
        for row in self.accuracy.itertuples():
            grid[row.layer, row.head] = row.accuracy
        return grid

    def ranked(self) -> pd.DataFrame:
        """Heads by accuracy, best first (ties: lower layer, then lower head)."""
        return self.accuracy.sort_values(["accuracy", "layer", "head"], ascending=[False, True, True], kind="stable")

    def tests(self) -> pd.DataFrame:
        """The best head tested against chance and against each baseline, one row each: ``comparison``,
        ``test``, ``statistic`` (hits for chance; ``min(b, c)`` for McNemar), ``p_value``, ``head_only``
        and ``other_only`` (McNemar's discordant probes: the head right and the baseline wrong, and the
        reverse) and ``meaning``.

        Against chance: the exact one-sided p-value of this many hits or more if the head picked at
        random (binomial when every probe has as many candidates, Poisson-binomial otherwise). Against a
        baseline: the exact two-sided McNemar test on the probes where exactly one of the two is right.
        The head was chosen as the best on these same probes, so these p-values are optimistic; the
        per-head ``p_holm`` column corrects for the number of heads, and :meth:`held_out` scores a head
        on probes it was not chosen on.
        """
        import pandas as pd  # deferred: pandas is heavy and only tables need it

        self._need_picks("tests")
        b = self.best
        layer, head = int(b["layer"]), int(b["head"])
        name = head_label(layer, head)
        mask = self.picks[:, layer, head] >= 0
        right = self.right(layer, head)[mask]
        same = len(np.unique(self.n_candidates[mask])) == 1
        chosen = f"chosen as the best of {len(self.accuracy)} heads on these probes, so optimistic: see held_out()"
        rows = [
            {
                "comparison": f"{name} vs chance",
                "test": "exact binomial, one-sided" if same else "exact Poisson-binomial, one-sided",
                "statistic": int(right.sum()),
                "p_value": float(b["p_chance"]),
                "head_only": np.nan,
                "other_only": np.nan,
                "meaning": (
                    f"P(≥ {int(right.sum())} of {int(mask.sum())} right) if the head picked a candidate at random "
                    f"(chance {_pct(float((1.0 / self.n_candidates[mask]).mean()))}); {chosen}"
                ),
            }
        ]
        for baseline in BASELINES:
            other = (getattr(self, baseline) == self.gold)[mask]
            only_head, only_other, p = mcnemar_exact(right, other)
            rows.append(
                {
                    "comparison": f"{name} vs {baseline}",
                    "test": "exact McNemar, two-sided",
                    "statistic": min(only_head, only_other),
                    "p_value": p,
                    "head_only": only_head,
                    "other_only": only_other,
                    "meaning": (
                        f"{name} right and the {baseline} candidate wrong on {only_head} probes, the reverse on "
                        f"{only_other}; P(a split this uneven or more) if both were equally good; {chosen}"
                    ),
                }
            )
        return pd.DataFrame(rows)

    def max_statistic(self, n_permutations: int = 1000, seed: int = 0) -> pd.DataFrame:
        """Every head against chance by a max-statistic permutation test, beside Holm: ``accuracy``'s
        ``layer, head, accuracy, correct, n`` with ``z`` (hits over chance in standard units) and
        ``p_max`` (the family-wise adjusted p-value: the share of ``n_permutations`` seeded rounds, each
        redrawing every probe's gold at random among its candidates, whose best head reaches this
        ``z``; :func:`~attnviz.analysis.probe_stats.max_statistic`) and ``beats_chance_max``
        (``p_max ≤ 0.05``). Unlike Holm it keeps the heads' dependence (heads that pick alike share
        their luck), so it is less conservative; its p-values are never below ``1 / (n_permutations + 1)``."""
        self._need_picks("max_statistic")
        layers, heads = self.accuracy.layer.to_numpy(), self.accuracy["head"].to_numpy()
        z, p = max_statistic(
            self.picks[:, layers, heads], self.n_candidates, self.gold, n_permutations=n_permutations, seed=seed
        )
        table = self.accuracy[["layer", "head", "accuracy", "correct", "n"]].copy()
        table["z"], table["p_max"], table["beats_chance_max"] = z, p, p <= ALPHA
        return table

    def groups(self) -> np.ndarray:  # [probe]
        """The default held-out groups: each probe with its Winograd twins — same pronoun and candidates,
        texts that differ in at most 3 tokens and a quarter of them, at most 4 probes a group
        (:func:`~attnviz.analysis.probe_stats.twin_groups`); each probe alone when ``per_probe`` has no
        ``text``. Computed once."""
        self._need_picks("groups")
        if self._groups is None and "text" not in self.per_probe.columns:
            self._groups = np.arange(len(self.gold))  # no texts to find twins in: each probe alone
        if self._groups is None:
            table = self.per_probe
            pronouns = table["pronoun"].astype(str).tolist() if "pronoun" in table.columns else [""] * len(table)
            if "candidates" in table.columns:
                candidates = [list(c) for c in table["candidates"]]
            else:  # a result without its candidates' texts: twins are told by pronoun and text alone
                candidates = [[] for _ in range(len(table))]
            self._groups = twin_groups(table["text"].astype(str).tolist(), pronouns, candidates)
        return self._groups

    def held_out(
        self, seed: int = 0, fraction: float = 0.5, groups: str | Sequence[Any] | np.ndarray | None = None
    ) -> HeldOut:
        """Choose the best head on a seeded split A of the probes (``fraction`` of them) and score it on
        the rest, B, with its Wilson interval and the baselines on the same B probes.

        ``groups`` keeps probes together: ``None`` groups each probe with its Winograd twins (texts that
        differ in a few words, same pronoun and candidates — a twin has the opposite gold, so splitting
        twins would let split A teach the answer to split B); a column name of ``per_probe``, or one label
        per probe, groups by it; ``groups=range(len(result.per_probe))`` splits probes freely. The split
        permutes the groups with ``numpy.random.default_rng(seed)`` and adds them to A until A holds
        ``round(fraction · n)`` probes or more.
        """
        self._need_picks("held_out")
        if not 0.0 < fraction < 1.0:
            raise InputError(
                f"fraction is the share of probes the head is chosen on, strictly between 0 and 1; got {fraction}"
            )
        n = len(self.gold)
        if groups is None:
            labels = self.groups()
            grouped_by = (
                f"Winograd twins: same pronoun and candidates, texts ≤ {TWIN_TOKENS} tokens and "
                f"≤ {100 * TWIN_SHARE:.0f} % apart, ≤ {TWIN_GROUP} a group"
                if "text" in self.per_probe.columns
                else "each probe alone: per_probe has no texts to find twins in"
            )
        elif isinstance(groups, str):
            if groups not in self.per_probe.columns:
                raise InputError(
                    f"no column {groups!r} in per_probe to group by; columns are {list(self.per_probe.columns)}"
                )
            labels, grouped_by = self.per_probe[groups].to_numpy(), f"by {groups!r}"
        else:
            labels, grouped_by = np.asarray(list(groups), dtype=object), "groups given"
            if labels.shape != (n,):
                raise InputError(f"groups needs one label per probe ({n}), got {labels.shape[0]}")
        _, codes = np.unique(np.asarray([str(x) for x in labels]), return_inverse=True)
        n_groups = int(codes.max()) + 1
        if n_groups < 2:
            raise InputError(
                f"cannot hold out: the {n} probes form one group ({grouped_by}); pass groups=… to split them"
            )
        sizes = np.bincount(codes, minlength=n_groups)
        order = np.random.default_rng(seed).permutation(n_groups)
        target = max(1, round(fraction * n))
        in_a = np.zeros(n_groups, dtype=bool)
        held = 0
        for g in order:
            if held >= target:
                break
            in_a[g] = True
            held += int(sizes[g])
        if in_a.all():  # one big group reached the target alone: the last group goes to B
            in_a[order[-1]] = False
        a, b = in_a[codes], ~in_a[codes]
        valid = self.picks >= 0
        hits = (self.picks.astype(np.int64) == self.gold.astype(np.int64)[:, None, None]) & valid
        scored_a = valid[a].sum(axis=0)
        acc_a = np.where(scored_a > 0, hits[a].sum(axis=0) / np.maximum(scored_a, 1), -1.0)
        # best on A; ties: lower layer, then lower head (argmax of the flattened [layer, head] grid)
        layer, head = np.unravel_index(int(np.argmax(acc_a)), acc_a.shape)
        mask_b = b & valid[:, layer, head]
        k, m = int(hits[mask_b, layer, head].sum()), int(mask_b.sum())
        low, high = wilson(k, m)
        baselines_b = {}
        for name in BASELINES:
            right = int((getattr(self, name) == self.gold)[b].sum())
            lo, hi = wilson(right, int(b.sum()))
            baselines_b[name] = (right / int(b.sum()), float(lo), float(hi))
        ids = self._ids()
        return HeldOut(
            seed=seed,
            fraction=fraction,
            grouped_by=grouped_by,
            n_groups=n_groups,
            ids_a=tuple(ids[a]),
            ids_b=tuple(ids[b]),
            layer=int(layer),
            head=int(head),
            accuracy_a=float(acc_a[layer, head]),
            correct_b=k,
            n_b=m,
            accuracy_b=k / m if m else float("nan"),
            low_b=float(low),
            high_b=float(high),
            baselines_b=baselines_b,
        )

    def picks_table(self, top: int = 5) -> pd.DataFrame:
        """``per_probe`` with, for each of the ``top`` best heads (``L15·H4``), the text of the candidate
        it picked on each probe (None where its layer was not captured) and ``L15·H4 gold``: whether that
        was the gold one. The candidates' texts come from ``per_probe``'s ``candidates`` column."""
        self._need_picks("picks_table")
        if "candidates" not in self.per_probe.columns:
            raise InputError(
                "picks_table needs the candidates' texts: per_probe has no 'candidates' column "
                "(a list per probe, in the order of the picks' indices)"
            )
        table = self.per_probe.copy()
        candidates = [list(c) for c in table["candidates"]]
        for row in self.ranked().head(top).itertuples(index=False):
            layer, head = int(row.layer), int(row.head)
            name = head_label(layer, head)
            picked = self.picks[:, layer, head]
            table[name] = [cands[p] if p >= 0 else None for cands, p in zip(candidates, picked.tolist(), strict=True)]
            table[f"{name} gold"] = self.right(layer, head)
        return table

    # --- what it says -------------------------------------------------------------------------

    def __str__(self) -> str:
        b = self.best
        n = int(b["n"])
        name = head_label(b["layer"], b["head"])
        skipped = f"; skipped {len(self.skipped)}" if self.skipped else ""
        if not self.has_picks or "low" not in self.accuracy.columns:  # a result built without its picks
            return (
                f"{n} probes on {self.model} ({self.how}): best head {name} picks the gold antecedent "
                f"{_pct(b['accuracy'])}; baselines — nearest candidate {_pct(self.baselines['nearest'])}, first candidate "
                f"{_pct(self.baselines['first'])}{skipped}"
            )
        try:
            h = self.held_out()
            held = f"held out: {_pct(h.accuracy_b)} {_interval(h.low_b, h.high_b)} on {h.n_b}, seed {h.seed}"
            if h.label != name:
                held += f", {h.label} chosen on the other {h.n_a}"
        except InputError as err:
            held = f"no held-out estimate: {err}"
        tests = self.tests().set_index("comparison")["p_value"]
        vs = [f"vs {what} {_p(tests[f'{name} vs {what}'])}" for what in ("chance", *BASELINES)]
        return (
            f"{n} probes on {self.model} ({self.how}): best head {name} {_pct(b['accuracy'])} "
            f"{_interval(b['low'], b['high'])} (chosen on these probes; {held}); {vs[0]}, "
            + ", ".join(vs[1:])
            + f" (McNemar); baselines: nearest candidate {_pct(self.baselines['nearest'])}, first candidate "
            f"{_pct(self.baselines['first'])}, chance {_pct(self.chance)}; {self.beating_chance} of "
            f"{len(self.accuracy)} heads beat chance after Holm (α = {ALPHA:g}){skipped}"
        )

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return html_of(self)  # drawn by attnviz.views.html, which registers it (data.reprs)

    # --- helpers ------------------------------------------------------------------------------

    _groups: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    def _need_picks(self, what: str) -> None:
        if not self.has_picks:
            raise InputError(
                f"{what} needs the per-probe picks, and this result has none: build it with ProbeResult.from_picks "
                "(attnviz.evaluate_probes does)"
            )

    def _ids(self) -> np.ndarray:  # [probe] the probes' ids ('#i' where a probe has none)
        if "id" in self.per_probe.columns:
            ids = [str(x) if str(x) else f"#{i}" for i, x in enumerate(self.per_probe["id"].tolist())]
        else:
            ids = [f"#{i}" for i in range(len(self.gold))]
        return np.asarray(ids, dtype=object)
