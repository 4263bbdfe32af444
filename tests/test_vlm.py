"""Vision-language models (LLaVA): the language model's attention over text and image tokens and the
vision tower's over the picture, two parts of one capture, each exact against the model's own eager
attention, each image position mapped to its patch of the picture; a batch of two texts and pictures."""

from __future__ import annotations

import pytest
import torch
from skimage.data import chelsea, coffee

import attnviz
from attnviz import figures
from attnviz.testing import tiny_vlm
from attnviz.views.image import patch_row

TEXT = "A photo: <image> the cat sleeps on a mat"


@pytest.fixture(scope="module")
def vlm():
    built = tiny_vlm()  # one build (the tokenizer is the slow part), switched between backends

    def make(backend: str = "sdpa"):
        built[0].set_attn_implementation(backend)
        return built

    return make


def _own_attentions(model, processor, text=TEXT, image=None, tower=False):
    """The model's own eager attention weights of the language model (``tower``: of its vision tower,
    run alone on the same pixels), per layer [head, q, k] (a batch: [batch, head, q, k])."""
    batch = isinstance(text, list)
    encoded = processor(text=text, images=chelsea() if image is None else image, return_tensors="pt", padding=batch)
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            if tower:
                out = model.model.vision_tower(encoded["pixel_values"], output_attentions=True)
            else:
                out = model(**encoded, output_attentions=True)
    finally:
        model.set_attn_implementation(before)
    return encoded, [a if batch else a[0] for a in out.attentions]


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_every_layer_equals_the_models_own_eager_attention(vlm, backend):
    model, processor = vlm(backend)
    cap = attnviz.capture(model, TEXT, chelsea(), processor=processor)
    _, own = _own_attentions(model, processor)
    assert cap.model["backend"] == backend and len(own) == 2 and cap.parts == ("decoder", "vision")
    for layer, weights in enumerate(own):
        assert cap.attention(layer, part="decoder").shape == weights.shape
        assert (cap.attention(layer, part="decoder") - weights).abs().max().item() <= 5e-7
    assert cap.validate().passed


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_the_vision_tower_is_a_part_equal_to_its_own_eager_attention(vlm, backend):
    """The vision tower's attention over [CLS] and the 4×4 patches, every layer (also the last, whose
    output LLaVA's vision_feature_layer=-2 does not read), equals the tower's own eager weights."""
    model, processor = vlm(backend)
    cap = attnviz.capture(model, TEXT, chelsea(), processor=processor)
    _, own = _own_attentions(model, processor, tower=True)
    assert len(own) == 2 and cap.info("vision")["n_layers"] == 2
    tokens, _ = cap.sequences("vision")
    assert tokens.tokens[:3] == ["[CLS]", "(0,0)", "(0,1)"] and len(tokens.tokens) == 17
    tower = cap.image_of("vision")
    assert tower is cap.vision and tower.prefix == ["[CLS]"] and tower.grid == (4, 4) and not tower.suffix
    assert torch.equal(tower.pixels, cap.image.pixels)
    for layer, weights in enumerate(own):
        assert cap.attention(layer, part="vision").shape == weights.shape == (4, 17, 17)
        assert (cap.attention(layer, part="vision") - weights).abs().max().item() <= 5e-7
    # a patch's row over the picture is the tower's own row, cell by cell
    values, off = patch_row(cap, 1, 2, query=(1, 2), part="vision")
    q = tower.token((1, 2))
    assert (values.flatten() - own[1][2, q, 1:]).abs().max() <= 5e-7 and off == pytest.approx(float(own[1][2, q, 0]))
    heat = torch.tensor(figures.image_attention(cap, 1, 2, query=(1, 2), part="vision").data[1].z)
    assert (heat.flatten() - own[1][2, q, 1:]).abs().max() <= 5e-7
    assert len(figures.image_heads(cap, 1, part="vision").data) == 8  # 4 heads: a picture and a heat each
    selected = cap.select("vision")
    assert selected.image is tower and selected.tokens == tokens.tokens and selected.parts == ("vision",)
    assert cap.select("decoder").image is cap.image
    with pytest.raises(attnviz.InputError, match=r"parts decoder, vision; say which with part="):
        cap.attention(0)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_a_batch_of_two_texts_and_two_pictures_is_exact_in_both_parts(vlm, backend):
    model, processor = vlm(backend)
    texts = [TEXT, "<image> a cup"]
    caps = attnviz.capture(model, texts, [chelsea(), coffee()], processor=processor)
    encoded, own = _own_attentions(model, processor, texts, [chelsea(), coffee()])
    _, tower = _own_attentions(model, processor, texts, [chelsea(), coffee()], tower=True)
    assert isinstance(caps, list) and len(caps) == 2
    lengths = encoded["attention_mask"].sum(-1).tolist()
    assert lengths[1] < lengths[0]  # the second text is padded
    for b, cap in enumerate(caps):
        n = lengths[b]
        assert cap.token_ids == encoded["input_ids"][b, :n].tolist() and cap.n_tokens == n
        for layer in range(2):
            assert (cap.attention(layer, part="decoder") - own[layer][b, :, :n, :n]).abs().max() <= 5e-7
            assert (cap.attention(layer, part="vision") - tower[layer][b]).abs().max() <= 5e-7
        assert cap.validate().passed
    assert caps[1].tokens[:2] == ["(0,0)", "(0,1)"] and caps[1].image.prefix == []
    assert not torch.equal(caps[0].image.pixels, caps[1].image.pixels)  # each its own picture


