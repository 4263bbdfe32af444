"""Train a small attention-only transformer on the classic induction task, saving checkpoints as the HF Trainer does.

Each training sequence is a random half repeated (``a b c … a b c …``): the second half can only be predicted by
looking back at the token after the current token's earlier copy — an induction head (Olsson et al. 2022), which
needs a previous-token head in the layer before it. The model is a ``LlamaForCausalLM`` of 2 layers whose MLPs are
zeroed and frozen (attention only), so attnviz captures it as it is. Every ``save_every`` steps the script writes
``checkpoint-N/`` (``save_pretrained`` of the model and of a word-level tokenizer whose tokens are the numbers
``0 … vocab-1``, and a ``trainer_state.json`` with ``global_step`` and the loss log), then::

    python examples/train_induction.py runs/induction          # some ten seconds on two CPU cores
    attnviz atlas --checkpoints runs/induction corpus.txt -o timeline.csv

The lesson reading such a run is docs/guides/training.md; ``corpus_texts`` writes a corpus of the same kind.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

VOCAB = 48  # the tokens "0" … "47"; the tokenizer adds "[UNK]" after them
LENGTH = 40  # tokens in each training sequence
MIN_HALF = 5  # the repeated half's length is drawn from MIN_HALF … LENGTH // 2
HALF = 16  # random tokens in each half of the corpus' texts (and the atlas' random_length)


def tokenizer_for(vocab: int = VOCAB):
    """A word-level tokenizer whose tokens are the numbers ``0 … vocab-1`` written with spaces ("3 17 5")."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {str(i): i for i in range(vocab)} | {"[UNK]": vocab}
    core = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")


def model_for(vocab: int = VOCAB, *, d_model: int = 64, heads: int = 4, layers: int = 2, positions: int = 64):
    """A ``LlamaForCausalLM`` (rotary positions) of ``layers`` attention layers whose MLPs add nothing (the
    output projection zeroed and every MLP weight frozen)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab + 1,
        hidden_size=d_model,
        intermediate_size=4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=positions,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    for layer in model.model.layers:  # attention only: the MLP's output projection is zero and stays so
        torch.nn.init.zeros_(layer.mlp.down_proj.weight)
        layer.mlp.requires_grad_(False)
    return model


def batch(g: torch.Generator, size: int, length: int = LENGTH, vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` sequences of ``length`` tokens, each ending in a random half repeated once (the half's length
    drawn from ``MIN_HALF … length // 2`` for each sequence, so that no fixed offset predicts the copy), random
    tokens before it: ``(ids [size, length], labels [size, length])`` — labels -100 but on the copy's tokens
    after its first (the only ones the copy predicts)."""
    ids = torch.randint(0, vocab, (size, length), generator=g)
    halves = torch.randint(MIN_HALF, length // 2 + 1, (size,), generator=g)
    labels = torch.full_like(ids, -100)
    for row, half in enumerate(halves.tolist()):
        start = length - 2 * half
        ids[row, start + half :] = ids[row, start : start + half]
        labels[row, start + half + 1 :] = ids[row, start + half + 1 :]
    return ids, labels


def corpus_texts(count: int = 24, *, seed: int = 1, half: int = HALF, vocab: int = VOCAB) -> list[str]:
    """Texts like the training data ("3 17 5 … 3 17 5 …"), for the atlas' corpus."""
    first = torch.randint(0, vocab, (count, half), generator=torch.Generator().manual_seed(seed))
    return [" ".join(str(i) for i in row.tolist() * 2) for row in first]


def train(
    out: str | Path,
    *,
    steps: int = 400,
    save_every: int = 25,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    d_model: int = 64,
    heads: int = 4,
    log=print,
) -> list[Path]:
    """Train from ``seed`` for ``steps`` steps, writing ``out/checkpoint-N/`` every ``save_every`` steps (and at
    step 0, before any training). Returns the checkpoint folders in step order."""
    torch.manual_seed(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, model = tokenizer_for(), model_for(d_model=d_model, heads=heads)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    history: list[dict] = []
    saved: list[Path] = []
    started = time.perf_counter()

    def save(step: int) -> None:
        folder = out / f"checkpoint-{step}"
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        state = {"global_step": step, "max_steps": steps, "log_history": history}
        (folder / "trainer_state.json").write_text(json.dumps(state, indent=1))
        saved.append(folder)
        loss = history[-1]["loss"] if history else float("nan")
        log(f"step {step:5d}  loss {loss:.3f}  ({time.perf_counter() - started:.1f} s)")

    model.train()
    save(0)
    for step in range(1, steps + 1):
        ids, labels = batch(g, batch_size)  # the loss of the copy only: nothing can predict random tokens
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append({"step": step, "loss": round(float(loss.detach()), 4)})
        if step % save_every == 0:
            save(step)
    model.eval()
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the run folder: checkpoint-N/ subfolders are written there")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", help="also write a corpus of such texts here (one per line)")
    args = parser.parse_args()
    train(args.out, steps=args.steps, save_every=args.save_every, seed=args.seed)
    if args.corpus:
        Path(args.corpus).write_text("\n".join(corpus_texts()) + "\n")


if __name__ == "__main__":
    main()
