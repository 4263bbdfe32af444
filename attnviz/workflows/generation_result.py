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
from ..errors import ArgumentTypeError, InputError

__all__ = ["Generation", "GenerationStep"]


@dataclass
class GenerationStep:
    """New token ``index`` of a generation: where it sits and what it attended to at its step.

    ``weights`` is ``[layer, head, key]``: the row of the token's own query over the positions
    up to it (the row the model computed when it read the token). ``chosen_by`` is the same for the
    position before it, whose output chose this token.
    """

    index: int
    position: int
    token: str  # its label (the text it covers; the tokenizer's piece is in gen.sequence.tokens)
    token_id: int
    layers: list[int]
    weights: Tensor  # [layer, head, key_pos]
    chosen_by: Tensor  # [layer, head, key_pos]: the row of the query that predicted this token
    keys: list[str]  # the key tokens' labels, positions 0..position

    def top(self, k: int = 5, *, layer: int | None = None, head: int | None = None) -> list[tuple[int, str, float]]:
        """The ``k`` keys this token attended to most: (position, token, weight), averaged over the
        layers and heads not given."""
        w = self.weights
        if layer is not None:
            if layer not in self.layers:
                raise InputError(f"layer {layer} was not captured; captured layers: {self.layers}")
            w = w[self.layers.index(layer) : self.layers.index(layer) + 1]
        if head is not None:
            if not 0 <= head < w.shape[1]:
                raise InputError(f"head {head} is out of range: heads 0..{w.shape[1] - 1}")
            w = w[:, head : head + 1]
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
