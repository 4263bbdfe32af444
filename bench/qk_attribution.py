"""What one ``qk_attribution`` costs, as a ratio to one plain forward of the same ids in the same run.

A Llama of SmolLM2's shape (``LlamaConfig``: 30 layers, d_model 576, 9 heads on 3 KV heads, MLP 1,536,
random weights, sdpa), CPU, process CPU time, median of interleaved repeats, at each n:

- ``forward``: the model's forward (``use_cache=False, logits_to_keep=1``), the baseline ×1.00;
- ``attribution``: ``attnviz.qk_attribution(model, cap, layer, head, query, key)`` on a capture of the
  text held already (its hooked forward up to the layer's attention, the replay, the check), at the
  deepest layer — the forward it runs is then the longest — and at the middle layer.

Also the bytes the attribution keeps (its components at the two positions: O(components · d_model)).
Issue #44's goal: one attribution ≤ 1.5× one forward at n = 512 and 4,096.

    python bench/qk_attribution.py                 # n = 512, 4096; 3 repeats
    python bench/qk_attribution.py --sizes 512 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def cpu_seconds(run) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512,4096")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, LlamaConfig

    import attnviz
    from attnviz.workflows.capture.models import IdsTokenizer

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    deep, middle = config.num_hidden_layers - 1, config.num_hidden_layers // 2
    print(
        f"Llama of SmolLM2's shape (random), CPU, {args.threads} thread(s), process CPU time, median of "
        f"{args.repeats} interleaved repeats\n"
    )
    print(f"| n | forward | attribution, layer {deep} | attribution, layer {middle} | kept by one attribution |")
    print("|---|---|---|---|---|")
    for n in [int(s) for s in args.sizes.split(",")]:
        ids = torch.randint(0, config.vocab_size, (n,), generator=torch.Generator().manual_seed(n))
        text = " ".join(map(str, ids.tolist()))
        tok = IdsTokenizer()
        cap = attnviz.capture(model, text, tokenizer=tok, layers=[deep, middle], check="off")
        query, key = n - 1, n // 3

        def forward(ids=ids):
            return model(input_ids=ids[None], use_cache=False, logits_to_keep=1)

        def attribution(layer, cap=cap, query=query, key=key, tok=tok):
            return attnviz.qk_attribution(model, cap, layer, 4, query, key, tokenizer=tok)

        runs = {
            "forward": forward,
            "deep": lambda: attribution(deep),
            "middle": lambda: attribution(middle),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        with torch.no_grad():
            for run in runs.values():
                run()  # warm-up
            for _ in range(args.repeats):
                for name, run in runs.items():
                    times[name].append(cpu_seconds(run))
        median = {name: statistics.median(values) for name, values in times.items()}
        why = runs["deep"]()
        kept = why.components.nbytes + why.matrix.nbytes
        base = median["forward"]
        print(
            f"| {n:,} | {base:.2f} s (×1.00) | {median['deep']:.2f} s (×{median['deep'] / base:.2f}) | "
            f"{median['middle']:.2f} s (×{median['middle'] / base:.2f}) | {kept / 1e6:.2f} MB |"
        )


if __name__ == "__main__":
    main()
