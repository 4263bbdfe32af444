"""bench/gpu_check.py cannot rot on a machine without a GPU: its refusal, its step runner (errors and
budgets), its table, the parsers of the benches' output, and (slow) the whole flow on the CPU."""

from __future__ import annotations

import importlib.util
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
assert _spec is not None and _spec.loader is not None
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up while the class is made
_spec.loader.exec_module(gpu_check)


@pytest.mark.skipif(torch.cuda.is_available(), reason="proves the refusal on a machine without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_3(tmp_path):
    out = tmp_path / "table.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == gpu_check.NO_CUDA == 3
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        f"gpu_check: no CUDA device here (torch {torch.__version__}, CUDA build None); nothing was run — run it on "
        "a CUDA machine, or pass --device cpu --quick for a smoke test"
    )
    assert not out.exists() and not out.with_suffix(".md.log").exists()


def _sleeps(seconds: float) -> dict:
    time.sleep(seconds)
    return {"result": "woke up"}


def _swallows_everything(_: float) -> dict:
    """A step whose own ``except Exception`` must not keep the budget from ending it."""
    while True:
        try:
            time.sleep(30)
        except Exception:  # noqa: BLE001 - the point of this step
            pass


def _raises(_: float) -> dict:
    raise ValueError("the model is\nnot there")


def test_a_failed_step_is_its_row_and_the_check_goes_on():
    Step = gpu_check.Step
    given: list[float] = []
    steps = [
        Step("a", "measures", 30, lambda s: given.append(s) or {"tokens": 8, "seconds": 1.5, "default_x": 1.02}),
        Step("b", "raises", 30, _raises),
        Step("c", "overruns", 0.2, lambda _: _sleeps(30)),
        Step("d", "swallows", 0.2, _swallows_everything),
        Step("e", "after them", 30, lambda _: {"result": "still ran"}, tag="e-tag"),
    ]
    before = signal.getsignal(signal.SIGALRM)
    echoed: list[str] = []
    rows = gpu_check.run_steps(steps, 60, echo=echoed.append)
    assert [(r.what, r.failed, r.result) for r in rows] == [
        ("measures", False, "ok"),
        ("raises", True, "ValueError: the model is not there"),
        ("overruns", True, "ran past its budget of 0.2 s"),
        ("swallows", True, "ran past its budget of 0.2 s"),
        ("after them", False, "still ran"),
    ]
    assert given == [30]  # a step is told the seconds it has
    assert rows[0].seconds == 1.5 and rows[0].tokens == 8  # a step's own figures are kept
    assert all(r.seconds is not None for r in rows)  # the others get their wall time
    assert rows[4].tag == "e-tag"
    assert echoed[1].startswith("FAILED raises (") and len(echoed) == 5
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is before


def test_the_total_budget_cuts_a_step_and_no_step_starts_after_it():
    Step = gpu_check.Step
    cleaned: list[int] = []
    steps = [Step("a", "long", 30, lambda _: _sleeps(30)), Step("b", "next", 30, lambda _: {"result": "ran"})]
    rows = gpu_check.run_steps(steps, 0.3, after_each=lambda: cleaned.append(1), echo=lambda _: None)
    assert [(r.failed, r.result) for r in rows] == [
        (True, "ran past its budget of 0.3 s"),
        (True, "not run: the check's 0.3 s were spent"),
    ]
    assert cleaned == [1, 1]


