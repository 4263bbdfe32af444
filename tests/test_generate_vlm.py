"""``attnviz.generate`` of a vision-language model (a tiny LLaVA) with a picture: the model's own greedy
tokens, every generated token's row over the picture's tokens and the prompt equal to the model's own
eager attention at its step, the image positions labelled by their patches as in a capture, the vision
tower read once at the prefill."""

from __future__ import annotations

import pytest
import torch
from skimage.data import chelsea
from test_load_vlm import eager_outputs

import attnviz
from attnviz import figures
from attnviz.testing import tiny_vlm

PROMPT = "USER: <image> What is in the picture? ASSISTANT:"
N_NEW = 4


@pytest.fixture(scope="module")
def vlm():
    built = tiny_vlm()

    def make(backend: str = "sdpa"):
        built[0].set_attn_implementation(backend)
        return built

    return make


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_a_vlm_generation_is_its_own_greedy_text_and_every_step_its_own_eager_row(vlm, backend):
    model, processor = vlm(backend)
    gen = attnviz.generate(model, PROMPT, chelsea(), processor=processor, max_new_tokens=N_NEW, check="full")
    cap = gen.capture
    encoded = processor(text=PROMPT, images=chelsea(), return_tensors="pt")
    prompt_ids = encoded["input_ids"][0].tolist()
    with torch.no_grad():
        plain = model.generate(**encoded, max_new_tokens=N_NEW, do_sample=False)[0].tolist()
    assert gen.ids.tolist() == plain and gen.prompt_length == len(prompt_ids) and len(gen) == N_NEW
    assert gen.steps == [len(prompt_ids)] + [1] * N_NEW
    assert cap.parts == ("decoder", "vision") and cap.model["backend"] == backend

    # each new token's row, as recorded at its step, is the model's own eager row of that token with the
    # picture and the text up to it (a forward of the sequence so far: what the step computed)
    pixels = encoded["pixel_values"]
    for position in range(gen.prompt_length, len(plain)):
        ids = torch.tensor([plain[: position + 1]])
        own = eager_outputs(model, input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels).attentions
        for layer in range(2):
            ours = cap.attention(layer, part="decoder")[:, position, : position + 1]
            assert (ours - own[layer][0, :, position]).abs().max() <= 5e-7
            assert float(cap.attention(layer, part="decoder")[:, position, position + 1 :].abs().sum()) == 0
    # the whole map: the prompt's rows too
    ids = torch.tensor([plain])
    own = eager_outputs(model, input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels).attentions
    tower = eager_outputs(model.model.vision_tower, pixel_values=pixels).attentions
    for layer in range(2):
        assert (cap.attention(layer, part="decoder") - own[layer][0]).abs().max() <= 5e-7
        assert (cap.attention(layer, part="vision") - tower[layer][0]).abs().max() <= 5e-7
    report = cap.validate()
    assert report.passed, str(report)


def test_the_image_positions_are_labelled_by_their_patches_and_drawn_over_the_picture(vlm):
    model, processor = vlm()
    gen = attnviz.generate(model, PROMPT, chelsea(), processor=processor, max_new_tokens=N_NEW)
    cap = gen.capture
    alone = attnviz.capture(model, PROMPT, chelsea(), processor=processor)
    n = gen.prompt_length
    # the prompt's tokens and picture exactly as a capture labels them; the new tokens after them
    assert cap.tokens[:n] == alone.tokens and cap.tokens[n:] == gen.new_tokens
    image_id = model.config.image_token_index
    at = [i for i, t in enumerate(gen.ids.tolist()) if t == image_id]
    assert len(at) == 16 and [cap.tokens[i] for i in at] == [f"({r},{c})" for r in range(4) for c in range(4)]
    grid = cap.image
    assert grid.grid == (4, 4) and grid.n_prefix == at[0] and grid.suffix == cap.tokens[at[-1] + 1 :]
    assert torch.equal(grid.pixels, alone.image.pixels) and cap.vision.prefix == ["[CLS]"]
    # a new token's row over the picture is its row at the image positions, each on its patch
    last = len(gen.ids) - 1
    heat = torch.tensor(figures.image_attention(cap, 1, 2, query=last, part="decoder").data[1].z)
    torch.testing.assert_close(heat.flatten(), cap.attention(1, head=2, part="decoder")[last, at], atol=1e-7, rtol=0)
    step = gen.step(N_NEW - 1)
    assert step.position == last and torch.equal(step.weights[1, 2], cap.attention(1, head=2, part="decoder")[last])
    positions, values, on_picture = figures.helpers.text_row(cap, 1, 2, query=last, part="decoder")
    assert at[0] not in positions and on_picture == pytest.approx(float(step.weights[1, 2, at].sum()), abs=1e-6)


