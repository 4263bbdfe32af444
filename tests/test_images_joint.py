"""Joint text–image models (CLIPModel, SiglipModel): the text tower and the vision tower as two parts of
one capture, each exact against the model's own eager output_attentions, on a batch of two pictures with
padded texts, the vision part's tokens mapped to the picture."""

from __future__ import annotations

import pytest
import torch
from skimage.data import chelsea, coffee

import attnviz
from attnviz import figures
from attnviz.testing import tiny_joint

TEXTS = ["a cat sleeping on a mat", "a cup"]


@pytest.fixture(scope="module")
def joint():
    built = {}

    def make(family: str, backend: str = "sdpa"):
        if family not in built:
            built[family] = tiny_joint(family)  # one build per family, switched between backends
        built[family][0].set_attn_implementation(backend)
        return built[family]

    return make


def _own(model, processor, texts, pictures):
    """The model's own eager attentions: (input ids and mask, text tower's per layer, vision tower's per
    layer), each [batch, head, q, k]."""
    encoded = processor(text=texts, images=pictures, return_tensors="pt", padding=True)
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(**encoded, output_attentions=True)
    finally:
        model.set_attn_implementation(before)
    return encoded, out.text_model_output.attentions, out.vision_model_output.attentions


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_both_towers_equal_the_models_own_eager_attention(joint, family, backend):
    model, processor = joint(family, backend)
    pictures = [chelsea(), coffee()]
    caps = attnviz.capture(model, TEXTS, pictures, processor=processor)
    encoded, text, vision = _own(model, processor, TEXTS, pictures)
    lengths = encoded["attention_mask"].sum(-1).tolist()
    assert lengths[1] < lengths[0] and len(text) == len(vision) == 2  # a padded batch, two layers a tower
    prefix = ["[CLS]"] if family == "clip" else []
    for b, cap in enumerate(caps):
        assert cap.parts == ("text", "vision") and cap.model["backend"] == backend
        n = lengths[b]
        assert cap.token_ids == encoded["input_ids"][b, :n].tolist() and cap.text == TEXTS[b]
        for layer in range(2):
            assert (cap.attention(layer, part="text") - text[layer][b, :, :n, :n]).abs().max() <= 5e-7
            assert (cap.attention(layer, part="vision") - vision[layer][b]).abs().max() <= 5e-7
        assert cap.validate().passed
        # the vision part's tokens: the tower's prefix, then the 4×4 patches of the picture it read
        grid = cap.image_of("vision")
        assert grid is cap.image and grid.prefix == prefix and grid.grid == (4, 4) and grid.patch == (8, 8)
        tokens, keys = cap.sequences("vision")
        assert tokens.tokens == prefix + [f"({r},{c})" for r in range(4) for c in range(4)] and keys is tokens
        assert cap.sequences("text")[0].tokens == cap.tokens
        assert cap.image_of("text") is None
    assert not torch.equal(caps[0].image.pixels, caps[1].image.pixels)


def test_clips_text_tower_is_causal_and_siglips_is_not(joint):
    """The text part records each tower's own mask: CLIP's text tower is causal, SigLIP's bidirectional."""
    clip = attnviz.capture(*joint("clip")[:1], TEXTS[0], chelsea(), processor=joint("clip")[1])
    siglip = attnviz.capture(*joint("siglip")[:1], TEXTS[0], chelsea(), processor=joint("siglip")[1])
    after = torch.ones(clip.n_tokens, clip.n_tokens, dtype=torch.bool).triu(1)  # key after the query
    assert clip.attention(0, part="text")[:, after].abs().max() == 0
    assert siglip.attention(0, part="text")[:, after].min() > 0


def test_the_vision_part_is_drawn_over_the_picture_and_the_text_part_is_not(joint):
    model, processor = joint("clip")
    cap = attnviz.capture(model, TEXTS[0], chelsea(), processor=processor)
    _, _, vision = _own(model, processor, [TEXTS[0]], [chelsea()])
    own = vision[1][0, 2, 0, 1:]  # [CLS]'s row of layer 1, head 2, over the patches
    values, off = figures.helpers.patch_row(cap, 1, 2, part="vision")
    assert (values.flatten() - own).abs().max() <= 5e-7 and off == pytest.approx(float(vision[1][0, 2, 0, 0]))
    heat = torch.tensor(figures.image_attention(cap, 1, 2, part="vision").data[1].z)
    assert (heat.flatten() - own).abs().max() <= 5e-7
    assert figures.image_rollout(cap, part="vision").data[1].z is not None
    with pytest.raises(attnviz.InputError, match=r"the text part's tokens are not on the picture; .*part='vision'"):
        figures.image_attention(cap, 1, part="text")
    with pytest.raises(attnviz.InputError, match=r"parts text, vision; say which with part="):
        cap.attention(0)
    selected = cap.select("vision")
    assert selected.parts == ("vision",) and selected.image is cap.image and selected.n_tokens == 17
    assert cap.select("text").image is None and cap.select("text").tokens == cap.tokens


def test_a_joint_capture_saves_and_loads_both_parts(joint, tmp_path):
    model, processor = joint("siglip")
    cap = attnviz.capture(model, TEXTS[0], chelsea(), processor=processor)
    back = attnviz.load(cap.save(tmp_path / "siglip.safetensors"))
    assert back.parts == ("text", "vision") and back.tokens == cap.tokens and back.image.grid == (4, 4)
    assert back.sequences("vision")[0].tokens == cap.sequences("vision")[0].tokens
    for part in ("text", "vision"):
        assert torch.equal(back.attention(1, part=part), cap.attention(1, part=part))


def test_bad_input_says_what_to_do(joint):
    model, processor = joint("clip")
    with pytest.raises(attnviz.InputError, match=r"1 text\(s\) and 2 picture\(s\): give as many texts as pictures"):
        attnviz.capture(model, TEXTS[0], [chelsea(), coffee()], processor=processor)
    with pytest.raises(attnviz.InputError, match=r"give a text and a picture"):
        attnviz.capture(model, TEXTS[0], processor=processor)
    with pytest.raises(attnviz.InputError, match=r"reads a text and a picture: pass its processor"):
        attnviz.capture(model, TEXTS[0], chelsea(), processor=processor.image_processor)
    # its tokenizer and its image processor given apart work as its processor does
    apart = attnviz.capture(model, TEXTS[0], processor.tokenizer, image=chelsea(), processor=processor.image_processor)
    assert apart.parts == ("text", "vision")
    with pytest.raises(attnviz.UnsupportedModelError, match=r"joint text–image model .*capture\(model, text, image"):
        attnviz.capture(model, chelsea(), processor.image_processor)