def test_rounds_are_interleaved_warmed_up_and_fit_the_budget():
    calls: list[int] = []

    def one_round(i: int) -> dict:
        calls.append(i)
        return {"plain": 10.0 + i, "sample": 20.0 + 2 * i}

    quick = gpu_check.measure(one_round, 3, 10, 60)
    assert calls == list(range(13)) and quick.warmups == 3 and len(quick.rounds) == 10
    assert quick.median("plain") == 17.5 and quick.ratio("sample") == statistics.median(
        (20 + 2 * i) / (10 + i) for i in range(3, 13)
    )
    assert quick.said(10) == "median of 10 interleaved rounds after 3 warm-up"

    def slow_round(i: int) -> dict:
        time.sleep(0.1)
        return {"plain": 1.0}

    cut = gpu_check.measure(slow_round, 3, 10, 0.5)  # 0.4 s usable: fewer rounds, said so
    assert 1 <= len(cut.rounds) < 10 and cut.warmups < 3
    assert cut.said(10).endswith(f"(fewer than 10: the step's budget) after {cut.warmups} warm-up")
    one = gpu_check.measure(slow_round, 3, 10, 0.01)  # no time at all: still one warm-up and one timed round
    assert (one.warmups, len(one.rounds)) == (1, 1)
    assert gpu_check.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]


def test_the_cpu_clock_times_a_call_in_milliseconds():
    ms, out = gpu_check.Clock("cpu").time(lambda: time.sleep(0.05) or "done")
    assert out == "done" and 45 < ms < 1000


def _row(what, **kw):
    return gpu_check.Row(what, **kw)


def test_the_table_is_markdown_with_dashes_for_what_a_step_did_not_measure_and_reads_back():
    rows = [
        _row(
            "GPT-2 small sdpa",
            tokens=512,
            forward_ms=7.05,
            taps_x=1.1,
            off_x=3.456,
            default_x=8.21,
            post_ms=44.4,
            peak_gb=1.5,
            seconds=3.2,
            result="median of 10 interleaved rounds after 3 warm-up",
        ),
        _row(
            "GPT-2 small sdpa: full validation",
            tokens=512,
            forward_ms=7.1,
            full_ms=1234.5,
            full_x=173.9,
            max_error=1.24e-5,
            seconds=9.0,
            result="validation passed",
        ),
        _row("pytest tests/test_gpu.py", seconds=40.0, result="25 passed in 39.1s"),
        _row("generation", result="exit 2: a | b", failed=True),
    ]
    assert gpu_check.format_table(rows).splitlines() == [
        "| what | tokens | forward ms | under taps × | check off × | default check × | post-forward ms | "
        "full validation ms (×) | peak GB | max error | step s | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        "| GPT-2 small sdpa | 512 | 7.05 | 1.10 | 3.46 | 8.21 | 44.4 | - | 1.50 | - | 3.2 | "
        "median of 10 interleaved rounds after 3 warm-up |",
        "| GPT-2 small sdpa: full validation | 512 | 7.1 | - | - | - | - | 1,234 (173.90×) | - | 1.2e-05 | 9.0 | "
        "validation passed |",
        "| pytest tests/test_gpu.py | - | - | - | - | - | - | - | - | - | 40.0 | 25 passed in 39.1s |",
        "| generation | - | - | - | - | - | - | - | - | - | - | FAILED: exit 2: a / b |",
    ]
    read = gpu_check.read_table("header\n\n" + gpu_check.format_table(rows) + "\n\nfoot")
    assert [r["what"] for r in read] == [r.what for r in rows]
    assert read[0]["default check ×"] == "8.21" and read[1]["full validation ms (×)"] == "1,234 (173.90×)"


def test_the_table_reader_refuses_a_table_without_a_column():
    table = gpu_check.format_table([_row("x", tokens=1)])
    lines = table.splitlines()
    no_peak = "\n".join(
        "|" + "|".join(c for i, c in enumerate(line.split("|")[1:-1]) if i != gpu_check.COLUMNS.index("peak GB")) + "|"
        for line in lines
    )
    with pytest.raises(ValueError, match="the table has no column 'peak GB'"):
        gpu_check.read_table(no_peak)
    with pytest.raises(ValueError, match="no table"):
        gpu_check.read_table("Traceback …")


