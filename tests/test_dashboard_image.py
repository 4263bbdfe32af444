"""The Image tab in a real browser: a picture uploaded to a tiny ViT, its attention drawn over the
picture, a patch clicked as the query, a broken file refused with a message."""

import base64

import numpy as np
import pytest
from attnviz.dashboard import create_app
from attnviz.dashboard.ids import ID, IID
from PIL import Image
from skimage.data import coffee
from test_dashboard import choose, no_console_errors, open_tab, poll, show_heatmap_in_tokens, wait_status
from test_images import bright_patch_vit

import attnviz


@pytest.fixture
def vit_folder(tmp_path):
    """A tiny ViT whose layer 0 sends every query to the one white patch (row 2, column 1) of a black
    picture, saved with its image processor as a folder the dashboard loads by name."""
    model, picture = bright_patch_vit(2, 1)
    folder = tmp_path / "tiny-vit"
    model.save_pretrained(folder)
    attnviz.testing.tiny_processor("vit").save_pretrained(folder)
    path = tmp_path / "white-patch.png"
    Image.fromarray(picture).save(path)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"this is not a picture")
    return folder, path, broken


def plot(dash_duo, script: str):
    return dash_duo.driver.execute_script(f"const p = document.querySelector('#{IID.graph} .js-plotly-plot'); {script}")


def picture_shown(dash_duo):
    """The figure's picture, decoded from plotly's typed array ({dtype, bdata, shape})."""
    z = plot(dash_duo, "return p.data[0].z;")
    shape = tuple(int(d) for d in str(z["shape"]).split(","))
    return np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"])).reshape(shape)


@pytest.mark.browser
@pytest.mark.slow
def test_an_uploaded_picture_is_drawn_under_its_attention_and_a_clicked_patch_becomes_the_query(dash_duo, vit_folder):
    folder, picture, broken = vit_folder
    dash_duo.start_server(create_app({"minilm": "MiniLM (BERT)", str(folder): "tiny ViT"}, default_model="minilm"))
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)
    choose(dash_duo, f"#{ID.model}", 1)  # the tiny ViT
    open_tab(dash_duo, "Image")
    dash_duo.find_element(f"#{IID.upload} input").send_keys(str(picture))
    poll(lambda: "where [CLS] attends" in dash_duo.find_element(f"#{IID.graph} .gtitle").text, timeout=60)
    # layer 0 of this model sends [CLS] to the white patch: the heat's brightest cell is that patch
    choose(dash_duo, f"#{IID.layer}", 0)
    poll(lambda: dash_duo.find_element(f"#{IID.graph} .gtitle").text.startswith("L0"))
    z = np.array(plot(dash_duo, "return p.data.find(t => t.type === 'heatmap').z;"))
    assert np.unravel_index(np.argmax(z), z.shape) == (2, 1)
    assert plot(dash_duo, "return p.data[0].type;") == "image"
    # a click on the patch at row 0, column 3 makes it the query (outlined on the picture)
    # (hovered through plotly at the patch's centre, then plotly's click event, as a mouse click emits it)
    plot(
        dash_duo,
        "Plotly.Fx.hover(p, {xval: 3 * 8 + 3.5, yval: 0 * 8 + 3.5}); p.emit('plotly_click', {points: p._hoverdata, event: {}});",
    )
    poll(lambda: "where (0,3) attends" in dash_duo.find_element(f"#{IID.graph} .gtitle").text)
    shape = plot(dash_duo, "const s = p.layout.shapes[0]; return [s.x0, s.y0, s.x1, s.y1];")
    assert shape == [23.5, -0.5, 31.5, 7.5]
    # the Lab's causal switch: (0,3), token 4, no longer sees the white patch (token 10); ÷√d_k off too
    switches = dash_duo.find_elements(f"#{IID.switches} input")
    switches[0].click()
    switches[1].click()
    poll(lambda: "(causal mask, no ÷√d_k)" in dash_duo.find_element(f"#{IID.graph} .gtitle").text)
    z = np.array(plot(dash_duo, "return p.data.find(t => t.type === 'heatmap').z;"))
    assert z[0, :4].sum() > 0 and z[1:].max() == 0
    switches[0].click()
    switches[1].click()
    poll(lambda: "(causal" not in dash_duo.find_element(f"#{IID.graph} .gtitle").text)
    # every head of the layer as thumbnails, each with the picture under it, the clicked patch outlined
    dash_duo.find_elements(f"#{IID.mode} input")[1].click()
    poll(lambda: "per head" in dash_duo.find_element(f"#{IID.graph} .gtitle").text)
    assert plot(dash_duo, "return p.data.filter(t => t.type === 'heatmap').length;") == 4
    assert plot(dash_duo, "return p.data.filter(t => t.type === 'image').length;") == 4
    assert plot(dash_duo, "return p.layout.shapes.length;") == 4
    # the rollout of the clicked patch to layer 0, 0.5·I + 0.5·A: half its flow stays, half goes to the white patch
    dash_duo.find_elements(f"#{IID.mode} input")[2].click()
    poll(lambda: "rollout to L0 of (0,3)" in dash_duo.find_element(f"#{IID.graph} .gtitle").text)
    z = np.array(plot(dash_duo, "return p.data.find(t => t.type === 'heatmap').z;"))
    assert z[0, 3] > 0.49 and z[2, 1] > 0.49 and z.sum() > 0.999
    # a sample picture: the coffee cup, as the model read it (32×32) under the heat
    choose(dash_duo, f"#{IID.sample}", 1)
    expected = attnviz.capture(attnviz.load_model(str(folder))[0], coffee(), attnviz.testing.tiny_processor("vit"))
    poll(lambda: np.array_equal(picture_shown(dash_duo), expected.image.pixels.numpy()), timeout=30)
    # a broken file is a message on the tab, and the page goes on
    dash_duo.find_element(f"#{IID.upload} input").send_keys(str(broken))
    dash_duo.wait_for_contains_text(f"#{IID.message}", "is not an image Pillow can read", timeout=30)
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_a_text_model_on_the_image_tab_says_to_pick_a_vision_model(dash_duo, vit_folder):
    _, picture, _ = vit_folder
    dash_duo.start_server(create_app({"minilm": "MiniLM (BERT)"}, default_model="minilm"))
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)
    open_tab(dash_duo, "Image")
    dash_duo.find_element(f"#{IID.upload} input").send_keys(str(picture))
    dash_duo.wait_for_contains_text(
        f"#{IID.message}", "is not a vision encoder, so it cannot read a picture", timeout=30
    )
    said = dash_duo.find_element(f"#{IID.message}").text  # the page's advice: the server's flag, not a Python call
    assert "attnviz app --model" in said and "tiny_model" not in said, said
    no_console_errors(dash_duo)
