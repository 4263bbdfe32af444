"""Every family in the support table, captured and compared with its own eager attention.

The support table (docs/guides/capture.md) is generated from ``attnviz.families.FAMILIES``; these tests are what makes each
row true: a family marked as supported is built (tiny, random weights), captured on each backend
the table names, and every part and layer is compared with the eager model's own
``output_attentions`` (``encoder_attentions``, ``decoder_attentions``, ``cross_attentions``).
"""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import BLOOM_SLOW

import attnviz
from attnviz.engine.specs import support_table
from attnviz.families import FAMILIES
from attnviz.families.falcon import falcon_passes_alibi
from attnviz.workflows.capture.models import IdsTokenizer

SUPPORTED = [(f.tiny, backend) for f in FAMILIES if f.how != "refused" for backend in f.backends]
#: Falcon's attention takes ALiBi as an argument (transformers < 5.25) rather than inside its mask only
OLD_FALCON = falcon_passes_alibi()
#: what stays refused: (tiny family, config overrides, the reason's words)
REFUSED = {
    "deberta talking heads": ("deberta", {"talking_head": True}, r"DeBERTa \(v1\) with talking_head=True mixes"),
    "bloom slow but exact": ("bloom", BLOOM_SLOW, r"Bloom with pretraining_tp > 1 and slow_but_exact=True bypasses"),
    **(
        {"falcon new + alibi": ("falcon_alibi", {"new_decoder_architecture": True}, "with transformers < 5.25")}
        if OLD_FALCON
        else {}
    ),
    "longt5 transient-global": (
        "longt5",
        {"encoder_attention_type": "transient-global"},
        "transient-global attention: its encoder's keys include one aggregate per block",
    ),
}
ENCODERS = {
    "bert",
    "roberta",
    "albert",
    "deberta_v2",
    "deberta",
    "mpnet",
}  # one-stack families whose attention is bidirectional
#: families held to the issue's bound (float32, every layer, padded): the others keep the table's 2e-6
TIGHT = {
    "deberta": 5e-7,
    "deberta_v2": 5e-7,
    "albert": 5e-7,
    "mpnet": 5e-7,
    "falcon": 5e-7,
    "falcon_new": 5e-7,
    "longt5": 5e-7,
}


def texts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(str(i) for i in torch.randint(3, 120, (n,), generator=g).tolist()) for n in lengths]


def padded(rows):
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
        mask[b, : len(row)] = 1
    return ids, mask