def test_image_positions_are_where_the_processor_put_the_image_tokens(vlm):
    model, processor = vlm()
    cap = attnviz.capture(model, TEXT, image=chelsea(), processor=processor)
    encoded, _ = _own_attentions(model, processor)
    ids = encoded["input_ids"][0].tolist()
    image_id = model.config.image_token_index
    where = [i for i, t in enumerate(ids) if t == image_id]
    grid = cap.image
    assert cap.token_ids == ids
    assert grid.grid == (4, 4) and grid.patch == (8, 8)  # 32×32 in 8×8 patches, [CLS] dropped
    assert where == list(range(grid.n_prefix, grid.n_prefix + grid.n_patches))
    assert grid.n_tokens == len(ids) == cap.n_tokens
    assert grid.labels == cap.tokens
    assert cap.tokens[where[0]] == "(0,0)" and cap.tokens[where[5]] == "(1,1)" and cap.tokens[where[-1]] == "(3,3)"
    assert grid.token((1, 2)) == where[6] and grid.box(where[6]) == (16, 8, 24, 16)
    assert grid.position(0) is None and grid.position(len(ids) - 1) is None  # text: off the picture
    assert "Ġcat" in grid.suffix and grid.prefix[:2] == ["A", "Ġphoto"]
    # each patch is a word of its own; the text's words are the text's
    words = {w.token_start: w for w in cap.words}
    assert words[where[5]].text == "(1,1)" and words[where[5]].token_stop == where[5] + 1
    assert any(w.text == "cat" for w in cap.words)
    # the picture kept is what the model read: its processor's output, un-normalised
    pixels = encoded["pixel_values"][0]
    ip = processor.image_processor
    back = (grid.pixels.permute(2, 0, 1).float() / 255 - torch.tensor(ip.image_mean)[:, None, None]) / torch.tensor(
        ip.image_std
    )[:, None, None]
    assert (back - pixels).abs().max() < 0.02


def test_a_words_row_is_drawn_over_its_patches(vlm):
    model, processor = vlm()
    cap = attnviz.capture(model, TEXT, chelsea(), processor=processor)
    _, own = _own_attentions(model, processor)
    grid = cap.image
    cat = cap.tokens.index("Ġcat")
    start = grid.n_prefix
    for layer, head in [(0, 1), (1, 3)]:
        expected = own[layer][head, cat, start : start + 16].reshape(4, 4)  # the model's own row over the image
        values, off = patch_row(cap, layer, head, query=cat, part="decoder")
        assert (values - expected).abs().max() <= 5e-7
        assert off == pytest.approx(1 - float(expected.sum()), abs=1e-6)
        fig = figures.image_attention(cap, layer, head, query="Ġcat", part="decoder")
        heat = torch.tensor(fig.data[1].z)
        assert (heat - expected).abs().max() <= 5e-7
        # cell (r, c) of the heat covers exactly patch (r, c)'s pixels
        r, c = divmod(int(expected.argmax()), 4)
        trace = fig.data[1]
        x0, y0, x1, y1 = grid.box(grid.token((r, c)))
        assert trace.x0 + c * trace.dx == pytest.approx((x0 + x1 - 1) / 2)
        assert trace.y0 + r * trace.dy == pytest.approx((y0 + y1 - 1) / 2)
        assert "on the text (not drawn)" in fig.layout.title.text and "where 'cat' attends" in fig.layout.title.text
    # beside it, the same row over the text tokens
    row = figures.query_row(cap, 1, 3, cat, part="decoder")
    assert row is not None


