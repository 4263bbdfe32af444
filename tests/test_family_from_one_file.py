"""Adding a family is one new file: a renamed copy of GPT-Neo's module (a family attnviz taps by
projection hooks, so nothing captures it unless its facts are registered), under a model type
transformers does not know, is found by the registry — dropped into the package's folder or
registered the way a user would — and a model of that type is captured exactly: every layer equal
to its own eager attention, as ``tests/test_families.py`` holds every family."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import attnviz
import attnviz.families as families
from attnviz.engine.specs import support_table
from attnviz.testing import tiny_families, tiny_model
from attnviz.workflows.capture.models import IdsTokenizer

NEW = "neo_copy"
#: what turns GPT-Neo's module into another family's: its model type, its row's name, its tiny config
#: reporting the new model type (transformers builds GPT-Neo's classes for it)
RENAMES = {'"gpt_neo"': f'"{NEW}"', '"GPT-Neo"': '"GPT-Neo, copied"', "rank=130": "rank=5000"}
RETYPED = f'''

def _retyped(config):
    config.model_type = "{NEW}"  # a model type of its own: only this file's facts can tap it
    return config


FACTS = replace(FACTS, tiny={{name: replace(t, config=lambda tf, t=t: _retyped(t.config(tf))) for name, t in FACTS.tiny.items()}})
'''


def write_family(folder: Path) -> Path:
    text = (Path(families.__file__).parent / "gpt_neo.py").read_text()
    for old, new in RENAMES.items():
        assert old in text, old
        text = text.replace(old, new)
    text = text.replace("from .facts import", "from dataclasses import replace\n\nfrom attnviz.families.facts import")
    path = folder / f"{NEW}.py"
    path.write_text(text + RETYPED)
    return path


def captured_exactly() -> None:
    """A padded batch of two texts of the new type, every layer against its own eager attention."""
    model = tiny_model(NEW, attn_implementation="eager")
    assert model.config.model_type == NEW
    texts = ["11 5 7 9 23 4 8 15", "3 99 42 7"]
    caps = attnviz.capture(model, texts, tokenizer=IdsTokenizer())
    for cap, text in zip(caps, texts, strict=True):
        ids = torch.tensor([[int(t) for t in text.split()]])
        with torch.no_grad():
            ref = model(ids, output_attentions=True).attentions
        assert cap.validate().passed and cap.parts == ("decoder",)
        assert cap.layer_indices("decoder") == list(range(len(ref))) == [0, 1]
        for layer, weights in enumerate(ref):
            torch.testing.assert_close(cap.attention(layer, part="decoder"), weights[0], atol=2e-6, rtol=0)


def test_a_family_registered_from_one_file_is_captured_exactly(tmp_path):
    spec = importlib.util.spec_from_file_location(NEW, write_family(tmp_path))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = tiny_model("gpt_neo", attn_implementation="eager")
    model.config.model_type = NEW
    with pytest.raises(attnviz.UnsupportedModelError):  # unregistered: its inline attention is not tapped
        attnviz.capture(model, "11 5 7", tokenizer=IdsTokenizer())
    with families.registered(module.FACTS):
        assert NEW in families.PROJECTION_SPECS and NEW in tiny_families()
        assert "| GPT-Neo, copied | projection hooks |" in support_table().splitlines()[-1]  # rank 5000: last
        captured_exactly()
    assert NEW not in families.PROJECTION_SPECS and NEW not in tiny_families()
    assert "GPT-Neo, copied" not in support_table()


def test_a_file_dropped_into_the_families_folder_is_discovered(tmp_path, monkeypatch):
    write_family(tmp_path)
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    try:
        families.discover()
        captured_exactly()
    finally:
        module = sys.modules.pop(f"attnviz.families.{NEW}", None)
        if module is not None:
            families.unregister(module.FACTS)
    assert NEW not in families.TINY


def test_a_model_type_is_registered_once():
    with pytest.raises(attnviz.InputError, match="'gpt_neo' is registered already"):
        families.register(families.facts.Facts(projection_specs={"gpt_neo": families.PROJECTION_SPECS["gpt_neo"]}))
