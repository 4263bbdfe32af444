"""The shortcuts the head atlas and the probe sets take for speed give what the long way gives, exactly:
many texts in one tokenizer call, the atlas' single tokenization and its pass without statistics by
norm, the random sequences' reduction to the detectors' sums alone, and the tally's examples kept for
every role and offset at once, each row's maximum read from the weights' bits (issues #21, #22)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnviz
from attnviz.analysis import corpus_stats
from attnviz.analysis.batch_texts import STATISTIC_COLUMNS
from attnviz.analysis.head_tally import EXAMPLES, OFFSETS, HeadTally, row_max
from attnviz.analysis.layer_reduction import BUDGET
from attnviz.analysis.stats import statistic_keys
from attnviz.errors import InputError, InputTooLongError
from attnviz.workflows.capture.inputs import encode, encode_all, tokenize, tokenize_each
from attnviz.workflows.capture.models import IdsTokenizer
from attnviz.workflows.corpus.atlas import ATLAS_STATISTICS
from attnviz.workflows.corpus.batched import BatchReducer

TEXTS = [
    "The trophy would not fit in the suitcase because it was too big.",
    "  spaces   before, and   after  ",
    "Ünïcödé — dashes … and 汉字 mixed in; it's fine!",
    "a",
    "The city councilmen refused the demonstrators a permit because they feared violence.",
]


def test_many_texts_in_one_tokenizer_call_encode_as_one_call_each(bert_tokenizer):
    kwargs = {"truncation": False}
    assert encode_all(bert_tokenizer, TEXTS, kwargs) == [encode(bert_tokenizer, t, kwargs) for t in TEXTS]
    for add_bos in (False, True):
        together = tokenize(bert_tokenizer, TEXTS, None, None, "minilm", add_bos)
        assert together == [tokenize(bert_tokenizer, [t], None, None, "minilm", add_bos)[0] for t in TEXTS]
    cut = tokenize(bert_tokenizer, TEXTS, 6, None, "minilm")
    assert cut == [tokenize(bert_tokenizer, [t], 6, None, "minilm")[0] for t in TEXTS]
    assert max(len(ids) for ids, _, _ in cut) == 6
    slow = IdsTokenizer()  # no fast tokenizer: text by text
    assert encode_all(slow, ["1 2 3", "4 5"], kwargs) == [encode(slow, t, kwargs) for t in ["1 2 3", "4 5"]]


def test_tokenize_each_puts_a_texts_error_in_its_place_as_a_call_of_its_own_raises_it(bert_tokenizer):
    limit = 12
    found = tokenize_each(bert_tokenizer, TEXTS, None, limit, "minilm")
    for text, one in zip(TEXTS, found):
        try:
            [alone] = tokenize(bert_tokenizer, [text], None, limit, "minilm")
        except InputTooLongError as err:
            assert isinstance(one, InputTooLongError) and str(one) == str(err)
            assert str(one).startswith("The text has ")
        else:
            assert one == alone
    assert sum(isinstance(one, InputTooLongError) for one in found) == 3
    with pytest.raises(InputTooLongError, match="^Text 0 has "):  # tokenize itself still stops at the first
        tokenize(bert_tokenizer, TEXTS, None, limit, "minilm")


def _texts(count: int, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 30, (count,), generator=g).tolist()
    return [" ".join(str(i) for i in torch.randint(3, 30, (n,), generator=g).tolist()) for n in lengths]


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_the_detectors_sums_alone_equal_those_of_the_whole_reduction(family):
    model, tok = attnviz.testing.tiny_model(family), IdsTokenizer()
    texts = _texts(9)
    index = {t: k for k, t in enumerate(texts)}
    full, alone = BatchReducer(model, tok, moved=False), BatchReducer(model, tok, statistics=False, patterns=True)
    tallies = []
    sums = {}
    for which, reducer, whole in (("full", full, True), ("alone", alone, False)):
        layers = sorted(full.layers or range(model.config.num_hidden_layers))
        tally = HeadTally(layers, model.config.num_attention_heads, torch.ones(200), index, full=whole)
        s = None
        for start in range(0, len(texts), 4):
            s, _ = reducer.add(s, texts[start : start + 4], tally=tally)
        sums[which] = s.frame()
        tallies.append(tally)
    for name in ("duplicate_token", "induction"):
        np.testing.assert_array_equal(sums["alone"][name].to_numpy(), sums["full"][name].to_numpy())
        assert np.isfinite(sums["full"][name].to_numpy()).all()
        k = EXAMPLES.index(name)
        np.testing.assert_array_equal(tallies[1].best[:, k].numpy(), tallies[0].best[:, k].numpy())
        np.testing.assert_array_equal(tallies[1].where[:, k].numpy(), tallies[0].where[:, k].numpy())
    assert sums["alone"]["previous"].isna().all() and not sums["full"]["previous"].isna().any()
    assert torch.isinf(tallies[1].best[:, EXAMPLES.index("previous")]).all()  # nothing else is kept


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_a_reducers_buffers_kept_from_batch_to_batch_give_each_batch_its_own_numbers(family):
    """BatchReducer keeps its weights-sized buffers from batch to batch: batches of growing and shrinking
    lengths reduced by one reducer give, batch by batch, the sums and tally of a fresh reducer per batch
    to the bit; a buffer outgrown is made at least twice as large (made a few times, not once a batch)."""
    from attnviz.attention import Scratch

    model, tok = attnviz.testing.tiny_model(family), IdsTokenizer()
    texts = sorted(_texts(12, seed=3), key=len) + _texts(3, seed=4)  # growing lengths, then shorter again
    index = {t: k for k, t in enumerate(texts)}
    layers = list(range(model.config.num_hidden_layers))
    made: list[int] = []
    reserve = Scratch.reserve

    def counted(self, name, size, device):
        before = self._buffers.get((name, str(device)))
        found = reserve(self, name, size, device)
        if found is not before:
            assert before is None or found.numel() >= 2 * before.numel()
            made.append(found.numel())
        return found

    kept = BatchReducer(model, tok, moved=False, statistics=ATLAS_STATISTICS)
    batches = [texts[start : start + 3] for start in range(0, len(texts), 3)]
    for batch in batches:
        fresh = BatchReducer(model, tok, moved=False, statistics=ATLAS_STATISTICS)
        tallies = [HeadTally(layers, model.config.num_attention_heads, torch.ones(200), index) for _ in "ab"]
        mine, _ = fresh.add(None, batch, tally=tallies[0])
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Scratch, "reserve", counted)
            theirs, _ = kept.add(None, batch, tally=tallies[1])
        assert mine.frame().equals(theirs.frame())
        for name in ("offsets", "rare", "best", "where", "offset_best", "offset_where"):
            assert torch.equal(getattr(tallies[0], name), getattr(tallies[1], name)), name
    assert made and len(made) < len(batches) * len({"scores", "weights"})  # kept, not made again each batch


def test_corpus_stats_without_the_statistics_by_norm_or_with_given_encodings_gives_the_same_table():
    model, tok = attnviz.testing.tiny_model("bert"), IdsTokenizer()
    texts = _texts(10, seed=1)
    whole = corpus_stats(model, texts, tok, batch_size=4, progress=False)
    encodings = dict(zip(texts, tokenize(tok, texts, None, None, "tiny", False)))
    lean = corpus_stats(model, texts, tok, batch_size=4, progress=False, moved=False, encodings=encodings)
    moved = [c for c in whole.columns if c.endswith("_moved")]
    assert moved and lean[moved].isna().all().all() and whole["first_moved"].notna().all()
    rest = [c for c in whole.columns if c not in moved]
    assert lean[rest].equals(whole[rest])
    wrong = {t: ([3, 4], [(0, 1), (2, 3)], ["3", "4"]) for t in texts}  # the given encodings are what is read
    assert corpus_stats(model, texts, tok, batch_size=4, progress=False, encodings=wrong)["tokens"].iloc[0] == 20


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_some_statistics_alone_equal_the_whole_reductions_and_leave_the_others_nan(family):
    """``statistics=`` names: those sums alone (the atlas' six without any product over every weight:
    the first key's column, the diagonals, the special keys gathered), in one chunk or many (rows from
    ``start`` on, a causal chunk's keys cut at its last row), equal to the whole reduction's."""
    model, tok = attnviz.testing.tiny_model(family), IdsTokenizer()
    texts = [*_texts(10, seed=2), "5"]  # and a text of one token: only its first row
    encoded = tokenize(tok, texts, None, None, "tiny", False)
    # special keys (an empty span) after the first: none to three per text, the last one among them
    for t, (ids, offsets, _) in enumerate(encoded):
        for position in [p for p in (len(ids) - 1, 2, 5) if 0 < p < len(ids)][: t % 4]:
            offsets[position] = (offsets[position][0], offsets[position][0])
    every = statistic_keys()
    keys = [k for k in every if not k.endswith("_moved")]  # by weight (the reducers here read no norms)
    for budget in (BUDGET, 300):  # 300 weights per step: chunks of a few rows
        whole = BatchReducer(model, tok, moved=False, budget=budget)
        full = None
        for start in range(0, len(texts), 4):
            full, _ = whole.add(full, texts[start : start + 4], encoded[start : start + 4])
        expected = full.frame()
        assert np.isfinite(expected[keys].to_numpy()).all()
        for chosen in (ATLAS_STATISTICS, ("self", "next"), ("special", "punctuation"), ("distance", "previous_token")):
            reducer = BatchReducer(model, tok, moved=False, statistics=chosen, budget=budget)
            some = None
            for start in range(0, len(texts), 4):
                some, _ = reducer.add(some, texts[start : start + 4], encoded[start : start + 4])
            got = some.frame()
            wanted = {STATISTIC_COLUMNS[name] for name in chosen}
            filled = [k for k in keys if STATISTIC_COLUMNS[k] in wanted]  # previous_token reads previous's sums
            assert set(chosen) <= set(filled)
            np.testing.assert_allclose(got[filled].to_numpy(), expected[filled].to_numpy(), rtol=1e-6, atol=1e-9)
            assert got[[k for k in every if k not in filled]].isna().all().all(), (chosen, budget)
    lean = corpus_stats(model, texts, tok, batch_size=4, progress=False, statistics=["entropy"])
    np.testing.assert_allclose(lean["entropy"], expected["entropy"], rtol=1e-6)
    assert lean["first"].isna().all() and lean["first_moved"].isna().all()  # nor any moved statistic


def test_statistics_names_what_it_cannot_compute():
    model, tok = attnviz.testing.tiny_model("bert"), IdsTokenizer()
    with pytest.raises(InputError, match="no statistic 'weights' to compute; choose from first, special"):
        corpus_stats(model, ["1 2 3"], tok, progress=False, statistics=["entropy", "weights"])
    with pytest.raises(InputError, match="no statistic 'first_moved'"):  # the moved statistics follow moved=
        BatchReducer(model, tok, statistics=["first_moved"])
    with pytest.raises(InputError, match="without a checkpoint"):
        corpus_stats(model, ["1 2 3"], tok, progress=False, statistics=["entropy"], checkpoint="x.ckpt")


def _example_loop(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per head, the largest value over (text, row) and the first (text, row) that holds it."""
    b, h, r = values.shape
    best, where = np.full(h, -np.inf), np.full((h, 2), -1.0)
    for head in range(h):
        for t in range(b):
            for i in range(r):
                if values[t, head, i] > best[head]:
                    best[head], where[head] = values[t, head, i], (t, i)
    return best, where


def test_the_tally_keeps_each_roles_and_offsets_first_largest_row_as_a_loop_does():
    g = torch.Generator().manual_seed(3)
    b, h, n = 3, 4, 11
    a = torch.randint(0, 4, (b, h, n, n), generator=g).float()  # few values: many ties
    a = a / a.sum(-1, keepdim=True).clamp_min(1)
    tally = HeadTally([0], h, torch.arange(40, dtype=torch.float64), {f"t{t}": t for t in range(b)})
    tally.batch(torch.randint(0, 40, (b, n), generator=g), [f"t{t}" for t in range(b)])
    visible = torch.ones(b, n, n, dtype=torch.bool)
    pairs = torch.zeros(3, 0, dtype=torch.long)
    tally.take("encoder", 0, a, 0, visible, torch.zeros(b, n), pairs, torch.zeros(0, dtype=torch.long), {}, None)
    tally.flush()
    m = a.numpy()
    i = np.arange(n)
    first = m[..., 0]
    best, where = _example_loop(first)
    k = EXAMPLES.index("first")
    np.testing.assert_array_equal(tally.best[0, k].numpy(), best)
    np.testing.assert_array_equal(tally.where[0, k].numpy(), where)
    previous = np.where(i[None, None] >= 1, m[:, :, i, np.maximum(i - 1, 0)], -np.inf)
    best, where = _example_loop(previous)
    np.testing.assert_array_equal(tally.best[0, EXAMPLES.index("previous")].numpy(), best)
    np.testing.assert_array_equal(tally.where[0, EXAMPLES.index("previous")].numpy(), where)
    top, arg = a.max(-1)
    offset = (arg - torch.arange(n)).numpy()
    bins = np.where(np.abs(offset) <= OFFSETS, offset + OFFSETS, 2 * OFFSETS + 1)
    for bin_ in range(2 * OFFSETS + 2):
        best, where = _example_loop(np.where(bins == bin_, top.numpy(), -np.inf))
        np.testing.assert_array_equal(tally.offset_best[0, bin_].numpy(), best)
        np.testing.assert_array_equal(tally.offset_where[0, bin_].numpy(), where)
    assert np.isfinite(tally.offset_best[0].numpy()).sum() > h  # several bins are filled


def _pronoun_rows(g: torch.Generator, batch: int, rows: int, keys: int) -> list:
    """Random probes' readings of a batch's kept rows: pronouns of 1–3 tokens, texts of a few lengths (some
    the batch's longest), 2–5 candidates of 0–9 tokens each (0: every token a sink), sinks or none."""
    from attnviz.analysis.probe_choices import PronounRows

    readings = []
    for text in range(batch):
        n_keys = int(torch.randint(max(4, keys - 8), keys + 1, (1,), generator=g))
        n_rows = int(torch.randint(1, rows + 1, (1,), generator=g))
        sinks = sorted({0, n_keys - 1}) if text % 4 else []  # every fourth probe: nothing left out
        candidates = []
        for _ in range(int(torch.randint(2, 6, (1,), generator=g))):
            length = int(torch.randint(0, 10, (1,), generator=g))
            start = int(torch.randint(1, max(2, n_keys - length), (1,), generator=g))
            candidates.append(tuple(t for t in range(start, min(n_keys, start + length)) if t not in sinks))
        readings.append(PronounRows(text, n_rows, n_keys, tuple(sinks), tuple(candidates)))
    return readings


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("renormalise", [True, False])
def test_a_batchs_candidate_weights_are_each_probes_own_to_the_last_bit(threads, renormalise):
    """evaluate_probes reads every probe of a batch at once (batch_candidate_weights): the numbers are
    those candidate_weights gives each probe's own rows — equal bit for bit, not within a tolerance —
    and so is each head's pick and best head (HeadChoices) as the probe-by-probe code made them."""
    from attnviz.analysis.coref import candidate_weights
    from attnviz.analysis.probe_choices import HeadChoices, batch_candidate_weights

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(7 + threads)
        for batch, layers, heads, rows, keys in ((5, 2, 3, 3, 9), (64, 6, 12, 2, 40), (9, 3, 4, 3, 130)):
            every = torch.rand(batch, layers, heads, rows, keys + 3, generator=g) ** 4  # peaked, like attention
            every[:, :, :, :, keys:] = 0.0  # past the batch's longest text: what PickedRows leaves
            readings = _pronoun_rows(g, batch, rows, keys)
            for r in readings:  # each text's padded keys and unused rows: 0, as PickedRows leaves them
                every[r.text, :, :, r.rows :] = 0.0
                every[r.text, :, :, :, r.keys :] = 0.0
            got = batch_candidate_weights(every, readings, renormalise)
            assert got.shape == (batch, layers, heads, max(len(r.candidates) for r in readings))
            for j, r in enumerate(readings):
                own = every[r.text, :, :, : r.rows, : r.keys]
                tokens = [[t for t in c if t not in r.exclude] for c in r.candidates]
                want = candidate_weights(own, tokens, list(r.exclude), renormalise)  # [layer, head, candidate]
                c = len(r.candidates)
                assert torch.equal(got[j, :, :, :c], want), (batch, j, (got[j, :, :, :c] - want).abs().max())
                assert torch.isneginf(got[j, :, :, c:]).all()
            held = [layer for layer in range(layers + 1) if layer != 1][:layers]  # a layer not captured: -1 there
            choices = HeadChoices.of(got, held, max(held) + 1)
            for j, (r, ch) in enumerate(zip(readings, choices)):  # the probe-by-probe code this replaced
                picks = torch.full((max(held) + 1, heads), -1, dtype=torch.int16)
                top = torch.full((max(held) + 1, heads), -1.0)
                most, choice = got[j, :, :, : len(r.candidates)].max(-1)
                picks[held], top[held] = choice.to(torch.int16), most
                layer, head = divmod(int(top.flatten().argmax()), heads)
                assert torch.equal(ch.picks, picks) and (ch.layer, ch.head) == (layer, head)
                assert ch.weight == float(top[layer, head]) and ch.pick == int(picks[layer, head])
    finally:
        torch.set_num_threads(before)


def test_each_rows_maximum_read_from_the_weights_bits_is_torchs_max_and_its_first_key_on_a_tie():
    g = torch.Generator().manual_seed(5)
    soft = torch.softmax(torch.randn(3, 4, 9, 13, generator=g) * 4, -1)
    soft[1, :, 6:] = 0  # a padded text's rows: all +0
    ties = torch.randint(0, 3, (3, 4, 9, 13), generator=g).float()  # few values: ties in most rows
    ties = ties / ties.sum(-1, keepdim=True).clamp_min(1)
    tiny = torch.full((2, 5), 1e-40)  # subnormal weights order by their bits too
    tiny[:, 3] = 2e-40
    for a in (soft, ties, tiny, ties.double(), ties.transpose(-1, -2)):  # the last two: torch's own max
        values, keys = row_max(a)
        expected = a.max(-1)
        assert torch.equal(keys, expected.indices) and torch.equal(values, expected.values)


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_the_tally_adds_a_batchs_layers_at_once_as_it_adds_them_one_by_one(family, monkeypatch):
    """HeadTally.take leaves each layer's rows pending and adds a chunk's layers at once, their heads side
    by side; with nothing held back (PENDING 0: each layer added as it comes) every count and example is
    the same, to the bit."""
    from attnviz.analysis import head_tally

    model, tok = attnviz.testing.tiny_model(family), IdsTokenizer()
    texts = _texts(11, seed=4)
    index = {t: k for k, t in enumerate(texts)}
    layers = list(range(model.config.num_hidden_layers))
    g = torch.Generator().manual_seed(2)
    counts = torch.randint(1, 12, (200,), generator=g).double()  # rows with one rarest token and rows with a tie
    tallies = []
    for held in (head_tally.PENDING, 0):
        monkeypatch.setattr(head_tally, "PENDING", held)
        tally = HeadTally(layers, model.config.num_attention_heads, counts, index)
        reducer = BatchReducer(model, tok, moved=False)
        s = None
        for start in range(0, len(texts), 4):
            s, _ = reducer.add(s, texts[start : start + 4], tally=tally)
        tallies.append(tally)
    for name in ("offsets", "rare", "rows", "rare_rows", "log_keys", "best", "where", "offset_best", "offset_where"):
        assert torch.equal(getattr(tallies[0], name), getattr(tallies[1], name)), name
    assert bool(torch.isfinite(tallies[0].best).all()) and bool((tallies[0].offsets.sum(-1) > 0).all())
    assert bool((0 < tallies[0].rare_rows).all()) and bool((tallies[0].rare_rows < tallies[0].rows).all())
