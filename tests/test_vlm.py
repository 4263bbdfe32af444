"""Vision-language models (LLaVA): the language model's attention over text and image tokens, exact
against its own eager attention, each image position mapped to its patch of the picture."""

from __future__ import annotations

import pytest
import torch
from skimage.data import chelsea

import attnviz
from attnviz import figures
from attnviz.views.image import patch_row
from attnviz.workflows.vlm import tiny_vlm

TEXT = "A photo: <image> the cat sleeps on a mat"


@pytest.fixture(scope="module")
def vlm():
    cache = {}

    def make(backend: str = "sdpa"):
        if backend not in cache:
            cache[backend] = tiny_vlm(attn_implementation=backend)
        return cache[backend]

    return make


def _own_attentions(model, processor, text=TEXT, image=None):
    """The model's own eager attention weights of the language model, per layer [head, q, k]."""
    encoded = processor(text=text, images=chelsea() if image is None else image, return_tensors="pt")
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(**encoded, output_attentions=True)
    finally:
        model.set_attn_implementation(before)
    return encoded, [a[0] for a in out.attentions]


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_every_layer_equals_the_models_own_eager_attention(vlm, backend):
    model, processor = vlm(backend)
    cap = attnviz.capture(model, TEXT, chelsea(), processor=processor)
    _, own = _own_attentions(model, processor)
    assert cap.model["backend"] == backend and len(own) == 2
    for layer, weights in enumerate(own):
        assert cap.attention(layer).shape == weights.shape
        assert (cap.attention(layer) - weights).abs().max().item() <= 5e-7
    assert cap.validate().passed


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
        values, off = patch_row(cap, layer, head, query=cat)
        assert (values - expected).abs().max() <= 5e-7
        assert off == pytest.approx(1 - float(expected.sum()), abs=1e-6)
        fig = figures.image_attention(cap, layer, head, query="Ġcat")
        heat = torch.tensor(fig.data[1].z)
        assert (heat - expected).abs().max() <= 5e-7
        # cell (r, c) of the heat covers exactly patch (r, c)'s pixels
        r, c = divmod(int(expected.argmax()), 4)
        trace = fig.data[1]
        x0, y0, x1, y1 = grid.box(grid.token((r, c)))
        assert trace.x0 + c * trace.dx == pytest.approx((x0 + x1 - 1) / 2)
        assert trace.y0 + r * trace.dy == pytest.approx((y0 + y1 - 1) / 2)
        assert "on the text (not drawn)" in fig.layout.title.text and "Ġcat" in fig.layout.title.text
    # beside it, the same row over the text tokens
    row = figures.query_row(cap, 1, 3, cat)
    assert row is not None


def test_bad_input_says_what_to_do(vlm):
    model, processor = vlm()
    with pytest.raises(attnviz.InputError, match=r"has 0 '<image>' tokens; write exactly one where the picture goes"):
        attnviz.capture(model, "the cat sleeps", chelsea(), processor=processor)
    with pytest.raises(attnviz.InputError, match=r"has 2 '<image>' tokens"):
        attnviz.capture(model, "<image> <image> cat", chelsea(), processor=processor)
    with pytest.raises(attnviz.InputError, match=r"give one picture with the text"):
        attnviz.capture(model, TEXT, processor=processor)
    with pytest.raises(attnviz.InputError, match=r"give one picture with the text"):
        attnviz.capture(model, TEXT, [chelsea(), chelsea()], processor=processor)
    with pytest.raises(attnviz.ArgumentTypeError, match=r"takes one text"):
        attnviz.capture(model, [TEXT, TEXT], chelsea(), processor=processor)
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