def test_each_goal_is_a_line_met_or_missed_with_its_number():
    rows = [
        _row("g", tokens=512, default_x=1.12, tag="gpt2-sdpa-1"),
        _row("l0", tokens=4096, default_x=1.04, tag="llama-0"),
        _row("l1", tokens=16384, default_x=1.02, tag="llama-1"),
        _row("l2", tokens=32768, result="ran past its budget of 40 s", failed=True, tag="llama-2"),
        _row("f", tokens=32768, forward_ms=1500.0, full_ms=1400.0, tag="llama-2-full"),
        _row("long", tokens=131072, peak_gb=50.2, captured=True, tag="llama-long-1"),
    ]
    lines = gpu_check.goals(rows, "NVIDIA H100 80GB HBM3", 79.2, 12.2)
    assert lines == [
        "- GPT-2 small ≤ 1.15× at 512 tokens with the default check: met (1.12× at 512)",
        "- the 8B shape ≤ 1.05× at 4k–32k (default check): missed (1.04× at 4,096; 1.02× at 16,384; "
        "not measured (ran past its budget of 40 s))",
        "- 128k tokens captured on one H200 (here NVIDIA H100 80GB HBM3, 79 GB): met (captured at 131,072 tokens, "
        "peak 50.2 GB with 4 of its 32 layers; all 32 add 12.2 GB of weights: ~62 GB, fits)",
        "- full validation at 32k in less time than the forward: met (1,400.0 ms against 1,500.0 ms at 32,768)",
    ]
    rows[0].default_x, rows[3].default_x, rows[4].full_ms = 8.21, 1.03, 9000.0
    rows[5] = _row("long", tokens=131072, result="out of GPU memory in the plain forward: skipped", tag="llama-long-1")
    lines = gpu_check.goals(rows, "NVIDIA H100 80GB HBM3", 79.2, 12.2)
    assert lines[0].endswith("missed (8.21× at 512)") and lines[1].startswith(
        "- the 8B shape ≤ 1.05× at 4k–32k (default check): met"
    )
    assert lines[2].endswith("missed (out of GPU memory in the plain forward: skipped)")
    assert lines[3].endswith("missed (9,000.0 ms against 1,500.0 ms at 32,768)")
    assert all(line.endswith("not run (step not selected)") for line in gpu_check.goals([], "cpu", None, None)[::3])


def test_an_unknown_step_is_refused_with_the_steps_there_are(capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--only", "llama,lama"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "gpu_check.py: error: --only: no step lama; the steps are tests, gpt2, llama, llama-long, bert, smollm2, "
        "generation, flash, flex"
    )


GENERATION_BENCH = """\
   model prompt  new  same  plain s | off: paired    med    min   wall | sample: paired    med    min   wall
 smollm2     25  128   yes     1.90 |       1.080  1.081  1.079  1.090 |          1.200  1.201  1.190  1.210
    gpt2     32  128    NO     0.43 |       1.122  1.122  1.122  1.114 |          1.102  1.102  1.102  1.100
"""


def test_the_generation_bench_table_is_read_where_its_columns_are():
    found = gpu_check.parse_generation_bench(GENERATION_BENCH)
    assert found["smollm2"] == gpu_check.GenerationRow(153, 1.90, 1.080, 1.090, 1.200, 1.210, True)
    assert found["gpt2"] == gpu_check.GenerationRow(160, 0.43, 1.122, 1.114, 1.102, 1.100, False)
    with pytest.raises(ValueError, match="no table row in bench/generation_overhead.py's output"):
        gpu_check.parse_generation_bench("Traceback …")


def test_a_backend_transformers_refuses_is_said_in_its_rows_not_a_failure():
    built = gpu_check.Built(lambda: gpu_check.gpt2_small("cpu", "float32", "flex_attention", True))
    fields = gpu_check.build_step(built, "cpu", 10)
    assert fields["result"].startswith("not run: transformers refuses it (ValueError: GPT2LMHeadModel does not support")
    plan = gpu_check.Plan(built, 32, None, False, 1, 3)
    assert gpu_check.overhead_step(plan, 10)["result"] == fields["result"]
    assert gpu_check.validation_step(plan, 10)["result"] == fields["result"]