def unblocked(blocked, block):  # [batch, blocks, head, L, 3L] -> [batch, head, n, n], n = blocks·L
    """LongT5's local attention weights laid out over the whole text, written out slot by slot: query
    i (block i // L, row i % L) reads slot s of the blocks before, at and after its own, key (i // L - 1)·L + s."""
    batch, blocks, heads = blocked.shape[:3]
    n = blocks * block
    dense = torch.zeros(batch, heads, n, n)
    for i in range(n):
        for s in range(3 * block):
            j = (i // block - 1) * block + s
            if 0 <= j < n:
                dense[:, :, i, j] = blocked[:, i // block, :, i % block, s]
    return dense


def reference(family, caps, **overrides) -> dict[str, tuple]:
    """The eager model's own attentions on the captures' ids, padded and masked."""
    eager = attnviz.testing.tiny_model(family, attn_implementation="eager", **overrides)
    ids, mask = padded([c.token_ids for c in caps])
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if eager.config.is_encoder_decoder:
        dec, dec_mask = padded([c.target.token_ids for c in caps])
        kwargs.update(decoder_input_ids=dec, decoder_attention_mask=dec_mask)
    with torch.no_grad():
        out = eager(**kwargs, output_attentions=True)
    if eager.config.is_encoder_decoder:
        encoder = out.encoder_attentions
        if family == "longt5":  # its local attention's weights come in blocks
            encoder = tuple(unblocked(a, eager.config.local_radius + 1) for a in encoder)
        return {"encoder": encoder, "decoder": out.decoder_attentions, "cross": out.cross_attentions}
    return {"encoder" if family in ENCODERS else "decoder": out.attentions}


@pytest.mark.parametrize("family,backend", SUPPORTED)
def test_every_part_matches_its_own_eager_attention_in_a_padded_batch(family, backend):
    """One batched, padded forward; each capture holds only its text (parts, layers, lengths), owns
    its rows, and equals the eager model's weights on the real tokens — a test that fails when the
    padding, the part labels or the target shift go wrong."""
    model = attnviz.testing.tiny_model(family, attn_implementation=backend)
    tok = IdsTokenizer()
    sources = texts([11, 8], seed=1)
    targets = texts([7, 5], seed=2) if model.config.is_encoder_decoder else None
    caps = attnviz.capture(model, sources, tok, target=targets)
    expected = reference(family, caps)
    for b, cap in enumerate(caps):
        assert cap.parts == tuple(expected), cap.parts
        n_src = cap.n_tokens
        n_tgt = len(cap.target_tokens) if cap.target is not None else n_src
        assert n_src == [11, 8][b] and n_tgt == ([7, 5][b] if targets else n_src)
        for part, refs in expected.items():
            assert cap.layer_indices(part) == list(range(len(refs)))
            n_q = n_tgt if part in ("decoder", "cross") else n_src
            n_k = n_tgt if part == "decoder" else n_src
            for layer, ref in enumerate(refs):
                ours = cap.attention(layer, part=part)
                assert ours.shape == (ref.shape[1], n_q, n_k)
                torch.testing.assert_close(ours, ref[b, :, :n_q, :n_k], atol=TIGHT.get(family, 2e-6), rtol=0)
        report = cap.validate()
        assert report.passed and report.parts == list(expected), str(report)
    alone = attnviz.capture(model, sources[1], tok, target=targets[1] if targets else None)
    alone.validate()  # as each of the batch was: full validation keeps each row's log-sum-exp
    assert caps[1].nbytes == alone.nbytes  # a cut of the batch keeps no part of the batch alive
    for part in alone.parts:
        torch.testing.assert_close(caps[1].attention(0, part=part), alone.attention(0, part=part), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "family", ["bloom", "mpt", "falcon_alibi", "t5", "umt5", "gpt_oss", "deberta_v2", "mpnet", "longt5"]
)
def test_position_biases_and_sinks_are_needed_and_checked(family):
    """Leave the bias (or the sinks) out of the recomputation and validation fails: the term matters,
    and a capture that lost it could not pass its own check."""
    cap = attnviz.capture(attnviz.testing.tiny_model(family, attn_implementation="eager"), **_src_only(family))
    part = "encoder" if "encoder" in cap.parts else "decoder"
    rec = cap.layer(0, part)
    assert rec.bias is not None or rec.relative_bias is not None or rec.sinks is not None
    stripped = replace(
        cap, records={key: replace(r, bias=None, relative_bias=None, sinks=None) for key, r in cap.records.items()}
    )
    assert cap.validate().passed and not stripped.validate().passed


def _src_only(family):
    ids = torch.randint(3, 120, (1, 12), generator=torch.Generator().manual_seed(2))
    kwargs = {"input_ids": ids}
    if family in {"t5", "umt5", "longt5"}:
        kwargs["decoder_input_ids"] = ids[:, :6]
    return kwargs


def test_t5_relative_bias_is_stored_once_per_stack_as_one_row_per_head():
    model = attnviz.testing.tiny_model("t5", attn_implementation="sdpa")
    cap = attnviz.capture(model, input_ids=torch.randint(3, 120, (1, 40)), decoder_input_ids=torch.arange(3, 23)[None])
    enc = [cap.layer(layer, "encoder") for layer in range(2)]
    assert enc[0].relative_bias.shape == (4, 79) and enc[0].bias is None  # [head, 2n - 1], not [head, n, n]
    assert enc[1].relative_bias is enc[0].relative_bias  # T5 passes layer 0's bias to every layer
    assert cap.layer(0, "cross").relative_bias is None and cap.layer(0, "cross").bias is None  # zeros dropped
    dense = enc[0].bias_part()
    i, j = 5, 17
    assert dense[2, i, j] == enc[0].relative_bias[2, j - i + 39]


def test_gpt_oss_sinks_take_a_share_of_each_row():
    model = attnviz.testing.tiny_model("gpt_oss", attn_implementation="eager")
    cap = attnviz.capture(model, input_ids=torch.randint(3, 120, (1, 9)))
    share = cap.sink_share(0, 2)
    row_sums = cap.attention(0, 2).sum(-1)
    assert share.shape == (9,) and bool((share > 0).all())
    torch.testing.assert_close(share + row_sums, torch.ones(9))
    assert cap.sink_share(0, 2, part="decoder") is not None
    assert (
        attnviz.capture(attnviz.testing.tiny_model("llama"), input_ids=torch.arange(3, 9)[None]).sink_share(0) is None
    )


DEBERTA_LAYOUTS = {
    "v3": {},  # c2p + p2c, log buckets, q/k shared with the relative embeddings, LayerNorm on them
    "v2": dict(share_att_key=False, position_buckets=-1, norm_rel_ebd="none", position_biased_input=True),
    "c2p only": dict(pos_att_type=["c2p"]),
    "no relative terms": dict(relative_attention=False, pos_att_type=None, position_biased_input=True),
}


@pytest.mark.parametrize("layout", DEBERTA_LAYOUTS)
def test_deberta_layouts_match_their_own_eager_attention_in_a_padded_batch(layout):
    """DeBERTa's disentangled scores — Q·Kᵀ/√(d·f) plus the c2p and p2c terms, recorded as a bias —
    equal the model's own weights at every layer within 5e-7, in a padded batch long enough that the
    relative distances reach past the buckets (40 tokens, 8 buckets) and get clamped."""
    overrides = DEBERTA_LAYOUTS[layout]
    model = attnviz.testing.tiny_model("deberta_v2", **overrides)
    caps = attnviz.capture(model, texts([40, 23], seed=3), IdsTokenizer())
    (refs,) = reference("deberta_v2", caps, **overrides).values()
    f = 1 + len(model.config.pos_att_type or []) if model.config.relative_attention else 1
    for b, cap in enumerate(caps):
        n = cap.n_tokens
        for layer, ref in enumerate(refs):
            rec = cap.layer(layer)
            assert rec.scaling == pytest.approx((8 * f) ** -0.5, rel=1e-12)  # its own 1/√(d·scale_factor)
            assert (rec.bias is not None) == (layout != "no relative terms")
            torch.testing.assert_close(cap.attention(layer), ref[b, :, :n, :n], atol=5e-7, rtol=0)
        assert cap.validate().passed


def test_deberta_v1_with_its_q_and_v_biases_matches_its_own_eager_attention():
    """DeBERTa (v1): the fused in_proj split per head, q_bias and v_bias added after it (random here:
    they start at zero), Q divided before Q·Kᵀ and the relative terms on that Q — every layer within
    5e-7 of the model's own weights in a padded batch, and A·V proved against its own output."""
    model = attnviz.testing.tiny_model("deberta")
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for layer in model.encoder.layer:
            for bias in (layer.attention.self.q_bias, layer.attention.self.v_bias):
                bias.copy_(torch.randn(bias.shape, generator=g))
    caps = attnviz.capture(model, texts([40, 23], seed=3), IdsTokenizer())
    ids, mask = padded([c.token_ids for c in caps])
    with torch.no_grad():
        refs = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    for b, cap in enumerate(caps):
        n = cap.n_tokens
        for layer, ref in enumerate(refs):
            assert cap.layer(layer).bias is not None and cap.layer(layer).scaling == pytest.approx(24**-0.5)
            torch.testing.assert_close(cap.attention(layer), ref[b, :, :n, :n], atol=5e-7, rtol=0)
        assert cap.validate().passed, str(cap.validate())


def test_albert_keys_each_call_of_its_shared_module_by_its_index_in_the_forward():
    """ALBERT's groups of shared layers (4 layers, 2 groups of 2 modules: 8 attention calls from 4
    modules): each call is a layer, in the order the model ran them, equal to its own eager
    attention — and the output projection, shared too, is proved per layer."""
    shape = dict(num_hidden_layers=4, num_hidden_groups=2, inner_group_num=2)
    for backend in ("eager", "sdpa"):
        model = attnviz.testing.tiny_model("albert", attn_implementation=backend, **shape)
        caps = attnviz.capture(model, texts([11, 8], seed=1), IdsTokenizer())
        (refs,) = reference("albert", caps, **shape).values()
        assert len(refs) == 8 and caps[0].layer_indices("encoder") == list(range(8))
        # layers 0-3 run group 0 (its two modules in turn), layers 4-7 group 1, as AlbertTransformer does
        names = [caps[0].layer(layer).name.removeprefix("encoder.albert_layer_groups.") for layer in range(8)]
        group = ["0.albert_layers.0.attention", "0.albert_layers.1.attention"] * 2
        assert names == group + [g.replace("0.", "1.", 1) for g in group]
        for b, cap in enumerate(caps):
            n = cap.n_tokens
            for layer, ref in enumerate(refs):
                torch.testing.assert_close(cap.attention(layer), ref[b, :, :n, :n], atol=5e-7, rtol=0)
                check = cap.layer(layer).projection_check
                assert check is not None and check[2] == n  # every row of this layer's own projection call
            assert cap.validate().passed
    ids = torch.tensor([caps[1].token_ids])
    with torch.no_grad(), attnviz.tap(model) as rec:  # two forwards in one tap: the count runs on, per forward
        model(ids)
        model(ids)
    assert [c.layer for c in rec.calls] == list(range(8)) * 2
    assert [c.step for c in rec.calls] == [0] * 8 + [1] * 8


def test_longt5_local_blocks_drawn_dense_keep_each_token_to_its_radius():
    """LongT5's encoder: each token sees the keys at most local_radius away (blocks of radius + 1,
    drawn over the whole text), with the relative bias of its blocks — and its transient-global
    variant, whose keys include per-block aggregates, is refused with why."""
    model = attnviz.testing.tiny_model("longt5")
    cap = attnviz.capture(model, texts([13], seed=4)[0], IdsTokenizer(), target=texts([4], seed=5)[0])
    radius = model.config.local_radius
    i, j = torch.arange(13)[:, None], torch.arange(13)[None, :]
    for layer in range(2):
        weights = cap.attention(layer, part="encoder")
        assert bool((weights[:, (i - j).abs() > radius] == 0).all())
        assert bool((weights[:, (i - j).abs() <= radius] > 0).all())
        assert cap.layer(layer, "encoder").bias is not None or cap.layer(layer, "encoder").relative_bias is not None
    glob = attnviz.testing.tiny_model("longt5", encoder_attention_type="transient-global")
    with pytest.raises(attnviz.UnsupportedModelError, match="transient-global attention: its encoder's keys"):
        attnviz.capture(glob, input_ids=torch.arange(3, 9)[None], decoder_input_ids=torch.arange(3, 6)[None])


def test_a_module_that_runs_twice_in_a_family_without_shared_layers_is_refused():
    """Only the families of ``SHARED_LAYERS`` number a module's calls by their order: a BERT whose one
    layer runs twice would otherwise hold two layers under one name — refused, with why."""
    model = attnviz.testing.tiny_model("bert")
    model.encoder.layer = torch.nn.ModuleList([model.encoder.layer[0]] * 2)
    with pytest.raises(attnviz.UnsupportedModelError, match="ran its attention twice encoder layer 0 in one forward"):
        attnviz.capture(model, input_ids=torch.arange(3, 9)[None])


@pytest.mark.parametrize("what", REFUSED)
def test_families_attnviz_cannot_reproduce_are_refused_before_running(what):
    family, overrides, needle = REFUSED[what]
    model = attnviz.testing.tiny_model(family, attn_implementation="eager", **overrides)
    kwargs = {"input_ids": torch.arange(3, 9)[None]}
    if model.config.is_encoder_decoder:
        kwargs["decoder_input_ids"] = torch.arange(3, 6)[None]
    with pytest.raises(attnviz.UnsupportedModelError, match=needle):
        attnviz.capture(model, **kwargs)


def test_the_docs_support_table_is_the_one_the_tests_check():
    page = (Path(__file__).parent.parent / "docs" / "guides" / "capture.md").read_text()
    assert support_table() in page
    tested = {f.tiny for f in FAMILIES if f.how != "refused"}
    assert tested == {family for family, _ in SUPPORTED}
    assert all(f.tiny in attnviz.testing.tiny_families() for f in FAMILIES if f.tiny)


def test_falcon_on_sdpa_shows_its_own_kernels_numbers():
    """Before transformers 5.25 Falcon's sdpa path adds ALiBi once (inside the mask) where its eager
    path adds it twice; from 5.25 both add it once, inside the mask, and attnviz records it as the
    bias. attnviz reproduces each backend's own computation, checked against that kernel's output."""
    ids = torch.randint(3, 120, (1, 10), generator=torch.Generator().manual_seed(5))
    sdpa = attnviz.capture(attnviz.testing.tiny_model("falcon_alibi", attn_implementation="sdpa"), input_ids=ids)
    eager = attnviz.capture(attnviz.testing.tiny_model("falcon_alibi", attn_implementation="eager"), input_ids=ids)
    assert sdpa.validate().passed and eager.validate().passed
    assert eager.layer(0).bias is not None
    gap = (sdpa.attention(0) - eager.attention(0)).abs().max()
    if OLD_FALCON:
        assert sdpa.layer(0).mask is not None and sdpa.layer(0).bias is None  # ALiBi folded into the mask
        assert gap > 1e-3  # the two paths differ in transformers
    else:
        mask = sdpa.layer(0).mask  # ALiBi moved to the bias: the mask (if kept) says only who may attend
        assert sdpa.layer(0).bias is not None and (mask is None or mask.dtype == torch.bool)
        assert gap < 1e-5


NEW_ALIBI = {"new_decoder_architecture": True, "num_kv_heads": 2, "parallel_attn": True}


@pytest.mark.skipif(OLD_FALCON, reason="refused before transformers 5.25 (test_families_attnviz_cannot_reproduce…)")
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_falcon_new_decoder_architecture_with_alibi_from_transformers_5_25(backend):
    """From 5.25 Falcon's ALiBi reaches every layout inside the mask: the new decoder architecture
    (q/k/v fused per key/value group) with ALiBi matches the model's own eager weights, padded."""
    model = attnviz.testing.tiny_model("falcon_alibi", attn_implementation=backend, **NEW_ALIBI)
    reference = attnviz.testing.tiny_model("falcon_alibi", attn_implementation="eager", **NEW_ALIBI)
    reference.load_state_dict(model.state_dict())
    caps = attnviz.capture(model, texts([11, 8], seed=3), IdsTokenizer())
    ids, mask = padded([c.token_ids for c in caps])
    with torch.no_grad():
        own = reference(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    for b, cap in enumerate(caps):
        n = cap.n_tokens
        assert cap.validate(rows=None).passed and cap.info("decoder")["n_kv_heads"] == 2
        for layer in range(2):
            torch.testing.assert_close(cap.attention(layer), own[layer][b, :, :n, :n], atol=2e-6, rtol=0)
