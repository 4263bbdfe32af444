"""Heads over training (issue #45): the head atlas over a run's checkpoints, checkpoint identity, and two models'
heads matched.

A real run: ``examples/train_induction.py`` trains a 2-layer attention-only Llama on repeated random halves
from a fixed seed (400 steps, a checkpoint every 50: some ten seconds on two cores). The timeline must see the
induction head form — the best induction score below 0.2 at step 0, above 0.5 at the end — with a
previous-token head present at or before the step it crosses; every score must be the one ``head_atlas`` gives
that checkpoint loaded alone, and the last checkpoint's induction score the one read from the model's own eager
attention weights (``output_attentions``), an independent reference.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import attnviz
from attnviz.analysis import head_atlas
from attnviz.workflows.capture.models import IdsTokenizer
from attnviz.workflows.corpus.atlas import random_repeats
from attnviz.workflows.corpus.timeline import find_checkpoints, weights_hash

ROOT = Path(__file__).resolve().parent.parent
STEPS, EVERY = 400, 50
SEQUENCES = 8  # the atlas' repeated random sequences (of the script's HALF tokens, twice)


def _script():
    spec = importlib.util.spec_from_file_location("train_induction", ROOT / "examples" / "train_induction.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return _script()


@pytest.fixture(scope="module")
def run(tmp_path_factory, script):
    """The trained run's folder, its checkpoint folders and the seconds training took."""
    folder = tmp_path_factory.mktemp("run") / "induction"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small gains nothing from a second thread, and the cores are shared
    try:
        started = time.perf_counter()
        saved = script.train(folder, steps=STEPS, save_every=EVERY, seed=0, log=lambda line: None)
        return folder, saved, time.perf_counter() - started
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def timeline(run, script):
    folder, _, _ = run
    return attnviz.head_timeline(
        folder,
        script.corpus_texts(),
        random_length=script.HALF,
        random_sequences=SEQUENCES,
        batch_size=8,
        progress=False,
    )


def _kwargs(script) -> dict:
    return dict(random_length=script.HALF, random_sequences=SEQUENCES, batch_size=8, progress=False)