def test_smollm2_falls_back_to_its_shape_from_its_config_when_its_weights_do_not_load(monkeypatch):
    import attnviz

    def fails(*args, **kwargs):
        raise FileNotFoundError("no GGUF here")

    monkeypatch.setattr(attnviz, "load_model", fails)
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: object())  # as if installed
    built = gpu_check.Built(lambda: None)
    model = gpu_check.smollm2("cpu", "float32", built, quick=False)
    assert built.note == "random weights in SmolLM2-135M's shape (loading failed: FileNotFoundError: no GGUF here)"
    config = model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    assert (config.hidden_size, config.intermediate_size, config.vocab_size) == (576, 1536, 49152)
    assert config.max_position_embeddings == 8192 and config.rope_parameters["rope_theta"] == 100000.0


@pytest.mark.slow
def test_the_whole_flow_runs_on_the_cpu_at_small_sizes(tmp_path):
    """Every kind of step but the tests and SmolLM2 (its 30 layers take a minute on this CPU; its
    fallback is tested above) through the command line, into the table file and its log: the overhead
    and full-validation steps on tiny GPT-2 and Llama models, the long steps' model built, freed and
    built again, the generation bench (a real subprocess, its table parsed), the absent flash-attention,
    flex refused for GPT-2 and run for BERT, and the goals under the table."""
    out = tmp_path / "gpu-check.md"
    only = "gpt2,llama,llama-long,generation,flash,flex"
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--only", only, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text()
    rows = gpu_check.read_table(text)
    by_what: dict[str, list[dict]] = {}
    for r in rows:
        by_what.setdefault(r["what"], []).append(r)
    assert [r["tokens"] for r in by_what["GPT-2 small sdpa"]] == ["32", "64"]
    for r in by_what["GPT-2 small sdpa"] + by_what["tiny random Llama, layers [0, 3]"]:
        assert float(r["forward ms"]) > 0 and float(r["under taps ×"]) > 0 and float(r["default check ×"]) > 0
        assert r["post-forward ms"] != "-" and r["result"].startswith("median of 3 interleaved rounds after 1 warm-up")
    # what tests/test_gpu.py asserts of the same command on CUDA
    llama = [r for r in rows if r["what"].startswith("tiny random Llama")]
    timed = [r for r in llama if r["default check ×"] != "-"]
    assert [r["tokens"] for r in timed] == ["128", "256", "512", "768", "1,024"]
    full = [r for r in llama if r["what"].endswith("full validation")]
    assert [r["tokens"] for r in full] == ["128", "512"] and all("validation passed" in r["result"] for r in full)
    assert all(float(r["max error"]) < 1e-4 and r["full validation ms (×)"].endswith("×)") for r in full)
    (gen,) = by_what["generation_overhead.py gpt2 float32 sdpa"]
    assert gen["tokens"] == "36" and "same tokens: yes" in gen["result"] and float(gen["check off ×"]) > 0
    assert by_what["GPT-2 small flash_attention_2"][0]["result"] == "not run: flash_attn does not import"
    flex_gpt2 = [r for r in rows if r["what"].startswith("GPT-2 small flex") and not r["what"].endswith(": free")]
    assert len(flex_gpt2) == 3 and all("transformers refuses it" in r["result"] for r in flex_gpt2)
    (bert_flex,) = by_what["BERT-base flex_attention"]
    assert float(bert_flex["default check ×"]) > 0
    goals = text.split("Goals (issue 42):\n")[1].splitlines()[:4]
    assert goals[0].startswith("- GPT-2 small ≤ 1.15× at 512 tokens with the default check: m")
    assert (
        goals[2].startswith("- 128k tokens captured on one H200 (here CPU")
        and "met (captured at 1,024 tokens" in goals[2]
    )
    assert "s in all" in text and ", 0 failed, " in text and text in proc.stdout
    log = out.with_suffix(".md.log").read_text()
    assert "bench/generation_overhead.py --device cpu --dtype float32 --attn sdpa --models gpt2" in log
    assert "  round 0: " in log
