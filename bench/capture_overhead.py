"""Capture cost as ratios to a plain forward, measured in the same run (the machines are noisy).

Time: for GPT-2 small (``GPT2Config()``, random weights, real code) at n = 128, 512, 1024, the
median over interleaved repeats of
  - ``plain``:   the sdpa model's forward (the baseline, ratio 1.00),
  - ``attnviz``: ``attnviz.capture`` of every layer on that same sdpa model (taps + trimming),
  - ``eager+oa``: the eager model's forward with ``output_attentions=True`` (what bertviz needs).
Memory: extra peak resident memory of one call over the model's resident size, each measured in
a fresh process (Linux ``VmHWM`` after resetting it through ``/proc/self/clear_refs``), next to
the bytes attnviz keeps (q, k, v and the model's attention output) and L·h·n² float32 bytes.
Also: the time to recompute one head's pattern at the largest n.

``--long N`` adds one SmolLM2 run at N tokens (plain forward vs capture; memory as above).
``--device``, ``--dtype`` and ``--attn`` run the models elsewhere (default: CPU, float32, sdpa for the
plain forward and the capture); on a GPU the times wait for the device (``torch.cuda.synchronize``)
and the resident-memory columns, which measure the host, are left out (``-``).

    python bench/capture_overhead.py                 # GPT-2 small table
    python bench/capture_overhead.py --long 4096     # and SmolLM2 at 4096 tokens
    python bench/capture_overhead.py --device cuda --dtype bfloat16 --attn flash_attention_2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch


def gpt2(backend: str, device: str = "cpu", dtype: str = "float32"):
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(GPT2Config(), attn_implementation=backend).eval()
    return model.to(device, getattr(torch, dtype))


def smollm2(backend: str, device: str = "cpu", dtype: str = "float32"):
    import attnviz

    model, _ = attnviz.load_model("smollm2", attn_implementation=backend, device=device, dtype=dtype)
    return model


def run_once(mode: str, model, ids: torch.Tensor):
    import attnviz

    ids = ids.to(model.device)
    with torch.no_grad():
        if mode == "attnviz":
            out = attnviz.capture(model, input_ids=ids)
        elif mode == "eager+oa":
            out = model(input_ids=ids, use_cache=False, output_attentions=True, logits_to_keep=1)
        else:
            out = model(input_ids=ids, use_cache=False, logits_to_keep=1)  # as capture() asks
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)  # a GPU runs asynchronously: time the work, not its launch
    return out


def _status(field: str) -> int:  # kB
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(field)


def memory_child(family: str, mode: str, n: int) -> None:
    """In a fresh process: extra peak RSS (bytes) of one call, printed as JSON."""
    torch.set_num_threads(torch.get_num_threads())
    model = (gpt2 if family == "gpt2" else smollm2)("eager" if mode == "eager+oa" else "sdpa")
    ids = torch.randint(0, 1000, (1, n))
    run_once("plain", model, ids[:, :8])  # warm up kernels at a tiny size
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS:")
    result = run_once(mode, model, ids)
    peak = _status("VmHWM:")
    kept = result.nbytes if mode == "attnviz" else 0
    print(json.dumps({"extra": (peak - base) * 1024, "kept": kept}))


def measure_memory(family: str, mode: str, n: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", family, mode, str(n)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def mb(x: float) -> str:
    return f"{'-':>8}" if x != x else f"{x / 2**20:8.1f}"  # NaN: not measured (a GPU run)


def gpt2_table(sizes: list[int], repeats: int, device: str = "cpu", dtype: str = "float32", attn: str = "sdpa") -> None:
    import attnviz

    models = {"plain": gpt2(attn, device, dtype), "eager+oa": gpt2("eager", device, dtype)}
    models["attnviz"] = models["plain"]
    cfg = models["plain"].config
    L, h, d = cfg.n_layer, cfg.n_head, cfg.n_embd
    where = "CPU" if device == "cpu" else device
    print(
        f"GPT-2 small (GPT2Config(): {L} layers × {h} heads, d_model {d}), {where}, {dtype}, plain and attnviz on "
        f"{attn}, {torch.get_num_threads()} threads, median of {repeats} interleaved repeats"
    )
    print(
        f"{'n':>5} {'plain s':>8} {'attnviz×':>9} {'eager+oa×':>10} | {'extra peak MB: plain':>21} {'attnviz':>8} "
        f"{'eager+oa':>9} | {'kept MB':>8} {'q/k/v MB':>8} {'L·h·n² MB':>10}"
    )
    for n in sizes:
        ids = torch.randint(0, cfg.vocab_size, (1, n))
        times: dict[str, list[float]] = {m: [] for m in models}
        for mode in models:  # warm-up
            run_once(mode, models[mode], ids)
        for _ in range(repeats):
            for mode, model in models.items():
                t0 = time.perf_counter()
                run_once(mode, model, ids)
                times[mode].append(time.perf_counter() - t0)
        med = {m: statistics.median(v) for m, v in times.items()}
        on_host = device == "cpu"  # the memory children measure the host's resident memory
        none = {"extra": float("nan"), "kept": float("nan")}
        mem = {m: measure_memory("gpt2", m, n) if on_host else none for m in ("plain", "attnviz", "eager+oa")}
        qkv = 3 * L * n * d * 4
        print(
            f"{n:>5} {med['plain']:8.3f} {med['attnviz'] / med['plain']:9.2f} {med['eager+oa'] / med['plain']:10.2f} | "
            f"{mb(mem['plain']['extra']):>21} {mb(mem['attnviz']['extra'])} {mb(mem['eager+oa']['extra']):>9} | "
            f"{mb(mem['attnviz']['kept'])} {mb(qkv)} {mb(L * h * n * n * 4):>10}"
        )
    n = sizes[-1]
    cap = attnviz.capture(models["plain"], input_ids=torch.randint(0, cfg.vocab_size, (1, n)).to(device))
    ts = []
    for i in range(20):
        t0 = time.perf_counter()
        cap.attention(i % L, head=i % h)
        ts.append(time.perf_counter() - t0)
    print(f"one head's pattern recomputed at n = {n}: median {statistics.median(ts) * 1000:.1f} ms")


def long_run(n: int, device: str = "cpu", dtype: str = "float32", attn: str = "sdpa") -> None:
    import attnviz

    model = smollm2(attn, device, dtype)
    ids = torch.randint(0, model.config.vocab_size, (1, n))
    run_once("plain", model, ids[:, :16])
    times = {}
    for mode in ("plain", "attnviz"):
        t0 = time.perf_counter()
        run_once(mode, model, ids)
        times[mode] = time.perf_counter() - t0
    none = {"extra": float("nan"), "kept": float("nan")}
    mem = {m: measure_memory("smollm2", m, n) if device == "cpu" else none for m in ("plain", "attnviz")}
    cfg = model.config
    L, h, kv, dh = (
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.hidden_size // cfg.num_attention_heads,
    )
    qkv = L * n * dh * (h + 2 * kv) * 4
    print(
        f"SmolLM2-135M at n = {n} ({attn}, {device}, {dtype}): plain {times['plain']:.1f} s, capture ×{times['attnviz'] / times['plain']:.2f}; "
        f"extra peak MB plain {mb(mem['plain']['extra']).strip()}, attnviz {mb(mem['attnviz']['extra']).strip()}; "
        f"kept {mb(mem['attnviz']['kept']).strip()} MB (q/k/v {mb(qkv).strip()} MB) where every pattern would be "
        f"{L * h * n * n * 4 / 2**30:.1f} GiB"
    )
    cap = attnviz.capture(model, input_ids=ids[:, :n].to(device))
    t0 = time.perf_counter()
    cap.attention(15, head=3)
    print(f"one head's pattern recomputed at n = {n}: {(time.perf_counter() - t0) * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="128,512,1024")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--long", type=int, default=0, help="also run SmolLM2 at this many tokens (e.g. 4096)")
    parser.add_argument("--device", default="cpu", help="where the models run: cpu (default), cuda, cuda:1 …")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--attn", default="sdpa", help="the backend of the plain forward and the capture (sdpa …)")
    parser.add_argument("--memory-child", nargs=3, metavar=("FAMILY", "MODE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        family, mode, n = args.memory_child
        memory_child(family, mode, int(n))
        return
    gpt2_table([int(s) for s in args.sizes.split(",")], args.repeats, args.device, args.dtype, args.attn)
    if args.long:
        long_run(args.long, args.device, args.dtype, args.attn)


if __name__ == "__main__":
    main()
