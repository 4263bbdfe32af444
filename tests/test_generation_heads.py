"""generate(heads=...): a generation keeps only some query heads, every step's rows those of a full generation.

The independent reference is a full generation of the same prompt (itself proved against the model's own
generate, a prefill and its eager weights in tests/test_generation.py): the kept heads' tensors equal its
same heads bit for bit, at every step.
"""

from __future__ import annotations

import pytest
import torch
from test_heads import BAD_HEADS

import attnviz
from attnviz.figures import step_figure
from attnviz.figures.helpers import step_summary
from attnviz.workflows.capture.models import IdsTokenizer

PROMPT = "11 5 7 9 13 21 34 55 89"
N_NEW = 5
KEPT = [1, 2]  # tiny Llama: 4 query heads over 2 KV heads — head 1 reads KV 0, head 2 reads KV 1


def _generate(model, **kwargs):
    extra = {"min_new_tokens": N_NEW} if model.config.model_type == "bart" else {}
    return attnviz.generate(model, PROMPT, IdsTokenizer(), max_new_tokens=N_NEW, **extra, **kwargs)


CASES = [("llama", "sdpa"), ("gpt2", "eager"), ("t5", "sdpa"), ("bart", "eager")]


@pytest.mark.parametrize("check", ["sample", "full"])
@pytest.mark.parametrize("family,backend", CASES, ids=[f"{f}-{b}" for f, b in CASES])
def test_the_kept_heads_of_a_generation_are_a_full_generation_s_same_heads(tiny, family, backend, check):
    """Same tokens; Q, K, V, the kernel's outputs, the maps and every step's two rows of the kept heads equal
    those of a full generation exactly (decoder self- and cross-attention, and the encoder, for T5 and BART)."""
    model = tiny(family, backend)
    full = _generate(model, check=check)
    kept = _generate(model, check=check, heads=KEPT)
    assert kept.ids.tolist() == full.ids.tolist() and kept.text == full.text
    a, b = full.capture, kept.capture
    assert b.model["heads"] == KEPT and "heads" not in a.model
    assert b.model["check_error"] == pytest.approx(a.model["check_error"], rel=1e-6, abs=1e-12)  # every head checked
    assert a.parts == b.parts
    for part in a.parts:
        assert b.kept_heads(part) == KEPT
        for layer in a.layer_indices(part):
            rec, ref = b.layer(layer, part), a.layer(layer, part)
            assert rec.heads == KEPT and rec.q.shape[0] == len(KEPT)
            n_kv = ref.k.shape[0]
            assert rec.kv_heads == [h // (ref.q.shape[0] // n_kv) for h in KEPT]
            assert rec.k.shape[0] == len(set(rec.kv_heads))  # under GQA the KV heads read, no more
            torch.testing.assert_close(rec.out, ref.out[KEPT], rtol=0, atol=0)  # every step's kernel output
            torch.testing.assert_close(
                b.attention(layer, part=part), a.attention(layer, part=part)[KEPT], rtol=0, atol=0
            )
            for head in KEPT:
                for name in ("q", "k", "v"):
                    ours, theirs = getattr(b, name)(layer, part, head), getattr(a, name)(layer, part, head)
                    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
                torch.testing.assert_close(
                    b.moved(layer, head, part=part), a.moved(layer, head, part=part), rtol=0, atol=0
                )
    for i in range(len(full)):  # every step, by the model's head numbers
        ours, theirs = kept.step(i), full.step(i)
        assert ours.heads == KEPT and theirs.heads is None and ours.head_numbers == KEPT
        torch.testing.assert_close(ours.weights, theirs.weights[:, KEPT], rtol=0, atol=0)
        torch.testing.assert_close(ours.chosen_by, theirs.chosen_by[:, KEPT], rtol=0, atol=0)
        for head in KEPT:
            assert ours.top(3, head=head) == theirs.top(3, head=head)
    assert b.validate().passed


def test_a_gqa_generation_keeps_one_key_value_head_for_a_group(tiny):
    """Tiny Llama: heads 0 and 1 read KV head 0 only, so the generation keeps one K and one V per layer."""
    model = tiny("llama")
    full, kept = _generate(model), _generate(model, heads=[0, 1])
    for layer in full.capture.layer_indices():
        rec = kept.capture.layer(layer)
        assert rec.kv_heads == [0, 0] and rec.k.shape[0] == rec.v.shape[0] == 1
        torch.testing.assert_close(rec.k[0], full.capture.layer(layer).k[0], rtol=0, atol=0)
        torch.testing.assert_close(rec.v[0], full.capture.layer(layer).v[0], rtol=0, atol=0)


def test_a_step_reads_a_kept_head_and_refuses_a_dropped_one(tiny, tmp_path):
    """``.step(i)``, its top keys, figure and summary take the model's head numbers; a dropped head is a
    HeadNotKeptError naming those kept, one outside the model an InputError — also read back from a file."""
    model = tiny("gpt2")
    full, kept = _generate(model), _generate(model, heads=[1, 3])
    step, ref = kept.step(2), full.step(2)
    assert step.weights.shape == (2, 2, step.position + 1)
    torch.testing.assert_close(step.weights[1, 1], ref.weights[1, 3], rtol=0, atol=0)  # head 3 stacked second
    assert step.top(2, layer=1, head=3) == ref.top(2, layer=1, head=3)
    fig, ref_fig = step_figure(kept, step, 1, 3), step_figure(full, ref, 1, 3)
    assert fig.data[0].y.tolist() == ref_fig.data[0].y.tolist() and fig.data[2].y.tolist() == ref_fig.data[2].y.tolist()
    assert fig.data[1].name == "mean of L1's 2 kept heads"  # the line: the mean of the kept heads
    torch.testing.assert_close(torch.tensor(fig.data[3].y), ref.weights[1, [1, 3]].mean(0).round(decimals=5))
    assert "at L1·H3" in step_summary(kept, step, 1, 3)
    dropped = r"head 2 was not kept: this generation kept heads 1, 3 .*generate again with heads=None or including 2"
    for call in (
        lambda: step.top(head=2),
        lambda: step_figure(kept, step, 1, 2),
        lambda: step_summary(kept, step, 0, 2),
        lambda: kept.to_pandas(head=2),
    ):
        with pytest.raises(attnviz.HeadNotKeptError, match=dropped):
            call()
    with pytest.raises(attnviz.InputError, match=r"head 4 is out of range: heads 0\.\.3"):
        step.top(head=4)
    with pytest.raises(attnviz.HeadNotKeptError, match="head 2 was not kept"):
        kept.capture.attention(0, 2)
    back = attnviz.Generation.of(attnviz.load(kept.save(tmp_path / "kept.attnviz")))  # what the page opens
    assert back.step(2).heads == [1, 3]
    torch.testing.assert_close(back.step(2).weights, step.weights, rtol=0, atol=0)
    assert kept.to_pandas(head=3).equals(full.to_pandas(head=3))


def test_per_layer_heads_step_only_when_every_layer_stacks_the_same(tiny):
    model = tiny("llama")
    same = _generate(model, heads={0: [2], 1: [2]})
    assert same.step(0).heads == [2] and same.capture.model["heads"] == {"0": [2], "1": [2]}
    mixed = _generate(model, heads={1: [2]})  # layer 0 keeps every head
    assert mixed.capture.layer(0).heads is None and mixed.capture.layer(1).heads == [2]
    with pytest.raises(attnviz.InputError, match=r"keeps different heads in different layers .*attention_rows"):
        mixed.step(0)


@pytest.mark.parametrize("heads, error, message", BAD_HEADS)
def test_heads_that_cannot_be_kept_are_refused_before_the_model_generates(tiny, heads, error, message, monkeypatch):
    model = tiny("llama")
    ran = []
    monkeypatch.setattr(type(model), "generate", lambda *a, **k: ran.append(1))
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: ran.append(1))
    with pytest.raises(error, match=message):
        attnviz.generate(model, PROMPT, IdsTokenizer(), heads=heads)
    assert not ran


