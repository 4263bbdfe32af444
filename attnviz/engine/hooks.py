"""Taps for families that compute attention inline (no AttentionInterface call to wrap).

From the facts in :data:`attnviz.engine.specs.PROJECTION_SPECS`: a pre-hook on the attention module keeps
its inputs (ALiBi, mask), hooks on the q/k/v (or fused) projection keep their outputs, and a
pre-hook on the output projection takes the model's own A·V and records the call into the same
:class:`~attnviz.engine.taps.Recorder` the interface taps use — so validation compares the recomputation
with what the model computed, and a wrong spec cannot go unnoticed.

The same hooks (:func:`projection_hooks`) carry the edits of :mod:`attnviz.edits` for these
families: the editor's pre-hook on the output projection hands it the edited A·V in place of the
model's, and tells the recorders what the edited call was.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from .interface import _EDITORS
from .specs import ProjectionSpec, fused_layout, supported_families
from .taps import _ACTIVE, Recorder, _active

__all__ = ["projection_hooks", "projection_read", "tap_projections"]

#: what a call hook gets: (attention module, its call as :func:`projection_read` reads it, the output
#: projection's input [batch, pos, head·d_v]); a Tensor it returns replaces that input
OnCall = Callable[[nn.Module, dict[str, Any], Tensor], Tensor | None]


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


def projection_read(
    spec: ProjectionSpec, attention: nn.Module, kept: dict[str, Any], *, unfold_mask: bool = False
) -> dict[str, Any]:
    """One call of an inline attention module, rebuilt from what the hooks kept (``kept``: the
    projections' outputs ``q``/``k``/``v`` or ``fused``, and the module's bound ``inputs``).

    Returns Q, K, V ``[batch, head, pos, d]``, the mask (bool "may attend" or additive), the bias
    ``[batch|1, head, query|1, key]``, the scaling, causal flag and window — :meth:`Recorder.add`'s
    keyword arguments but ``out``, and what :mod:`attnviz.edits` recomputes a call from.
    ``unfold_mask``: an additive term the mask carries on every key it lets through (Falcon's
    ALiBi, ``spec.mask_bias``) moves into the bias and the mask becomes bool, so that a key an edit
    unblocks gets that term too (what the model would have added had its mask not blocked it)."""
    heads = int(getattr(attention, spec.heads))
    if spec.fused:
        q, k, v = _split_fused(kept["fused"], fused_layout(spec, attention), heads)
    else:
        q, k, v = (_split_heads(kept[name], heads) for name in ("q", "k", "v"))
    clip = spec.clip(attention)
    if clip:
        q, k, v = (t.clamp(min=-clip, max=clip) for t in (q, k, v))
    inputs = kept.get("inputs", {})
    batch = q.shape[0]
    bias = spec.bias(attention, inputs, batch)
    mask = inputs.get(spec.mask) if spec.mask else None
    if isinstance(mask, Tensor):
        if mask.dtype == torch.bool and spec.mask_true_means_masked:
            mask = ~mask
        carried = spec.mask_bias(attention, inputs, batch) if unfold_mask else None
        if carried is not None and mask.is_floating_point():
            mask = mask > torch.finfo(mask.dtype).min / 2
            bias = carried if bias is None else bias + carried
    else:
        mask = None
    if bias is not None:
        bias = bias[..., -q.shape[-2] :, :] if bias.shape[-2] > 1 else bias
        bias = bias[..., -k.shape[-2] :]
    return dict(
        q=q,
        k=k,
        v=v,
        mask=mask,
        key_padding=None,
        bias=bias,
        sinks=None,
        scaling=float(spec.scaling(attention)),
        causal=spec.causal and mask is None,
        window=spec.window(attention),
        softcap=None,
        designed_causal=spec.causal,
    )


@contextlib.contextmanager
def projection_hooks(
    model: nn.Module,
    spec: ProjectionSpec,
    on_call: OnCall,
    *,
    active: Callable[[nn.Module], bool],
    first: bool = False,
    unfold_mask: bool = False,
) -> Iterator[None]:
    """Hooks on every ``spec.module`` of ``model`` that hand each call to ``on_call``.

    While ``active(attention)``: a pre-hook on the attention module keeps its inputs (ALiBi, mask),
    forward hooks keep the q/k/v (or fused) projections' outputs, and a pre-hook on the output
    projection calls ``on_call(attention, read, out)`` — ``read`` as :func:`projection_read` gives
    it, ``out`` the model's own A·V (heads concatenated). A Tensor ``on_call`` returns goes to the
    output projection in place of ``out`` (``first``: this pre-hook runs before any other, so the
    recorders' hooks see the replaced input). The hooks are removed on exit, also on error."""
    reason = spec.refuse(model.config)
    if reason:
        raise UnsupportedModelError(f"{reason}. attnviz supports {supported_families()}")
    handles = []
    try:
        for attention in (m for m in model.modules() if type(m).__name__ == spec.module):
            kept: dict[str, Any] = {}
            signature = inspect.signature(attention.forward)

            def keep_inputs(module, args, kwargs, attention=attention, kept=kept, signature=signature):
                if active(attention):
                    kept.clear()
                    kept["inputs"] = signature.bind_partial(*args, **kwargs).arguments

            def keep_output(name, attention=attention, kept=kept):
                def hook(_module, _args, output):
                    if active(attention):
                        kept[name] = output

                return hook

            def finish(_module, args, attention=attention, kept=kept):
                if not active(attention) or "inputs" not in kept:
                    return None
                read = projection_read(spec, attention, kept, unfold_mask=unfold_mask)
                kept.clear()
                replaced = on_call(attention, read, args[0])
                return None if replaced is None else (replaced, *args[1:])

            handles.append(attention.register_forward_pre_hook(keep_inputs, with_kwargs=True))
            parts = {"fused": spec.fused} if spec.fused else {"q": spec.q, "k": spec.k, "v": spec.v}
            for name, child in parts.items():
                assert child is not None, f"{spec.module}: a spec names q, k and v, or one fused projection"
                handles.append(attention.get_submodule(child).register_forward_hook(keep_output(name)))
            handles.append(attention.get_submodule(spec.out).register_forward_pre_hook(finish, prepend=first))
        if not handles:
            raise UnsupportedModelError(
                f"{type(model).__name__} has no {spec.module} module; attnviz supports {supported_families()}"
            )
        yield
    finally:
        for handle in handles:
            handle.remove()


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

    For families that compute attention inline (see :data:`attnviz.engine.specs.PROJECTION_SPECS`): a
    pre-hook on the attention module keeps its inputs (ALiBi, mask), hooks on the q/k/v (or
    fused) projection keep their outputs, and a pre-hook on the output projection takes the
    model's own A·V and records the call (:func:`projection_hooks`). A call an active editor
    changed is recorded as the editor says it ran (:meth:`attnviz.edits.Editor.seen`). The hooks
    belong to this capture alone, record only in its context, and are removed on exit, also on error.
    """
    recorder = Recorder(model, layers=layers, to_cpu=to_cpu, weight_mode=weight_mode, lengths=lengths)

    def mine(_attention: nn.Module) -> bool:
        return recorder in _ACTIVE.get()

    def record(attention: nn.Module, read: dict[str, Any], out: Tensor) -> None:
        editor = next((e for e in reversed(_EDITORS.get()) if e.owns(attention)), None)
        edited = None if editor is None else editor.seen(attention)
        if edited is not None:
            read, out = edited[0] or read, edited[1]
        _record_projection(recorder, attention, read, out)

    with _active(recorder), projection_hooks(model, spec, record, active=mine):
        yield recorder


def _record_projection(recorder: Recorder, attention: nn.Module, read: dict[str, Any], out: Tensor) -> None:
    """Record one call (``out``: the A·V the output projection got, [batch, pos, head·d_v])."""
    heads = read["q"].shape[1]
    recorder.add(attention, "projection hooks", out=out.view(*out.shape[:2], heads, -1), **read)
