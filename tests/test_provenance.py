"""Provenance (issue 46, item 2): every capture records which weights, tokenizer, versions, device, backend and
check produced it (``cap.model["provenance"]``); capture files and tables keep it, ``attnviz info`` prints it,
and a capture opened against other weights says so with both hashes."""

from __future__ import annotations

import gc
import hashlib
import json
import warnings
import weakref

import pytest
import torch
import transformers

import attnviz
from attnviz import edits
from attnviz.cli import main
from attnviz.errors import CaptureMismatchError, OtherWeightsWarning
from attnviz.workflows.capture import provenance as prov
from attnviz.workflows.capture.models import IdsTokenizer

TEXT = "11 5 7 9 13 21 8 30"


def _reference_hash(model: torch.nn.Module) -> str:
    """sha256 over the state written out independently: the state_dict plus the non-persistent buffers,
    each tensor's bytes through numpy (bf16 through int16), in name order."""
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu()
        digest.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{list(t.shape)}\n".encode())
        digest.update(t.contiguous().view(torch.int16 if t.dtype == torch.bfloat16 else t.dtype).numpy().tobytes())
    return digest.hexdigest()


@pytest.fixture
def llama():
    return attnviz.testing.tiny_model("llama")


def test_a_capture_records_its_weights_tokenizer_versions_and_check(llama, smol_tokenizer):
    model = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer))
    cap = attnviz.capture(model, "The cat sat on the mat.", smol_tokenizer, add_bos=True)
    p = cap.provenance
    assert set(p) == set(prov.FIELDS)
    assert p["weights_sha256"] == _reference_hash(model)
    assert p["tokenizer_sha256"] == hashlib.sha256(smol_tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    assert (p["transformers"], p["torch"], p["attnviz"]) == (transformers.__version__, torch.__version__, "0.1.0")
    assert (p["device"], p["dtype"], p["backend"], p["add_bos"], p["edits"]) == ("cpu", "float32", "sdpa", True, None)
    report = cap.validate(rows=None)
    worst = report.worst()
    assert p["check"] == "sample" and p["check_passed"] is True
    assert 0 < p["check_worst"] <= 1 and p["check_max_abs_error"] <= worst["tolerance"]
    json.dumps(p)  # flat JSON values
    assert all(not isinstance(v, (dict, list)) for v in p.values())
    # the same weights built again hash the same; another seed does not
    assert attnviz.capture(attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer)), "a b", smol_tokenizer)
    assert prov.weights_hash(attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer))) == p["weights_sha256"]
    assert (
        prov.weights_hash(attnviz.testing.tiny_model("llama", seed=1, vocab_size=len(smol_tokenizer)))
        != (p["weights_sha256"])
    )
    assert attnviz.capture(model, "a b", smol_tokenizer).provenance["add_bos"] is False


def test_the_weights_hash_is_cached_per_model_and_redone_when_a_weight_changes(llama):
    first = prov.weights_hash(llama)
    assert llama in prov._WEIGHTS and prov.weights_hash(llama) == first
    with torch.no_grad():
        llama.model.layers[0].self_attn.q_proj.weight[0, 0] += 1.0  # in place: the version counter moves
    changed = prov.weights_hash(llama)
    assert changed != first and changed == _reference_hash(llama)
    with torch.no_grad():
        llama.model.norm.weight = torch.nn.Parameter(torch.zeros_like(llama.model.norm.weight))  # replaced
    assert prov.weights_hash(llama) == _reference_hash(llama) != changed
    assert not hasattr(llama, "attnviz_weights_sha256") and all("sha" not in k for k in vars(llama))
    local = attnviz.testing.tiny_model("gpt2")
    prov.weights_hash(local)
    alive = weakref.ref(local)
    del local
    gc.collect()
    assert alive() is None  # the cache keeps no model alive


def test_the_file_and_the_table_keep_it_and_old_files_load_without(llama, tmp_path):
    cap = attnviz.capture(llama, TEXT, IdsTokenizer())
    loaded = attnviz.load(cap.save(tmp_path / "a.attnviz"))
    assert loaded.provenance == cap.provenance and loaded.provenance["weights_sha256"]
    assert cap.to_pandas(0, 0).attrs["provenance"] == cap.provenance
    old = attnviz.capture(llama, TEXT, IdsTokenizer())
    del old.model["provenance"]
    again = attnviz.load(old.save(tmp_path / "old.attnviz"))
    assert again.provenance == {} and torch.allclose(again.attention(0), cap.attention(0), atol=1e-6)


def test_an_intervention_records_its_edits(llama):
    chosen = [edits.knockout(layer=1, head=0, query=5, key=[2, 3]), edits.temperature(2.0, layer=0)]
    out = attnviz.intervene(llama, TEXT, chosen, IdsTokenizer())
    assert out.capture_after.provenance["edits"] == "; ".join(str(e) for e in chosen)
    assert out.capture_before.provenance["edits"] is None
    assert out.capture_after.provenance["weights_sha256"] == out.capture_before.provenance["weights_sha256"]


