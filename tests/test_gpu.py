"""CUDA paths: half precision, tensors kept on the device, validation recomputed in float32."""

import pytest
import torch

import attnviz

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "bert"])
def test_capture_on_cuda_in_each_dtype(family, dtype):
    model = attnviz.testing.tiny_model(family, attn_implementation="sdpa").to("cuda", dtype)
    ids = torch.randint(3, 120, (1, 12))
    cap = attnviz.capture(model, input_ids=ids)
    assert cap.q(0).device.type == "cpu" and cap.q(0).dtype == dtype
    report = cap.validate()
    assert report.dtype == str(dtype).removeprefix("torch.")
    assert report.passed, str(report)


def test_keep_on_device_keeps_tensors_on_cuda():
    model = attnviz.testing.tiny_model("llama", attn_implementation="sdpa").to("cuda")
    cap = attnviz.capture(model, input_ids=torch.randint(3, 120, (2, 12)), keep_on_device=True)
    assert cap[0].q(0).device.type == "cuda" and cap[0].attention(0).device.type == "cuda"
    assert cap[0].validate().passed
    assert cap[0].to("cpu").q(0).device.type == "cpu"
    from attnviz import figures

    assert figures.heatmap(cap[0], 0, 1).data[0].z is not None  # figures take device captures too
    assert len(cap[0].to_pandas(layer=0, head=1)) == 12 * 12


def test_eager_half_weights_are_compared_in_float32():
    model = attnviz.testing.tiny_model("llama", attn_implementation="eager").to("cuda", torch.float16)
    cap = attnviz.capture(model, input_ids=torch.randint(3, 120, (1, 16)))
    report = cap.validate()
    assert {r["quantity"] for r in report.rows} == {"output", "weights"} and report.passed, str(report)


@pytest.mark.parametrize(
    "family,kwargs", [("llama", {}), ("mistral", {}), ("t5", {}), ("llama", {"cache_implementation": "static"})]
)
@pytest.mark.parametrize("keep_on_device", [False, True])
def test_generation_on_cuda_equals_the_cpu_generation(family, kwargs, keep_on_device):
    from attnviz.workflows.capture.models import IdsTokenizer

    prompt = "11 5 7 9 13 21 34 55 89"
    on_cpu = attnviz.generate(attnviz.testing.tiny_model(family), prompt, IdsTokenizer(), max_new_tokens=6, **kwargs)
    model = attnviz.testing.tiny_model(family).to("cuda")
    gen = attnviz.generate(model, prompt, IdsTokenizer(), max_new_tokens=6, keep_on_device=keep_on_device, **kwargs)
    assert gen.new_token_ids == on_cpu.new_token_ids
    assert gen.capture.q(0, part="decoder").device.type == ("cuda" if keep_on_device else "cpu")
    assert gen.capture.validate().passed
    for part in gen.capture.parts:
        torch.testing.assert_close(
            gen.capture.attention(1, part=part).cpu(), on_cpu.capture.attention(1, part=part), atol=1e-4, rtol=0
        )


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "t5"])
def test_edits_on_cuda_equal_the_cpu_edits(family):
    from attnviz import edits
    from attnviz.workflows.capture.models import IdsTokenizer

    text, kw = "11 5 7 9 13 21 34 55", ({"target": "3 4 5 6"} if family == "t5" else {})
    plan = [edits.knockout(layer=1, head=0, key="5"), edits.temperature(2.0, layer=0), edits.ablate(layer=1, head=1)]
    on_cpu = attnviz.intervene(attnviz.testing.tiny_model(family), text, plan, IdsTokenizer(), **kw)
    model = attnviz.testing.tiny_model(family).to("cuda")
    out = attnviz.intervene(model, text, plan, IdsTokenizer(), **kw)
    assert out.check_error <= 1e-4
    torch.testing.assert_close(out.after.logprobs, on_cpu.after.logprobs, atol=1e-4, rtol=0)
    df = attnviz.head_importance(model, text, 40, IdsTokenizer(), progress=False, decoder_text=kw.get("target"))
    assert len(df) > 0 and df["logprob_drop"].is_monotonic_decreasing