def test_the_run_saves_trainer_style_checkpoints_in_under_two_minutes(run):
    folder, saved, seconds = run
    assert [p.name for p in saved] == [f"checkpoint-{s}" for s in range(0, STEPS + 1, EVERY)]  # ≥ 6 checkpoints
    state = json.loads((saved[-1] / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS and len(state["log_history"]) == STEPS
    assert seconds < 120, f"training took {seconds:.0f} s"
    print(f"trained {STEPS} steps in {seconds:.1f} s")


def test_the_induction_head_forms_after_a_previous_token_head(timeline):
    best = timeline.groupby(["step", "role"])["score"].max().unstack()
    steps = sorted(best.index)
    assert best.loc[steps[0], "induction"] < 0.2 and best.loc[steps[-1], "induction"] > 0.5
    crossing = next(s for s in steps if best.loc[s, "induction"] > 0.5)
    previous = timeline[(timeline.role == "previous_token") & timeline.passes & (timeline.step <= crossing)]
    assert not previous.empty, "no previous-token head at or before the induction head"
    # the induction heads are in the second layer, the previous-token head in the first
    last = timeline[(timeline.step == steps[-1]) & timeline.passes]
    assert set(last[last.role == "induction"].layer) == {1}
    assert set(last[last.role == "previous_token"].layer) == {0}
    assert set(timeline.role) == set(attnviz.analysis.ROLES) - {"coreference"}
    assert timeline.attrs["steps"] == steps and timeline.attrs["duplicates"] == []
    print(best[["previous_token", "induction"]].round(3).to_string())


def test_every_score_is_the_atlas_of_that_checkpoint_loaded_alone(timeline, run, script):
    _, saved, _ = run
    texts = script.corpus_texts()
    for folder in saved:
        alone = head_atlas(str(folder), texts, **_kwargs(script))
        rows = timeline[timeline.checkpoint == folder.name]
        assert rows.weights_hash.nunique() == 1
        for role, group in rows.groupby("role"):
            expected = alone.sort_values(["layer", "head"])[role].to_numpy()
            got = group.sort_values(["layer", "head"]).score.to_numpy()
            np.testing.assert_array_equal(got, expected, err_msg=f"{folder.name} {role}")
            assert (group.threshold == attnviz.analysis.ROLES[role].threshold).all()


def test_the_induction_score_is_the_models_own_eager_weights(timeline, run, script):
    _, saved, _ = run
    model = script.model_for()
    model = type(model).from_pretrained(saved[-1], attn_implementation="eager").eval()
    tokenizer = script.tokenizer_for()
    half = script.HALF
    expected = np.zeros((2, 4))
    rows = len(tokenizer)
    for ids, _, _ in random_repeats(tokenizer, rows, SEQUENCES, half, seed=0):
        assert len(ids) == 2 * half  # no special tokens: the second copy starts at half
        with torch.no_grad():
            maps = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
        for layer, m in enumerate(maps):  # each second-copy token → the one after its earlier copy
            expected[layer] += m[0, :, half + torch.arange(half), torch.arange(half) + 1].sum(-1).double().numpy()
    expected /= SEQUENCES * half
    last = timeline[(timeline.checkpoint == saved[-1].name) & (timeline.role == "induction")]
    got = last.sort_values(["layer", "head"]).score.to_numpy().reshape(2, 4)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_the_corpus_is_tokenized_once_for_every_checkpoint(run, script, tokenizer_calls):
    _, saved, _ = run
    texts = script.corpus_texts()
    calls = tokenizer_calls(script.tokenizer_for())
    df = attnviz.head_timeline(saved[:3], texts, roles="induction,previous_token", **_kwargs(script))
    assert df.checkpoint.nunique() == 3
    assert sum(1 for c in calls if c == texts) == 1, "the corpus was tokenized more than once"
    assert not any(isinstance(c, list) and c != texts for c in calls)


def test_a_copied_checkpoint_is_flagged_as_the_same_weights(run, script, tmp_path):
    _, saved, _ = run
    copied = tmp_path / "checkpoint-450"
    shutil.copytree(saved[-1], copied)
    state = json.loads((copied / "trainer_state.json").read_text())
    (copied / "trainer_state.json").write_text(json.dumps({**state, "global_step": 450}))
    with pytest.warns(
        UserWarning, match=r"'checkpoint-400' \(step 400\) and 'checkpoint-450' \(step 450\) hold the same"
    ):
        df = attnviz.head_timeline(
            [saved[0], saved[-1], copied], script.corpus_texts(), roles="induction", **_kwargs(script)
        )
    flags = df.groupby("checkpoint").same_weights_as.first()
    assert flags.to_dict() == {"checkpoint-0": "", "checkpoint-400": "", "checkpoint-450": "checkpoint-400"}
    assert df.attrs["duplicates"] == [("checkpoint-400", "checkpoint-450")]
    hashes = df.groupby("checkpoint").weights_hash.first()
    assert hashes["checkpoint-400"] == hashes["checkpoint-450"] != hashes["checkpoint-0"]


def test_the_weights_hash_follows_the_weights():
    a = attnviz.testing.tiny_model("llama")
    b = copy.deepcopy(a)
    assert weights_hash(a) == weights_hash(b)
    with torch.no_grad():
        b.model.layers[1].self_attn.o_proj.weight[0, 0] += 1e-6
    assert weights_hash(a) != weights_hash(b)


def test_checkpoints_are_ordered_by_step_not_by_name(tmp_path):
    for name, step in (
        ("checkpoint-5", None),
        ("checkpoint-40", None),
        ("checkpoint-100", None),
        ("checkpoint-7", 1000),
    ):
        (tmp_path / name).mkdir()
        if step is not None:
            (tmp_path / name / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "runs").mkdir()  # not a checkpoint
    found = find_checkpoints(tmp_path)
    assert [(c.name, c.step) for c in found] == [
        ("checkpoint-5", 5),
        ("checkpoint-40", 40),
        ("checkpoint-100", 100),
        ("checkpoint-7", 1000),
    ]
    revisions = find_checkpoints("EleutherAI/pythia-70m", ["step1000", "step143000"])
    assert [(c.step, c.model, c.revision) for c in revisions] == [
        (1000, "EleutherAI/pythia-70m", "step1000"),
        (143000, "EleutherAI/pythia-70m", "step143000"),
    ]


def test_bad_checkpoints_are_refused_with_what_to_do(tmp_path, run, script):
    with pytest.raises(attnviz.InputError, match="holds no checkpoint-\\*/ folder and no model"):
        attnviz.head_timeline(tmp_path, ["1 2 3"])
    with pytest.raises(attnviz.InputError, match="is not a folder: give a run folder"):
        attnviz.head_timeline(tmp_path / "nowhere", ["1 2 3"])
    with pytest.raises(attnviz.InputError, match="give checkpoints= the hub name"):
        attnviz.head_timeline([tmp_path], ["1 2 3"], revisions=["step1"])
    # a checkpoint whose tokenizer differs from the first one's
    _, saved, _ = run
    other = tmp_path / "checkpoint-999"
    shutil.copytree(saved[-1], other)
    script.tokenizer_for(vocab=40).save_pretrained(other)
    with pytest.raises(
        attnviz.InputError, match="the tokenizer of 'checkpoint-999' differs from that of 'checkpoint-0'"
    ):
        attnviz.head_timeline([saved[0], other], script.corpus_texts(), roles="induction", **_kwargs(script))


def test_a_stopped_timeline_resumes_from_its_checkpoint(run, script, tmp_path):
    _, saved, _ = run
    texts, kept = script.corpus_texts(), tmp_path / "timeline.ckpt"
    args = dict(roles="induction,previous_token", **_kwargs(script))
    whole = attnviz.head_timeline(saved[:4], texts, **args)
    per = len(texts) + 1
    sent = []

    def signal_in_the_third(done, total):
        assert total == 4 * per
        if done > 2 * per and not sent:  # inside the third checkpoint's atlas
            sent.append(done)
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(attnviz.Interrupted, match="stopped by SIGTERM: 2 checkpoints' atlases saved") as stopped:
        attnviz.head_timeline(saved[:4], texts, checkpoint=kept, on_progress=signal_in_the_third, **args)
    assert stopped.value.checkpoint == kept and kept.is_file()
    with pytest.raises(attnviz.InputError, match="exists: pass resume=True"):
        attnviz.head_timeline(saved[:4], texts, checkpoint=kept, **args)
    with pytest.raises(attnviz.InputError, match="other settings"):
        attnviz.head_timeline(saved[:4], texts, checkpoint=kept, resume=True, **{**args, "seed": 1})
    resumed = attnviz.head_timeline(saved[:4], texts, checkpoint=kept, resume=True, **args)
    assert resumed.attrs["resumed_after"] == 2
    assert resumed.equals(whole)


# ------------------------------------------------------------------------------------------- two models side by side
HEADS, D_HEAD = 4, 8
PERMUTATIONS = [[2, 0, 3, 1], [1, 3, 0, 2]]  # model B's head j is model A's head PERMUTATIONS[layer][j]


@pytest.fixture(scope="module")
def permuted():
    """A tiny Llama (4 query and 4 key-value heads, sharpened queries and keys so heads differ) and the same
    model with each layer's heads shuffled: the Q, K, V rows and the output projection's columns of each head
    moved together, so the model computes the same function."""
    a = attnviz.testing.tiny_model("llama", num_key_value_heads=HEADS, attn_implementation="eager")
    with torch.no_grad():
        for layer in a.model.layers:
            layer.self_attn.q_proj.weight.mul_(6)
            layer.self_attn.k_proj.weight.mul_(6)
    b = copy.deepcopy(a)
    with torch.no_grad():
        for layer, perm in zip(b.model.layers, PERMUTATIONS):
            att, order = layer.self_attn, torch.tensor(perm)
            for linear in (att.q_proj, att.k_proj, att.v_proj):
                linear.weight.copy_(linear.weight.view(HEADS, D_HEAD, -1)[order].reshape(HEADS * D_HEAD, -1))
            att.o_proj.weight.copy_(att.o_proj.weight.view(-1, HEADS, D_HEAD)[:, order].reshape(-1, HEADS * D_HEAD))
    g = torch.Generator().manual_seed(0)
    texts = [" ".join(map(str, torch.randint(0, 128, (n,), generator=g).tolist())) for n in (12, 20, 9, 30)]
    ids = torch.tensor([[int(x) for x in texts[3].split()]])
    with torch.no_grad():
        torch.testing.assert_close(a(ids).logits, b(ids).logits, atol=1e-5, rtol=0)  # the same function
    return a, b, texts


@pytest.mark.parametrize("measure", ["js", "cosine"])
def test_align_heads_recovers_a_known_permutation_of_heads(permuted, measure):
    a, b, texts = permuted
    result = attnviz.align_heads(a, b, texts, tokenizer=IdsTokenizer(), measure=measure)
    expected = [np.argsort(perm).tolist() for perm in PERMUTATIONS]
    assert [result.permutation(layer) for layer in range(2)] == expected
    assert (result.matching.similarity > 1 - 1e-6).all()
    assert result.counts() == {"kept": 8, "changed": 0, "no match": 0}
    assert (result.matching.roles_a == result.matching.roles_b).all()
    # every other pair is less alike than the matched one
    for layer, perm in enumerate(expected):
        sim = result.similarity[layer]
        off = sim.copy()
        off[np.arange(HEADS), perm] = -1
        assert off.max() < 1 - 1e-4


def test_align_heads_across_layers_keeps_each_head_in_its_layer(permuted):
    a, b, texts = permuted
    result = attnviz.align_heads(a, b, texts, tokenizer=IdsTokenizer(), across_layers=True, atlas=False)
    assert (result.matching.layer_a == result.matching.layer_b).all()
    assert [result.permutation(layer) for layer in range(2)] == [np.argsort(p).tolist() for p in PERMUTATIONS]
    assert result.across is not None and result.across.shape == (2, HEADS, 2, HEADS)


def test_align_heads_says_which_heads_changed_their_role_or_have_no_match(permuted):
    a, _, texts = permuted
    b = copy.deepcopy(a)
    with torch.no_grad():  # layer 1, head 2 made to look at the token before: its rows change
        b.model.layers[1].self_attn.q_proj.weight[2 * D_HEAD : 3 * D_HEAD].mul_(0)
    result = attnviz.align_heads(a, b, texts, tokenizer=IdsTokenizer(), threshold=0.99)
    row = result.matching.set_index(["layer_a", "head_a"]).loc[(1, 2)]
    assert row.status == "no match" and row.similarity < 0.99
    kept = result.matching[result.matching.layer_a == 0]
    assert (kept.status == "kept").all()


def test_align_heads_refuses_models_of_other_shapes(permuted):
    a, _, texts = permuted
    other = attnviz.testing.tiny_model("llama", num_key_value_heads=2, num_attention_heads=2)
    with pytest.raises(attnviz.InputError, match="4 heads and .* 2 × 2: align models of the same shape|same shape"):
        attnviz.align_heads(a, other, texts, tokenizer=IdsTokenizer(), atlas=False)
    with pytest.raises(attnviz.InputError, match="measure must be one of js, cosine"):
        attnviz.align_heads(a, a, texts, tokenizer=IdsTokenizer(), measure="kl")


# ------------------------------------------------------------------------------------------------- the command line
def test_atlas_checkpoints_writes_the_timeline_the_api_gives(run, script, tmp_path, capsys):
    import pandas as pd

    from attnviz.cli import main

    _, saved, _ = run
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(script.corpus_texts()) + "\n")
    out = tmp_path / "timeline.csv"
    listed = ",".join(str(p) for p in saved[:3])
    assert (
        main(["atlas", "--checkpoints", listed, str(corpus), "--roles", "induction,sink", "-o", str(out), "--quiet"])
        == 0
    )
    err = capsys.readouterr().err
    assert "3 checkpoints (steps 0–100), 24 texts; first head per role:" in err
    expected = attnviz.head_timeline(saved[:3], script.corpus_texts(), roles="induction,sink", progress=False)
    got = pd.read_csv(out, keep_default_na=False)
    assert list(got.columns) == list(expected.columns)
    np.testing.assert_allclose(got.score.to_numpy(), expected.score.to_numpy(), rtol=1e-12)
    assert got.checkpoint.tolist() == expected.checkpoint.tolist()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["atlas", "smollm2", "c.txt", "--checkpoints", "run"], "--checkpoints reads the checkpoints' own weights"),
        (["atlas", "c.txt", "--revisions", "step1"], "--revisions names a hub model's revisions: give the hub name"),
        (["atlas", "c.txt"], "give MODEL (an embedded alias, hub name or folder), or --checkpoints"),
        (["atlas", "--checkpoints", "run", "c.txt", "-o", "t.html"], "a timeline is a table, give a .csv or .parquet"),
        (["atlas", "--checkpoints", "run", "c.txt", "--resume"], "--resume continues from a checkpoint"),
        (["atlas", "smollm2", "c.txt", "--resume"], "give them with --checkpoints"),
    ],
)
def test_atlas_checkpoints_refuses_bad_arguments_in_one_line(argv, said, capsys, tmp_path, monkeypatch):
    from attnviz.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err


