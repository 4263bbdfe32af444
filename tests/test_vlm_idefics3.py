"""Idefics3 (the architecture of SmolVLM): its language model's attention over the text and the picture's
tokens and its vision tower's over the patches, two parts of one capture, each exact against the
model's own eager attention; each image token mapped to the block of patches the model's own connector
(pixel shuffle) made it from; a word's row drawn over those pixels; generation from a picture; a
picture split into tiles refused with what to do."""

from __future__ import annotations

import pytest
import torch
from skimage.data import chelsea, coffee
from test_load_vlm import eager_outputs

import attnviz
from attnviz import figures
from attnviz.testing import tiny_vlm
from attnviz.views.image import patch_row

TEXT = "A photo: <image> the cat sleeps on a mat"


@pytest.fixture(scope="module")
def idefics3():
    built = tiny_vlm("idefics3")  # one build, switched between backends

    def make(backend: str = "sdpa"):
        built[0].set_attn_implementation(backend)
        return built

    return make


def _own(model, encoded):
    """The model's own eager attention: the language model's and the vision tower's (run alone on the
    same pixels), each layer ``[batch, head, q, k]``."""
    pixels = encoded["pixel_values"].flatten(0, 1)  # [texts, pictures = 1, 3, h, w] -> the tower's batch
    return eager_outputs(model, **encoded).attentions, eager_outputs(
        model.model.vision_model, pixel_values=pixels
    ).attentions


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_both_parts_of_a_padded_batch_equal_the_models_own_eager_attention(idefics3, backend):
    model, processor = idefics3(backend)
    texts = [TEXT, "<image> a cup"]
    caps = attnviz.capture(model, texts, [chelsea(), coffee()], processor=processor)
    encoded = processor(text=texts, images=[chelsea(), coffee()], return_tensors="pt", padding=True)
    own, tower = _own(model, encoded)
    lengths = encoded["attention_mask"].sum(-1).tolist()
    assert len(own) == len(tower) == 2 and lengths[0] != lengths[1]
    for b, cap in enumerate(caps):
        n = lengths[b]
        assert cap.parts == ("decoder", "vision") and cap.model["backend"] == backend
        assert cap.token_ids == encoded["input_ids"][b, :n].tolist()
        for layer in range(2):
            assert (cap.attention(layer, part="decoder") - own[layer][b, :, :n, :n]).abs().max() <= 5e-7
            assert cap.attention(layer, part="vision").shape == (4, 64, 64)  # 8×8 patches, no [CLS]
            assert (cap.attention(layer, part="vision") - tower[layer][b]).abs().max() <= 5e-7
        report = cap.validate()
        assert report.passed, str(report)
    assert not torch.equal(caps[0].image.pixels, caps[1].image.pixels)  # each its own picture


def test_each_image_token_is_the_block_of_patches_the_models_own_connector_made_it_from(idefics3):
    """The connector's pixel shuffle, run on the patches' own indices, says which patches feed each
    image token; the capture's cell of that token covers exactly those patches' pixels."""
    model, processor = idefics3()
    cap = attnviz.capture(model, TEXT, chelsea(), processor=processor)
    image, tower = cap.image, cap.vision
    assert image.grid == (4, 4) and image.patch == (16, 16) and tower.grid == (8, 8) and tower.patch == (8, 8)
    assert tower.prefix == [] and torch.equal(image.pixels, tower.pixels)
    connector = model.model.connector
    indices = torch.arange(64, dtype=torch.float64).view(1, 64, 1)
    fed = connector.pixel_shuffle(indices, connector.scale_factor)[0].long()  # [16 image tokens, 4 patches]
    ids = cap.token_ids
    at = [i for i, t in enumerate(ids) if t == model.config.image_token_id]
    assert at == list(range(image.n_prefix, image.n_prefix + 16))
    for k, position in enumerate(at):
        x0, y0, x1, y1 = image.box(position)
        inside = {
            p - tower.n_prefix
            for p in range(tower.n_prefix, tower.n_tokens)
            if x0 <= tower.box(p)[0] and tower.box(p)[2] <= x1 and y0 <= tower.box(p)[1] and tower.box(p)[3] <= y1
        }
        assert inside == set(fed[k].tolist()), (k, inside, fed[k])
    # the text around the image tokens is the processor's: its tokens are text tokens of the capture
    assert image.prefix[-2:] == ["<fake_token_around_image>", "<global-img>"]
    assert image.suffix[0] == "<fake_token_around_image>" and "Ġcat" in image.suffix


