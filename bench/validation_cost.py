"""What checking costs, as ratios to a plain forward measured in the same run.

1. GPT-2 small (``GPT2Config()``, random weights, sdpa) at n = 512 and 1024: a plain forward, a
   capture with ``check="off"`` (the taps alone: goal ≤ 1.05×), and the default capture with its
   sample check (goal: the check adds ≤ 5 % of the forward). One torch thread and process CPU time
   over paired, alternating repeats (medians), which these shared machines keep within ~2 %.
2. SmolLM2-135M at ``--long`` tokens (default 8192, sdpa): the plain forward against the full
   ``validate()`` of a capture — every row of every layer and head (goal ≤ 1× the forward). Both on
   all cores, once each (the long run takes minutes).

    python bench/validation_cost.py                  # both parts
    python bench/validation_cost.py --long 0         # GPT-2 part only
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import attnviz


def gpt2():
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(GPT2Config(), attn_implementation="sdpa").eval()


def cpu_seconds(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def gpt2_part(sizes: list[int], repeats: int) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = gpt2()
    print(f"GPT-2 small, sdpa, 1 thread, CPU time, median of {repeats} paired alternating repeats")
    print(
        f"{'n':>5} {'forward s':>10} {'capture (check off) ×':>22} {'capture (sample check) ×':>25} {'check / forward':>16}"
    )
    for n in sizes:
        ids = torch.randint(0, model.config.vocab_size, (1, n))
        modes = {
            "plain": lambda ids=ids: model(input_ids=ids, use_cache=False, logits_to_keep=1),  # as capture() asks
            "off": lambda ids=ids: attnviz.capture(model, input_ids=ids, check="off"),
            "sample": lambda ids=ids: attnviz.capture(model, input_ids=ids),
        }
        times: dict[str, list[float]] = {m: [] for m in modes}
        with torch.no_grad():
            for fn in modes.values():
                fn()  # warm up
            for _ in range(repeats):
                for mode, fn in modes.items():
                    times[mode].append(cpu_seconds(fn))
        med = {m: statistics.median(v) for m, v in times.items()}
        check = statistics.median(s - o for s, o in zip(times["sample"], times["off"])) / med["plain"]
        print(
            f"{n:>5} {med['plain']:10.3f} {med['off'] / med['plain']:22.3f} {med['sample'] / med['plain']:25.3f} "
            f"{check:15.1%}"
        )
    torch.set_num_threads(threads)


def smollm2_part(n: int) -> None:
    model, _ = attnviz.load_model("smollm2")
    ids = torch.randint(0, model.config.vocab_size, (1, n))
    with torch.no_grad():
        model(input_ids=ids[:, :16], use_cache=False)
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=False)
        forward = time.perf_counter() - t0
    cap = attnviz.capture(model, input_ids=ids, check="off")
    t0 = time.perf_counter()
    report = cap.validate()
    full = time.perf_counter() - t0
    t0 = time.perf_counter()
    cap.validate(rows=32)
    sample = time.perf_counter() - t0
    print(
        f"SmolLM2-135M at n = {n} ({torch.get_num_threads()} threads): forward {forward:.1f} s; full validate() "
        f"{full:.1f} s = ×{full / forward:.2f} of the forward; sample check {sample:.2f} s; "
        f"{'PASS' if report.passed else 'FAIL'}, worst output error {report.worst('output')['max_abs_error']:.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512,1024")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--long", type=int, default=8192, help="SmolLM2 length for the full validation (0: skip)")
    args = parser.parse_args()
    gpt2_part([int(s) for s in args.sizes.split(",")], args.repeats)
    if args.long:
        smollm2_part(args.long)


if __name__ == "__main__":
    main()