def test_the_figures_draw_the_timelines_numbers_and_first_crossings(timeline, run):
    from attnviz.figures import timeline_lines, timeline_map

    fig = timeline_map(timeline, "induction")
    table = timeline[timeline.role == "induction"].pivot_table(index=["layer", "head"], columns="step", values="score")
    np.testing.assert_array_equal(np.asarray(fig.data[0].z, dtype=float), table.to_numpy())
    assert list(fig.data[0].y) == [f"L{layer}·H{head}" for layer, head in table.index]
    rows = timeline[(timeline.role == "induction") & timeline.passes]
    firsts = rows.groupby(["layer", "head"]).step.min()
    marked = dict(zip(fig.data[1].y, fig.data[1].x))
    assert marked == {f"L{layer}·H{head}": str(step) for (layer, head), step in firsts.items()}
    lines = timeline_lines(timeline, "induction", [(1, 0)], loss=timeline.attrs["loss"])
    (star,) = [t for t in lines.data if t.name == "L1·H0 first crossing"]  # L1·H0 becomes an induction head
    assert star.x[0] == firsts[(1, 0)] and star.text[0] == f"L1·H0 step {firsts[(1, 0)]}"
    assert lines.data[-1].name == "loss" and len(lines.data[-1].x) == STEPS
    with pytest.raises(attnviz.InputError, match="holds no 'coreference' scores"):
        timeline_map(timeline, "coreference")


