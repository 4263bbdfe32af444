"""``attnviz.load_model`` of a saved vision-language model (a tiny LLaVA) and a saved joint CLIP / SigLIP:
the class its config names (``AutoModelForImageTextToText``, the joint model), the processor saved
beside it, and a capture of the loaded folder equal to the model's own eager attention."""

from __future__ import annotations

import pytest
import torch
from skimage.data import chelsea, coffee

import attnviz
from attnviz.testing import tiny_joint, tiny_vlm
from attnviz.workflows.capture.models import load_processor, model_kind

TEXT = "A photo: <image> the cat sleeps"


def eager_outputs(model, **inputs):
    """The model's own outputs with its eager attention (``output_attentions``), its backend restored after."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(**inputs, output_attentions=True)
    finally:
        model.set_attn_implementation(before)


@pytest.fixture(scope="module")
def llava_folder(tmp_path_factory):
    model, processor = tiny_vlm()
    folder = tmp_path_factory.mktemp("tiny-llava")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module", params=["clip", "siglip"])
def joint_folder(request, tmp_path_factory):
    model, processor = tiny_joint(request.param)
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return request.param, str(folder)


def test_a_saved_llava_loads_as_an_image_text_to_text_model_with_its_processor(llava_folder):
    model, tokenizer = attnviz.load_model(llava_folder)  # the two-value form, as before
    assert type(model).__name__ == "LlavaForConditionalGeneration" and not model.training
    assert model_kind(model.config) == "vlm" and model.config.architectures == ["LlavaForConditionalGeneration"]
    assert tokenizer.convert_tokens_to_ids("<image>") == model.config.image_token_index
    again, _, processor = attnviz.load_model(llava_folder, with_processor=True)
    assert again is model  # the cached load
    assert type(processor).__name__ == "LlavaProcessor" and processor is load_processor(llava_folder)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_a_loaded_llava_folder_captures_its_own_eager_attention(llava_folder, backend):
    model, _, processor = attnviz.load_model(llava_folder, with_processor=True, attn_implementation=backend)
    # by name, the processor saved in the folder is the one read
    cap = attnviz.capture(llava_folder, TEXT, chelsea(), attn_implementation=backend)
    assert cap.parts == ("decoder", "vision") and cap.model["backend"] == backend
    encoded = processor(text=TEXT, images=chelsea(), return_tensors="pt")
    out = eager_outputs(model, **encoded)
    tower = eager_outputs(model.model.vision_tower, pixel_values=encoded["pixel_values"])
    assert cap.token_ids == encoded["input_ids"][0].tolist()
    assert cap.tokens[cap.image.n_prefix] == "(0,0)" and cap.image.grid == (4, 4)
    for layer in range(2):
        assert (cap.attention(layer, part="decoder") - out.attentions[layer][0]).abs().max() <= 5e-7
        assert (cap.attention(layer, part="vision") - tower.attentions[layer][0]).abs().max() <= 5e-7
    assert cap.validate().passed


def test_a_saved_joint_model_loads_both_towers_and_captures_them(joint_folder):
    family, folder = joint_folder
    model, tokenizer, processor = attnviz.load_model(folder, with_processor=True)
    assert type(model).__name__ == {"clip": "CLIPModel", "siglip": "SiglipModel"}[family]
    assert model_kind(model.config) == "joint" and tokenizer is not None
    assert type(processor).__name__ == {"clip": "CLIPProcessor", "siglip": "SiglipProcessor"}[family]
    texts, pictures = ["a cat sleeping on a mat", "a cup"], [chelsea(), coffee()]
    caps = attnviz.capture(folder, texts, pictures)
    encoded = processor(text=texts, images=pictures, return_tensors="pt", padding=True)
    out = eager_outputs(model, **encoded)
    lengths = encoded["attention_mask"].sum(-1).tolist()
    for b, cap in enumerate(caps):
        assert cap.parts == ("text", "vision")
        n = lengths[b]
        for layer in range(2):
            own_text = out.text_model_output.attentions[layer][b, :, :n, :n]
            assert (cap.attention(layer, part="text") - own_text).abs().max() <= 5e-7
            assert (
                cap.attention(layer, part="vision") - out.vision_model_output.attentions[layer][b]
            ).abs().max() <= 5e-7
        assert cap.validate().passed


def test_a_vision_encoder_and_a_text_model_load_as_before(tmp_path):
    vit = attnviz.testing.tiny_model("vit")
    vit.save_pretrained(tmp_path / "vit")
    attnviz.testing.tiny_processor("vit").save_pretrained(tmp_path / "vit")
    model, tokenizer, processor = attnviz.load_model(str(tmp_path / "vit"), with_processor=True)
    assert type(model).__name__ == "ViTModel" and tokenizer is None and type(processor).__name__.startswith("ViT")
    model, tokenizer, processor = attnviz.load_model("minilm", with_processor=True)
    assert type(model).__name__ == "BertModel" and tokenizer is not None and processor is None


def test_a_vlm_folder_without_its_processor_says_to_save_it(tmp_path):
    model, processor = tiny_vlm()
    model.save_pretrained(tmp_path)
    processor.tokenizer.save_pretrained(tmp_path)  # the tokenizer, not the image processor
    with pytest.raises(attnviz.ModelNotFoundError, match=r"processor\.save_pretrained"):
        attnviz.load_model(str(tmp_path), with_processor=True)
    with pytest.raises(attnviz.InputError, match="needs its processor"):
        attnviz.capture(str(tmp_path), TEXT, chelsea())
    with pytest.raises(attnviz.ArgumentTypeError, match="with_processor must be True or False"):
        attnviz.load_model(str(tmp_path), with_processor="yes")  # type: ignore[arg-type]


def test_the_text_figures_are_public_in_attnviz_figures_and_draw_the_models_own_row(llava_folder):
    """attnviz.figures exports text_attention beside image_attention (text_row / text_positions in its helpers); the bars
    of a word's row over the text are the loaded model's own eager row at the text positions."""
    from attnviz import figures
    from attnviz.views import image

    assert "text_attention" in figures.__all__ and figures.text_attention is image.text_attention
    for name in ("text_row", "text_positions"):  # numbers, not figures: beside them in figures.helpers
        assert name in figures.helpers.__all__ and getattr(figures.helpers, name) is getattr(image, name)
    model, _, processor = attnviz.load_model(llava_folder, with_processor=True)
    cap = attnviz.capture(llava_folder, TEXT, chelsea())
    encoded = processor(text=TEXT, images=chelsea(), return_tensors="pt")
    own = eager_outputs(model, **encoded).attentions
    ids = encoded["input_ids"][0].tolist()
    text = [i for i, t in enumerate(ids) if t != model.config.image_token_index]
    assert figures.helpers.text_positions(cap, "decoder") == text
    cat = cap.tokens.index("Ġcat")
    for layer, head in ((1, 0), (0, 3)):
        fig = figures.text_attention(cap, layer, head, query=cat, part="decoder")
        bars = torch.tensor(fig.data[0].y)
        expected = own[layer][0, head, cat]
        torch.testing.assert_close(bars, expected[text], atol=5e-7, rtol=0)
        assert f"{1 - float(expected[text].sum()):.0%} on the picture" in fig.layout.title.text
        positions, values, on_picture = figures.helpers.text_row(cap, layer, head, query=cat, part="decoder")
        assert positions == text and torch.equal(values, bars.to(values.dtype))
