"""The projection-hook side of the engine, for families that compute attention inline (no
AttentionInterface call to wrap).

From the facts in :data:`attnviz.families.PROJECTION_SPECS`: a pre-hook on the attention module
keeps its inputs (ALiBi, mask), hooks on the q/k/v (or fused) projection keep their outputs, and a
pre-hook on the output projection hands the call — its Q, K, V, bias and mask, and the model's own
A·V — as an :class:`InlineCall` to :func:`attnviz.engine.listeners.dispatch`, the same dispatch the
interface wrapper uses: an active editor may compute the call (its A·V then goes to the output
projection in place of the model's), and the recorders record it — so validation compares the
recomputation with what the model computed, and a wrong spec cannot go unnoticed.

The hooks are installed once per model, however many taps and editors listen to it
(reference-counted, :func:`hooked`), and act only for the listeners active in the calling context;
what they keep between the hooks of one call is kept per thread.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..families.facts import ProjectionSpec
from .listeners import compiled_dispatch, listened
from .projections import projection_module
from .specs import fused_layout, supported_families

__all__ = ["InlineCall", "hooked", "hooked_models", "projection_read"]


def _split_heads(x: Tensor, heads: int) -> Tensor:  # [batch, pos, head·d] -> [batch, head, pos, d]
    b, n, width = x.shape
    return x.view(b, n, heads, width // heads).transpose(1, 2)


def _split_fused(fused: Tensor, layout: str, heads: int, kv_heads: int) -> tuple[Tensor, Tensor, Tensor]:
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
    if layout == "grouped":  # [batch, pos, kv_head, group + 2, d]: each group's query heads, its key, its value
        x = fused.view(b, n, kv_heads, heads // kv_heads + 2, width // (heads + 2 * kv_heads))
        q = x[..., :-2, :].reshape(b, n, heads, -1).transpose(1, 2)
        return q, x[..., -2, :].transpose(1, 2), x[..., -1, :].transpose(1, 2)
    raise UnsupportedModelError(f"unknown fused q/k/v layout {layout!r}")


def projection_read(
    spec: ProjectionSpec, attention: nn.Module, kept: dict[str, Any], *, unfold_mask: bool = False
) -> dict[str, Any]:
    """One call of an inline attention module, rebuilt from what the hooks kept (``kept``: the
    projections' outputs ``q``/``k``/``v`` or ``fused``, and the module's bound ``inputs``).

    Returns Q, K, V ``[batch, head, pos, d]``, the mask (bool "may attend" or additive), the bias
    ``[batch|1, head, query|1, key]``, the scaling, causal flag and window — :meth:`Recorder.add`'s
    keyword arguments but ``out``, and what :mod:`attnviz.engine.editor` recomputes a call from.
    ``unfold_mask``: an additive term the mask carries on every key it lets through (Falcon's
    ALiBi, ``spec.mask_bias``) moves into the bias and the mask becomes bool, so that a key an edit
    unblocks gets that term too (what the model would have added had its mask not blocked it)."""
    heads = int(getattr(attention, spec.heads))
    if spec.fused:
        kv_heads = int(getattr(attention, "num_kv_heads", heads))
        q, k, v = _split_fused(kept["fused"], fused_layout(spec, attention), heads, kv_heads)
    else:
        q, k, v = (_split_heads(kept[name], heads) for name in ("q", "k", "v"))
    clip = spec.clip(attention)
    if clip:
        q, k, v = (t.clamp(min=-clip, max=clip) for t in (q, k, v))
    q_bias, v_bias = spec.qv_bias(attention)
    if q_bias is not None:
        q = q + q_bias.view(1, heads, 1, -1)
    if v_bias is not None:
        v = v + v_bias.view(1, v.shape[1], 1, -1)
    inputs = kept.get("inputs", {})
    q, k = spec.rotate(attention, inputs, q, k)
    if spec.fused:  # some made anew (a bias added, RoPE): a view left alone would keep the whole fused output alive
        fused = kept["fused"].untyped_storage().data_ptr()
        views = [t.untyped_storage().data_ptr() == fused for t in (q, k, v)]
        if not all(views):
            q, k, v = (t.clone() if view else t for t, view in zip((q, k, v), views))
    batch = q.shape[0]
    bias = spec.bias(attention, inputs, batch)
    scored = spec.qk_bias(attention, inputs, q, k)
    if scored is not None:
        bias = scored if bias is None else bias + scored
    if spec.mask_from is not None:
        mask = spec.mask_from(attention, inputs, q.shape[-2])
    else:
        mask = inputs.get(spec.mask) if spec.mask else None
    if isinstance(mask, Tensor):
        if mask.dtype != torch.bool and not mask.is_floating_point():
            mask = mask != 0  # a 0/1 integer mask (DeBERTa): 1 = may attend
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


class InlineCall:
    """One call of an inline attention module, caught by its hooks (see :class:`attnviz.engine.listeners.Call`).

    ``kept``: what the hooks kept of the call (:func:`projection_read`); ``out``: the model's own
    A·V, the output projection's input ``[batch, pos, head·d_v]``."""

    backend = "projection hooks"

    def __init__(self, spec: ProjectionSpec, module: nn.Module, kept: dict[str, Any], out: Tensor) -> None:
        self.spec, self.module, self.kept, self.out = spec, module, kept, out
        self._terms: dict[bool, dict[str, Any]] = {}

    @property
    def dtype(self) -> torch.dtype:
        return self.out.dtype

    def terms(self, dense_masks: dict[int, Any], *, unfold: bool = False) -> dict[str, Any]:
        if unfold not in self._terms:
            self._terms[unfold] = projection_read(self.spec, self.module, self.kept, unfold_mask=unfold)
        return self._terms[unfold]

    def own(self) -> Tensor:
        return self.out  # the model computed it already

    def split(self, result: Tensor) -> tuple[Tensor, None]:
        heads = int(getattr(self.module, self.spec.heads))
        if result.untyped_storage().nbytes() > result.numel() * result.element_size():
            result = result.clone()  # a cut of a larger output (LongT5's padded blocks): not kept alive
        return result.view(*result.shape[:2], heads, -1), None

    def join(self, out: Tensor, weights: Tensor | None) -> Tensor:
        return out.reshape(*out.shape[:2], -1)