# ------------------------------------------------------------------------------------------------ the Training tab
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, script):
    """A tiny run of 3 checkpoints (20 steps) and a copy of its last one under another step, and its corpus file."""
    folder = tmp_path_factory.mktemp("tiny") / "run"
    saved = script.train(folder, steps=20, save_every=10, seed=0, d_model=32, heads=2, log=lambda line: None)
    copied = folder / "checkpoint-30"
    shutil.copytree(saved[-1], copied)
    state = json.loads((copied / "trainer_state.json").read_text())
    (copied / "trainer_state.json").write_text(json.dumps({**state, "global_step": 30}))
    corpus = folder.parent / "corpus.txt"
    corpus.write_text("\n".join(script.corpus_texts(4)) + "\n")
    return folder, corpus


@pytest.mark.browser
def test_the_training_tab_reads_a_run_draws_its_roles_and_compares_two_steps(dash_duo, tiny_run):
    from attnviz.dashboard import create_app
    from attnviz.dashboard.training_view import RID
    from test_dashboard import MODELS, no_console_errors, open_tab, poll

    folder, corpus = tiny_run
    dash_duo.start_server(create_app(MODELS, default_model="minilm"))
    open_tab(dash_duo, "Training")
    dash_duo.find_element(f"#{RID.run}").send_keys(str(folder))
    dash_duo.find_element(f"#{RID.corpus}").send_keys(str(corpus))
    dash_duo.find_element(f"#{RID.read}").click()
    dash_duo.wait_for_contains_text(f"#{RID.note}", "4 checkpoints (steps 0–30)", timeout=120)
    # the duplicate weights said on the page, naming both checkpoints
    dash_duo.wait_for_contains_text(f"#{RID.warning}", "'checkpoint-20' (step 20) and 'checkpoint-30' (step 30)")
    dash_duo.wait_for_contains_text(f"#{RID.map} .gtitle", "induction over training", timeout=30)
    # the map's rows are the heads, its columns the steps, its values the timeline's scores
    z = dash_duo.driver.execute_script(  # the values plotly.js drew (decoded from the figure's typed arrays)
        f"const gd = document.getElementById('{RID.map}').querySelector('.js-plotly-plot');"
        "return Array.from(gd._fullData[0].z, row => Array.from(row));"
    )
    expected = attnviz.head_timeline(folder, str(corpus), roles="induction", progress=False)
    table = expected.pivot_table(index=["layer", "head"], columns="step", values="score")
    np.testing.assert_allclose(np.array(z, dtype=float), table.to_numpy(), rtol=1e-9)
    # a head's line, then its map at two steps side by side
    dash_duo.select_dcc_dropdown(f"#{RID.heads}", index=0)
    poll(lambda: "score over training" in dash_duo.find_element(f"#{RID.lines}").text, timeout=30)
    dash_duo.select_dcc_dropdown(f"#{RID.head}", index=1)
    dash_duo.find_element(f"#{RID.compare}").click()
    poll(lambda: "step 0" in dash_duo.find_element(f"#{RID.pair}").text, timeout=60)
    assert "step 30" in dash_duo.find_element(f"#{RID.pair}").text
    # a folder without checkpoints is a message on the page, no exception's name
    box = dash_duo.find_element(f"#{RID.run}")
    box.clear()
    box.send_keys(str(corpus.parent / "nowhere"))
    dash_duo.find_element(f"#{RID.read}").click()
    dash_duo.wait_for_contains_text(f"#{RID.note}", "is not a folder: give a run folder", timeout=30)
    assert "Error" not in dash_duo.find_element(f"#{RID.note}").text
    no_console_errors(dash_duo)
