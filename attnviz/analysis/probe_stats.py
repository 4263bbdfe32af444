"""The statistics of a probe set, as plain functions on counts and boolean arrays (numpy and the
standard library only; the tests hold them against scipy and statsmodels).

- :func:`wilson`: the 95 % Wilson score interval of a proportion ``k / n``.
- :func:`binomial_sf`, :func:`poisson_binomial_pmf`, :func:`chance_sf`: the exact one-sided p-value
  of "at least ``k`` hits" when each probe ``i`` is a hit by chance with probability ``1 /
  n_candidates[i]`` — binomial when every probe has the same number of candidates, Poisson-binomial
  (by convolution) when they differ.
- :func:`mcnemar_exact`: the exact two-sided McNemar test of two pickers on the same probes (the
  discordant probes only).
- :func:`holm`: Holm's step-down adjusted p-values (family-wise error at ``alpha``).
- :func:`max_statistic`: the max-statistic permutation test over every head at once (the heads'
  dependence kept: each probe's gold redrawn at random among its candidates).
- :func:`twin_groups`: probes whose texts differ in a few words (Winograd twins), as group labels.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from ..errors import InputError

__all__ = [
    "COMMON_BIGRAM",
    "TWIN_GROUP",
    "TWIN_SHARE",
    "TWIN_TOKENS",
    "Z95",
    "binomial_pmf",
    "binomial_sf",
    "chance_sf",
    "holm",
    "max_statistic",
    "mcnemar_exact",
    "poisson_binomial_pmf",
    "twin_groups",
    "wilson",
]

Z95 = NormalDist().inv_cdf(0.975)  # 1.959963984540054: the two-sided 95 % normal quantile


def wilson(k: np.ndarray | int, n: np.ndarray | int, z: float = Z95) -> tuple[np.ndarray, np.ndarray]:
    """The Wilson score interval of ``k`` successes in ``n`` trials (elementwise; 95 % by default):
    centre ``(k + z²/2) / (n + z²)``, half-width ``z √(k(n−k)/n + z²/4) / (n + z²)``. Unlike the
    normal interval it stays inside [0, 1] and is not empty at 0 or ``n`` hits. ``n == 0`` gives
    NaN."""
    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        denominator = n + z * z
        centre = (k + z * z / 2) / denominator
        half = z * np.sqrt(k * (n - k) / n + z * z / 4) / denominator
        low = np.where(n > 0, np.clip(centre - half, 0.0, 1.0), np.nan)
        high = np.where(n > 0, np.clip(centre + half, 0.0, 1.0), np.nan)
    return low, high


def binomial_pmf(n: int, p: float) -> np.ndarray:  # [n + 1]: P(X = 0 … n), X ~ Binomial(n, p)
    """The binomial distribution's probabilities, computed in log space (exact to rounding)."""
    if n < 0 or not 0.0 <= p <= 1.0:
        raise InputError(f"a binomial needs n ≥ 0 and 0 ≤ p ≤ 1, got n={n}, p={p}")
    if p in (0.0, 1.0):
        out = np.zeros(n + 1)
        out[0 if p == 0.0 else n] = 1.0
        return out
    k = np.arange(n + 1)
    log_choose = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in k])
    return np.exp(log_choose + k * math.log(p) + (n - k) * math.log1p(-p))


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p): the exact one-sided p-value of ``k`` or more hits."""
    return _tail(binomial_pmf(n, p), k)


def poisson_binomial_pmf(probabilities: Sequence[float] | np.ndarray) -> np.ndarray:  # [n + 1]
    """The distribution of the number of hits among independent trials with these hit probabilities
    (the Poisson-binomial distribution), exactly: the trials are grouped by probability, each group's
    count is binomial, and the groups' distributions are convolved."""
    ps = np.asarray(probabilities, dtype=float).ravel()
    if ((ps < 0) | (ps > 1) | np.isnan(ps)).any():
        raise InputError("hit probabilities must lie in [0, 1]")
    out = np.ones(1)
    values, counts = np.unique(ps, return_counts=True)
    for p, m in zip(values, counts, strict=True):
        out = np.convolve(out, binomial_pmf(int(m), float(p)))
    return out


def chance_sf(k: int, n_candidates: Sequence[int] | np.ndarray) -> float:
    """P(at least ``k`` hits) when probe ``i`` is hit by chance with probability ``1 / n_candidates[i]``:
    binomial when every probe has as many candidates, Poisson-binomial otherwise."""
    counts = np.asarray(n_candidates, dtype=float)
    if (counts < 1).any():
        raise InputError("every probe needs at least one candidate to have a chance level")
    return _tail(poisson_binomial_pmf(1.0 / counts), k)


def _tail(pmf: np.ndarray, k: int) -> float:  # P(X ≥ k), clipped to [0, 1] against rounding
    if k <= 0:
        return 1.0
    return float(min(1.0, max(0.0, pmf[k:].sum())))


