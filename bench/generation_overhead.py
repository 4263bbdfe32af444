"""What recording a generation costs, as ratios to the model's own ``generate`` in the same run.

For each model, the same prompt, greedy, ``--new-tokens`` new tokens (default 128; ``min_new_tokens``
is set to the same number so that no model stops early):
  - ``plain``:  ``model.generate(input_ids, attention_mask=..., do_sample=False)`` (the baseline, 1.00),
  - ``off``:    ``attnviz.generate(..., check="off")``: the recording tap, the extra cached forward for
                the last token and the assembly of the capture,
  - ``sample``: ``attnviz.generate(...)`` with its default check, which also proves every generated row
                (and a sample of the prompt's) against the kernel output of the step that made it.
Time is process CPU time (``time.process_time``) at ``--threads`` torch threads over ``--rounds``
interleaved rounds (the order of the three rotates each round), after one warm-up of each; the
goal is judged on the median of each round's own ratio (the ratio of the medians and of the minima
are shown next to it). Wall time (ratio of the medians) is printed too.
Every run's new tokens are compared with the plain run's.
Memory: ``gen.capture.nbytes`` against ``attnviz.capture(model, input_ids=<the generated ids>).nbytes``
(one prefill of the same sequence); and, for information, the extra peak resident memory of one
plain generate and one ``attnviz.generate(check="off")`` in a fresh process (Linux ``VmHWM`` reset
through ``/proc/self/clear_refs``, as bench/capture_overhead.py measures it; ``--no-peak`` skips it).

Goals (issue #9): ``off`` ≤ 1.10× plain, the same tokens, and generation capture memory = prefill
capture memory ± 5 %. The ``sample`` ratio and the peak memory are reported, not judged. Exit status 1
when a goal is missed.

Models: ``smollm2`` (the embedded SmolLM2-135M, its tokenizer, an English prompt) and ``gpt2``
(GPT-2 small, ``GPT2Config()``, random weights, a tokenizer whose words are token ids).

``--device``, ``--dtype`` and ``--attn`` run the models elsewhere (default: CPU, float32, the model's own
backend); off the CPU each timed call waits for the device and the peak resident-memory runs (which
measure the host) are skipped.

    python bench/generation_overhead.py                         # both models, 128 new tokens
    python bench/generation_overhead.py --models gpt2 --rounds 3 --threads 2
    python bench/generation_overhead.py --device cuda --dtype bfloat16 --attn sdpa
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import attnviz
from attnviz.workflows.capture.models import IdsTokenizer

GOAL_TIME = 1.10
GOAL_MEMORY = 0.05
PROMPT = "The old lighthouse keeper climbed the spiral stairs every evening at dusk. When he reached the lamp room, he"
GPT2_PROMPT_TOKENS = 32


def load(
    family: str, device: str = "cpu", dtype: str = "float32", attn: str | None = None
) -> tuple[Any, Any, str, torch.Tensor]:
    """(model, tokenizer, prompt, prompt ids [1, n] on the model's device)."""
    if family == "smollm2":
        model, tok = attnviz.load_model("smollm2", device=device, dtype=dtype, attn_implementation=attn)
        assert callable(tok)
        ids = torch.tensor([tok(PROMPT)["input_ids"]])
        return model, tok, PROMPT, ids.to(next(model.parameters()).device)
    if family == "gpt2":
        from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        if attn is None:
            model = GPT2LMHeadModel(GPT2Config())
        else:
            model = AutoModelForCausalLM.from_config(GPT2Config(), attn_implementation=attn)
        model = model.eval().to(device, getattr(torch, dtype))
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, model.config.vocab_size, (1, GPT2_PROMPT_TOKENS), generator=g)
        return model, IdsTokenizer(), " ".join(map(str, ids[0].tolist())), ids.to(model.device)
    raise SystemExit(f"unknown model {family!r}: choose smollm2, gpt2")


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(CPU seconds, wall seconds, result); on a GPU after waiting for its work to finish."""
    c0, w0 = time.process_time(), time.perf_counter()
    result = fn()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.process_time() - c0, time.perf_counter() - w0, result


def setup(family: str, new_tokens: int, device: str = "cpu", dtype: str = "float32", attn: str | None = None):
    """(model, tokenizer, prompt, prompt ids, plain(), captured(check)) for one model."""
    model, tok, prompt, ids = load(family, device, dtype, attn)
    gc = model.generation_config
    if gc.pad_token_id is None:  # keeps generate from warning (and choosing) at every call
        gc.pad_token_id = gc.eos_token_id if isinstance(gc.eos_token_id, int) else 0
    n_prompt = ids.shape[1]

    # the same settings for both; min_new_tokens = max_new_tokens: every run makes all n tokens
    def plain(n: int = new_tokens) -> list[int]:
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False
            )
        return out[0, n_prompt:].tolist()

    def captured(check: str, n: int = new_tokens):
        return lambda: attnviz.generate(
            model, prompt, tok, max_new_tokens=n, min_new_tokens=n, do_sample=False, check=check
        )

    return model, tok, prompt, ids, plain, captured


def _status(field: str) -> int:  # kB
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(field)


def memory_child(family: str, new_tokens: int) -> None:
    """In a fresh process: the extra peak resident memory (bytes) of plain generate, then of
    attnviz.generate(check="off"), each over the resident size before it (Linux VmHWM, reset
    through /proc/self/clear_refs), printed as JSON."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    *_, plain, captured = setup(family, new_tokens)
    plain(4)  # warm up the kernels at a few tokens (a full-size run would leave its memory to the allocator)
    captured("off", 4)()
    peaks = {}
    for mode, fn in (("plain", plain), ("off", captured("off"))):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status("VmRSS:")
        result = fn()
        peaks[mode] = (_status("VmHWM:") - base) * 1024
        del result
    print(json.dumps(peaks))


