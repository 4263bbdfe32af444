"""The command line and the public surface."""

import subprocess
import sys

import pandas as pd
import pytest

import attnviz
from attnviz.cli import main


def test_all_is_sorted_and_complete():
    """Every public name attnviz offers — classes, functions, constants, lower-case too — is in
    ``__all__``, and nothing in it is missing; submodules are reached as attributes."""
    import types

    assert attnviz.__all__ == sorted(attnviz.__all__)
    for name in attnviz.__all__:
        assert hasattr(attnviz, name), name
    public = {n for n, v in vars(attnviz).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public == set(attnviz.__all__), public ^ set(attnviz.__all__)
    assert {"Capture", "AttnvizError", "capture", "load", "tap", "evaluate_probes"} <= public


@pytest.mark.parametrize("name", ["tiny_model", "tiny_families", "tiny_processor"])
def test_the_tiny_models_left_the_api_and_their_old_names_warn_for_a_release(name):
    """The tiny models are for tests (``attnviz.testing``): the old top-level name still gives the same
    function, with a DeprecationWarning naming the new one."""
    assert name not in attnviz.__all__
    with pytest.warns(DeprecationWarning, match=rf"attnviz\.{name} is deprecated .* use attnviz\.testing\.{name}"):
        old = getattr(attnviz, name)
    assert old is getattr(attnviz.testing, name)


def test_import_has_no_side_effects():
    code = (
        "import sys, attnviz; "
        "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as A; "
        "assert 'dash' not in sys.modules, 'dash imported'; "
        "assert A._local_mapping == {}, A._local_mapping"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_error_is_an_attnviz_error():
    for name in attnviz.__all__:
        obj = getattr(attnviz, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, attnviz.AttnvizError)


@pytest.mark.slow
def test_cli_capture_query_save_and_validate(tmp_path, capsys):
    out = tmp_path / "cat.attnviz"
    assert (
        main(
            [
                "capture",
                "minilm",
                "The cat sat on the mat because it was tired.",
                "--query",
                "it",
                "--layer",
                "5",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "attention from 'it' in layer 5" in printed and "H11: cat=" in printed and out.exists()
    assert main(["validate", "--capture", str(out), "--csv", str(tmp_path / "errors.csv")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("attnviz validation PASS: minilm, 6 layers × 12 heads")
    assert (tmp_path / "errors.csv").read_text().startswith("part,layer,head,quantity,rows,max_abs_error")


def test_cli_validate_of_a_text_checks_what_a_capture_checks(tmp_path, capsys):
    """``attnviz validate MODEL TEXT`` once captured with the check off: no weights compared on eager (while
    it told the user to load eager) and no output projection's line; a capture in Python had both."""
    text = "A sentence of mine."
    assert main(["validate", "minilm", text, "--attn-implementation", "eager", "--csv", str(tmp_path / "e.csv")]) == 0
    printed = capsys.readouterr().out
    ours = attnviz.capture("minilm", text, attn_implementation="eager").validate()
    assert printed.splitlines()[0] == str(ours)
    assert "A vs the model's weights" in printed and "vs the model's output projection" in printed
    assert "not produced by the eager backend" not in printed
    quantities = set(pd.read_csv(tmp_path / "e.csv")["quantity"])
    assert quantities == set(ours.to_pandas()["quantity"]) and "weights" in quantities, quantities


def test_cli_errors_are_messages_not_tracebacks(tmp_path, capsys):
    assert main(["validate", "--capture", str(tmp_path / "missing.attnviz")]) == 2
    assert capsys.readouterr().err.startswith("error: no capture file at")
    assert main(["capture", "no-such/model-xyz", "hi"]) == 2
    assert "could not load model 'no-such/model-xyz'" in capsys.readouterr().err


def test_cli_help_lists_the_commands():
    result = subprocess.run([sys.executable, "-m", "attnviz", "--help"], capture_output=True, text=True, check=True)
    for command in ("capture", "validate", "app"):
        assert command in result.stdout


@pytest.mark.slow
def test_cli_coref_and_probes(tmp_path, capsys):
    assert (
        main(
            [
                "coref",
                "smollm2",
                "我家的小猫很可爱，它很好动。",
                "--pronoun",
                "它",
                "--candidates",
                "小猫,我家",
                "--top",
                "3",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("'它' → 小猫 / 我家 over 270 heads of smollm2 (leaving out '我₁' and renormalising each row)")
    assert "prepend a BOS" in out
    per_probe = tmp_path / "picks.csv"
    assert (
        main(
            ["probes", "minilm", "en", "--top", "2", "--csv", str(tmp_path / "acc.csv"), "--per-probe", str(per_probe)]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "42 probes on minilm" in out and "nearest candidate 50.0 %, first candidate 50.0 %" in out
    assert "heads beat chance after Holm" in out and "held out:" in out
    assert pd.read_csv(per_probe).shape[0] == 42
    assert (tmp_path / "acc.csv").read_text().startswith("layer,head,accuracy,correct,n")
