"""A word's row over the text beside its row over the picture (attnviz.views.image: text_positions,
text_row, text_attention) on a tiny random LLaVA and a tiny random joint CLIP, against the models' own
eager ``output_attentions`` on the processor's inputs."""

import pytest
import torch
from PIL import Image
from skimage.data import chelsea

import attnviz
from attnviz.testing import tiny_joint, tiny_vlm
from attnviz.views.image import patch_row, text_attention, text_positions, text_row

PROMPT = "USER: <image> What is in the picture? ASSISTANT: a cat"


@pytest.fixture(scope="module")
def llava():
    model, processor = tiny_vlm(attn_implementation="eager")
    picture = Image.fromarray(chelsea())
    cap = attnviz.capture(model, PROMPT, picture, processor=processor)
    inputs = processor(text=[PROMPT], images=[picture], return_tensors="pt")
    with torch.no_grad():
        own = model(**inputs, output_attentions=True).attentions  # per layer [1, head, query, key]
    tokens = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    return cap, own, tokens


@pytest.fixture(scope="module")
def clip():
    model, processor = tiny_joint("clip", attn_implementation="eager")
    picture = Image.fromarray(chelsea())
    cap = attnviz.capture(model, "a photo of a cat", picture, processor=processor)
    inputs = processor(text=["a photo of a cat"], images=[picture], return_tensors="pt")
    with torch.no_grad():
        own = model(**inputs, output_attentions=True).text_model_output.attentions
    return cap, own


def test_a_vlm_words_row_over_the_text_is_its_own_row_at_the_text_positions(llava):
    cap, own, tokens = llava
    text = [i for i, t in enumerate(tokens) if t != "<image>"]
    image = [i for i, t in enumerate(tokens) if t == "<image>"]
    assert text_positions(cap, "decoder") == text and len(image) == 16
    picture_q = tokens.index("Ġpicture")
    for layer in (0, 1):
        for head in (None, 0, 3):
            for q in (picture_q, len(tokens) - 1):
                expected = own[layer][0].mean(0)[q] if head is None else own[layer][0, head, q]
                positions, values, on_picture = text_row(cap, layer, head, query=q, part="decoder")
                assert positions == text
                torch.testing.assert_close(values, expected[text], atol=5e-7, rtol=0)
                assert on_picture == pytest.approx(float(expected[image].sum()), abs=1e-6)
                # beside it, the same row over the picture: the two halves add up to the whole row
                grid, rest = patch_row(cap, layer, head, query=q, part="decoder")
                torch.testing.assert_close(grid.flatten(), expected[image], atol=5e-7, rtol=0)
                assert float(values.sum()) == pytest.approx(rest, abs=1e-6)
    # a neighbouring token's row is not the word's (what the dashboard's test relies on)
    assert (
        text_row(cap, 1, None, query=picture_q - 1, part="decoder")[1] - own[1][0].mean(0)[picture_q][text]
    ).abs().max() > 1e-4


def test_text_attention_draws_the_row_as_bars_the_query_in_red_and_says_the_share_on_the_picture(llava):
    cap, own, tokens = llava
    q = len(tokens) - 1
    fig = text_attention(cap, 1, 2, query=q, part="decoder")
    text = text_positions(cap, "decoder")
    bar = fig.data[0]
    torch.testing.assert_close(torch.tensor(bar.y, dtype=torch.float32), own[1][0, 2, q][text], atol=5e-7, rtol=0)
    assert list(fig.layout.xaxis.ticktext)[-2:] == ["a", "cat"] and len(fig.layout.xaxis.ticktext) == len(text)
    colours = list(bar.marker.color)
    assert colours.count("#d62728") == 1 and colours[-1] == "#d62728"
    share = float(own[1][0, 2, q][[i for i, t in enumerate(tokens) if t == "<image>"]].sum())
    assert fig.layout.title.text == f"L1·H2: where 'cat' attends over the text — {share:.0%} on the picture"
    # the Lab's switches recompute the same row: no ÷√d_k
    positions, values, _ = text_row(cap, 1, 2, query=q, part="decoder", scale=False)
    torch.testing.assert_close(values, cap.attention(1, 2, part="decoder", scale=False)[q][positions])


def test_a_joint_text_towers_row_is_over_all_its_tokens_and_the_vision_tower_has_no_text(clip):
    cap, own = clip
    assert text_positions(cap, "text") == [0, 1, 2, 3, 4]
    assert text_positions(cap, "vision") == []
    positions, values, on_picture = text_row(cap, 1, 1, query=3, part="text")
    torch.testing.assert_close(values, own[1][0, 1, 3], atol=5e-7, rtol=0)
    assert on_picture == pytest.approx(0, abs=1e-6) and values[4] == 0  # CLIP's text tower is causal
    fig = text_attention(cap, 0, None, query=4, part="text")
    assert fig.layout.title.text == "L0·heads' mean: where 'cat' attends over the text"
    assert list(fig.layout.xaxis.ticktext) == ["a", "photo", "of", "a", "cat"]


def test_text_rows_of_a_part_without_text_or_a_query_off_the_part_say_what_to_do(clip, llava):
    cap, _ = clip
    with pytest.raises(attnviz.InputError, match=r"the vision part has no text: its tokens are the picture's"):
        text_row(cap, 1, query=0, part="vision")
    with pytest.raises(attnviz.OutOfRangeError, match=r"query 9 is not a token of the text part: 0\.\.4"):
        text_row(cap, 1, query=9, part="text")
    vlm, _, _ = llava
    with pytest.raises(attnviz.OutOfRangeError, match=r"head 7 is out of range: layer 1 has heads 0\.\.3"):
        text_row(vlm, 1, 7, query=0, part="decoder")
    vit = attnviz.capture(attnviz.testing.tiny_model("vit"), chelsea(), attnviz.testing.tiny_processor("vit"))
    assert text_positions(vit) == []


def test_a_prompt_ending_in_its_picture_says_the_rows_share_on_the_text_in_every_image_figure():
    """With ``<image>`` last the text is all before the picture (the grid's prefix, no suffix): the
    titles still say the share on the text, not a list of the prefix's tokens as for [CLS]."""
    from attnviz import figures

    model, processor = tiny_vlm()
    cap = attnviz.capture(model, "Describe this: <image>", chelsea(), processor=processor)
    assert cap.image.suffix == [] and text_positions(cap, "decoder") == list(range(cap.image.n_prefix))
    last = cap.image.n_prefix + 15  # the last patch: its row over the text before the picture
    grid, rest = patch_row(cap, 1, None, query=last, part="decoder")
    assert figures.image_attention(cap, 1, query=last, part="decoder").layout.title.text == (
        f"L1·heads' mean: where (3,3) attends — {rest:.0%} on the text (not drawn)"
    )
    assert "on the text (not drawn)" in figures.image_rollout(cap, query=last, part="decoder").layout.title.text
    assert "· text " in figures.image_heads(cap, 1, query=last, part="decoder").layout.annotations[0].text
    positions, values, on_picture = text_row(cap, 1, None, query=(3, 3), part="decoder")
    assert float(values.sum()) == pytest.approx(rest, abs=1e-6) and on_picture == pytest.approx(
        float(grid.sum()), abs=1e-6
    )
