"""Taps for families that compute attention inline (no AttentionInterface call to wrap).

From the facts in :data:`attnviz.specs.PROJECTION_SPECS`: a pre-hook on the attention module keeps
its inputs (ALiBi, mask), hooks on the q/k/v (or fused) projection keep their outputs, and a
pre-hook on the output projection takes the model's own A·V and records the call into the same
:class:`~attnviz.taps.Recorder` the interface taps use — so validation compares the recomputation
with what the model computed, and a wrong spec cannot go unnoticed.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from .errors import UnsupportedModelError
from .specs import ProjectionSpec, fused_layout, supported_families
from .taps import _ACTIVE, Recorder, _active

__all__ = ["tap_projections"]


def _split_heads(x: Tensor, heads: int) -> Tensor:  # [batch, pos, head·d] -> [batch, head, pos, d]
    b, n, width = x.shape
    return x.view(b, n, heads, width // heads).transpose(1, 2)


def _split_fused(fused: Tensor, layout: str, heads: int) -> tuple[Tensor, Tensor, Tensor]:
    b, n, width = fused.shape
    if layout == "concat":
        q, k, v = fused.chunk(3, dim=-1)
        return _split_heads(q, heads), _split_heads(k, heads), _split_heads(v, heads)
    if layout == "interleaved":  # [batch, pos, head, 3, d]
        x = fused.view(b, n, heads, 3, width // (3 * heads))
        return tuple(x[..., i, :].transpose(1, 2) for i in range(3))  # type: ignore[return-value]
    if layout == "multi_query":  # [batch, pos, head + 2, d]: the query heads, one key head, one value head
        x = fused.view(b, n, heads + 2, width // (heads + 2))
        return x[:, :, :-2].transpose(1, 2), x[:, :, -2:-1].transpose(1, 2), x[:, :, -1:].transpose(1, 2)
    raise UnsupportedModelError(f"unknown fused q/k/v layout {layout!r}")


@contextlib.contextmanager
def tap_projections(
    model: nn.Module,
    spec: ProjectionSpec,
    *,
    layers: set[int] | None = None,
    to_cpu: bool = True,
    weight_mode: str = "keep",
    lengths: dict[str, list[int]] | None = None,
) -> Iterator[Recorder]:
    """Record Q, K, V and the attention output through forward hooks on the projections.

    For families that compute attention inline (see :data:`attnviz.specs.PROJECTION_SPECS`): a
    pre-hook on the attention module keeps its inputs (ALiBi, mask), hooks on the q/k/v (or
    fused) projection keep their outputs, and a pre-hook on the output projection takes the
    model's own A·V and records the call. The hooks belong to this capture alone, record only in
    its context, and are removed on exit, also on error.
    """
    reason = spec.refuse(model.config)
    if reason:
        raise UnsupportedModelError(f"{reason}. attnviz supports {supported_families()}")
    recorder = Recorder(model, layers=layers, to_cpu=to_cpu, weight_mode=weight_mode, lengths=lengths)
    handles = []

    def mine() -> bool:
        return recorder in _ACTIVE.get()

    with _active(recorder):
        try:
            for attention in (m for m in model.modules() if type(m).__name__ == spec.module):
                scratch: dict[str, Any] = {}
                signature = inspect.signature(attention.forward)

                def keep_inputs(module, args, kwargs, scratch=scratch, signature=signature):
                    if mine():
                        scratch["inputs"] = signature.bind_partial(*args, **kwargs).arguments

                def keep_output(name, scratch=scratch):
                    def hook(_module, _args, output):
                        if mine():
                            scratch[name] = output

                    return hook

                def finish(_module, args, attention=attention, scratch=scratch):
                    if mine():
                        _record_projection(recorder, spec, attention, scratch, args[0])

                handles.append(attention.register_forward_pre_hook(keep_inputs, with_kwargs=True))
                parts = {"fused": spec.fused} if spec.fused else {"q": spec.q, "k": spec.k, "v": spec.v}
                for name, child in parts.items():
                    assert child is not None, f"{spec.module}: a spec names q, k and v, or one fused projection"
                    handles.append(attention.get_submodule(child).register_forward_hook(keep_output(name)))
                handles.append(attention.get_submodule(spec.out).register_forward_pre_hook(finish))
            if not handles:
                raise UnsupportedModelError(
                    f"{type(model).__name__} has no {spec.module} module; attnviz supports {supported_families()}"
                )
            yield recorder
        finally:
            for handle in handles:
                handle.remove()


def _record_projection(
    recorder: Recorder, spec: ProjectionSpec, attention: nn.Module, scratch: dict, out: Tensor
) -> None:
    heads = int(getattr(attention, spec.heads))
    if spec.fused:
        q, k, v = _split_fused(scratch.pop("fused"), fused_layout(spec, attention), heads)
    else:
        q, k, v = (_split_heads(scratch.pop(name), heads) for name in ("q", "k", "v"))
    clip = spec.clip(attention)
    if clip:
        q, k, v = (t.clamp(min=-clip, max=clip) for t in (q, k, v))
    inputs = scratch.pop("inputs", {})
    batch = q.shape[0]
    bias = spec.bias(attention, inputs, batch)
    if bias is not None:
        bias = bias[..., -q.shape[-2] :, :] if bias.shape[-2] > 1 else bias
        bias = bias[..., -k.shape[-2] :]
    mask = inputs.get(spec.mask) if spec.mask else None
    if isinstance(mask, Tensor):
        if mask.dtype == torch.bool and spec.mask_true_means_masked:
            mask = ~mask
    else:
        mask = None
    recorder.add(
        attention,
        "projection hooks",
        q,
        k,
        v,
        out.view(*out.shape[:2], heads, -1),
        mask=mask,
        bias=bias,
        scaling=float(spec.scaling(attention)),
        causal=spec.causal and mask is None,
        window=spec.window(attention),
        designed_causal=spec.causal,
    )
