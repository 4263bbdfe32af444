"""bench/gpu_check.py cannot rot on a machine without a GPU: its refusal, its step runner (errors and
budgets), its table, the parsers of the benches' output, and (slow) the whole flow on the CPU."""

from __future__ import annotations

import importlib.util
import signal
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


def _swallows_everything() -> dict:
    """A step whose own ``except Exception`` must not keep the budget from ending it."""
    while True:
        try:
            time.sleep(30)
        except Exception:  # noqa: BLE001 - the point of this step
            pass


def _raises() -> dict:
    raise ValueError("the model is\nnot there")


def test_a_failed_step_is_its_row_and_the_check_goes_on():
    Step = gpu_check.Step
    steps = [
        Step("a", "measures", 30, lambda: {"tokens": 8, "seconds": 1.5, "ratio": "1.02", "max_error": 3e-6}),
        Step("b", "raises", 30, _raises),
        Step("c", "overruns", 0.2, lambda: _sleeps(30)),
        Step("d", "swallows", 0.2, _swallows_everything),
        Step("e", "after them", 30, lambda: {"result": "still ran"}),
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
    assert rows[0].seconds == 1.5 and rows[0].tokens == 8  # a step's own figures are kept
    assert all(r.seconds is not None for r in rows)  # the others get their wall time
    assert echoed[1].startswith("FAILED raises (") and len(echoed) == 5
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is before


def test_the_total_budget_cuts_a_step_and_no_step_starts_after_it():
    Step = gpu_check.Step
    cleaned: list[int] = []
    steps = [Step("a", "long", 30, lambda: _sleeps(30)), Step("b", "next", 30, lambda: {"result": "ran"})]
    rows = gpu_check.run_steps(steps, 0.3, after_each=lambda: cleaned.append(1), echo=lambda _: None)
    assert [(r.failed, r.result) for r in rows] == [
        (True, "ran past its budget of 0.3 s"),
        (True, "not run: the check's 0.3 s were spent"),
    ]
    assert cleaned == [1, 1]


def test_the_table_is_markdown_with_dashes_for_what_a_step_did_not_measure():
    Row = gpu_check.Row
    rows = [
        Row("SmolLM2-135M long capture", 8192, 1.234, 3.456, "1.07", 1.24e-5, "validation passed"),
        Row("pytest tests/test_gpu.py", seconds=40.0, result="25 passed in 39.1s"),
        Row("generation", result="exit 2: a | b", failed=True),
    ]
    assert gpu_check.format_table(rows).splitlines() == [
        "| step | tokens | seconds | peak GPU GB | overhead × | validation max error | result |",
        "|---|---|---|---|---|---|---|",
        "| SmolLM2-135M long capture | 8,192 | 1.2 | 3.46 | 1.07 | 1.2e-05 | validation passed |",
        "| pytest tests/test_gpu.py | - | 40.0 | - | - | - | 25 passed in 39.1s |",
        "| generation | - | - | - | - | - | FAILED: exit 2: a / b |",
    ]


def test_an_unknown_step_is_refused_with_the_steps_there_are(capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--only", "llama,lama"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "gpu_check.py: error: --only: no step lama; the steps are tests, capture-bench, generation-bench, smollm2, llama"
    )


CAPTURE_BENCH = """\
GPT-2 small (GPT2Config(): 12 layers × 12 heads, d_model 768), cuda, bfloat16, plain and attnviz on sdpa, 16 threads
    n  plain s  attnviz×  eager+oa× |  extra peak MB: plain  attnviz  eager+oa |  kept MB q/k/v MB  L·h·n² MB
  128    0.012      1.31       1.02 |                     -        -         - |        -      4.5        0.6
 1024    0.020      1.12       1.40 |                     -        -         - |        -     36.0       36.0
one head's pattern recomputed at n = 1024: median 0.4 ms
"""
GENERATION_BENCH = """\
   model prompt  new  same  plain s | off: paired    med    min   wall | sample: paired    med    min   wall
 smollm2     25  128   yes     1.90 |       1.080  1.081  1.079  1.090 |          1.200  1.201  1.190  1.210
    gpt2     32  128    NO     0.43 |       1.122  1.122  1.122  1.114 |          1.102  1.102  1.102  1.100
"""


def test_the_benches_tables_are_read_where_their_columns_are():
    assert gpu_check.parse_capture_bench(CAPTURE_BENCH) == (1024, "1.12 (eager+oa 1.40)")
    assert gpu_check.parse_generation_bench(GENERATION_BENCH) == {
        "smollm2": (153, "1.080 (wall 1.090)", True),
        "gpt2": (160, "1.122 (wall 1.114)", False),
    }
    with pytest.raises(ValueError, match="no table row in bench/capture_overhead.py's output"):
        gpu_check.parse_capture_bench("Traceback …")


@pytest.mark.slow
def test_the_whole_flow_runs_on_the_cpu_at_small_sizes(tmp_path):
    """The generation bench (a real subprocess, its table parsed) and the long captures' code on a tiny
    random Llama, through the command line, into the table file and its log. (All steps with
    ``--quick`` take about 3 minutes on this machine: GPT-2 small is built five times by the capture
    bench and SmolLM2 loads from its GGUF file; run it by hand.)"""
    out = tmp_path / "gpu-check.md"
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--only", "generation-bench,llama"]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = out.read_text()
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in lines[1:]] == [
        "| generation_overhead.py float32 sdpa",
        "| tiny random Llama: build",
        "| tiny random Llama, layers [0, 3]",
    ]
    gen, _, llama = (line.split(" | ") for line in lines[1:])
    assert gen[1] == "36" and gen[4].startswith("gpt2 ")  # 32 prompt + 4 new tokens, the paired ratio read
    assert llama[1] == "256" and float(llama[5]) < 1e-4 and "validation passed" in llama[6]
    assert "\n3 steps, 0 failed, " in table
    assert table in proc.stdout
    assert (
        "bench/generation_overhead.py --device cpu --dtype float32 --attn sdpa"
        in out.with_suffix(".md.log").read_text()
    )