def test_a_words_row_is_drawn_over_its_cells_of_the_picture(idefics3):
    model, processor = idefics3()
    cap = attnviz.capture(model, TEXT, chelsea(), processor=processor)
    encoded = processor(text=TEXT, images=chelsea(), return_tensors="pt")
    own, _ = _own(model, encoded)
    grid = cap.image
    cat = cap.tokens.index("Ġcat")
    start = grid.n_prefix
    for layer, head in [(0, 1), (1, 3)]:
        expected = own[layer][0, head, cat, start : start + 16].reshape(4, 4)
        values, off = patch_row(cap, layer, head, query=cat, part="decoder")
        assert (values - expected).abs().max() <= 5e-7
        assert off == pytest.approx(1 - float(expected.sum()), abs=1e-6)
        fig = figures.image_attention(cap, layer, head, query="Ġcat", part="decoder")
        trace = fig.data[1]
        assert (torch.tensor(trace.z) - expected).abs().max() <= 5e-7
        r, c = divmod(int(expected.argmax()), 4)  # the heat's cell (r, c) sits on the block's 16×16 pixels
        x0, y0, x1, y1 = grid.box(grid.token((r, c)))
        assert (x1 - x0, y1 - y0) == (16, 16)
        assert trace.x0 + c * trace.dx == pytest.approx((x0 + x1 - 1) / 2)
        assert trace.y0 + r * trace.dy == pytest.approx((y0 + y1 - 1) / 2)


def test_a_picture_split_into_tiles_and_smolvlm_are_refused_with_what_to_do(idefics3):
    model, processor = idefics3()
    processor.image_processor.do_image_splitting = True
    try:
        with pytest.raises(attnviz.UnsupportedModelError, match=r"do_image_splitting = False"):
            attnviz.capture(model, TEXT, chelsea(), processor=processor)
        with pytest.raises(attnviz.UnsupportedModelError, match=r"do_image_splitting = False"):
            attnviz.generate(model, TEXT, chelsea(), processor=processor, max_new_tokens=1)
    finally:
        processor.image_processor.do_image_splitting = False
    from attnviz.workflows.capture.vlm import vlm_refusal

    smolvlm = type("Config", (), {"model_type": "smolvlm"})()
    assert "Idefics3" in (vlm_refusal(smolvlm) or "") and vlm_refusal(model.config) is None


def test_generation_from_a_picture_is_the_models_own_text_and_each_step_its_own_eager_row(idefics3):
    model, processor = idefics3()
    prompt = "User:<image> What is in the picture?\nAssistant:"
    gen = attnviz.generate(model, prompt, chelsea(), processor=processor, max_new_tokens=3, check="full")
    encoded = processor(text=prompt, images=chelsea(), return_tensors="pt")
    with torch.no_grad():
        plain = model.generate(**encoded, max_new_tokens=3, do_sample=False)[0].tolist()
    assert gen.ids.tolist() == plain and gen.prompt_length == encoded["input_ids"].shape[1]
    ids = torch.tensor([plain])
    image = {k: encoded[k] for k in ("pixel_values", "pixel_attention_mask")}
    own = eager_outputs(model, input_ids=ids, attention_mask=torch.ones_like(ids), **image).attentions
    for layer in range(2):
        assert (gen.capture.attention(layer, part="decoder") - own[layer][0]).abs().max() <= 5e-7
    assert gen.capture.image.grid == (4, 4) and gen.capture.validate().passed


def test_a_saved_idefics3_loads_with_its_processor_and_captures_by_its_folder(idefics3, tmp_path):
    model, processor = idefics3()
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded, _, again = attnviz.load_model(str(tmp_path), with_processor=True)
    assert type(loaded).__name__ == "Idefics3ForConditionalGeneration" and again is not None
    by_folder = attnviz.capture(str(tmp_path), TEXT, chelsea())
    direct = attnviz.capture(model, TEXT, chelsea(), processor=processor)
    assert by_folder.tokens == direct.tokens and torch.equal(by_folder.image.pixels, direct.image.pixels)
    for part in ("decoder", "vision"):
        torch.testing.assert_close(by_folder.attention(1, part=part), direct.attention(1, part=part), atol=1e-6, rtol=0)
