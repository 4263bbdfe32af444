"""Attention in tiles of queries and keys, each row's log-sum-exp kept, and any tile of weights from it.

- :func:`attnviz.attention.online_attention` against torch's own SDPA and an explicit logsumexp;
- full validation (now through it) against the query-chunked path it replaced, head by head, on the
  families whose quirks it must honour (causal, bidirectional, GQA, sliding window, T5's relative
  bias, gpt-oss's sinks, soft-capping, a padded batch);
- ``cap.attention(l, h, rows=, cols=)`` against the whole map's tile on every family of the support table;
- the log-sum-exp through a capture file.
"""

from dataclasses import replace

import pytest
import torch

import attnviz
from attnviz.attention import attention_output, attention_tile, online_attention, scaled_dot_product
from attnviz.data.validate import LayerErrors
from attnviz.errors import ArgumentTypeError, OutOfRangeError
from attnviz.families import FAMILIES
from attnviz.workflows.capture.models import IdsTokenizer

#: every tiny family the support table claims (tests/test_families.py's SUPPORTED, one backend each)
CLAIMED = sorted({f.tiny for f in FAMILIES if f.how != "refused" and f.tiny})


def text(n: int, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    return " ".join(str(i) for i in torch.randint(3, 120, (n,), generator=g).tolist())


def capture(family: str, n: int = 13, **overrides):
    model = attnviz.testing.tiny_model(family, **overrides)
    target = text(9, seed=2) if model.config.is_encoder_decoder else None
    return attnviz.capture(model, text(n, seed=1), IdsTokenizer(), target=target)


# ------------------------------------------------------------------ the function itself
def explicit(q, k, v, *, scale, causal=False, window=None, mask=None, bias=None, sinks=None, softcap=None):
    """Scores written out whole, the softmax by torch.logsumexp: (out, lse)."""
    groups = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    s = q @ k.transpose(1, 2) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if bias is not None:
        s = s + bias
    n_q, n_k = s.shape[-2:]
    i = torch.arange(n_q)[:, None] + (n_k - n_q)
    j = torch.arange(n_k)[None, :]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= i - j < window
    if mask is not None:
        allowed = allowed & mask
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks[:, None, None].expand(-1, n_q, 1)], -1)
    lse = torch.logsumexp(s, -1)
    w = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    w = w[..., :-1] if sinks is not None else w
    return w @ v, lse, w


CASES = {
    "causal": dict(causal=True),
    "bidirectional": dict(causal=False),
    "sliding window": dict(causal=True, window=5),
    "bias, sinks, soft-cap": dict(causal=True, bias=True, sinks=True, softcap=2.0),
    "mask with empty rows": dict(causal=False, mask=True),
}


@pytest.mark.parametrize("case", CASES)
def test_online_attention_equals_torch_sdpa_and_an_explicit_logsumexp(case):
    """Small tiles (7 keys, a few rows) so that the running max and sum are rescaled many times and
    causal / window tiles are skipped; GQA (4 heads over 2); 37 queries over 41 keys (queries aligned
    with the last keys). Torch's SDPA is the reference where it takes the case; the written-out
    logsumexp for the log-sum-exp, the sinks and the soft-cap."""
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(4, 37, 8, generator=g), torch.randn(2, 41, 8, generator=g), torch.randn(2, 41, 5, generator=g)
    kw = dict(CASES[case])
    if kw.pop("bias", False):
        kw["bias"] = torch.randn(4, 37, 41, generator=g)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(4, generator=g)
    if kw.pop("mask", False):
        kw["mask"] = torch.rand(1, 37, 41, generator=g) > 0.4
        kw["mask"][0, 5] = False  # a row with every key masked: output 0, lse -inf, weights 0
    out, lse = online_attention(q, k, v, scale=0.3, block_keys=7, budget=4 * 7 * 3, **kw)
    ref_out, ref_lse, ref_w = explicit(
        q, k, v, scale=0.3, **{**kw, "mask": None if "mask" not in kw else kw["mask"][0]}
    )
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-6)
    if case in ("causal", "bidirectional"):
        n_q, n_k = 37, 41
        allowed = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q)
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q,
            k.repeat_interleave(2, 0),
            v.repeat_interleave(2, 0),
            attn_mask=allowed if kw["causal"] else None,
            scale=0.3,
        )
        torch.testing.assert_close(out, sdpa, atol=1e-6, rtol=0)
    if case == "mask with empty rows":
        assert bool((out[:, 5] == 0).all()) and bool(torch.isneginf(lse[:, 5]).all())
    rows, cols = torch.tensor([36, 0, 5, 17]), torch.tensor([40, 1, 2, 30])
    tile = attention_tile(
        q, k, lse[:, rows], rows=rows, cols=cols, scale=0.3, **{n: t for n, t in kw.items() if n != "sinks"}
    )
    torch.testing.assert_close(tile, ref_w[:, rows][:, :, cols], atol=1e-6, rtol=0)