def mcnemar_exact(a_right: np.ndarray, b_right: np.ndarray) -> tuple[int, int, float]:
    """The exact two-sided McNemar test of two pickers scored on the same probes.

    Returns ``(b, c, p)``: ``b`` probes only ``a`` got right, ``c`` only ``b`` got right, and the p-value
    ``min(1, 2 · P(Binomial(b + c, ½) ≤ min(b, c)))`` — under "equally good" each discordant probe is
    a fair coin. Probes both got right (or wrong) say nothing about which is better."""
    a_right = np.asarray(a_right, dtype=bool)
    b_right = np.asarray(b_right, dtype=bool)
    if a_right.shape != b_right.shape:
        raise InputError(f"McNemar needs the same probes for both: {a_right.shape} vs {b_right.shape}")
    only_a = int((a_right & ~b_right).sum())
    only_b = int((~a_right & b_right).sum())
    discordant = only_a + only_b
    if discordant == 0:
        return only_a, only_b, 1.0
    lower = float(binomial_pmf(discordant, 0.5)[: min(only_a, only_b) + 1].sum())
    return only_a, only_b, min(1.0, 2.0 * lower)


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values: sorted ascending, the ``i``-th (0-based) of ``m`` is
    multiplied by ``m − i``, made non-decreasing and capped at 1. A hypothesis is rejected at family-wise
    level ``alpha`` when its adjusted p-value is ≤ ``alpha``."""
    p = np.asarray(p_values, dtype=float).ravel()
    m = p.size
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def max_statistic(
    picks: np.ndarray, n_candidates: np.ndarray, gold: np.ndarray, *, n_permutations: int = 1000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Every head against chance at once, by a max-statistic permutation test (Westfall–Young).

    ``picks``: ``[probe, head]`` candidate indices (-1: not scored); ``n_candidates``, ``gold``:
    ``[probe]``. Each head's statistic is its hits over chance in standard units,
    ``z = (hits − Σ pᵢ) / √(Σ pᵢ(1 − pᵢ))`` with ``pᵢ = 1 / n_candidatesᵢ`` over the probes it scored.
    Under "no head knows the answer" every probe's gold could as well be any of its candidates: each of
    ``n_permutations`` rounds (``numpy.random.default_rng(seed)``) redraws every gold uniformly among
    its probe's candidates, keeps every head's picks — so the heads' dependence stays as it is — and
    notes the largest ``z`` over the heads. Returns ``(z [head], p [head])``: a head's adjusted p-value
    is ``(1 + #rounds whose max ≥ its z) / (1 + n_permutations)``; ``p ≤ α`` controls the family-wise
    error at ``α`` over every head, and is never below ``1 / (1 + n_permutations)``."""
    picks = np.asarray(picks)
    counts = np.asarray(n_candidates, dtype=np.int64)
    gold = np.asarray(gold, dtype=np.int64)
    if picks.ndim != 2 or picks.shape[0] != counts.size or gold.shape != counts.shape:
        raise InputError(
            f"max_statistic needs picks [probe, head] and [probe] arrays, got {picks.shape}, {counts.shape}, {gold.shape}"
        )
    if n_permutations < 1:
        raise InputError(f"n_permutations must be at least 1, got {n_permutations}")
    valid = (picks >= 0).astype(float)  # [probe, head]
    chance = 1.0 / counts
    mean = chance @ valid
    sd = np.sqrt((chance * (1 - chance)) @ valid)
    sd = np.where(sd > 0, sd, np.inf)

    def z(hits: np.ndarray) -> np.ndarray:  # [..., head]
        return (hits - mean) / sd

    observed = z(((picks == gold[:, None]) & (picks >= 0)).sum(axis=0))
    width = int(counts.max())
    chosen = np.zeros((picks.shape[0], width, picks.shape[1]))  # [probe, candidate, head]: 1 where the head picked it
    probe, head = np.nonzero(picks >= 0)
    chosen[probe, picks[probe, head], head] = 1.0
    flat = chosen.reshape(-1, picks.shape[1])  # [probe · candidate, head]
    rng = np.random.default_rng(seed)
    maxima = np.empty(n_permutations)
    for start in range(
        0, n_permutations, 256
    ):  # rounds in blocks: [block, probe · candidate] @ [probe · candidate, head]
        block = min(256, n_permutations - start)
        drawn = np.floor(rng.random((block, counts.size)) * counts).astype(np.int64)
        onehot = np.zeros((block, counts.size, width))
        np.put_along_axis(onehot, drawn[:, :, None], 1.0, axis=2)
        maxima[start : start + block] = z(onehot.reshape(block, -1) @ flat).max(axis=1)
    exceed = (maxima[None, :] >= observed[:, None] - 1e-12).sum(axis=1)
    return observed, (1.0 + exceed) / (1.0 + n_permutations)


TWIN_TOKENS = 3  # texts whose tokens differ in at most this many places are twins …
TWIN_SHARE = 0.25  # … and in at most this share of the longer text's tokens
TWIN_GROUP = 4  # a group of twins holds at most this many probes (the closest pairs join first)
COMMON_BIGRAM = 64  # a bigram in more texts than this is no witness of a twin (templated sets)


