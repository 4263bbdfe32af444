"""The support sweep over what the support table claims: every family of it, on each backend the table
names, built tiny and captured in a padded batch, equals the model's own eager attention within
``sweep.EXACT`` at every part, layer and head — and the sweep's section of the docs' support page is
written by its script (``python -m attnviz.testing.sweep --write``), between its marks.
"""

from pathlib import Path

import pytest
import torch
import transformers

from attnviz.families import FAMILIES
from attnviz.testing import sweep, sweep_table, sweep_towers

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
def test_every_claimed_family_is_exact_against_its_own_eager_attention():
    outcomes = sweep.claimed()
    assert {(o.family, o.backend) for o in outcomes} == {
        (f.tiny, b) for f in FAMILIES if f.how != "refused" and f.tiny for b in f.backends
    }
    not_exact = [o.line() for o in outcomes if o.kind != "exact"]
    assert not not_exact, "claimed but not exact:\n" + "\n".join(not_exact)
    assert all(o.error is not None and o.error <= sweep.EXACT for o in outcomes)


@pytest.mark.slow
def test_every_vision_encoder_is_exact_on_a_batch_of_two_pictures():
    outcomes = sweep.vision()
    assert {o.family for o in outcomes} == {"vit", "deit", "dinov2", "dinov2_registers", "clip_vision", "siglip_vision"}
    assert len(outcomes) == 12  # eager and sdpa each
    not_exact = [o.line() for o in outcomes if o.kind != "exact"]
    assert not not_exact, "not exact:\n" + "\n".join(not_exact)


@pytest.mark.slow
def test_every_model_of_two_towers_is_exact_in_each_part():
    """Joint CLIP and SigLIP (text and vision towers), LLaVA and Idefics3 (language model and vision tower), two
    padded texts with two pictures, each part against the model's own eager attention."""
    outcomes = sweep_towers.towers()
    assert {(o.family, o.backend) for o in outcomes} == {
        (f, b) for f in ("clip (joint)", "siglip (joint)", "llava", "idefics3") for b in ("eager", "sdpa")
    }
    not_exact = [o.line() for o in outcomes if o.kind != "exact"]
    assert not not_exact, "not exact:\n" + "\n".join(not_exact)
    assert "**The models of two towers**" in sweep_table.markdown(outcomes, outcomes, outcomes, [], outcomes)


@pytest.mark.slow
def test_a_wrong_number_of_two_towers_is_a_mismatch_not_exact():
    (eager, sdpa) = sweep_towers.towers(["clip (joint)"], compare=lambda caps, own: 1e-3)
    assert eager.kind == sdpa.kind == "mismatch" and eager.error == 1e-3 and "max error 1.0e-03" in eager.reason


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["gemma3_text", "modernbert", "mixtral"])
def test_the_generic_tiny_build_reaches_families_no_other_test_names(model_type):
    """The sweep of transformers' families builds a family from its config's generic fields and
    compares it on both backends (alternating local/global layers, mixtures of experts)."""
    outcomes, _ = sweep.transformers_families([model_type])
    assert [(o.backend, o.kind) for o in outcomes] == [("eager", "exact"), ("sdpa", "exact")], outcomes


def test_a_wrong_number_is_a_mismatch_not_exact(monkeypatch):
    """The classification can fail: a comparison off by more than EXACT is a mismatch with its error."""
    monkeypatch.setattr(sweep, "compare", lambda eager, model: 1e-3)
    (outcome,) = sweep.claimed(["llama"])[:1]
    assert outcome.kind == "mismatch" and outcome.error == 1e-3 and "> 1e-06" in outcome.reason


def test_the_section_names_an_outcome_without_a_number_by_its_kind_and_reason():
    """A vision encoder or a model of two towers refused (no error number) is listed, not a crash."""
    exact = sweep.Outcome("vit", "eager", "exact", 0.0)
    refused = sweep.Outcome("vit", "sdpa", "refused", reason="no such backend")
    section = sweep_table.markdown([exact], [exact, refused], [], [], [exact, refused])
    assert "1 of 2 family × backend pairs exact" in section
    assert section.startswith(f"Measured with transformers {transformers.__version__} and torch {torch.__version__}")
    assert "vit (sdpa) refused: no such backend" in section and "vit (eager 0e+00, sdpa refused)" in section


def test_the_support_page_holds_the_sweeps_section_between_its_marks():
    for path in (ROOT / sweep_table.PAGE,):
        text = path.read_text()
        assert text.count(sweep_table.MARK) == 2, path
        section = text.split(sweep_table.MARK)[1]
        assert (
            "Measured with transformers " in section
            and "**The claimed families:**" in section
            and "**The vision encoders**" in section
            and f"of {_pairs()} family × backend pairs exact" in section
        )


def _pairs() -> int:
    return sum(len(f.backends) for f in FAMILIES if f.how != "refused" and f.tiny)