# ------------------------------------------------------------------ full validation
def chunked_errors(rec):
    """What full validation computed before it went by tiles of keys: A·V by query chunks."""
    consumer = LayerErrors(rec)
    for rows, keys, out, weights in attention_output(rec.q, rec.k, rec.v, **rec.sdpa_arguments()):
        consumer.add(rows, keys, weights, out)
    return consumer.errors()


def softcapped():
    """No claimed tiny family soft-caps (Gemma-2 is not claimed): a llama capture whose records say
    soft-cap 1.5, their outputs the reference SDPA's with it (the sample check's reference)."""
    cap = capture("llama")
    for key, rec in cap.records.items():
        out, _ = scaled_dot_product(rec.q[None], rec.k[None], rec.v[None], scale=rec.scaling, causal=True, softcap=1.5)
        cap.records[key] = replace(rec, softcap=1.5, out=out[0])
    return cap


VALIDATED = {
    "gpt2 (causal)": lambda: [capture("gpt2")],
    "bert (bidirectional)": lambda: [capture("bert")],
    "llama (GQA)": lambda: [capture("llama")],
    "mistral (GQA, sliding window of 4)": lambda: [capture("mistral", n=17)],
    "t5 (relative bias; encoder, decoder, cross)": lambda: [capture("t5")],
    "gpt_oss (sinks, sliding window)": lambda: [capture("gpt_oss", n=17)],
    "soft-cap": lambda: [softcapped()],
    "padded batch (gpt2, bart)": lambda: [
        *attnviz.capture(attnviz.testing.tiny_model("gpt2"), [text(13, 1), text(6, 2)], IdsTokenizer()),
        *attnviz.capture(
            attnviz.testing.tiny_model("bart"),
            [text(11, 3), text(5, 4)],
            IdsTokenizer(),
            target=[text(7, 5), text(3, 6)],
        ),
    ],
}


@pytest.mark.parametrize("what", VALIDATED)
def test_full_validation_by_tiles_of_keys_reports_the_query_chunked_errors(what):
    """Per part, layer and head: the same max |model| bit for bit, the same error within float32
    noise (1e-6 of max |model|), the same verdict; and every layer's log-sum-exp kept. Then one head's
    output is pushed off by 1e-3: the report finds it there and only there (the comparison is live)."""
    for cap in VALIDATED[what]():
        report = cap.validate()
        assert report.passed, str(report)
        rows = {(r["part"], r["layer"], r["head"]): r for r in report.rows if r["quantity"] == "output"}
        assert len(rows) == sum(rec.q.shape[0] for rec in cap.records.values())
        for (part, layer), rec in cap.records.items():
            errors, scales = chunked_errors(rec)["output"]
            for head, (error, scale) in enumerate(zip(errors.tolist(), scales.tolist())):
                row = rows[(part, layer, head)]
                assert row["rel_error"] * scale == pytest.approx(row["max_abs_error"]) or scale == 0
                assert abs(row["max_abs_error"] - error) <= 1e-6 * scale, (part, layer, head, row, error)
                assert row["passed"] == (error <= row["tolerance"])
            assert rec.lse is not None and rec.lse.shape == rec.q.shape[:2] and not bool(rec.lse.isnan().any())
        (part, layer), rec = next(iter(cap.records.items()))
        out = rec.out.clone()
        out[1, -1] += 1e-3
        cap.records[(part, layer)] = replace(rec, out=out)
        bad = [r for r in cap.validate().rows if r["quantity"] == "output" and not r["passed"]]
        assert [(r["part"], r["layer"], r["head"]) for r in bad] == [(part, layer, 1)]
        assert bad[0]["max_abs_error"] == pytest.approx(1e-3, rel=1e-3)


# ------------------------------------------------------------------ tiles of weights
@pytest.mark.parametrize("family", CLAIMED)
def test_a_tile_of_weights_from_the_log_sum_exp_is_the_whole_maps_tile(family):
    """Every part and layer of every claimed family: rows in any order (repeated), columns as a range
    with a step, a slice, a tensor; every head and one head; the log-sum-exp computed for the rows asked
    (kept: those rows' entries are no longer NaN) and then read back — within 1e-6 of the whole map."""
    cap = capture(family)
    for part in cap.parts:
        for layer in cap.layer_indices(part):
            full = cap.attention(layer, part=part)
            heads, n_q, n_k = full.shape
            rows, cols = [n_q - 1, 0, 3, 3], range(1, n_k, 2)
            tile = cap.attention(layer, part=part, rows=rows, cols=cols)
            torch.testing.assert_close(tile, full[:, rows][:, :, list(cols)], atol=1e-6, rtol=0)
            lse = cap.layer(layer, part).lse
            assert not bool(lse[:, rows].isnan().any()) and bool(lse[:, 1:3].isnan().all())
            for head in (0, heads - 1):
                one = cap.attention(layer, head, part=part, rows=slice(2, None), cols=torch.tensor([n_k - 1, 0]))
                torch.testing.assert_close(one, full[head, 2:][:, [n_k - 1, 0]], atol=1e-6, rtol=0)
            whole = cap.attention(layer, part=part, rows=range(n_q), cols=range(n_k))  # lse complete now
            torch.testing.assert_close(whole, full, atol=1e-6, rtol=0)
            torch.testing.assert_close(cap.log_sum_exp(layer, part=part), cap.layer(layer, part).fill_lse())