class _Hooks:
    """The hooks on one model's attention modules, shared by every listener of that model."""

    def __init__(self, model: nn.Module, spec: ProjectionSpec) -> None:
        self.count = 0
        self.local = threading.local()  # per thread: {id(attention module): what its hooks kept of the call}
        self.handles: list[Any] = []
        try:
            for name, attention in model.named_modules():
                if type(attention).__name__ == spec.module:
                    self._hook(model, spec, name, attention)
        except BaseException:
            self.remove()
            raise
        if not self.handles:
            raise UnsupportedModelError(
                f"{type(model).__name__} has no {spec.module} module; attnviz supports {supported_families()}"
            )

    def kept(self, attention: nn.Module) -> dict[str, Any]:
        by_module = self.local.__dict__.setdefault("by_module", {})
        return by_module.setdefault(id(attention), {})

    def _hook(self, model: nn.Module, spec: ProjectionSpec, path: str, attention: nn.Module) -> None:
        signature = inspect.signature(attention.forward)
        dispatch = compiled_dispatch()

        def keep_inputs(_module, args, kwargs):
            if listened(attention):
                kept = self.kept(attention)
                kept.clear()
                kept["inputs"] = signature.bind_partial(*args, **kwargs).arguments

        def keep_output(name):
            def hook(_module, _args, output):
                if listened(attention):  # the call's first output: DeBERTa-v3 runs q/k again on its relative embeddings
                    self.kept(attention).setdefault(name, output)

            return hook

        def finish(_module, args):
            kept = self.kept(attention)
            if "inputs" not in kept or not listened(attention):
                return None
            call = InlineCall(spec, attention, dict(kept), args[0])
            kept.clear()
            result = dispatch(call)
            return None if result is args[0] else (result, *args[1:])

        self.handles.append(attention.register_forward_pre_hook(keep_inputs, with_kwargs=True))
        parts = {"fused": spec.fused} if spec.fused else {"q": spec.q, "k": spec.k, "v": spec.v}
        for name, child in parts.items():
            assert child is not None, f"{spec.module}: a spec names q, k and v, or one fused projection"
            self.handles.append(attention.get_submodule(child).register_forward_hook(keep_output(name)))
        out = projection_module(model, path)
        if out is None:
            raise UnsupportedModelError(f"{path} ({spec.module}) has no output projection at {spec.out!r}")
        self.handles.append(out.register_forward_pre_hook(finish))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


_LOCK = threading.Lock()
_HOOKED: dict[int, _Hooks] = {}  # id(model) -> its hooks, while some listener holds them


@contextlib.contextmanager
def hooked(model: nn.Module, spec: ProjectionSpec) -> Iterator[None]:
    """The projection hooks on every ``spec.module`` of ``model``, for the block: installed by the
    first listener of the model, removed in ``finally`` by the last (also when the block raises).
    Whether the hooks can read this configuration (``spec.refuse``) is :func:`attnviz.engine.taps.attached`'s
    check."""
    with _LOCK:
        hooks = _HOOKED.get(id(model))
        if hooks is None:
            hooks = _HOOKED[id(model)] = _Hooks(model, spec)
        hooks.count += 1
    try:
        yield
    finally:
        with _LOCK:
            hooks.count -= 1
            if hooks.count == 0:
                del _HOOKED[id(model)]
                hooks.remove()


def hooked_models() -> int:
    """How many models carry attnviz's projection hooks right now (for tests and debugging)."""
    return len(_HOOKED)
