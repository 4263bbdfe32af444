"""Recording a generation's steps: each kernel call of a cached decoder streamed into one layer's rows.

A decoder with a cache reads the prompt once (the prefill), then runs one forward per new token:
the new position's query against the cache's keys and values, to which the step appends its own.
The cache is append-only, so a whole generation fits in the calls of one forward: every step's
query and output rows, and every position's key and value as the step that made it wrote them into
the cache. :class:`StepRecorder` streams each call into those rows as it happens; nothing of size
steps × n is kept, whatever the cache (dynamic, sliding-window, static).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from ..engine.taps import AttentionCall, Recorder
from ..engine.transfer import HostCopies
from ..errors import UnsupportedModelError

__all__ = ["StepRecorder"]

#: the parts a generation runs once, at the prefill, kept whole: an encoder-decoder's source, a
#: vision-language model's picture (its vision tower)
_ONCE = {"encoder": "source", "vision": "picture"}
_TENSOR_FIELDS = ("q", "k", "v", "out", "weights", "mask", "key_padding", "bias")


@dataclass
class _Stream:
    """One attention's rows, appended step by step."""

    first: AttentionCall  # the first call: name, part, layer, scaling, backend, sizes, sinks
    q: list[Tensor] = field(default_factory=list)  # [head, step's queries, d_head] per step
    out: list[Tensor] = field(default_factory=list)
    k: list[Tensor] = field(default_factory=list)  # the positions each step added (cross: the source, once)
    v: list[Tensor] = field(default_factory=list)
    bias: list[tuple[int, Tensor, Tensor]] = field(default_factory=list)  # (first query, key positions, values)
    steps: list[int] = field(default_factory=list)  # queries per step
    weight_error: Tensor | None = None
    weight_scale: Tensor | None = None

    n: int = 0  # positions read so far

    def take(self, call: AttentionCall, move) -> None:
        assert call.q is not None and call.k is not None and call.v is not None and call.out is not None
        n_q, n_k = call.q.shape[-2], call.k.shape[-2]
        past = self.n
        if call.part == "cross":  # the source's keys: the same at every step
            if not self.k:
                self.k.append(move(call.k[0]))
                self.v.append(move(call.v[0]))
            elif n_k != self.k[0].shape[-2]:
                raise UnsupportedModelError(
                    f"{call.name} read {n_k} source positions at one step and {self.k[0].shape[-2]} at another"
                )
            first_key = 0
        else:
            # A dynamic cache hands the kernel every position so far, a static one its whole buffer (the
            # new rows at the step's positions); a sliding-window cache keeps only the last positions,
            # the new ones last (each copied by move).
            start = past if n_k >= past + n_q else n_k - n_q
            self.k.append(move(call.k[0, :, start : start + n_q]))
            self.v.append(move(call.v[0, :, start : start + n_q]))
            first_key = past + n_q - n_k if n_k < past + n_q else 0
        self.q.append(move(call.q[0]))
        self.out.append(move(call.out[0].transpose(0, 1)))
        if call.bias is not None:
            key_positions = torch.arange(n_k) + first_key
            keep = key_positions < past + n_q if call.part != "cross" else key_positions >= 0
            values = call.bias[0].expand(-1, n_q, -1)[..., keep.to(call.bias.device)]
            self.bias.append((past, key_positions[keep], move(values.float())))
        if call.weight_error is not None and call.weight_scale is not None:
            err, scale = call.weight_error[0], call.weight_scale[0]  # where the kernel ran: no wait per step
            self.weight_error = err if self.weight_error is None else torch.maximum(self.weight_error, err)
            self.weight_scale = scale if self.weight_scale is None else torch.maximum(self.weight_scale, scale)
        self.steps.append(n_q)
        self.n += n_q

    def assemble(self) -> AttentionCall:
        """One call over every position, as a single prefill of the whole sequence would have made."""
        first = self.first
        cross = first.part == "cross"
        k = self.k[0] if cross else torch.cat(self.k, dim=1)
        v = self.v[0] if cross else torch.cat(self.v, dim=1)
        return AttentionCall(
            name=first.name,
            part=first.part,
            layer=first.layer,
            scaling=first.scaling,
            causal=not cross,
            window=None if cross else first.sliding_window,
            softcap=first.softcap,
            backend=first.backend,
            q=torch.cat(self.q, dim=1)[None],
            k=k[None],
            v=v[None],
            out=torch.cat(self.out, dim=1).transpose(0, 1)[None],
            bias=self._bias(k.shape[-2]),
            sinks=first.sinks,
            weight_error=None if self.weight_error is None else self.weight_error[None],
            weight_scale=None if self.weight_scale is None else self.weight_scale[None],
            sizes=first.sizes,
        )

    def _bias(self, n_keys: int) -> Tensor | None:  # [1, head, query, key]
        if not self.bias:
            return None
        n, heads = self.n, self.bias[0][2].shape[0]
        device = self.bias[0][2].device
        dense = torch.full((heads, n, n_keys), float("nan"), device=device)
        for first_query, keys, values in self.bias:
            dense[:, first_query : first_query + values.shape[1], keys.to(device)] = values
        needed = torch.ones(n, n_keys, dtype=torch.bool, device=device)
        if self.first.part != "cross":
            needed = torch.tril(needed)
        if bool(dense.isnan().any(0)[needed].any()):
            raise UnsupportedModelError(
                f"{self.first.name} gave its position bias for only some of the keys at each step; "
                "attnviz cannot assemble the bias of the whole generation"
            )
        return dense.nan_to_num(0.0)[None]


class StepRecorder(Recorder):
    """A :class:`Recorder` for generation: each call of a layer is streamed into that layer's rows
    (queries and outputs of the step, the keys and values it added) instead of being kept whole."""

    reads_in_forward: ClassVar[bool] = True  # each step's part and bias are read as the step runs

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.streams: dict[tuple[str, int], _Stream] = {}
        self.encoder_calls: list[AttentionCall] = []
        self.copies = HostCopies()

    def keep(self, call: AttentionCall) -> None:
        assert call.q is not None
        if call.q.shape[0] != 1:
            raise UnsupportedModelError(
                f"{call.name} ran on {call.q.shape[0]} sequences at once; attnviz records the generation of one"
            )
        key = (call.part, call.layer)
        if call.part in _ONCE:  # an encoder's source, a VLM's picture: read once, before the steps
            if key in self.streams:
                raise UnsupportedModelError(
                    f"{call.name} ran twice while generating; the {_ONCE[call.part]} is read once"
                )
            super().keep(call)
            self.encoder_calls.append(call)
            self.streams[key] = _Stream(call, steps=[call.q.shape[-2]], n=call.q.shape[-2])
            return
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = _Stream(call)
            self.calls.append(AttentionCall(**{**call.__dict__, **dict.fromkeys(_TENSOR_FIELDS)}))  # sizes only

        def move(t: Tensor) -> Tensor:  # a copy of its own, wherever it is kept: a view would keep the step's
            # whole cache alive, and a compiled static cache's CUDA graphs write the next step into the same
            # buffers (q and out read at the end were a later step's: torch refused them, test_gpu.py)
            return self.copies.copy(t, own=True) if not self.keep_on_device else t.clone()

        stream.take(call, move)

    def finish(self) -> None:
        self.copies.wait()  # every step's copies to the host, started without waiting
        super().finish()

    def assembled(self) -> list[AttentionCall]:
        return self.encoder_calls + [s.assemble() for key, s in self.streams.items() if key[0] not in _ONCE]