def measure_peaks(family: str, new_tokens: int, threads: int) -> dict[str, int] | None:
    if not os.path.exists("/proc/self/clear_refs"):
        return None
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--memory-child",
            family,
            "--new-tokens",
            str(new_tokens),
            "--threads",
            str(threads),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench_model(
    family: str, new_tokens: int, rounds: int, device: str = "cpu", dtype: str = "float32", attn: str | None = None
) -> dict[str, Any]:
    t0 = time.perf_counter()
    model, tok, prompt, ids, plain, captured = setup(family, new_tokens, device, dtype, attn)
    load_s = time.perf_counter() - t0
    n_prompt = ids.shape[1]

    modes: dict[str, Callable[[], Any]] = {"plain": plain, "off": captured("off"), "sample": captured("sample")}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    reference: list[int] | None = None
    mismatches: list[str] = []
    gens: dict[str, Any] = {}

    def run(mode: str, record: bool) -> None:
        nonlocal reference
        c, w, result = timed(modes[mode])
        new = result if mode == "plain" else result.new_token_ids
        if reference is None:
            reference = new
        elif new != reference:
            first = next((i for i, (a, b) in enumerate(zip(new, reference)) if a != b), min(len(new), len(reference)))
            mismatches.append(f"{mode}: {len(new)} tokens, first difference at new token {first}")
        if mode != "plain":
            gens[mode] = result
        if record:
            cpu[mode].append(c)
            wall[mode].append(w)

    order = list(modes)
    for mode in order:  # warm-up (and the reference tokens)
        run(mode, record=False)
    for r in range(rounds):
        for mode in order[r % 3 :] + order[: r % 3]:
            run(mode, record=True)

    assert reference is not None
    same = not mismatches and len(reference) == new_tokens
    # memory: the generation's capture against one prefill capture of the same ids
    full_ids = gens["off"].ids[None]
    assert full_ids.shape[1] == n_prompt + len(reference) and full_ids[0, n_prompt:].tolist() == reference
    prefill = attnviz.capture(model, tokenizer=tok, input_ids=full_ids, check="off")
    assert isinstance(prefill, attnviz.Capture)
    med_cpu = {m: statistics.median(v) for m, v in cpu.items()}
    med_wall = {m: statistics.median(v) for m, v in wall.items()}
    return {
        "family": family,
        "name": type(model).__name__,
        "load_s": load_s,
        "n_prompt": n_prompt,
        "n_new": len(reference),
        "cpu": med_cpu,
        "cpu_min": {m: min(v) for m, v in cpu.items()},
        "cpu_all": cpu,
        "wall_all": wall,
        "paired": {m: statistics.median(a / b for a, b in zip(cpu[m], cpu["plain"])) for m in cpu},
        "wall": med_wall,
        "same": same,
        "mismatches": mismatches,
        "nbytes_gen": {m: g.capture.nbytes for m, g in gens.items()},
        "nbytes_prefill": prefill.nbytes,
        "prompt": prompt,
        "text": gens["off"].text,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="smollm2,gpt2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-peak", action="store_true", help="skip the peak-memory runs (a fresh process per model)")
    parser.add_argument("--verbose", action="store_true", help="print every round's CPU seconds")
    parser.add_argument("--device", default="cpu", help="where the models run: cpu (default), cuda, cuda:1 …")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--attn", default=None, help="the models' backend: sdpa, eager … (default: the model's own)")
    parser.add_argument("--memory-child", metavar="FAMILY", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args.memory_child, args.new_tokens)
        return 0
    from transformers.utils import logging

    logging.set_verbosity_error()

    results = []
    for family in (f.strip() for f in args.models.split(",")):
        t0 = time.perf_counter()
        res = bench_model(family, args.new_tokens, args.rounds, args.device, args.dtype, args.attn)
        on_host = args.device == "cpu"  # the peak runs measure the host's resident memory
        res["peaks"] = None if args.no_peak or not on_host else measure_peaks(family, args.new_tokens, args.threads)
        res["total_s"] = time.perf_counter() - t0
        results.append(res)
        prompt = res["prompt"] if len(res["prompt"]) <= 120 else res["prompt"][:117] + "…"
        print(f"{family}: prompt {res['n_prompt']} tokens {prompt!r}")
        print(f"{family}: continuation {res['text'][:100]!r}{'…' if len(res['text']) > 100 else ''}")
        print(f"{family}: load {res['load_s']:.1f} s, bench {res['total_s']:.1f} s", flush=True)

    print()
    print(
        f"attnviz.generate vs model.generate, greedy, {args.new_tokens} new tokens, {args.device}, {args.dtype}, "
        f"{args.attn or 'default'} backend, {args.threads} torch "
        f"thread(s), process CPU time over {args.rounds} interleaved rounds.\n"
        "Ratios to plain: 'paired' = median of each round's own ratio (judged), 'med' = ratio of the medians, "
        "'min' = ratio of the minima; 'wall' = ratio of the median wall times."
    )
    print(
        f"{'model':>8} {'prompt':>6} {'new':>4} {'same':>5} {'plain s':>8} | {'off:':>4} {'paired':>6} {'med':>6} "
        f"{'min':>6} {'wall':>6} | {'sample:':>7} {'paired':>6} {'med':>6} {'min':>6} {'wall':>6}"
    )
    missed = []
    for r in results:
        c, cm, p, w = r["cpu"], r["cpu_min"], r["paired"], r["wall"]
        cols = {
            m: f"{p[m]:6.3f} {c[m] / c['plain']:6.3f} {cm[m] / cm['plain']:6.3f} {w[m] / w['plain']:6.3f}"
            for m in ("off", "sample")
        }
        print(
            f"{r['family']:>8} {r['n_prompt']:>6} {r['n_new']:>4} {'yes' if r['same'] else 'NO':>5} "
            f"{c['plain']:8.2f} | {'':>4} {cols['off']} | {'':>7} {cols['sample']}"
        )
        if args.verbose:
            for m, v in r["cpu_all"].items():
                walls = " ".join(f"{x:.2f}" for x in r["wall_all"][m])
                print(f"{'':>8} {m:>6} CPU s per round: {' '.join(f'{x:.2f}' for x in v)}; wall s: {walls}")
        if not r["same"]:
            missed.append(f"{r['family']}: tokens differ from model.generate ({'; '.join(r['mismatches'][:3])})")
        if p["off"] > GOAL_TIME:
            missed.append(f"{r['family']}: check='off' costs {p['off']:.3f}× model.generate (goal ≤ {GOAL_TIME:.2f}×)")
    print()
    print(
        "Memory: bytes the generation's capture keeps (gen.capture.nbytes) against a prefill capture of the same "
        "ids; extra peak RSS of one call in a fresh process (information, not judged)"
    )
    print(
        f"{'model':>8} {'positions':>9} {'gen MB':>8} {'prefill MB':>10} {'gen/prefill':>11} | "
        f"{'peak MB: plain':>14} {'attnviz off':>11}"
    )
    for r in results:
        mem = r["nbytes_gen"]["off"] / r["nbytes_prefill"]
        peaks = r["peaks"]
        peak = f"{peaks['plain'] / 2**20:14.1f} {peaks['off'] / 2**20:11.1f}" if peaks else f"{'-':>14} {'-':>11}"
        print(
            f"{r['family']:>8} {r['n_prompt'] + r['n_new']:>9} {r['nbytes_gen']['off'] / 2**20:8.2f} "
            f"{r['nbytes_prefill'] / 2**20:10.2f} {mem:11.3f} | {peak}"
        )
        if r["nbytes_gen"]["sample"] != r["nbytes_gen"]["off"]:
            print(f"{'':>8} (the check='sample' capture keeps {r['nbytes_gen']['sample'] / 2**20:.2f} MB)")
        if abs(mem - 1) > GOAL_MEMORY:
            missed.append(
                f"{r['family']}: the generation capture keeps {mem:.3f}× the prefill capture (goal 1 ± {GOAL_MEMORY:.0%})"
            )
    print()
    print(
        f"goals: check='off' ≤ {GOAL_TIME:.2f}× plain (paired), same tokens, capture memory within "
        f"±{GOAL_MEMORY:.0%} of the prefill capture's; check='sample' and peak memory are reported, not judged"
    )
    for m in missed:
        print(f"MISSED {m}")
    print("all goals met" if not missed else f"{len(missed)} goal(s) missed")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
