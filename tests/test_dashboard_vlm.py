"""The Image tab in a real browser with models of two towers: a tiny random LLaVA (a prompt read with the
picture, a word of it chosen, its row drawn over the picture beside its row over the text, the vision
tower a part choice) and a tiny random joint CLIP (its text tower and its vision tower), each saved to a
folder with its processor; a tiny Idefics3 (image tokens of 2×2 patch blocks); a VLM family attnviz
refuses with a picture is a message on the tab.

The references are the models' own eager ``output_attentions`` on the same processed inputs, not the
dashboard's capture."""

import base64

import numpy as np
import pytest
import torch
import transformers as tf
from attnviz.dashboard import create_app
from attnviz.dashboard.ids import ID, IID
from PIL import Image
from selenium.webdriver.common.keys import Keys
from skimage.data import chelsea
from test_dashboard import choose, no_console_errors, open_tab, poll, show_heatmap_in_tokens, wait_status

import attnviz
from attnviz.testing import tiny_joint, tiny_vlm
from attnviz.workflows.capture.models import embedded_source

TOL = 1e-6  # the page draws float32 weights; a neighbouring token's row differs by ~1e-3 in these models


def _shown(value) -> np.ndarray:
    """A plotted array: a list, or plotly's typed array ({dtype, bdata, shape})."""
    if isinstance(value, dict):
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return data.reshape(tuple(int(d) for d in str(value.get("shape", len(data))).split(",")))
    return np.array(value, dtype=float)


def heat(dash_duo) -> np.ndarray:
    return _shown(
        dash_duo.driver.execute_script(
            f"const p = document.querySelector('#{IID.graph} .js-plotly-plot');"
            " return p.data.find(t => t.type === 'heatmap').z;"
        )
    )


def bars(dash_duo) -> tuple[np.ndarray, list[str]]:
    y, ticks = dash_duo.driver.execute_script(
        f"const p = document.querySelector('#{IID.strip} .js-plotly-plot');"
        " return [p.data[0].y, p.layout.xaxis.ticktext];"
    )
    return _shown(y), list(ticks)


def title(dash_duo, graph: str) -> str:
    return dash_duo.find_element(f"#{graph} .gtitle").text


def type_prompt(dash_duo, text: str) -> None:
    box = dash_duo.find_element(f"#{IID.prompt}")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(text + Keys.ENTER)


VLM_PROMPT = "USER: <image> What is in the picture? ASSISTANT: a cat"  # the tab's opening prompt for a VLM


def open_image_tab(dash_duo, folder, label: str, photo, prompt: str | None = VLM_PROMPT) -> None:
    """The page on MiniLM with ``folder`` second in the model list: that model picked, the Image tab
    opened, its opening ``prompt`` awaited (None: none to wait for) and ``photo`` uploaded."""
    dash_duo.start_server(create_app({"minilm": "MiniLM (BERT)", str(folder): label}, default_model="minilm"))
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)
    choose(dash_duo, f"#{ID.model}", 1)
    open_tab(dash_duo, "Image")
    if prompt is not None:
        poll(lambda: dash_duo.find_element(f"#{IID.prompt}").get_attribute("value") == prompt, timeout=60)
    dash_duo.find_element(f"#{IID.upload} input").send_keys(str(photo))


@pytest.fixture
def photo(tmp_path):
    path = tmp_path / "chelsea.png"
    Image.fromarray(chelsea()).save(path)
    return path