def _tokens(text: str) -> list[str]:  # words, with each CJK character a token of its own
    return re.findall(r"[\u3400-\u9fff\uf900-\ufaff]|[^\W\u3400-\u9fff\uf900-\ufaff]+|[^\w\s]", text.lower())


def _differing(a: list[str], b: list[str]) -> int:  # tokens of the longer text that the other lacks
    matched = sum(block.size for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
    return max(len(a), len(b)) - matched


def _one_edit_pairs(members: list[int], tokens: list[list[str]]) -> set[tuple[int, int]]:
    """Pairs of texts one token apart (one replaced, or one more in the longer), found by signature in
    linear time: the text with position k left out, keyed with and without k's place."""
    keys: dict[tuple, list[int]] = {}
    for i in members:
        t = tuple(tokens[i])
        keys.setdefault(("whole", t), []).append(i)
        for k in range(len(t)):
            keys.setdefault(("replaced", k, t[:k] + t[k + 1 :]), []).append(i)
            keys.setdefault(("dropped", t[:k] + t[k + 1 :]), []).append(i)
    pairs: set[tuple[int, int]] = set()
    for key, texts in keys.items():
        if key[0] == "dropped":  # a text with one token left out is another text whole
            found = [(i, j) for i in texts for j in keys.get(("whole", key[1]), [])]
        else:  # the same text, or the same but at position k
            found = [(i, j) for x, i in enumerate(texts) for j in texts[x + 1 :]]
        pairs.update((min(i, j), max(i, j)) for i, j in found if i != j)
    return pairs


def twin_groups(
    texts: Sequence[str],
    pronouns: Sequence[str],
    candidates: Sequence[Sequence[str]],
    *,
    max_diff: int = TWIN_TOKENS,
    max_share: float = TWIN_SHARE,
    max_group: int = TWIN_GROUP,
) -> np.ndarray:  # [probe]: a group label per probe (0, 1, …)
    """Group label per probe: probes with the same pronoun and the same candidates (in any order, any
    case) whose texts differ in at most ``max_diff`` tokens (words; a CJK character is a token), and in
    at most ``max_share`` of the longer text's tokens, are twins — "…because it is too big." / "…too
    small." A held-out split keeps a group together, so a probe's twin never tells the other split the
    answer.

    Twins of twins join too, the closest pairs first, up to ``max_group`` probes a group: a templated
    set, where every sentence is a word away from many others, is not fused into one group. Pairs one
    token apart are found by signature; pairs further apart among texts that share a rare bigram (one a
    twin must keep, in at most :data:`COMMON_BIGRAM` texts), so a large set is not compared pair by pair.
    """
    n = len(texts)
    if not len(pronouns) == len(candidates) == n:
        raise InputError(
            f"twin_groups needs one pronoun and candidate list per text, got {n}, {len(pronouns)}, {len(candidates)}"
        )
    parent, size = list(range(n)), [1] * n

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    buckets: dict[tuple, list[int]] = {}
    for i in range(n):
        key = (str(pronouns[i]).lower(), tuple(sorted(str(c).lower() for c in candidates[i])))
        buckets.setdefault(key, []).append(i)
    tokens = [_tokens(str(t)) for t in texts]
    grams = [set(zip(["^", *t], [*t, "$"], strict=True)) for t in tokens]
    pairs: list[tuple[int, int, int]] = []  # (differing tokens, i, j)
    for members in buckets.values():
        close = _one_edit_pairs(members, tokens)
        pairs += [(0 if tokens[i] == tokens[j] else 1, i, j) for i, j in close]
        if max_diff < 2:
            continue
        # a twin keeps at least one of a text's 2·max_diff + 1 rarest bigrams (an edit breaks at most two)
        postings: dict[tuple[str, str], list[int]] = {}
        for i in members:
            for gram in grams[i]:
                postings.setdefault(gram, []).append(i)
        for i in members:
            rare = sorted(grams[i], key=lambda gram: len(postings[gram]))[: 2 * max_diff + 1]
            witnesses = [postings[gram] for gram in rare if len(postings[gram]) <= COMMON_BIGRAM]
            for j in sorted({j for texts_ in witnesses for j in texts_ if j > i and (i, j) not in close}):
                limit = min(max_diff, max_share * max(len(tokens[i]), len(tokens[j])))
                if abs(len(tokens[i]) - len(tokens[j])) <= limit:
                    diff = _differing(tokens[i], tokens[j])
                    if diff <= limit:
                        pairs.append((diff, i, j))
    for diff, i, j in sorted(pairs):
        limit = min(max_diff, max_share * max(len(tokens[i]), len(tokens[j])))
        ri, rj = root(i), root(j)
        if diff <= limit and ri != rj and size[ri] + size[rj] <= max_group:
            parent[rj] = ri
            size[ri] += size[rj]
    labels: dict[int, int] = {}
    return np.array([labels.setdefault(root(i), len(labels)) for i in range(n)], dtype=np.int64)