def test_tiles_under_other_settings_and_of_words_equal_the_whole_maps():
    """causal / scale / temperature other than the model's: the rows' log-sum-exp is computed for them
    (and not kept); words: the word map's tile."""
    cap = capture("gpt2", n=15)
    for kw in (dict(causal=False), dict(scale=False), dict(temperature=2.5), dict(causal=True, scale=0.5)):
        full = cap.attention(1, 2, **kw)
        tile = cap.attention(1, 2, rows=[14, 3], cols=range(2, 12), **kw)
        torch.testing.assert_close(tile, full[[14, 3]][:, 2:12], atol=1e-6, rtol=0)
    assert cap.layer(1).lse is None
    words = cap.attention(0, words=True)
    torch.testing.assert_close(cap.attention(0, words=True, rows=[1], cols=slice(0, 3)), words[:, [1], :3])


def test_rows_every_key_of_which_an_additive_mask_hides_come_out_as_the_whole_map_gives_them():
    """An additive mask of float32's min over a whole row: its logits all equal, its lse indistinguishable
    from them in float32 — the tile still equals the whole map (uniform over the keys the causal
    structure leaves)."""
    cap = capture("llama", n=9)
    rec = cap.layer(0)
    mask = torch.zeros(9, 9)
    mask[2] = torch.finfo(torch.float32).min
    mask[5, :3] = torch.finfo(torch.float32).min
    cap.records[("decoder", 0)] = replace(rec, mask=mask)
    full = cap.attention(0)
    torch.testing.assert_close(full[:, 2, :3], torch.full((4, 3), 1 / 3))
    torch.testing.assert_close(cap.attention(0, rows=range(9), cols=range(9)), full, atol=1e-6, rtol=0)


def test_rows_and_cols_outside_the_map_are_refused_with_the_valid_range():
    cap = capture("bart")
    with pytest.raises(
        OutOfRangeError, match=r"rows must lie in 0\.\.8 \(or -9\.\.-1 from the end; 9 query rows\), got 9"
    ):
        cap.attention(0, 1, part="cross", rows=[0, 9])
    with pytest.raises(
        OutOfRangeError, match=r"cols must lie in 0\.\.12 \(or -13\.\.-1 from the end; 13 key columns\), got 13"
    ):
        cap.attention(0, part="cross", cols=range(10, 14))
    with pytest.raises(
        OutOfRangeError, match=r"rows must lie in 0\.\.12 \(or -13\.\.-1 from the end; 13 query rows\), got -14"
    ):
        cap.attention(0, part="encoder", rows=torch.tensor([-14]))
    with pytest.raises(ArgumentTypeError, match="rows must be a range, a slice, a sequence of ints or a 1-d tensor"):
        cap.attention(0, part="encoder", rows="all")


def test_the_log_sum_exp_is_saved_and_loaded_and_files_without_it_still_load(tmp_path):
    cap = capture("gpt_oss")
    attnviz.load(cap.save(tmp_path / "before.safetensors"))  # no lse yet: loads, and computes it on demand
    before = attnviz.load(tmp_path / "before.safetensors")
    assert all(rec.lse is None for rec in before.records.values())
    cap.validate()
    again = attnviz.load(cap.save(tmp_path / "after.safetensors"))
    for key, rec in cap.records.items():
        torch.testing.assert_close(again.records[key].lse, rec.lse, atol=0, rtol=0)
    torch.testing.assert_close(again.attention(1, 3, rows=[4], cols=range(13)), before.attention(1, 3)[[4]])


def test_rows_and_cols_read_as_python_reads_indices():
    """A slice clamps and may step backwards, an index may count from the end — a range, a list, a tensor
    and a slice that name the same rows give the same tile."""
    cap = capture("gpt2")
    n = cap.layer(0).n_queries
    full = cap.attention(0, 1)
    same = [slice(0, n + 5), range(n), list(range(n)), torch.arange(n), slice(None)]
    for rows in same:
        torch.testing.assert_close(cap.attention(0, 1, rows=rows), full, atol=1e-6, rtol=0)
    for rows in ([-1], range(-1, -4, -1), slice(None, None, -2), torch.tensor([-2, 0])):
        picked = list(range(n))[rows] if isinstance(rows, slice) else [int(i) % n for i in rows]
        expected = full[picked]
        torch.testing.assert_close(cap.attention(0, 1, rows=rows), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(cap.attention(0, 1, cols=[-1, 0]), full[:, [n - 1, 0]], atol=1e-6, rtol=0)