def test_a_long_bfloat16_capture_kept_on_cuda_validates_every_row():
    """What bench/gpu_check.py's long captures rely on, at a size every GPU holds."""
    model = attnviz.testing.tiny_model("llama", attn_implementation="sdpa", max_position_embeddings=2048)
    model = model.to("cuda", torch.bfloat16)
    ids = torch.randint(3, 120, (1, 2048))
    cap = attnviz.capture(model, input_ids=ids, layers=[1], keep_on_device=True)
    assert cap.layer_indices() == [1] and cap.q(1).device.type == "cuda" and cap.q(1).dtype == torch.bfloat16
    report = cap.validate()
    assert report.dtype == "bfloat16" and {r["rows"] for r in report.rows} == {2048} and report.passed, str(report)


def test_the_gpu_check_runs_its_long_captures_on_cuda(tmp_path):
    """bench/gpu_check.py's CUDA path (peak memory, kept tensors) at the quick sizes, through its command line."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "gpu-check.md"
    script = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py"
    cmd = [sys.executable, str(script), "--quick", "--only", "llama", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r for r in _read_table(out.read_text()) if r["what"].startswith("tiny random Llama")]
    assert "on cuda" in rows[0]["result"]
    timed = [r for r in rows if r["default check ×"] != "-"]
    assert len(timed) == 3 and all(float(r["peak GB"]) > 0 and float(r["forward ms"]) > 0 for r in timed)
    full = [r for r in rows if r["what"].endswith("full validation")]
    assert len(full) == 2 and all("validation passed" in r["result"] for r in full)


def _read_table(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("| ").split(" | ")]
    return [dict(zip(head, (c.strip() for c in line.strip()[2:-2].split(" | ")))) for line in lines[1:]]


def kept_heads_on(device: str, keep_on_device: bool) -> None:
    """capture(heads=) and generate(heads=) on ``device``: the kept heads are those of a capture (a generation) of
    every head on the same device, narrowed where the records are (kept on the device, or copied to the host)."""
    from attnviz.workflows.capture.models import IdsTokenizer

    model = attnviz.testing.tiny_model("llama", attn_implementation="sdpa").to(device)  # 4 query heads, 2 KV heads
    ids = torch.randint(3, 120, (1, 12), generator=torch.Generator().manual_seed(0))
    full = attnviz.capture(model, input_ids=ids, keep_on_device=keep_on_device)
    some = attnviz.capture(model, input_ids=ids, heads=[1, 3], keep_on_device=keep_on_device)
    assert some.kept_heads() == [1, 3] and some.q(0).shape[0] == 2 and some.k(0).shape[0] == 2
    assert some.q(0).device.type == (device if keep_on_device else "cpu")
    for layer in full.layer_indices():
        for head in (1, 3):
            torch.testing.assert_close(some.attention(layer, head), full.attention(layer, head), atol=0, rtol=0)
    assert some.validate().passed
    prompt = "11 5 7 9 13 21 34 55 89"
    gen_full = attnviz.generate(model, prompt, IdsTokenizer(), max_new_tokens=4, keep_on_device=keep_on_device)
    gen_some = attnviz.generate(
        model, prompt, IdsTokenizer(), max_new_tokens=4, heads=[1, 3], keep_on_device=keep_on_device
    )
    assert gen_some.new_token_ids == gen_full.new_token_ids and gen_some.capture.kept_heads() == [1, 3]
    for head in (1, 3):
        torch.testing.assert_close(gen_some.capture.attention(1, head), gen_full.capture.attention(1, head))


@pytest.mark.parametrize("keep_on_device", [False, True])
def test_kept_heads_on_cuda_equal_the_same_heads_of_every_head(keep_on_device):
    kept_heads_on("cuda", keep_on_device)
