"""Taps: record what each attention kernel of an unmodified model receives and returns.

transformers' attention modules call
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, default)(module, q, k, v,
mask, scaling=…, **kwargs)`` with Q and K *as the kernel sees them* (after RoPE, before GQA
expansion), V, the mask, the scaling and the backend's own arguments (sliding window, soft-cap,
causal flag, T5's ``position_bias``, gpt-oss's sinks ``s_aux``). For the duration of a capture,
:func:`tap` puts a recording wrapper in front of the model's backend through the mapping's
documented ``__setitem__`` (the slot ``AttentionInterface.register`` fills). The wrapper calls
exactly the function the caller would have got — the mapped backend, or for ``"eager"`` the
``default`` the calling code passed to ``get_interface`` (read from that call site) — records its
inputs and result, and hands the result back unchanged. The model's config is never touched, so
the backend is not switched; the previous mapping is restored in ``finally``, also when forward
raises.

Each recorded call is keyed by the module that made it: its path in the model gives the part
(``encoder`` / ``decoder`` / ``cross``) and the layer (:func:`attnviz.engine.specs.locate`), never the
call order. An argument the recorder does not understand refuses the capture
(:class:`UnsupportedModelError`), so a map is never silently missing a term.

Several captures may run at once — other threads, other models, nested ``with tap(a): with
tap(b):`` blocks. The wrapper is installed once per backend (reference-counted) and records into
every :class:`Recorder` active in the *calling* context (a ``ContextVar``) that owns the module;
every other call passes straight through to the function it would have run anyway.

The wrapper and its installation live in :mod:`attnviz.engine.interface`; the hooks for families that
compute attention inline in :mod:`attnviz.engine.hooks`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from .interface import _ACTIVE, installed_backends, wrapped
from .specs import (
    INERT_ARGUMENTS,
    INTERPRETED_ARGUMENTS,
    PROJECTION_SPECS,
    locate,
    supported_families,
)

__all__ = ["AttentionCall", "Recorder", "installed_backends", "tap", "tap_model"]


@dataclass
class AttentionCall:
    """One call of an attention kernel, as recorded (tensors may be on the model's device).

    The mask is normalised: ``mask`` is a 4-D bool ("may attend") or additive tensor, or None;
    ``key_padding`` marks real keys when the kernel got a 2-D padding mask (flash); ``causal`` is
    the causal structure the kernel applied on top of them.
    """

    name: str  # the attention module's qualified name in the model
    part: str  # "encoder", "decoder" or "cross"
    layer: int
    scaling: float
    causal: bool  # the causal structure the kernel applied besides ``mask``
    window: int | None
    softcap: float | None
    backend: str
    # the tensors: None when the layer was not asked for (or the kernel gave no such thing)
    q: Tensor | None = None  # [batch, head, query_pos, d_head]
    k: Tensor | None = None  # [batch, kv_head, key_pos, d_head]
    v: Tensor | None = None  # [batch, kv_head, key_pos, d_head_v]
    out: Tensor | None = None  # [batch, query_pos, head, d_head_v], the kernel's own output
    weights: Tensor | None = (
        None  # [batch, head, query_pos, key_pos] when the backend returned them (and they are kept)
    )
    mask: Tensor | None = None  # [batch|1, head|1, query_pos, key_pos] bool (True = may attend) or additive
    key_padding: Tensor | None = None  # [batch, key_pos] bool, True = a real key
    bias: Tensor | None = None  # [batch|1, head|1, query_pos|1, key_pos] added to the scores (T5, ALiBi)
    sinks: Tensor | None = None  # [head] learned sink logits (gpt-oss)
    weight_error: Tensor | None = None  # [batch, head] max |recomputed - model's weights| (weights dropped)
    weight_scale: Tensor | None = None  # [batch, head] max |model's weights|
    sizes: dict[str, int] = field(default_factory=dict)  # n_heads, n_kv_heads, d_head (also when not kept)
    sliding_window: int | None = None  # the window the module asked for, also when its mask carries it
    step: int = 0  # how many earlier calls this module made in this tap (a generation's step)

    def item(self, b: int) -> dict[str, Any]:
        """Batch item ``b`` of this call: q/k/v/out as ``[head, pos, d]`` views, its mask (with the
        key padding folded in) as ``[head or 1, query_pos, key_pos]`` and its bias likewise."""

        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[b if t.shape[0] > 1 else 0]

        mask = pick(self.mask)
        if self.key_padding is not None:
            padding = self.key_padding[b][None, None, :]
            if mask is None:
                mask = padding
            elif mask.dtype == torch.bool:
                mask = mask & padding
            else:
                mask = mask.masked_fill(~padding, torch.finfo(mask.dtype).min)
        assert self.q is not None and self.k is not None and self.v is not None, "a layer that was not kept"
        return dict(
            q=self.q[b],
            k=self.k[b],
            v=self.v[b],
            out=None if self.out is None else self.out[b].transpose(0, 1),
            mask=mask,
            bias=pick(self.bias),
            sinks=self.sinks,
            scale=self.scaling,
            causal=self.causal,
            window=self.window,
            softcap=self.softcap,
        )


#: the tensor fields of an :class:`AttentionCall` (moved to the CPU when kept, dropped when a layer is done)
CALL_TENSORS = (
    "q",
    "k",
    "v",
    "out",
    "weights",
    "mask",
    "key_padding",
    "bias",
    "sinks",
    "weight_error",
    "weight_scale",
)


@dataclass
class Recorder:
    """Collects the attention calls of one forward of one model (see :func:`tap`)."""

    model: nn.Module
    layers: set[int] | None = None  # None = every layer
    to_cpu: bool = True
    weight_mode: str = "keep"  # backend's weights: "keep" them, "compare" at once and keep only the errors, or "drop"
    lengths: dict[str, list[int]] | None = None  # per part: real query rows per batch item (right padding)
    calls: list[AttentionCall] = field(default_factory=list)
    _names: dict[int, str] = field(default_factory=dict)
    _encoder_decoder: bool = False
    _dense: dict[int, Tensor] = field(default_factory=dict)  # flex BlockMasks already made dense
    _steps: dict[int, int] = field(default_factory=dict)  # calls so far per module
    _where: dict[tuple[int, bool], tuple[str, int]] = field(default_factory=dict)  # (module, causal) -> part, layer

    def __post_init__(self) -> None:
        self._names = {id(m): name for name, m in self.model.named_modules()}
        self._encoder_decoder = bool(getattr(getattr(self.model, "config", None), "is_encoder_decoder", False))

    def owns(self, module: nn.Module) -> bool:
        return id(module) in self._names

    def record(self, backend: str, module: nn.Module, args: tuple, kwargs: dict, result: Any) -> None:
        """Record one call of an attention-interface function (its arguments and its result)."""
        out, weights = result if isinstance(result, tuple) else (result, None)
        self.add(module, backend, out=out, weights=weights, **self.read(backend, module, args, kwargs))

    def read(self, backend: str, module: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
        """What one attention-interface call computes, as :meth:`add`'s keyword arguments (all but
        ``out`` and ``weights``): Q, K, V, the normalised mask and the scaling, causal flag, window,
        bias, sinks and soft-cap the kernel applies. Refuses an argument it cannot interpret."""
        family = type(module).__name__
        if len(args) > 4:
            raise UnsupportedModelError(
                f"{family} passes {len(args) - 4} positional argument(s) after the mask to its attention "
                "function; attnviz cannot tell what they do, so it will not show a possibly wrong map"
            )
        query, key, value, mask = (list(args) + [None] * 4)[:4]
        if mask is None:
            mask = kwargs.get("attention_mask")
        _check_arguments(family, kwargs, module)
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        is_causal = kwargs.get("is_causal")
        if is_causal is None:
            is_causal = bool(getattr(module, "is_causal", False))
        window = kwargs.get("sliding_window") or None
        mask, key_padding = self._normalise_mask(family, mask, query, key)
        # The mask decides when there is one; without one eager attends everywhere while sdpa and
        # flash apply the causal flag (sdpa only for more than one query).
        causal = bool(is_causal) and backend != "eager" and not (mask is not None and key_padding is None)
        if backend.startswith("sdpa") and query.shape[-2] == 1:
            causal = False
        if mask is not None and window is not None and backend.startswith(("eager", "sdpa")):
            window = None  # eager and sdpa get the window inside the 4-D mask
        return dict(
            q=query,
            k=key,
            v=value,
            mask=mask,
            key_padding=key_padding,
            bias=kwargs.get("position_bias"),
            sinks=kwargs.get("s_aux"),
            scaling=float(scaling),
            causal=causal,
            window=window,
            softcap=kwargs.get("softcap"),
            sliding_window=kwargs.get("sliding_window") or None,
        )

    def _normalise_mask(
        self, family: str, mask: Any, query: Tensor, key: Tensor
    ) -> tuple[Tensor | None, Tensor | None]:
        """(4-D mask or None, 2-D key padding or None) for every mask form the interface passes."""
        if mask is None or isinstance(mask, Tensor) and mask.dim() == 4:
            return mask, None
        if isinstance(mask, Tensor) and mask.dim() == 2:  # flash: [batch, key_pos], 1 = a real token
            if mask.shape[-1] != key.shape[-2]:
                raise UnsupportedModelError(
                    f"{family} passed a 2-D mask over {mask.shape[-1]} keys for {key.shape[-2]} keys; "
                    "attnviz cannot align it"
                )
            return None, mask.bool()
        if type(mask).__name__ == "BlockMask":  # flex attention
            cached = self._dense.get(id(mask))
            if cached is None:
                cached = self._dense[id(mask)] = _dense_block_mask(mask, query, key)
            return cached, None
        raise UnsupportedModelError(
            f"{family} passed a {type(mask).__name__} mask "
            f"{tuple(mask.shape) if isinstance(mask, Tensor) else ''} that attnviz cannot read; "
            "load the model with attn_implementation='sdpa' or 'eager'"
        )

    def where(self, module: nn.Module, causal: bool) -> tuple[str, int]:
        key = (id(module), causal)
        found = self._where.get(key)
        if found is None:  # a module's place does not change: looked up once (a generation calls it every step)
            found = self._where[key] = locate(
                self._names[id(module)],
                encoder_decoder=self._encoder_decoder,
                causal=causal,
                layer_idx=getattr(module, "layer_idx", None),
            )
        return found

    def place(
        self, module: nn.Module, causal: bool, mask: Tensor | None, designed_causal: bool | None = None
    ) -> tuple[str, int]:
        """(part, layer) of a call: the module's path, and whether its attention is causal by design
        (its ``is_causal``, else ``designed_causal``, else the call's causal flag or mask structure)."""
        looks_causal = getattr(module, "is_causal", None)
        if looks_causal is None:
            looks_causal = designed_causal
        if looks_causal is None:
            looks_causal = causal or (mask is not None and _is_causal_structure(mask))
        return self.where(module, bool(looks_causal))

    def add(
        self,
        module: nn.Module,
        backend: str,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        *,
        weights: Any = None,
        mask: Tensor | None = None,
        key_padding: Tensor | None = None,
        bias: Tensor | None = None,
        sinks: Tensor | None = None,
        scaling: float,
        causal: bool,
        window: int | None = None,
        softcap: float | None = None,
        designed_causal: bool | None = None,
        sliding_window: int | None = None,
    ) -> None:
        """Append one layer's call; tensors of layers not asked for are dropped at once.

        ``designed_causal`` says whether the attention is causal by design (when the module has no
        ``is_causal``): it names the part of a one-stack model even for a single token."""
        part, layer = self.place(module, causal, mask, designed_causal)
        keep = self.layers is None or layer in self.layers

        if bias is not None and not bias.any():
            bias = None  # T5's cross-attention passes zeros
        call = AttentionCall(
            name=self._names[id(module)],
            part=part,
            layer=layer,
            scaling=scaling,
            causal=causal,
            window=int(window) if window is not None else None,
            softcap=softcap,
            backend=backend,
            sizes={"n_heads": q.shape[1], "n_kv_heads": k.shape[1], "d_head": q.shape[-1]},
            sliding_window=int(sliding_window or window or 0) or None,
            step=self._steps.get(id(module), 0),
        )
        self._steps[id(module)] = call.step + 1
        if keep:
            call.q, call.k, call.v, call.out = q.detach(), k.detach(), v.detach(), out.detach()
            call.mask, call.key_padding = mask, key_padding
            call.bias = bias.detach() if isinstance(bias, Tensor) else None
            call.sinks = sinks.detach() if isinstance(sinks, Tensor) else None
            if isinstance(weights, Tensor) and self.weight_mode == "keep":
                call.weights = weights.detach()
            elif isinstance(weights, Tensor) and self.weight_mode == "compare":
                from ..data.validate import weight_errors

                lengths = None if self.lengths is None else self.lengths.get(part)
                call.weight_error, call.weight_scale = weight_errors(call, weights.detach(), lengths)
            self.keep(call)
        else:
            self.calls.append(call)

    def keep(self, call: AttentionCall) -> None:
        """Store a call of a layer that was asked for (moved to the CPU unless ``to_cpu`` is off)."""
        if self.to_cpu:
            for name in CALL_TENSORS:
                value = getattr(call, name)
                if isinstance(value, Tensor):
                    setattr(call, name, value.to("cpu"))
        self.calls.append(call)


def _is_causal_structure(mask: Tensor) -> bool:
    """Whether a 4-D mask blocks every key after its query (the last query aligned with the last key)."""
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    allowed = allowed[0, 0]
    q, k = allowed.shape
    return q > 1 and not bool(torch.triu(allowed, diagonal=1 + k - q).any())


def _check_arguments(family: str, kwargs: dict, module: nn.Module) -> None:
    for name, value in kwargs.items():
        if name in INTERPRETED_ARGUMENTS or name in INERT_ARGUMENTS or value is None or value is False:
            continue
        raise UnsupportedModelError(
            f"{family} passes {name}={_describe(value)} to its attention function; attnviz does not know "
            f"how {name!r} changes the attention, so it will not show a possibly wrong map. "
            f"attnviz supports {supported_families()}"
        )
    if kwargs.get("dropout") and module.training:
        raise UnsupportedModelError(f"{family} applies attention dropout; call model.eval() first")


def _describe(value: Any) -> str:
    return f"<tensor {tuple(value.shape)}>" if isinstance(value, Tensor) else repr(value)[:40]


def _dense_block_mask(block_mask: Any, query: Tensor, key: Tensor) -> Tensor:  # [batch, 1, q, k] bool
    """A flex-attention BlockMask as the dense "may attend" mask its ``mask_mod`` describes."""
    n_q, n_k = query.shape[-2], key.shape[-2]
    batch = query.shape[0]
    device = query.device
    b = torch.arange(batch, device=device)[:, None, None, None]
    q = torch.arange(n_q, device=device)[None, None, :, None]
    k = torch.arange(n_k, device=device)[None, None, None, :]
    try:
        heads = [block_mask.mask_mod(b, torch.full_like(b, h), q, k) for h in (0, query.shape[1] - 1)]
    except Exception as err:  # noqa: BLE001 - any failure means we cannot read this mask
        raise UnsupportedModelError(
            f"could not evaluate the flex-attention mask function ({type(err).__name__}: {err}); "
            "load the model with attn_implementation='sdpa' or 'eager'"
        ) from err
    dense = heads[0].expand(batch, 1, n_q, n_k)
    if not torch.equal(dense, heads[1].expand(batch, 1, n_q, n_k)):
        raise UnsupportedModelError("the flex-attention mask differs between heads; attnviz reads one mask per layer")
    return dense.contiguous()


@contextlib.contextmanager
def _active(recorder: Recorder) -> Iterator[None]:
    token = _ACTIVE.set(_ACTIVE.get() + (recorder,))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def tap(
    model: nn.Module,
    *,
    layers: set[int] | None = None,
    to_cpu: bool = True,
    weight_mode: str = "keep",
    lengths: dict[str, list[int]] | None = None,
    recorder_class: type[Recorder] = Recorder,
) -> Iterator[Recorder]:
    """Record every attention call of ``model`` made inside the ``with`` block, in this context.

    >>> with tap(model) as rec:
    ...     model(**inputs)
    >>> rec.calls[0].part, rec.calls[0].layer, rec.calls[0].q.shape   # [batch, head, query_pos, d_head]

    Taps nest (an inner tap on another model, or the same one, records too). The wrappers are
    removed on exit, also when the block raises; the model is not modified.
    """
    recorder = recorder_class(model, layers=layers, to_cpu=to_cpu, weight_mode=weight_mode, lengths=lengths)
    with _active(recorder), wrapped(model):
        yield recorder


def tap_model(
    model: nn.Module,
    *,
    layers: set[int] | None = None,
    to_cpu: bool = True,
    weight_mode: str = "keep",
    lengths: dict[str, list[int]] | None = None,
):
    """The right tap for ``model``: projection hooks for the families in :data:`PROJECTION_SPECS`,
    the AttentionInterface wrapper for every other."""
    from .hooks import tap_projections

    spec = PROJECTION_SPECS.get(getattr(getattr(model, "config", None), "model_type", ""))
    if spec is not None:
        return tap_projections(model, spec, layers=layers, to_cpu=to_cpu, weight_mode=weight_mode, lengths=lengths)
    return tap(model, layers=layers, to_cpu=to_cpu, weight_mode=weight_mode, lengths=lengths)
