"""What keeping "what each head moves" costs a capture, as ratios to a plain forward in the same run.

GPT-2 small (``GPT2Config()``: 12 layers × 12 heads, d_model 768, random weights, sdpa), CPU, one
thread, process CPU time (less sensitive to a shared machine than wall clock), median of
interleaved repeats, at each n:

- ``plain``: the model's forward (the baseline, ×1.00);
- ``taps``: ``attnviz.capture(check="off")`` with the value terms left out (the taps alone);
- ``capture, check off``: the same with the value terms (``value_dots`` of every layer: the Gram
  matrices ``W_O^hᵀ W_O^h`` and one ``vᵀ G v`` per head and key);
- ``capture``: the default capture, its sample check and the output-projection check included;
- ``value terms``, ``projection check``: those two steps alone (run on a capture's records), as a
  share of the forward — the direct measure of what this adds, steadier than a difference of two
  noisy ratios.

Also the bytes a capture keeps for the value terms next to what it keeps in all (O(layers·heads·n)).
The issue's goal: the capture stays ≤ 1.05× the plain forward at n = 512 and 1,024.

    python bench/moved_cost.py                # n = 512, 1024; 5 repeats
    python bench/moved_cost.py --sizes 512 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnviz.workflows.capture import pipeline


def cpu_seconds(run) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512,1024")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, GPT2Config

    import attnviz

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(GPT2Config(), attn_implementation="sdpa").eval()
    with_terms = pipeline.add_value_terms

    def without_terms(*_args, **_kwargs) -> None:
        return None

    def capture(ids: torch.Tensor, check: str, terms: bool):
        pipeline.add_value_terms = with_terms if terms else without_terms  # type: ignore[assignment]
        try:
            return attnviz.capture(model, input_ids=ids, check=check)
        finally:
            pipeline.add_value_terms = with_terms  # type: ignore[assignment]

    print(f"GPT-2 small, CPU, 1 thread, process CPU time, median of {args.repeats} interleaved repeats\n")
    print(
        "| n | plain forward | taps (no value terms) | capture, check off | capture (sample + projection check) "
        "| value terms | projection check | value terms kept | capture keeps |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in [int(s) for s in args.sizes.split(",")]:
        ids = torch.randint(0, 50257, (1, n), generator=torch.Generator().manual_seed(n))
        modes = {
            "plain": lambda ids=ids: model(input_ids=ids, use_cache=False, logits_to_keep=1),  # as capture() asks
            "taps": lambda ids=ids: capture(ids, "off", False),
            "off": lambda ids=ids: capture(ids, "off", True),
            "sample": lambda ids=ids: capture(ids, "sample", True),
        }
        with torch.no_grad():
            for run in modes.values():
                run()  # warm-up
            cap = capture(ids, "sample", True)
            watch = _watch(model, ids)
            modes["terms"] = lambda cap=cap: with_terms(model, [cap], None, "off")
            modes["terms+check"] = lambda cap=cap, watch=watch: with_terms(model, [cap], watch, "sample")
            times: dict[str, list[float]] = {k: [] for k in modes}
            for _ in range(args.repeats):
                for key, run in modes.items():
                    times[key].append(cpu_seconds(run))
        median = {k: statistics.median(v) for k, v in times.items()}
        kept = sum(r.value_dots.nbytes + r.projection_check.nbytes for r in cap.records.values())
        print(
            f"| {n} | {median['plain']:.2f} s | ×{median['taps'] / median['plain']:.3f} "
            f"| ×{median['off'] / median['plain']:.3f} | ×{median['sample'] / median['plain']:.3f} "
            f"| {median['terms'] / median['plain']:.1%} | {(median['terms+check'] - median['terms']) / median['plain']:.1%} "
            f"| {kept / 1e6:.2f} MB | {cap.nbytes / 1e6:.0f} MB |"
        )


def _watch(model, ids):
    """The rows of every output projection the taps keep in one forward (what the check compares with)."""
    import attnviz

    with attnviz.tap(model) as recorder:
        model(input_ids=ids, use_cache=False)
    return recorder.projections


if __name__ == "__main__":
    main()