def test_bad_input_says_what_to_do(vlm):
    model, processor = vlm()
    with pytest.raises(attnviz.InputError, match=r"has 0 '<image>' tokens; write exactly one where the picture goes"):
        attnviz.capture(model, "the cat sleeps", chelsea(), processor=processor)
    with pytest.raises(attnviz.InputError, match=r"has 2 '<image>' tokens"):
        attnviz.capture(model, "<image> <image> cat", chelsea(), processor=processor)
    with pytest.raises(attnviz.InputError, match=r"give one picture with each text"):
        attnviz.capture(model, TEXT, processor=processor)
    with pytest.raises(attnviz.InputError, match=r"give one picture with each text"):
        attnviz.capture(model, TEXT, [chelsea(), chelsea()], processor=processor)
    with pytest.raises(attnviz.InputError, match=r"a list of texts and a list of as many pictures"):
        attnviz.capture(model, [TEXT, TEXT], chelsea(), processor=processor)
    with pytest.raises(attnviz.ArgumentTypeError, match=r"takes a text \(a str with an image token\)"):
        attnviz.capture(model, 3, chelsea(), processor=processor)
    with pytest.raises(attnviz.InputError, match=r"needs its processor \(text and images together\)"):
        attnviz.capture(model, TEXT, chelsea(), processor=processor.image_processor)
    with pytest.raises(attnviz.InputError, match=r"needs its processor"):
        attnviz.capture(model, TEXT, chelsea())
    with pytest.raises(attnviz.ImageFileError):
        attnviz.capture(model, TEXT, image="no/such/file.png", processor=processor)
    for error in (attnviz.InputError, attnviz.ArgumentTypeError, attnviz.ImageFileError):
        assert issubclass(error, attnviz.AttnvizError)


def test_a_vlm_capture_saves_and_loads_with_its_picture(vlm, tmp_path):
    model, processor = vlm()
    cap = attnviz.capture(model, TEXT, chelsea(), processor=processor)
    cap.save(tmp_path / "vlm.safetensors")
    back = attnviz.load(tmp_path / "vlm.safetensors")
    assert back.image.suffix == cap.image.suffix and back.image.prefix == cap.image.prefix
    assert back.image.labels == back.tokens
    assert torch.equal(back.image.pixels, cap.image.pixels)
    assert back.vision.prefix == ["[CLS]"] and back.sequences("vision")[0].tokens == cap.sequences("vision")[0].tokens
    assert torch.equal(back.attention(1, part="vision"), cap.attention(1, part="vision"))


def _tiny_smolvlm():
    import transformers as tf

    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    config = tf.SmolVLMConfig(
        text_config=dict(model_type="llama", **small, num_key_value_heads=2, vocab_size=128),
        vision_config=dict(**small, image_size=32, patch_size=8),
        scale_factor=2,
    )
    return tf.SmolVLMForConditionalGeneration(config).eval()


def test_smolvlm_and_qwen2_vl_with_a_picture_are_refused_with_why():
    """A VLM whose image tokens attnviz does not map (SmolVLM: its processor untested here; Qwen2-VL:
    2×2 merge blocks, one call per picture) is refused before any forward, saying why."""
    model = _tiny_smolvlm()
    with pytest.raises(attnviz.UnsupportedModelError, match=r"SmolVLM: its processor needs torchvision"):
        attnviz.capture(model, "<image> a cat", chelsea(), processor=object())
    with pytest.raises(attnviz.UnsupportedModelError, match=r"untested .* It captures LLaVA and Idefics3"):
        attnviz.capture(model, "<image> a cat", image=chelsea())
    from attnviz.workflows.capture.vlm import vlm_refusal

    qwen = type("Config", (), {"model_type": "qwen2_vl"})()
    assert "spatial_merge_size × spatial_merge_size blocks" in (vlm_refusal(qwen) or "")
    llava = type("Config", (), {"model_type": "llava"})()
    assert vlm_refusal(model.config.text_config) is None and vlm_refusal(llava) is None
