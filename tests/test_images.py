"""Images in: vision encoders captured from pictures, their tokens on the patch grid, attention drawn
over the picture.

The models are tiny and random (no vision weights ship offline); the pictures are real: scikit-image's
bundled cat (Chelsea) and coffee cup, both CC0 by their photographers. Every layer of every family is
compared with the model's own eager ``output_attentions`` on a batch of two pictures.
"""

import json

import numpy as np
import pytest
import torch
from skimage.data import chelsea, coffee

import attnviz
from attnviz import figures
from attnviz.data.images import ImageGrid

VISION = ["vit", "deit", "dinov2", "dinov2_registers", "clip_vision", "siglip_vision"]
PREFIX = {
    "vit": ["[CLS]"],
    "deit": ["[CLS]", "[DIST]"],
    "dinov2": ["[CLS]"],
    "dinov2_registers": ["[CLS]", "[REG0]", "[REG1]", "[REG2]", "[REG3]"],
    "clip_vision": ["[CLS]"],
    "siglip_vision": [],
}


def own_attentions(family, pictures):
    """The eager model's own attention weights on the processor's pixel values of ``pictures``."""
    eager = attnviz.testing.tiny_model(family, attn_implementation="eager")
    pixels = attnviz.testing.tiny_processor(family)(images=pictures, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return eager(pixel_values=pixels, output_attentions=True).attentions


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("family", VISION)
def test_every_layer_of_a_batch_of_two_pictures_is_the_models_own_eager_attention(family, backend):
    model = attnviz.testing.tiny_model(family, attn_implementation=backend)
    assert model.config._attn_implementation == backend
    caps = attnviz.capture(model, [chelsea(), coffee()], attnviz.testing.tiny_processor(family))
    expected = own_attentions(family, [chelsea(), coffee()])
    assert len(caps) == 2 and len(expected) == 2
    for b, cap in enumerate(caps):
        assert cap.parts == ("encoder",) and cap.model["backend"] == backend
        assert cap.tokens[: len(PREFIX[family])] == PREFIX[family]
        assert cap.n_tokens == len(PREFIX[family]) + 16 == expected[0].shape[-1]
        for layer, ref in enumerate(expected):
            ours = cap.attention(layer)
            assert ours.shape == ref[b].shape
            assert (ours - ref[b]).abs().max().item() <= 5e-7, (family, backend, b, layer)
    # each capture of the batch keeps its own picture and its own maps: those of that picture alone
    alone = attnviz.capture(model, coffee(), attnviz.testing.tiny_processor(family))
    assert torch.equal(caps[1].image.pixels, alone.image.pixels)
    assert not torch.equal(caps[0].image.pixels, caps[1].image.pixels)
    assert torch.allclose(caps[1].attention(0), alone.attention(0), atol=1e-6)


def test_one_picture_gives_one_capture_and_a_list_gives_a_list():
    model = attnviz.testing.tiny_model("vit")
    one = attnviz.capture(model, chelsea(), attnviz.testing.tiny_processor("vit"))
    assert isinstance(one, attnviz.Capture)
    assert isinstance(attnviz.capture(model, image=[chelsea()], processor=attnviz.testing.tiny_processor("vit")), list)


def test_the_grid_names_cls_registers_and_each_patch_with_its_row_column_and_pixels():
    cap = attnviz.capture(
        attnviz.testing.tiny_model("dinov2_registers"), chelsea(), attnviz.testing.tiny_processor("dinov2_registers")
    )
    grid = cap.image
    assert grid.prefix == PREFIX["dinov2_registers"] and grid.grid == (4, 4) and grid.patch == (8, 8)
    assert cap.image.pixels.shape == (32, 32, 3) and cap.image.pixels.dtype == torch.uint8
    assert cap.tokens[:6] == ["[CLS]", "[REG0]", "[REG1]", "[REG2]", "[REG3]", "(0,0)"]
    assert cap.tokens[-1] == "(3,3)" and len(cap.tokens) == 21
    for token in range(5):
        assert grid.position(token) is None and grid.box(token) is None
    assert grid.token((2, 3)) == 5 + 2 * 4 + 3 == grid.token("(2,3)")
    assert grid.position(16) == (2, 3)
    assert grid.box(16) == (24, 16, 32, 24)  # x0, y0, x1, y1: column 3, row 2 of 8×8 patches
    assert grid.box(5) == (0, 0, 8, 8)
    # each token is its own word: word-level rules become patch-level ones
    assert cap.source.word_labels == cap.tokens and all(len(w.tokens) == 1 for w in cap.words)
    with pytest.raises(attnviz.OutOfRangeError, match=r"patch \(4, 0\) is out of range: the grid has rows 0..3"):
        grid.token((4, 0))
    with pytest.raises(attnviz.InputError, match="no token '\\[DIST\\]' in this image"):
        grid.token("[DIST]")


def test_the_picture_is_what_the_model_read():
    """The processed image kept with the capture is the processor's output un-normalised: the cat
    resized to 32×32 (the processor's own resize of the original, within rounding)."""
    from PIL import Image

    cap = attnviz.capture(attnviz.testing.tiny_model("vit"), chelsea(), attnviz.testing.tiny_processor("vit"))
    resized = np.asarray(Image.fromarray(chelsea()).resize((32, 32), Image.BILINEAR)).astype(int)
    assert np.abs(cap.image.pixels.numpy().astype(int) - resized).max() <= 1


def bright_patch_vit(row, col):
    """A tiny ViT whose layer 0 makes every query, in every head, attend to the one bright patch of a
    black picture, and that picture (32×32, white at patch (row, col))."""
    model = attnviz.testing.tiny_model("vit", attn_implementation="eager")
    d = model.config.hidden_size
    w = torch.tensor([1.0, -1.0] * (d // 2))  # mean 0, variance 1: the layer norm keeps its sign
    with torch.no_grad():
        emb = model.embeddings
        emb.cls_token.zero_()
        emb.position_embeddings.zero_()
        conv = emb.patch_embeddings.projection
        conv.weight.copy_(w[:, None, None, None].expand_as(conv.weight) / conv.weight[0].numel())
        conv.bias.zero_()  # a patch's embedding: its mean pixel (-1 black, +1 white) times w
        layer = model.layers[0]
        layer.layernorm_before.weight.fill_(1.0)
        layer.layernorm_before.bias.zero_()
        attn = layer.attention
        attn.k_proj.weight.copy_(torch.ones(d, 1) @ w[None, :] / d)  # white patch: key +1, black −1, CLS 0
        attn.k_proj.bias.zero_()
        attn.q_proj.weight.zero_()
        attn.q_proj.bias.fill_(3.0)  # every query the same: it likes a key of +1
    picture = np.zeros((32, 32, 3), np.uint8)
    picture[row * 8 : (row + 1) * 8, col * 8 : (col + 1) * 8] = 255
    return model, picture


def heat_cells(fig):
    """(the heatmap's values, and the pixel columns and rows each cell covers): a cell centred at
    x0 + c·dx spans dx pixels whose centres are at integers."""
    heat = next(t for t in fig.data if t.type == "heatmap")
    z = np.array(heat.z)

    def span(start, step, i):  # the pixels whose centres lie inside the cell
        lo, hi = start + i * step - step / 2, start + i * step + step / 2
        return range(int(np.floor(lo)) + 1, int(np.ceil(hi)))

    return z, lambda r, c: (span(heat.y0, heat.dy, r), span(heat.x0, heat.dx, c))


def test_a_patch_overlay_lands_on_that_patchs_pixels():
    model, picture = bright_patch_vit(2, 1)
    cap = attnviz.capture(model, picture, attnviz.testing.tiny_processor("vit"), check="full")
    bright = cap.image.token((2, 1))
    weights = cap.attention(0)  # [head, query, key]
    assert weights[:, :, bright].min() > 0.99  # every query of every head attends to the bright patch
    pixels = cap.image.pixels.numpy()
    white = np.argwhere(pixels[..., 0] == 255)
    assert len(white) == 64
    for fig in (
        figures.image_attention(cap, 0, head=0),
        figures.image_attention(cap, 0, query=(3, 3)),
        figures.image_heads(cap, 0),
    ):
        z, cells = heat_cells(fig)
        r, c = np.unravel_index(np.argmax(z), z.shape)
        assert (r, c) == (2, 1)
        rows, cols = cells(r, c)
        assert len(rows) == 8 and len(cols) == 8
        covered = {(y, x) for y in rows for x in cols}
        assert covered == {tuple(p) for p in white}
        image = next(t for t in fig.data if t.type == "image")
        assert np.array_equal(np.array(image.z, dtype=np.uint8), pixels)
    grid, prefix = figures.helpers.patch_row(cap, 0, 0, query="[CLS]")
    assert grid.shape == (4, 4) and grid[2, 1] > 0.99 and prefix < 0.01
    # rollout mixes the residual in: the bright patch still carries the CLS's flow through layer 0
    z, _ = heat_cells(figures.image_rollout(cap, layer=0))
    assert np.unravel_index(np.argmax(z), z.shape) == (2, 1)


def test_the_thumbnails_show_every_head_and_the_query_patch_is_outlined():
    cap = attnviz.capture(attnviz.testing.tiny_model("vit"), chelsea(), attnviz.testing.tiny_processor("vit"))
    fig = figures.image_heads(cap, 1, query=(1, 2))
    heats = [t for t in fig.data if t.type == "heatmap"]
    assert len(heats) == 4
    for h, heat in enumerate(heats):
        expected = cap.attention(1, head=h)[cap.image.token((1, 2)), 1:].reshape(4, 4)
        assert np.allclose(np.array(heat.z), expected.numpy(), atol=1e-6)
    boxes = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(boxes) == 4 and (boxes[0].x0, boxes[0].y0) == (15.5, 7.5)
    # the CLS is not on the picture: no box, its share in the title
    fig = figures.image_attention(cap, 1)
    assert not fig.layout.shapes and "on [CLS] (not drawn)" in fig.layout.title.text


def test_the_heatmap_is_labelled_by_patch():
    cap = attnviz.capture(attnviz.testing.tiny_model("deit"), chelsea(), attnviz.testing.tiny_processor("deit"))
    fig = figures.heatmap(cap, 0, 1)
    assert list(fig.layout.xaxis.ticktext)[:4] == ["[CLS]", "[DIST]", "(0,0)", "(0,1)"]
    assert list(fig.layout.yaxis.ticktext)[-1] == "(3,3)"
    # word level is patch level: each patch its own word, the same map
    words = figures.heatmap(cap, 0, 1, words=True)
    assert list(words.layout.xaxis.ticktext) == cap.tokens
    assert np.array_equal(np.array(words.data[0].z, dtype=float), np.array(fig.data[0].z, dtype=float))


def test_an_image_capture_survives_save_and_load(tmp_path):
    cap = attnviz.capture(
        attnviz.testing.tiny_model("dinov2_registers"), chelsea(), attnviz.testing.tiny_processor("dinov2_registers")
    )
    back = attnviz.load(cap.save(tmp_path / "cat.safetensors"))
    assert isinstance(back.image, ImageGrid)
    assert torch.equal(back.image.pixels, cap.image.pixels) and back.image.pixels.dtype == torch.uint8
    assert (back.image.grid, back.image.patch, back.image.prefix) == (cap.image.grid, cap.image.patch, cap.image.prefix)
    assert back.tokens == cap.tokens and back.source.word_labels == cap.tokens
    assert torch.equal(back.attention(1), cap.attention(1))
    figures.image_attention(back, 1, query="(0,0)")  # a loaded capture draws over its picture
    # a text capture's file has no picture, and loads without one
    text = attnviz.capture(attnviz.testing.tiny_model("bert"), "5 6 7", attnviz.workflows.capture.models.IdsTokenizer())
    assert attnviz.load(text.save(tmp_path / "text.safetensors")).image is None


def test_pixel_values_give_the_same_capture_as_the_picture():
    model, processor = attnviz.testing.tiny_model("clip_vision"), attnviz.testing.tiny_processor("clip_vision")
    from_picture = attnviz.capture(model, coffee(), processor)
    pixels = processor(images=coffee(), return_tensors="pt")["pixel_values"]
    from_tensor = attnviz.capture(model, pixel_values=pixels, processor=processor)
    assert torch.equal(from_tensor.attention(1), from_picture.attention(1))
    assert torch.equal(from_tensor.image.pixels, from_picture.image.pixels)
    # without the processor's mean and std, the picture is each channel stretched to 0..255
    stretched = attnviz.capture(model, pixel_values=pixels).image.pixels
    assert stretched.amax(dim=(0, 1)).tolist() == [255, 255, 255] and stretched.amin(dim=(0, 1)).tolist() == [0, 0, 0]


def test_a_folder_loads_its_own_image_processor(tmp_path):
    """A name or folder goes through from_pretrained: the model's class and AutoImageProcessor."""
    model, processor = attnviz.testing.tiny_model("vit"), attnviz.testing.tiny_processor("vit")
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    cap = attnviz.capture(str(tmp_path), chelsea())
    assert cap.model["class"] == "ViTModel" and cap.image.grid == (4, 4)
    assert torch.allclose(cap.attention(0), attnviz.capture(model, chelsea(), processor).attention(0), atol=1e-6)


def test_paths_arrays_and_pil_images_are_the_same_picture(tmp_path):
    from PIL import Image

    path = tmp_path / "cat.png"
    Image.fromarray(chelsea()).save(path)
    model, processor = attnviz.testing.tiny_model("vit"), attnviz.testing.tiny_processor("vit")
    caps = [
        attnviz.capture(model, source, processor)
        for source in (chelsea(), Image.fromarray(chelsea()), path, str(path), chelsea() / 255.0)
    ]
    for cap in caps[1:]:
        assert torch.allclose(cap.attention(1), caps[0].attention(1), atol=1e-6)


def test_bad_pictures_are_refused_with_what_to_do(tmp_path):
    model, processor = attnviz.testing.tiny_model("vit"), attnviz.testing.tiny_processor("vit")
    notes = tmp_path / "notes.png"
    notes.write_text(json.dumps({"not": "an image"}))
    with pytest.raises(attnviz.ImageFileError, match=r"is not an image Pillow can read .*give a PNG, JPEG"):
        attnviz.capture(model, notes, processor)
    with pytest.raises(attnviz.ImageFileError, match=r"image 1: no file at 'missing.jpg'"):
        attnviz.capture(model, [chelsea(), "missing.jpg"], processor)
    with pytest.raises(attnviz.ImageFileError, match=r"array of shape \(3, 32, 32\); give \[height, width\]"):
        attnviz.capture(model, np.zeros((3, 32, 32), np.uint8), processor)
    with pytest.raises(attnviz.ImageFileError, match=r"holds floats in 2..2; give floats in 0..1 or uint8"):
        attnviz.capture(model, np.full((32, 32, 3), 2.0), processor)
    with pytest.raises(
        attnviz.InputError, match="has no name or folder to load its image processor from; pass processor="
    ):
        attnviz.capture(model, chelsea())


def test_a_text_model_given_a_picture_says_which_models_read_images():
    with pytest.raises(attnviz.InputError, match=r"\(bert\) is not a vision encoder, so it cannot read an image"):
        attnviz.capture(attnviz.testing.tiny_model("bert"), chelsea())
    with pytest.raises(attnviz.InputError, match="is not a vision encoder.*ViT"):
        attnviz.capture(attnviz.testing.tiny_model("gpt2"), pixel_values=torch.zeros(1, 3, 32, 32))


def test_image_figures_of_a_text_capture_say_what_they_need():
    cap = attnviz.capture(attnviz.testing.tiny_model("bert"), "5 6 7", attnviz.workflows.capture.models.IdsTokenizer())
    with pytest.raises(attnviz.InputError, match="this capture has no picture: image figures draw a vision"):
        figures.image_attention(cap, 0)


def test_an_image_file_too_large_is_refused_before_it_is_decoded(tmp_path, monkeypatch):
    from PIL import Image

    from attnviz.workflows.capture import images

    path = tmp_path / "big.png"
    Image.fromarray(chelsea()).save(path)
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 100 * 100)
    with pytest.raises(attnviz.ImageFileError, match=r"has 451×300 pixels, more than 10,000; resize it first"):
        attnviz.capture(attnviz.testing.tiny_model("vit"), path, attnviz.testing.tiny_processor("vit"))


def test_the_labs_switches_recompute_the_row_over_the_picture():
    """A patch's row with the causal mask forced sees only the tokens up to it (row by row), and without
    ÷√d_k it is the unscaled softmax: both are the capture's own recomputation, drawn on the grid."""
    cap = attnviz.capture(attnviz.testing.tiny_model("vit"), chelsea(), attnviz.testing.tiny_processor("vit"))
    q = cap.image.token((1, 1))
    grid, _ = figures.helpers.patch_row(cap, 1, 0, query=(1, 1), causal=True)
    assert torch.equal(grid.flatten(), cap.attention(1, 0, causal=True)[q, 1:])
    assert grid[0].min() > 0 and grid[1, :2].min() > 0 and grid[1, 2:].max() == 0 and grid[2:].max() == 0
    unscaled, _ = figures.helpers.patch_row(cap, 1, 0, query=(1, 1), scale=False)
    assert torch.equal(unscaled.flatten(), cap.attention(1, 0, scale=False)[q, 1:])
    assert not torch.allclose(unscaled, figures.helpers.patch_row(cap, 1, 0, query=(1, 1))[0])
    fig = figures.image_attention(cap, 1, 0, query=(1, 1), causal=True, scale=False)
    assert "(causal mask, no ÷√d_k)" in fig.layout.title.text
    z, _ = heat_cells(fig)
    assert np.allclose(z.flatten(), cap.attention(1, 0, causal=True, scale=False)[q, 1:].numpy())


@pytest.mark.parametrize("joint", ["clip", "siglip"])
def test_a_joint_text_image_model_is_refused_and_its_vision_tower_captured(joint):
    import transformers as tf

    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    names = {"clip": ("CLIPConfig", "CLIPTextConfig", "CLIPVisionConfig", "CLIPModel", "clip_vision")}
    names["siglip"] = ("SiglipConfig", "SiglipTextConfig", "SiglipVisionConfig", "SiglipModel", "siglip_vision")
    config, text, vision, model_class, tiny = names[joint]
    model = getattr(tf, model_class)(
        getattr(tf, config)(
            text_config=getattr(tf, text)(**small, vocab_size=99, bos_token_id=0, eos_token_id=1).to_dict(),
            vision_config=getattr(tf, vision)(**small, image_size=32, patch_size=8).to_dict(),
        )
    ).eval()
    with pytest.raises(attnviz.UnsupportedModelError, match=r"is a joint text–image model .*model\.vision_model"):
        attnviz.capture(model, chelsea(), attnviz.testing.tiny_processor(tiny))
    cap = attnviz.capture(model.vision_model, chelsea(), attnviz.testing.tiny_processor(tiny))
    assert cap.n_tokens == len(PREFIX[tiny]) + 16
