"""What a probe accuracy means: the statistics of attnviz.analysis.probe_stats against scipy and
statsmodels on the same counts, and ProbeResult built by hand from picks whose counts are known."""

from __future__ import annotations

import itertools
from html import escape

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom, binomtest
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

import attnviz
from attnviz.analysis import ProbeResult
from attnviz.analysis.probe_stats import (
    binomial_sf,
    chance_sf,
    holm,
    mcnemar_exact,
    poisson_binomial_pmf,
    twin_groups,
    wilson,
)

# --- the formulas against their references --------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 40, 179, 1000])
def test_wilson_interval_is_statsmodels_wilson(n):
    ks = np.unique(np.linspace(0, n, 12).round().astype(int))
    low, high = wilson(ks, np.full(ks.shape, n))
    ref_low, ref_high = proportion_confint(ks, n, alpha=0.05, method="wilson")
    np.testing.assert_allclose(low, ref_low, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(high, ref_high, rtol=1e-12, atol=1e-14)


def test_wilson_of_no_trials_is_nan():
    low, high = wilson(0, 0)
    assert np.isnan(low) and np.isnan(high)


@pytest.mark.parametrize(("n", "p"), [(10, 0.5), (25, 1 / 3), (179, 0.5), (60, 0.25)])
def test_binomial_tail_is_scipy_binomtest_greater(n, p):
    for k in range(n + 1):
        assert binomial_sf(k, n, p) == pytest.approx(
            binomtest(k, n, p, alternative="greater").pvalue, rel=1e-9, abs=1e-15
        )


def test_poisson_binomial_is_the_enumeration_of_every_outcome():
    ps = np.array([0.5, 0.5, 1 / 3, 1 / 3, 1 / 3, 0.25, 0.2, 0.5])
    brute = np.zeros(len(ps) + 1)
    for outcome in itertools.product([0, 1], repeat=len(ps)):
        hits = np.array(outcome, dtype=bool)
        brute[hits.sum()] += np.prod(np.where(hits, ps, 1 - ps))
    np.testing.assert_allclose(poisson_binomial_pmf(ps), brute, rtol=1e-12, atol=1e-15)
    counts = np.round(1 / ps).astype(int)
    for k in range(len(ps) + 1):
        assert chance_sf(k, counts) == pytest.approx(brute[k:].sum(), rel=1e-12, abs=1e-15)


def test_chance_with_equal_candidate_counts_is_the_binomial():
    assert chance_sf(31, [3] * 70) == pytest.approx(binomtest(31, 70, 1 / 3, alternative="greater").pvalue, rel=1e-10)


def test_poisson_binomial_agrees_with_a_monte_carlo_on_a_large_mixed_set():
    counts = np.array([2] * 120 + [3] * 40 + [5] * 19)
    rng = np.random.default_rng(7)
    draws = (rng.random((200_000, counts.size)) < 1 / counts).sum(axis=1)
    for k in (60, 72, 80):
        estimate = (draws >= k).mean()
        assert chance_sf(k, counts) == pytest.approx(
            estimate, abs=4 * np.sqrt(estimate * (1 - estimate) / draws.size) + 1e-4
        )


@pytest.mark.parametrize(
    ("only_a", "only_b", "both", "neither"), [(30, 25, 60, 64), (0, 0, 5, 5), (9, 1, 3, 2), (1, 12, 0, 0)]
)
def test_mcnemar_is_statsmodels_exact(only_a, only_b, both, neither):
    a = np.array([True] * only_a + [False] * only_b + [True] * both + [False] * neither)
    b = np.array([False] * only_a + [True] * only_b + [True] * both + [False] * neither)
    got_a, got_b, p = mcnemar_exact(a, b)
    ref = mcnemar([[both, only_a], [only_b, neither]], exact=True)
    assert (got_a, got_b) == (only_a, only_b)
    assert min(got_a, got_b) == ref.statistic
    assert p == pytest.approx(ref.pvalue, rel=1e-12)


def test_holm_is_statsmodels_holm():
    rng = np.random.default_rng(3)
    for p in (rng.random(270) ** 6, np.array([0.01, 0.04, 0.03, 0.005, 0.5]), np.array([0.2, 0.2, 0.01])):
        reject, adjusted, _, _ = multipletests(p, alpha=0.05, method="holm")
        np.testing.assert_allclose(holm(p), adjusted, rtol=1e-12)
        assert ((holm(p) <= 0.05) == reject).all()


def test_twins_are_texts_a_few_words_apart_with_the_same_pronoun_and_candidates():
    texts = [
        "The trophy doesn't fit in the suitcase because it is too big.",
        "The trophy doesn't fit in the suitcase because it is too small.",
        "The city councilmen refused the demonstrators a permit because they feared violence.",
        "The city councilmen refused the demonstrators a permit because they advocated violence.",
        "The trophy is in the suitcase and it looks fine on the shelf near the window today.",  # same candidates, not a twin
        "it: trophy",  # a short text two tokens from the next: not a twin (half its tokens differ)
        "it: suitcase",
        "小猫抓不到老鼠，因为它跑得太慢了。",
        "小猫抓不到老鼠，因为它跑得太快了。",
    ]
    pronouns = ["it", "it", "they", "they", "it", "it", "it", "它", "它"]
    candidates = [
        ["trophy", "suitcase"],
        ["Suitcase", "trophy"],
        ["councilmen", "demonstrators"],
        ["councilmen", "demonstrators"],
        ["trophy", "suitcase"],
        ["trophy", "suitcase"],
        ["trophy", "suitcase"],
        ["小猫", "老鼠"],
        ["老鼠", "小猫"],
    ]
    g = twin_groups(texts, pronouns, candidates)
    assert g[0] == g[1] and g[2] == g[3] and g[7] == g[8]
    assert len(set(g.tolist())) == 6


# --- a result built by hand from picks whose counts are known -------------------------------------


def hand_result(n_probes: int = 20, three_from: int | None = None) -> ProbeResult:
    """``n_probes`` probes in twin pairs (2k, 2k+1: same text but the last word, opposite gold), two
    layers of three heads: L0·H0 always right, L0·H1 right on the first 15, L0·H2 always candidate 0,
    L1·H* always wrong except L1·H1 right on probes 0–9. Probes from ``three_from`` on have 3 candidates."""
    n_cand = np.full(n_probes, 2)
    if three_from is not None:
        n_cand[three_from:] = 3
    gold = np.array([i % 2 for i in range(n_probes)])
    picks = np.zeros((n_probes, 2, 3), dtype=np.int16)
    picks[:, 0, 0] = gold
    picks[:, 0, 1] = np.where(np.arange(n_probes) < 15, gold, 1 - gold)
    picks[:, 0, 2] = 0
    picks[:, 1, :] = (1 - gold)[:, None]
    picks[:10, 1, 1] = gold[:10]
    nearest = np.ones(n_probes, dtype=int)  # right on odd probes
    first = np.zeros(n_probes, dtype=int)  # right on even probes
    per_probe = [
        {
            "id": f"en-{i:02d}",
            "text": f"The cup number {i // 2} does not fit in the box because it is too {'small' if i % 2 else 'big'}.",
            "pronoun": "it",
            "candidates": [f"cup{i // 2}", "box", "shelf"][: n_cand[i]],
            "gold": [f"cup{i // 2}", "box"][gold[i]],
        }
        for i in range(n_probes)
    ]
    return ProbeResult.from_picks(picks, gold, nearest, first, n_cand, per_probe, model="hand", how="by hand")


def test_from_picks_counts_what_was_picked():
    r = hand_result()
    acc = r.accuracy.set_index(["layer", "head"])
    assert acc.loc[(0, 0), "correct"] == 20 and acc.loc[(0, 1), "correct"] == 15 and acc.loc[(0, 2), "correct"] == 10
    assert acc.loc[(1, 0), "correct"] == 0 and acc.loc[(1, 1), "correct"] == 10
    assert (acc.n == 20).all() and (acc.accuracy == acc.correct / 20).all()
    assert r.baselines == {"nearest": 0.5, "first": 0.5}
    assert (r.n_layers, r.n_heads) == (2, 3) and r.chance == 0.5
    ref_low, ref_high = proportion_confint(acc.correct, 20, method="wilson")
    np.testing.assert_allclose(acc.low, ref_low, rtol=1e-12)
    np.testing.assert_allclose(acc.high, ref_high, rtol=1e-12)
    p = [binomtest(int(k), 20, 0.5, alternative="greater").pvalue for k in acc.correct]
    np.testing.assert_allclose(acc.p_chance, p, rtol=1e-9)
    np.testing.assert_allclose(acc.p_holm, multipletests(p, method="holm")[1], rtol=1e-9)
    # 20/20: p = 2^-20, ×6 heads ≪ 0.05; 15/20: p = 0.0207, ×5 > 0.05
    assert acc.beats_chance.tolist() == [True, False, False, False, False, False] and r.beating_chance == 1


def test_mixed_candidate_counts_use_the_poisson_binomial():
    r = hand_result(three_from=12)
    row = r.accuracy.set_index(["layer", "head"]).loc[(0, 1)]
    # 12 probes at chance 1/2 and 8 at 1/3: the two binomials convolved (scipy's pmf)
    pmf = np.convolve(binom.pmf(np.arange(13), 12, 1 / 2), binom.pmf(np.arange(9), 8, 1 / 3))
    assert row.p_chance == pytest.approx(pmf[int(row.correct) :].sum(), rel=1e-10)
    assert r.chance == pytest.approx((12 / 2 + 8 / 3) / 20)
    assert r.tests().test[0] == "exact Poisson-binomial, one-sided"
    assert hand_result().tests().test[0] == "exact binomial, one-sided"


def test_tests_of_the_best_head_against_chance_and_each_baseline():
    r = hand_result()
    t = r.tests().set_index("comparison")
    assert list(t.index) == ["L0·H0 vs chance", "L0·H0 vs nearest", "L0·H0 vs first"]
    assert t.loc["L0·H0 vs chance", "p_value"] == pytest.approx(0.5**20)
    # L0·H0 is always right; nearest is right on the 10 odd probes: 10 discordant, all the head's
    ref = mcnemar([[10, 10], [0, 0]], exact=True)
    assert t.loc["L0·H0 vs nearest", "p_value"] == pytest.approx(ref.pvalue)
    assert (t.loc["L0·H0 vs nearest", "head_only"], t.loc["L0·H0 vs nearest", "other_only"]) == (10, 0)
    assert "optimistic" in t.loc["L0·H0 vs first", "meaning"]


def test_held_out_is_seeded_keeps_twins_together_and_scores_on_the_other_split():
    r = hand_result(40)
    h = r.held_out(seed=0)
    assert h == r.held_out(seed=0)
    assert any(r.held_out(seed=s).ids_a != h.ids_a for s in range(1, 6))
    assert set(h.ids_a).isdisjoint(h.ids_b) and len(h.ids_a) + len(h.ids_b) == 40 and len(h.ids_a) == 20
    for a in h.ids_a:  # each probe's twin (2k ↔ 2k+1) is on the same side
        i = int(a.split("-")[1])
        assert f"en-{i ^ 1:02d}" in h.ids_a
    assert h.n_groups == 20
    assert (h.layer, h.head) == (0, 0) and h.accuracy_a == 1.0 and h.correct_b == 20 and h.n_b == 20
    assert (h.low_b, h.high_b) == pytest.approx(proportion_confint(20, 20, method="wilson"))
    assert h.baselines_b["nearest"][0] == 0.5  # twins together: every B pair has one odd probe
    free = r.held_out(seed=0, groups=range(40))
    assert free.n_groups == 40 and "groups given" in free.grouped_by


def random_result(seed: int = 5, n_probes: int = 60) -> ProbeResult:
    rng = np.random.default_rng(seed)
    n_cand = rng.integers(2, 5, n_probes)
    gold = rng.integers(0, n_cand)
    picks = (rng.integers(0, 60, (n_probes, 3, 4)) % n_cand[:, None, None]).astype(np.int16)
    per_probe = [
        {"id": f"r{i}", "text": f"text {i}", "pronoun": "it", "candidates": ["a", "b", "c", "d"][: n_cand[i]]}
        for i in range(n_probes)
    ]
    return ProbeResult.from_picks(
        picks, gold, rng.integers(0, n_cand), rng.integers(0, n_cand), n_cand, per_probe, model="random"
    )


def test_held_out_chooses_on_a_and_scores_on_b_by_hand():
    r = random_result()
    ids = r.per_probe.id.tolist()
    for seed in range(4):
        h = r.held_out(seed=seed, fraction=0.4)
        a = np.isin(ids, h.ids_a)
        b = np.isin(ids, h.ids_b)
        assert a.sum() == 24 and (a ^ b).all()  # every probe its own group: round(0.4 · 60) in A
        right = r.picks == r.gold[:, None, None]
        on_a = right[a].mean(axis=0)
        best = max((on_a[i, j], -i, -j) for i in range(3) for j in range(4))  # ties: lower layer, head
        assert (h.layer, h.head) == (-best[1], -best[2]) and h.accuracy_a == pytest.approx(best[0])
        assert h.correct_b == right[b, h.layer, h.head].sum() and h.n_b == b.sum()
        assert h.baselines_b["first"][0] == pytest.approx((r.first == r.gold)[b].mean())


def test_picks_table_names_the_candidate_each_top_head_picked():
    r = hand_result()
    table = r.picks_table(top=2)
    assert list(table.columns[-4:]) == ["L0·H0", "L0·H0 gold", "L0·H1", "L0·H1 gold"]
    assert table["L0·H0"].tolist() == table["gold"].tolist() and table["L0·H0 gold"].all()
    assert table.loc[16, "L0·H1"] == "box" and not table.loc[16, "L0·H1 gold"]  # wrong from probe 15 on
    assert table["L0·H1 gold"].sum() == 15


def test_the_text_says_interval_held_out_tests_and_holm():
    r = hand_result(40)
    text = str(r)
    h = r.held_out()
    assert text.startswith(
        "40 probes on hand (by hand): best head L0·H0 100.0 % [91.2, 100.0] (chosen on these probes; "
    )
    assert f"held out: 100.0 % [{100 * h.low_b:.1f}, 100.0] on 20, seed 0" in text
    assert "vs chance p < 1e-10, vs nearest p = 1.9e-06, vs first p = 1.9e-06 (McNemar)" in text
    assert "1 of 6 heads beat chance after Holm (α = 0.05)" in text
    html = r._repr_html_()
    assert "vs nearest" in html and "L0·H0" in html and "<table" in html


def test_bad_arrays_are_refused_with_what_is_wrong():
    r = hand_result()
    with pytest.raises(attnviz.InputError, match=r"gold must hold one entry per probe \(20\), got shape \(19,\)"):
        ProbeResult.from_picks(r.picks, r.gold[:-1], r.nearest, r.first, r.n_candidates, r.per_probe, model="x")
    picks = r.picks.copy()
    picks[3, 0, 0] = 2
    with pytest.raises(
        attnviz.InputError, match=r"picks hold an index outside the probe's candidates at probe\(s\) \[3\]"
    ):
        ProbeResult.from_picks(picks, r.gold, r.nearest, r.first, r.n_candidates, r.per_probe, model="x")
    with pytest.raises(attnviz.InputError, match="per_probe has 19 rows for 20 probes"):
        ProbeResult.from_picks(r.picks, r.gold, r.nearest, r.first, r.n_candidates, r.per_probe[:-1], model="x")
    with pytest.raises(attnviz.InputError, match="fraction is the share"):
        r.held_out(fraction=1.0)
    bare = ProbeResult(r.accuracy[["layer", "head", "accuracy", "correct", "n"]], r.per_probe, r.baselines, "x")
    with pytest.raises(attnviz.InputError, match="held_out needs the per-probe picks"):
        bare.held_out()
    assert "best head L0·H0 picks the gold antecedent 100.0 %" in str(bare)


def test_a_layer_not_captured_is_left_out():
    r = hand_result()
    picks = r.picks.copy()
    picks[:, 1, :] = -1
    s = ProbeResult.from_picks(picks, r.gold, r.nearest, r.first, r.n_candidates, pd.DataFrame(r.per_probe), model="x")
    assert s.accuracy.layer.unique().tolist() == [0] and len(s.accuracy) == 3
    np.testing.assert_allclose(s.accuracy.p_holm, multipletests(s.accuracy.p_chance, method="holm")[1])


# --- the figure and the HTML ----------------------------------------------------------------------


def test_probe_intervals_draws_the_top_heads_intervals_lines_and_held_out_row():
    from attnviz.figures import probe_intervals

    r = random_result(n_probes=80)
    fig = probe_intervals(r, top=5)
    heads, held, *lines = fig.data
    top = r.ranked().head(5)
    assert list(heads.y) == [f"L{a}·H{b}" for a, b in zip(top.layer, top["head"], strict=True)]
    np.testing.assert_allclose(heads.x, top.accuracy)
    np.testing.assert_allclose(np.asarray(heads.x) + heads.error_x.array, top.high)
    np.testing.assert_allclose(np.asarray(heads.x) - heads.error_x.arrayminus, top.low)
    h = r.held_out()
    assert held.y == (f"held out: {h.label}",) and held.x == (h.accuracy_b,)
    assert held.x[0] + held.error_x.array[0] == pytest.approx(h.high_b)
    assert held.x[0] - held.error_x.arrayminus[0] == pytest.approx(h.low_b)
    assert {line.name.rsplit(" ", 2)[0]: line.x[0] for line in lines} == {
        "chance": pytest.approx(r.chance),
        "nearest candidate": pytest.approx(r.baselines["nearest"]),
        "first candidate": pytest.approx(r.baselines["first"]),
    }
    assert list(fig.layout.yaxis.categoryarray) == list(heads.y)[::-1] + [held.y[0]]  # best at the top
    assert "optimistic" in fig.layout.title.text


def test_probe_intervals_and_the_map_say_what_is_missing():
    from attnviz.figures import probe_accuracy_map, probe_intervals

    r = hand_result()
    bare = ProbeResult(
        r.accuracy[["layer", "head", "accuracy", "correct", "n"]], r.per_probe, r.baselines, "x", "", 2, 3
    )
    with pytest.raises(attnviz.InputError, match="probe_intervals needs the per-probe picks"):
        probe_intervals(bare)
    with pytest.raises(attnviz.InputError, match="top is how many heads"):
        probe_intervals(r, top=0)
    assert "[83.9, 100.0]" in probe_accuracy_map(r).layout.title.text
    assert "1 of 6 heads beat chance after Holm" in probe_accuracy_map(r).layout.title.text
    assert "probes: best L0·H0 100.0 %" in probe_accuracy_map(bare).layout.title.text


def test_html_holds_the_sentence_the_tests_and_the_top_heads():
    r = hand_result(40)
    html = r._repr_html_()
    assert escape(str(r)) in html
    for comparison in r.tests().comparison:
        assert comparison in html
    assert "<th" in html and "p_holm" in html and "beats_chance" in html


# --- the max-statistic permutation test -----------------------------------------------------------


@pytest.mark.parametrize("seed", [12, 15])
def test_max_statistic_of_one_head_is_its_exact_chance_p_value(seed):
    from attnviz.analysis.probe_stats import max_statistic

    rng = np.random.default_rng(seed)
    counts = rng.choice([2, 5], 60)  # up to 5 candidates: a draw that left some out would show
    gold = rng.integers(0, counts)
    pick = np.where(rng.random(60) < 0.08, gold, rng.integers(0, counts))[:, None]  # one head, near chance
    k = int((pick[:, 0] == gold).sum())
    _, p = max_statistic(pick, counts, gold, n_permutations=20_000, seed=1)
    exact = chance_sf(k, counts)
    assert 0.01 < exact < 0.5  # a p-value in the range where a wrong null distribution shows
    assert p[0] == pytest.approx(exact, abs=4 * np.sqrt(exact * (1 - exact) / 20_000) + 1e-4)


def test_max_statistic_pays_nothing_for_copies_of_a_head_and_holm_pays_for_each():
    r = random_result(n_probes=80)
    layer, head = int(r.best["layer"]), int(r.best["head"])
    copies = np.repeat(r.picks[:, layer : layer + 1, head : head + 1], 8, axis=2)  # one layer of 8 identical heads
    s = ProbeResult.from_picks(copies, r.gold, r.nearest, r.first, r.n_candidates, r.per_probe, model="copies")
    one = ProbeResult.from_picks(copies[:, :, :1], r.gold, r.nearest, r.first, r.n_candidates, r.per_probe, model="one")
    m8, m1 = s.max_statistic(n_permutations=4000), one.max_statistic(n_permutations=4000)
    assert m8.p_max.nunique() == 1 and m8.p_max.iloc[0] == m1.p_max.iloc[0]  # same seed, same draws, same max
    assert s.accuracy.p_holm.iloc[0] == pytest.approx(min(1, 8 * s.accuracy.p_chance.iloc[0]))
    full = r.max_statistic(n_permutations=500)
    assert (full.p_max >= r.accuracy.p_chance - 0.05).all() and (full.p_max >= 1 / 501).all()
    assert full.equals(r.max_statistic(n_permutations=500)) and not full.p_max.equals(
        r.max_statistic(500, seed=3).p_max
    )


def test_twins_two_words_apart_are_found_and_a_templated_set_is_not_one_group():
    a = "The city councilmen refused the demonstrators a permit because they feared violence."
    b = "The city councilmen refused the demonstrators a permit because they strongly advocated violence."
    c = "The city councilmen refused the demonstrators a permit since they wanted peace and quiet."
    g = twin_groups([a, b, c], ["they"] * 3, [["councilmen", "demonstrators"]] * 3)
    assert g[0] == g[1] != g[2]
    feelings = ["tired", "late", "right", "wrong", "sick"]
    texts = [f"The doctor told the nurse that she was {f} because of the {w}." for f in feelings for w in "abcdefgh"]
    g = twin_groups(texts, ["she"] * len(texts), [["doctor", "nurse"]] * len(texts))
    sizes = np.bincount(g)
    assert sizes.max() <= 4 and len(sizes) >= len(texts) // 4
    for group in range(len(sizes)):  # each group is sentences one word apart from another of the group
        members = [texts[i].split() for i in np.flatnonzero(g == group)]
        for x in members:
            assert (
                any(sum(p != q for p, q in zip(x, y, strict=True)) == 1 for y in members if y is not x)
                or len(members) == 1
            )


def test_a_result_without_texts_holds_out_each_probe_alone():
    r = hand_result(20)
    bare = ProbeResult.from_picks(
        r.picks, r.gold, r.nearest, r.first, r.n_candidates, [{"id": f"p{i}"} for i in range(20)], model="x"
    )
    h = bare.held_out()
    assert h.n_groups == 20 and "no texts" in h.grouped_by
    assert "held out:" in str(bare)


# --- on a real model ------------------------------------------------------------------------------


@pytest.mark.slow
def test_minilm_on_the_shipped_winograd_pairs_states_its_numbers(minilm):
    model, tok = minilm
    r = attnviz.evaluate_probes(model, "en", tok, progress=False)
    acc = r.accuracy
    low, high = proportion_confint(acc.correct, acc.n, method="wilson")
    np.testing.assert_allclose(acc.low, low, rtol=1e-12)
    np.testing.assert_allclose(acc.high, high, rtol=1e-12)
    p = [binomtest(int(k), int(n), 0.5, alternative="greater").pvalue for k, n in zip(acc.correct, acc.n, strict=True)]
    np.testing.assert_allclose(acc.p_chance, p, rtol=1e-9)
    np.testing.assert_allclose(acc.p_holm, multipletests(p, method="holm")[1], rtol=1e-9)
    # the 42 probes are 21 twin pairs (en-01/en-02 …): each pair is one group, on one side of the split
    assert (np.bincount(r.groups()) == 2).all()
    h = r.held_out(seed=0)
    for i in range(1, 43, 2):
        assert (f"en-{i:02d}" in h.ids_a) == (f"en-{i + 1:02d}" in h.ids_a)
    table = r.picks_table(top=3)
    best = f"L{int(r.best['layer'])}·H{int(r.best['head'])}"
    assert (table[f"{best} gold"] == (table[best] == table["gold"])).all()
    text = str(r)
    assert f"best head {best} " in text and "held out:" in text and "heads beat chance after Holm" in text


def test_a_pair_of_twins_alone_has_no_held_out_estimate_and_says_why():
    from attnviz.figures import probe_intervals

    r = hand_result(2)  # en-00 and en-01: one pair of twins, one group
    assert r.groups().tolist() == [0, 0]
    with pytest.raises(attnviz.InputError, match="cannot hold out: the 2 probes form one group"):
        r.held_out()
    assert "no held-out estimate: cannot hold out: the 2 probes form one group" in str(r)
    fig = probe_intervals(r)
    assert "too few probes to hold any out" in fig.layout.title.text
    assert not any(str(t.name).startswith("held out") for t in fig.data)
    assert r.held_out(groups="id").n_b == 1