def test_a_capture_opened_against_other_weights_of_the_same_shape_is_refused_with_both_hashes(llama, tmp_path):
    cap = attnviz.load(attnviz.capture(llama, TEXT, IdsTokenizer()).save(tmp_path / "a.attnviz"))
    other = attnviz.testing.tiny_model("llama", seed=1)
    ours, theirs = prov.weights_hash(other), cap.provenance["weights_sha256"]
    for run in (
        lambda: attnviz.intervene(other, cap, [edits.temperature(2.0, layer=0)], IdsTokenizer()),
        lambda: attnviz.head_importance(other, cap, 3, IdsTokenizer()),
    ):
        with pytest.raises(CaptureMismatchError) as err:
            run()
        assert f"the capture's weights are sha256 {theirs[:16]}…, this model's {ours[:16]}…" in str(err.value)
    # its own weights: no warning, no refusal
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attnviz.intervene(llama, cap, [edits.temperature(2.0, layer=0)], IdsTokenizer())


def test_weights_that_differ_where_the_capture_cannot_tell_warn_with_both_hashes(llama, tmp_path):
    cap = attnviz.load(attnviz.capture(llama, TEXT, IdsTokenizer()).save(tmp_path / "a.attnviz"))
    changed = attnviz.testing.tiny_model("llama")
    with torch.no_grad():
        changed.model.norm.weight.mul_(2.0)  # after the last attention: its Q and output are the capture's
    with pytest.warns(OtherWeightsWarning) as caught:
        attnviz.intervene(changed, cap, [edits.temperature(2.0, layer=0)], IdsTokenizer())
    message = str(caught[0].message)
    assert cap.provenance["weights_sha256"][:16] in message and prov.weights_hash(changed)[:16] in message


def test_attnviz_info_prints_one_line_per_field(llama, tmp_path, capsys):
    cap = attnviz.capture(llama, TEXT, IdsTokenizer())
    path = cap.save(tmp_path / "a.attnviz")
    assert main(["info", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    fields = dict(line.split(":", 1) for line in lines)
    assert [k for k in fields if k in prov.FIELDS] == list(prov.FIELDS)
    assert fields["weights_sha256"].strip() == cap.provenance["weights_sha256"]
    assert fields["tokens"].strip() == "8" and fields["parts"].strip() == "decoder (2 layers)"
    del cap.model["provenance"]
    old = cap.save(tmp_path / "old.attnviz")
    assert main(["info", str(old)]) == 0
    assert "provenance: none recorded" in capsys.readouterr().out.replace("  ", "")
    assert main(["info", str(tmp_path / "missing.attnviz")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: no capture file at {str(tmp_path / 'missing.attnviz')!r}; save one with attnviz.capture(...).save(path)"
    )


def test_an_exported_page_carries_the_captures_provenance(llama, tmp_path):
    """``attnviz export`` and ``figures.to_html(provenance=)``: the page shows the provenance and holds it as JSON
    a program reads back equal to the capture's; a page without it holds none."""
    cap = attnviz.capture(llama, TEXT, IdsTokenizer())
    path = cap.save(tmp_path / "a.attnviz")
    out = tmp_path / "a.html"
    assert main(["export", "--capture", str(path), "-o", str(out), "--views", "heatmap"]) == 0
    page = out.read_text(encoding="utf-8")
    start = page.index('<script type="application/json" id="attnviz-provenance">')
    data = page[page.index(">", start) + 1 : page.index("</script>", start)]
    assert json.loads(data) == cap.provenance
    assert f"<code>{cap.provenance['weights_sha256']}</code>" in page
    bare = attnviz.figures.html_page(attnviz.figures.heatmap(cap, 0, 0))
    assert "attnviz-provenance" not in bare


def test_an_image_written_with_the_provenance_carries_it(llama, tmp_path):
    """``figures.write_image(fig, path, provenance=cap.provenance)``: a PNG's text chunk (read by Pillow, which
    also checks the chunk's CRC) and an SVG's metadata hold the capture's provenance as JSON."""
    import xml.etree.ElementTree as ET

    from PIL import Image

    cap = attnviz.capture(llama, TEXT, IdsTokenizer())
    fig = attnviz.figures.heatmap(cap, 0, 0)
    png = attnviz.figures.write_image(fig, tmp_path / "a.png", provenance=cap.provenance, width=300, height=300)
    with Image.open(png) as image:
        image.load()  # every chunk read, CRCs checked
        assert json.loads(image.text["attnviz-provenance"]) == cap.provenance
        assert image.size == (300, 300)
    svg = attnviz.figures.write_image(fig, tmp_path / "a.svg", provenance=cap.provenance, width=300, height=300)
    meta = ET.parse(svg).getroot().find("{http://www.w3.org/2000/svg}metadata")
    assert meta is not None and json.loads(meta.text) == cap.provenance
    with Image.open(attnviz.figures.write_image(fig, tmp_path / "b.png", width=300, height=300)) as image:
        image.load()
        assert "attnviz-provenance" not in image.text
