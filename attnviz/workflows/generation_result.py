"""What :func:`attnviz.generate` returns: a :class:`Generation` (prompt, new tokens and the capture
of every step) and the :class:`GenerationStep` of one new token. Data over a :class:`Capture`: no
model runs here, so a generation read back with :func:`attnviz.load` is the same object.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.capture import Capture, TokenSequence
from ..errors import ArgumentTypeError, HeadNotKeptError, InputError

__all__ = ["Generation", "GenerationStep"]


@dataclass
class GenerationStep:
    """New token ``index`` of a generation: where it sits and what it attended to at its step.

    ``weights`` is ``[layer, head, key]``: the row of the token's own query over the positions
    up to it (the row the model computed when it read the token). ``chosen_by`` is the same for the
    position before it, whose output chose this token. Its heads are the ones the generation kept
    (``heads``, the model's numbers: every head unless ``generate(heads=)`` kept some); every method
    takes a head by the model's number (:meth:`head_index`).
    """

    index: int
    position: int
    token: str  # its label (the text it covers; the tokenizer's piece is in gen.sequence.tokens)
    token_id: int
    layers: list[int]
    weights: Tensor  # [layer, head, key_pos]
    chosen_by: Tensor  # [layer, head, key_pos]: the row of the query that predicted this token
    keys: list[str]  # the key tokens' labels, positions 0..position
    heads: list[int] | None = None  # the model's numbers of the heads stacked in weights (None: every head, in order)
    n_heads: int | None = None  # the model's query heads per layer (None: as many as weights stacks)

    @property
    def head_numbers(self) -> list[int]:
        """The model's numbers of the heads stacked in :attr:`weights` and :attr:`chosen_by`, in order."""
        return list(range(self.weights.shape[1])) if self.heads is None else list(self.heads)

    def head_index(self, head: int) -> int:
        """Where the model's head ``head`` sits in :attr:`weights`' second dimension: an
        :class:`InputError` for a head outside the model's, a :class:`~attnviz.errors.HeadNotKeptError`
        for one the generation did not keep (``generate(heads=)``), naming those it kept."""
        if not isinstance(head, int) or isinstance(head, bool):
            raise ArgumentTypeError(f"head must be an int, got {type(head).__name__}")
        n = self.n_heads if self.n_heads is not None else self.weights.shape[1]
        if not 0 <= head < n:
            raise InputError(f"head {head} is out of range: heads 0..{n - 1}")
        kept = self.head_numbers
        if head not in kept:
            raise HeadNotKeptError(
                f"head {head} was not kept: this generation kept heads {', '.join(map(str, kept))} "
                f"(generate(..., heads=) / --heads); generate again with heads=None or including {head}"
            )
        return kept.index(head)

    def top(self, k: int = 5, *, layer: int | None = None, head: int | None = None) -> list[tuple[int, str, float]]:
        """The ``k`` keys this token attended to most: (position, token, weight), averaged over the
        layers and heads not given (the heads kept; ``head`` by the model's number)."""
        w = self.weights
        if layer is not None:
            if layer not in self.layers:
                raise InputError(f"layer {layer} was not captured; captured layers: {self.layers}")
            w = w[self.layers.index(layer) : self.layers.index(layer) + 1]
        if head is not None:
            stacked = self.head_index(head)
            w = w[:, stacked : stacked + 1]
        mean = w.mean(dim=(0, 1))
        values, index = mean.topk(min(k, mean.numel()))
        return [(int(i), self.keys[int(i)], float(v)) for v, i in zip(values, index)]

    def __repr__(self) -> str:
        top = ", ".join(f"{t!r} {w:.2f}" for _, t, w in self.top(3))
        return f"GenerationStep({self.index}: {self.token!r} at position {self.position}; attends to {top})"


@dataclass
class Generation:
    """A generation and its capture: prompt and new tokens, every step's attention.

    For an encoder-decoder model the prompt is the source (the encoder's text) and the generated
    sequence is the decoder's: its start token, then the new tokens; the capture has the parts
    ``encoder``, ``decoder`` and ``cross``.
    """

    capture: Capture

    @classmethod
    def of(cls, cap: Capture) -> Generation:
        """The generation a capture holds (for example one read back with :func:`attnviz.load`)."""
        if "generation" not in cap.model:
            raise InputError("this capture is of one forward, not of a generation; make one with attnviz.generate()")
        return cls(cap)

    @property
    def info(self) -> dict[str, Any]:
        return self.capture.model["generation"]

    @property
    def part(self) -> str:
        return "decoder"

    @property
    def sequence(self) -> TokenSequence:
        """The generated sequence's tokens (prompt and new; the decoder's for encoder-decoders)."""
        return self.capture.sequences("decoder")[0]

    @property
    def prompt_length(self) -> int:
        """Where the new tokens start in :attr:`ids`."""
        return int(self.info["prompt_length"])

    @property
    def ids(self) -> Tensor:  # [pos]
        return torch.tensor(self.sequence.token_ids)

    @property
    def new_token_ids(self) -> list[int]:
        return self.sequence.token_ids[self.prompt_length :]

    @property
    def new_tokens(self) -> list[str]:
        return self.sequence.tokens[self.prompt_length :]

    @property
    def text(self) -> str:
        """The continuation (special tokens left out)."""
        return str(self.info["text"])

    @property
    def steps(self) -> list[int]:
        """Queries each forward read: the prompt's length at the prefill, then 1 per new token."""
        return list(self.info["steps"])

    def __len__(self) -> int:
        return len(self.new_token_ids)

    def step(self, index: int) -> GenerationStep:
        """New token ``index`` (0 = the first new token; negative counts from the end)."""
        n = len(self)
        if not isinstance(index, int) or isinstance(index, bool):
            raise ArgumentTypeError(f"step index must be an int, got {type(index).__name__}")
        if not -n <= index < n:
            raise InputError(f"this generation has {n} new tokens (0..{n - 1}); step {index} is out of range")
        index %= n
        position = self.prompt_length + index
        labels = self.sequence.token_labels
        cap = self.capture
        layers = cap.layer_indices("decoder")
        stacks = {tuple(cap.layer(layer, "decoder").head_numbers) for layer in layers}
        if len(stacks) > 1:
            raise InputError(
                "this generation keeps different heads in different layers (generate(heads={layer: …})); a step "
                "stacks the same heads of every layer: generate with one list of heads, or read a layer's rows "
                "with gen.capture.attention_rows(layer, [position], part='decoder')"
            )
        kept = cap.layer(layers[0], "decoder").heads
        rows = [cap.attention_rows(layer, [position], part="decoder")[:, 0].cpu() for layer in layers]
        before = (
            [cap.attention_rows(layer, [position - 1], part="decoder")[:, 0].cpu() for layer in layers]
            if position
            else rows
        )
        return GenerationStep(
            index=index,
            position=position,
            token=labels[position],
            token_id=self.sequence.token_ids[position],
            layers=layers,
            weights=torch.stack(rows)[..., : position + 1],
            chosen_by=torch.stack(before)[..., : position + 1],
            keys=labels[: position + 1],
            heads=None if kept is None else list(kept),
            n_heads=cap.info("decoder")["n_heads"],
        )

    def to_pandas(self, *, layer: int | None = None, head: int | None = None, top: int = 3):
        """One row per new token: its position, token, and the keys it attended to most."""
        import pandas as pd  # deferred: pandas is heavy and only tables need it

        rows = []
        for i in range(len(self)):
            s = self.step(i)
            best = s.top(top, layer=layer, head=head)
            rows.append(
                {
                    "step": i,
                    "position": s.position,
                    "token": s.token,
                    "token_id": s.token_id,
                    **{f"top{j + 1}": f"{t} ({p})" for j, (p, t, _) in enumerate(best)},
                    **{f"top{j + 1}_weight": w for j, (_, _, w) in enumerate(best)},
                }
            )
        return pd.DataFrame(rows)

    def save(self, path: str | Path) -> Path:
        """Save the capture (with its generation) to a file; ``Generation.of(attnviz.load(path))`` reads it back."""
        return self.capture.save(path)

    def __repr__(self) -> str:
        start = (
            f"{self.capture.n_tokens} source tokens → start token + {len(self)} new"
            if self.capture.target is not None
            else f"{self.prompt_length} prompt tokens + {len(self)} new"
        )
        text = f"{self.text[:60]!r}{'…' if len(self.text) > 60 else ''}"
        return f"Generation({self.capture.model.get('name')!r}: {start}, {text})"