@pytest.fixture
def llava_folder(tmp_path):
    model, processor = tiny_vlm()
    folder = tmp_path / "tiny-llava"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def own_rows(folder, text: str, path) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """(the tokens, each layer's heads' mean weights [layer, query, key] of the language model, the same of
    the vision tower) from the LLaVA's own eager attention on the processor's inputs."""
    model = tf.AutoModelForImageTextToText.from_pretrained(folder, attn_implementation="eager").eval()
    processor = tf.AutoProcessor.from_pretrained(folder)
    inputs = processor(text=[text], images=[Image.open(path).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
        vision = model.model.vision_tower(inputs["pixel_values"], output_attentions=True).attentions
    tokens = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    return tokens, torch.stack([a[0].mean(0) for a in out.attentions]), torch.stack([a[0].mean(0) for a in vision])


@pytest.mark.browser
@pytest.mark.slow
def test_a_word_of_a_vlm_prompt_is_drawn_over_the_picture_beside_its_row_over_the_text(dash_duo, llava_folder, photo):
    open_image_tab(dash_duo, llava_folder, "tiny LLaVA", photo)
    prompt = VLM_PROMPT
    poll(lambda: "where 'cat' attends over the text" in title(dash_duo, IID.strip), timeout=60)
    tokens, decoder, vision = own_rows(llava_folder, prompt, photo)
    image = [i for i, t in enumerate(tokens) if t == "<image>"]
    text = [i for i in range(len(tokens)) if i not in image]
    assert len(image) == 16 and tokens[-1] == "Ġcat"
    # the last word by default: its row at L1 (the heads' mean) over the picture, cell (r, c) on image token r·4+c
    last = len(tokens) - 1
    poll(lambda: np.allclose(heat(dash_duo), decoder[1, last, image].reshape(4, 4).numpy(), atol=TOL, rtol=0))
    y, ticks = bars(dash_duo)
    assert np.allclose(y, decoder[1, last, text].numpy(), atol=TOL, rtol=0)
    assert ticks[-2:] == ["a", "cat"] and len(ticks) == len(text)
    share = float(decoder[1, last, image].sum())
    assert f"{share:.0%} on the picture" in title(dash_duo, IID.strip)
    assert f"L1·heads' mean: where 'cat' attends — {1 - share:.0%} on the text (not drawn)" == title(
        dash_duo, IID.graph
    )
    # another word, "picture" (token 23): both figures follow it, layer 0, head 2
    picture = tokens.index("Ġpicture")
    choose(dash_duo, f"#{IID.word}", text.index(picture))
    poll(lambda: "where 'picture' attends over the text" in title(dash_duo, IID.strip))
    choose(dash_duo, f"#{IID.layer}", 0)
    choose(dash_duo, f"#{IID.head}", 3)  # mean, H0, H1, H2
    poll(lambda: title(dash_duo, IID.strip).startswith("L0·H2"))
    model = tf.AutoModelForImageTextToText.from_pretrained(llava_folder, attn_implementation="eager").eval()
    processor = tf.AutoProcessor.from_pretrained(llava_folder)
    inputs = processor(text=[prompt], images=[Image.open(photo).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        head2 = model(**inputs, output_attentions=True).attentions[0][0, 2, picture]
    poll(lambda: np.allclose(heat(dash_duo), head2[image].reshape(4, 4).numpy(), atol=TOL, rtol=0))
    assert "L0·H2: where 'picture' attends" in title(dash_duo, IID.graph)
    assert np.allclose(bars(dash_duo)[0], head2[text].numpy(), atol=TOL, rtol=0)
    # every head of layer 0 as thumbnails of the word's rows; back to one head
    dash_duo.find_elements(f"#{IID.mode} input")[1].click()
    poll(lambda: "L0: where 'picture' attends, per head" in title(dash_duo, IID.graph))
    with torch.no_grad():
        heads = model(**inputs, output_attentions=True).attentions[0][0, :, picture]
    thumbs = dash_duo.driver.execute_script(
        f"return document.querySelector('#{IID.graph} .js-plotly-plot').data.filter(t => t.type === 'heatmap').map(t => t.z);"
    )
    assert len(thumbs) == 4
    for h, z in enumerate(thumbs):
        assert np.allclose(_shown(z), heads[h, image].reshape(4, 4).numpy(), atol=TOL, rtol=0)
    dash_duo.find_elements(f"#{IID.mode} input")[0].click()
    # the vision tower, a part choice: [CLS]'s row over the patches, no text strip
    dash_duo.find_elements(f"#{IID.part} input")[1].click()
    poll(lambda: "where [CLS] attends" in title(dash_duo, IID.graph), timeout=30)
    poll(lambda: np.allclose(heat(dash_duo), vision[1, 0, 1:].reshape(4, 4).numpy(), atol=TOL, rtol=0))
    assert not dash_duo.find_element(f"#{IID.strip}").is_displayed()
    # a prompt without <image>: the picture is put in front, and the words are the new prompt's
    dash_duo.find_elements(f"#{IID.part} input")[0].click()
    type_prompt(dash_duo, "the dog sleeps")
    poll(lambda: "where 's' attends over the text" in title(dash_duo, IID.strip), timeout=60)
    tokens, decoder, _ = own_rows(llava_folder, "<image> the dog sleeps", photo)
    text = [i for i, t in enumerate(tokens) if t != "<image>"]
    poll(lambda: np.allclose(bars(dash_duo)[0], decoder[1, -1, text].numpy(), atol=TOL, rtol=0))
    # two <image> tokens: the library's message on the tab
    type_prompt(dash_duo, "<image> and <image>")
    dash_duo.wait_for_contains_text(f"#{IID.message}", "the text has 2 '<image>' tokens", timeout=30)
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_continue_the_text_with_the_picture_shows_each_new_tokens_row_over_it(dash_duo, llava_folder, photo):
    """The VLM writes on from the prompt and the picture (attnviz.generate); the word list ends with the new
    tokens, the last chosen, and its row over the picture is the model's own eager row of that token."""
    open_image_tab(dash_duo, llava_folder, "tiny LLaVA", photo)
    prompt = VLM_PROMPT
    poll(lambda: "where 'cat' attends over the text" in title(dash_duo, IID.strip), timeout=60)
    box = dash_duo.find_element(f"#{IID.new_tokens}")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("3")
    dash_duo.find_element(f"#{IID.generate}").click()
    dash_duo.wait_for_contains_text(f"#{IID.generated}", "The model wrote 3 new tokens", timeout=60)
    # the reference: the model's own greedy continuation, then its eager forward of the whole sequence
    model = tf.AutoModelForImageTextToText.from_pretrained(llava_folder, attn_implementation="eager").eval()
    processor = tf.AutoProcessor.from_pretrained(llava_folder)
    inputs = processor(text=[prompt], images=[Image.open(photo).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=3, do_sample=False)
        rows = (
            model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                pixel_values=inputs["pixel_values"],
                output_attentions=True,
            )
            .attentions[1][0]
            .mean(0)
        )
    tokens = processor.tokenizer.convert_ids_to_tokens(ids[0].tolist())
    image = [i for i, t in enumerate(tokens) if t == "<image>"]
    last = len(tokens) - 1
    shown = dash_duo.find_element(f"#{IID.word}").text
    assert shown.startswith("▸") and shown.endswith(f"· {last}"), shown  # the last new token is the chosen word
    poll(lambda: np.allclose(heat(dash_duo), rows[last, image].reshape(4, 4).numpy(), atol=TOL, rtol=0))
    text = [i for i in range(len(tokens)) if i not in image]
    assert np.allclose(bars(dash_duo)[0], rows[last, text].numpy(), atol=TOL, rtol=0)
    assert dash_duo.find_element(f"#{IID.generated}").text.endswith(" ".join(tokens[-3:]))
    # a number out of range is the tab's message; the generation stays shown
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("0")
    dash_duo.find_element(f"#{IID.generate}").click()
    dash_duo.wait_for_contains_text(f"#{IID.message}", "give a number of new tokens from 1 to 512", timeout=30)
    assert "The model wrote 3 new tokens" in dash_duo.find_element(f"#{IID.generated}").text
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_a_joint_clip_shows_its_vision_tower_and_its_text_tower(dash_duo, tmp_path, photo):
    model, processor = tiny_joint("clip")
    folder = tmp_path / "tiny-clip"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    open_image_tab(dash_duo, folder, "tiny CLIP", photo, prompt="a photo of a cat")
    eager = tf.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    inputs = processor(text=["a photo of a cat"], images=[Image.open(photo).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        out = eager(**inputs, output_attentions=True)
    text_rows = out.text_model_output.attentions
    vision_rows = out.vision_model_output.attentions
    # the vision tower first, as for a vision encoder: [CLS]'s row (heads' mean) over the picture
    poll(lambda: "where [CLS] attends" in title(dash_duo, IID.graph), timeout=60)
    expected = vision_rows[1][0].mean(0)[0, 1:].reshape(4, 4).numpy()
    poll(lambda: np.allclose(heat(dash_duo), expected, atol=TOL, rtol=0))
    # the text tower: its last word's row over its tokens (CLIP's text tower is causal), one head's map beside
    dash_duo.find_elements(f"#{IID.part} input")[1].click()
    poll(lambda: "where 'cat' attends over the text" in title(dash_duo, IID.strip), timeout=30)
    n = inputs["input_ids"].shape[1]
    y, ticks = bars(dash_duo)
    assert ticks == ["a", "photo", "of", "a", "cat"] and n == 5
    assert np.allclose(y, text_rows[1][0].mean(0)[n - 1].numpy(), atol=TOL, rtol=0)
    choose(dash_duo, f"#{IID.word}", 1)  # "photo": it sees "a" and itself only
    choose(dash_duo, f"#{IID.head}", 2)  # H1
    poll(lambda: title(dash_duo, IID.strip).startswith("L1·H1: where 'photo'"))
    y, _ = bars(dash_duo)
    assert np.allclose(y, text_rows[1][0, 1, 1].numpy(), atol=TOL, rtol=0) and y[2:].max() == 0
    map_z = _shown(
        dash_duo.driver.execute_script(
            f"return document.querySelector('#{IID.graph} .js-plotly-plot').data.find(t => t.type === 'heatmap').z;"
        )
    )
    # the map: the heatmap figure's 5 decimals, its causal triangle left empty
    assert np.allclose(np.nan_to_num(map_z), text_rows[1][0, 1].numpy(), atol=5e-6, rtol=0)
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_an_idefics3_word_is_drawn_over_its_blocks_of_the_picture(dash_duo, tmp_path, photo):
    """Idefics3 (SmolVLM's architecture): each image token one 2×2 block of the tower's patches, so the
    word's row is a 4×4 heat over the picture; the vision tower (no [CLS]) a part of its own. Its
    processor saved as Idefics3's are, splitting pictures into tiles (which the library refuses, saying
    to set do_image_splitting = False): the page reads the picture whole and says so."""
    model, processor = tiny_vlm("idefics3")
    processor.image_processor.do_image_splitting = True
    processor.image_processor.size = {"longest_edge": 128}  # 2 × 2 tiles of 64 beside the whole
    folder = tmp_path / "tiny-idefics3"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    with pytest.raises(attnviz.UnsupportedModelError, match="do_image_splitting = False"):
        attnviz.capture(str(folder), VLM_PROMPT, chelsea())
    open_image_tab(dash_duo, folder, "tiny Idefics3", photo)
    prompt = VLM_PROMPT
    dash_duo.wait_for_contains_text(f"#{IID.note}", "the page reads the picture whole instead", timeout=30)
    poll(lambda: "where 'cat' attends over the text" in title(dash_duo, IID.strip), timeout=60)
    eager = tf.AutoModelForImageTextToText.from_pretrained(folder, attn_implementation="eager").eval()
    again = tf.AutoProcessor.from_pretrained(folder)
    assert again.image_processor.do_image_splitting  # as saved; the reference reads the picture whole
    again.image_processor.do_image_splitting = False
    inputs = again(text=[prompt], images=[Image.open(photo).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        rows = eager(**inputs, output_attentions=True).attentions[1][0].mean(0)
        tower = eager.model.vision_model(inputs["pixel_values"][:, 0], output_attentions=True).attentions[1][0].mean(0)
    tokens = again.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    image = [i for i, t in enumerate(tokens) if t == "<image>"]
    text = [i for i in range(len(tokens)) if i not in image]
    assert len(image) == 16 and tokens[-1] == "Ġcat" and "<global-img>" in tokens
    poll(lambda: np.allclose(heat(dash_duo), rows[-1, image].reshape(4, 4).numpy(), atol=TOL, rtol=0))
    assert np.allclose(bars(dash_duo)[0], rows[-1, text].numpy(), atol=TOL, rtol=0)
    # the vision tower: 8×8 patches and no [CLS], the centre patch's row over them
    dash_duo.find_elements(f"#{IID.part} input")[1].click()
    poll(lambda: "where (4,4) attends" in title(dash_duo, IID.graph), timeout=30)
    poll(lambda: np.allclose(heat(dash_duo), tower[4 * 8 + 4].reshape(8, 8).numpy(), atol=TOL, rtol=0))
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_a_vlm_attnviz_refuses_with_a_picture_is_a_message_on_the_image_tab(dash_duo, tmp_path, photo):
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    config = tf.SmolVLMConfig(
        text_config=dict(model_type="llama", **small, num_key_value_heads=2, vocab_size=128),
        vision_config=dict(**small, image_size=32, patch_size=8),
        scale_factor=2,
    )
    folder = tmp_path / "tiny-smolvlm"
    tf.SmolVLMForConditionalGeneration(config).save_pretrained(folder)
    source, kwargs = embedded_source("smollm2")
    tf.AutoTokenizer.from_pretrained(source, **kwargs).save_pretrained(folder)
    open_image_tab(dash_duo, folder, "tiny SmolVLM", photo, prompt=None)
    dash_duo.wait_for_contains_text(f"#{IID.message}", "cannot be shown with a picture: SmolVLM", timeout=30)
    assert "It captures LLaVA and Idefics3" in dash_duo.find_element(f"#{IID.message}").text
    no_console_errors(dash_duo)