@pytest.mark.slow
def test_the_command_line_generates_with_heads(tmp_path, capsys):
    from attnviz.cli import main

    path = tmp_path / "gen.attnviz"
    argv = ["generate", "smollm2", "The cat sat on the", "--max-new-tokens", "2", "--heads", "3,7", "--steps"]
    assert main([*argv, "-o", str(path)]) == 0
    assert "mean over heads 3,7" in capsys.readouterr().out
    gen = attnviz.Generation.of(attnviz.load(path))
    assert gen.capture.kept_heads() == [3, 7] and gen.capture.layer(0).q.shape[0] == 2 and len(gen) == 2
    assert gen.capture.layer(0).kv_heads == [1, 2]  # SmolLM2: 9 query heads over 3 KV heads


def test_the_command_line_refuses_heads_out_of_range_before_the_weights(capsys, monkeypatch):
    from attnviz.cli import main

    def refuse(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before --heads was checked")

    monkeypatch.setattr("attnviz.workflows.capture.pipeline.load_model", refuse)
    with pytest.raises(SystemExit) as stop:  # argparse's own one line
        main(["generate", "smollm2", "The cat", "--heads", "a"])
    assert stop.value.code == 2 and "--heads takes comma-separated integers like 3,7" in capsys.readouterr().err
    assert main(["generate", "smollm2", "The cat", "--heads", "99"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--heads: head 99 is out of range: smollm2 has heads 0..8" in err, err


@pytest.mark.browser
def test_a_saved_generation_of_some_heads_replays_them_by_their_numbers_on_the_page(dash_duo, tmp_path, smol_tokenizer):
    """The page opens a generation of heads 1 and 3: the lab's head selector offers H1 and H3, the step slider's
    line and figure name the head picked by its number, and H3's bars are the model's head 3."""
    from attnviz.dashboard import create_app
    from attnviz.dashboard.ids import GID, ID
    from test_dashboard import MODELS, choose, no_console_errors, open_tab, wait_status

    model = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer), max_position_embeddings=64)
    gen = attnviz.generate(model, "The cat sat on the mat because", smol_tokenizer, max_new_tokens=4, heads=[1, 3])
    path = gen.save(tmp_path / "kept.attnviz")
    dash_duo.start_server(create_app(MODELS, capture_file=str(path)))
    wait_status(dash_duo, "generated 4 new tokens")
    open_tab(dash_duo, "AttentionLab")
    dash_duo.wait_for_contains_text(f"#{GID.step_text}", "·H1")  # the first kept head, by its number
    choose(dash_duo, f"#{ID.head}", 1)
    dash_duo.wait_for_contains_text(f"#{GID.step_text}", "·H3")
    dash_duo.wait_for_contains_text(f"#{GID.step_graph} .gtitle", "·H3 bars")
    layer = int(dash_duo.find_element(f"#{GID.step_text}").text.split("at L")[1].split("·")[0])
    bars = dash_duo.driver.execute_script(
        f"return Array.from(document.querySelector('#{GID.step_graph} .js-plotly-plot')._fullData[2].y);"
    )
    step = gen.step(0)
    assert bars == pytest.approx(step.weights[step.layers.index(layer), 1].tolist(), abs=1e-5)  # head 3, stacked 2nd
    no_console_errors(dash_duo)