def test_the_picture_goes_in_as_for_a_capture_and_by_a_saved_folder(vlm, tmp_path):
    model, processor = vlm()
    by_name = attnviz.generate(model, PROMPT, image=chelsea(), processor=processor, max_new_tokens=2)
    positional = attnviz.generate(model, PROMPT, chelsea(), processor=processor, max_new_tokens=2)
    assert torch.equal(by_name.ids, positional.ids)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded = attnviz.generate(str(tmp_path), PROMPT, chelsea(), max_new_tokens=2)  # the folder's processor
    assert torch.equal(loaded.ids, by_name.ids)
    for part in ("decoder", "vision"):
        torch.testing.assert_close(
            loaded.capture.attention(1, part=part), by_name.capture.attention(1, part=part), atol=1e-6, rtol=0
        )


def test_bad_pictures_say_what_to_do(vlm):
    model, processor = vlm()
    with pytest.raises(attnviz.InputError, match="write exactly one where the picture goes"):
        attnviz.generate(model, "What is in the picture?", chelsea(), processor=processor, max_new_tokens=2)
    with pytest.raises(attnviz.InputError, match=r"give one picture with each text: generate\(model, text, image="):
        attnviz.generate(model, PROMPT, processor=processor, max_new_tokens=2)
    pixels = processor(text=PROMPT, images=chelsea(), return_tensors="pt")["pixel_values"]
    with pytest.raises(attnviz.InputError, match="pass the picture as image="):
        attnviz.generate(model, PROMPT, processor.tokenizer, pixel_values=pixels, max_new_tokens=2)
    with pytest.raises(attnviz.InputError, match="the prompt has '<image>' but no picture: pass it"):
        attnviz.generate(model, PROMPT, processor.tokenizer, max_new_tokens=2)
    with pytest.raises(attnviz.InputError, match="reads no pictures while it generates"):
        attnviz.generate(attnviz.testing.tiny_model("llama"), "1 2 3", image=chelsea(), max_new_tokens=2)
    # the text alone generates as any decoder's
    text_only = attnviz.generate(model, "USER: hello ASSISTANT:", processor.tokenizer, max_new_tokens=2)
    assert text_only.capture.parts == ("decoder",)


def test_a_vlm_family_attnviz_does_not_map_is_refused_with_why():
    """SmolVLM with a picture: refused before any step, saying why, as attnviz.capture refuses it;
    load_model would load it as a VLM (AutoModelForImageTextToText)."""
    import transformers as tf

    from attnviz.workflows.capture.models import model_kind

    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    config = tf.SmolVLMConfig(
        text_config=dict(model_type="llama", **small, num_key_value_heads=2, vocab_size=128),
        vision_config=dict(**small, image_size=32, patch_size=8),
        scale_factor=2,
    )
    model = tf.SmolVLMForConditionalGeneration(config).eval()
    assert model_kind(model.config) == "vlm"
    with pytest.raises(attnviz.UnsupportedModelError, match=r"SmolVLM: its processor needs torchvision"):
        attnviz.generate(model, "<image> a cat", chelsea(), max_new_tokens=2)
    with pytest.raises(attnviz.UnsupportedModelError, match=r"untested .* It captures LLaVA and Idefics3"):
        attnviz.generate(model, "<image> a cat", image=chelsea(), processor=object(), max_new_tokens=2)


def test_a_saved_vlm_generation_loads_back_with_its_picture(vlm, tmp_path):
    model, processor = vlm()
    gen = attnviz.generate(model, PROMPT, chelsea(), processor=processor, max_new_tokens=3)
    gen.save(tmp_path / "gen.attnviz")
    back = attnviz.Generation.of(attnviz.load(tmp_path / "gen.attnviz"))
    assert back.new_tokens == gen.new_tokens and back.capture.parts == ("decoder", "vision")
    assert back.capture.image.suffix == gen.capture.image.suffix and torch.equal(
        back.capture.image.pixels, gen.capture.image.pixels
    )
    for part in ("decoder", "vision"):
        assert torch.equal(back.capture.attention(1, part=part), gen.capture.attention(1, part=part))
