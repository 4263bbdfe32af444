"""Taps: record what each attention call of an unmodified model computes.

:func:`tap` records every attention call of a model made inside a ``with`` block, for every family
attnviz captures. Most families call transformers'
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, default)(module, q, k, v,
mask, scaling=…, **kwargs)`` with Q and K *as the kernel sees them* (after RoPE, before GQA
expansion), V, the mask, the scaling and the backend's own arguments (sliding window, soft-cap,
causal flag, T5's ``position_bias``, gpt-oss's sinks ``s_aux``): for them a recording wrapper sits
in front of the model's backend (:mod:`attnviz.engine.interface`), calls exactly the function the
caller would have got and hands its result back unchanged. The families that compute attention
inline (GPT-Neo, XGLM, GPT-1, Bloom, MPT, Falcon-ALiBi, DeBERTa-v2/v3:
:data:`attnviz.families.PROJECTION_SPECS`)
are read through hooks on their projections (:mod:`attnviz.engine.hooks`). :func:`attached` chooses.
The model's config is never touched; everything is removed in ``finally``, also when forward raises.

Each recorded call is keyed by the module that made it: its path in the model gives the part
(``encoder`` / ``decoder`` / ``cross``) and the layer (:func:`attnviz.engine.specs.locate`), never the
call order — except in a family whose modules each run for several layers
(:data:`attnviz.families.SHARED_LAYERS`, ALBERT), where the layer is the call's index in its forward. An argument attnviz does not understand refuses the capture
(:class:`UnsupportedModelError`), so a map is never silently missing a term.

Several captures may run at once — other threads, other models, nested ``with tap(a): with
tap(b):`` blocks. A :class:`Recorder` is a listener (:mod:`attnviz.engine.listeners`): it hears the
calls made in the context that entered its tap, of the modules of its own model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..attention import attention_output, head_max
from ..deprecation import renamed
from ..families import PROJECTION_SPECS, SHARED_LAYERS, TOWERS
from .hooks import hooked
from .interface import installed_backends, wrapped
from .listeners import Call, Seen, listening, owner, recorders
from .projections import ProjectionWatch
from .specs import check_supported, locate
from .transfer import HostCopies

__all__ = [
    "CALL_TENSORS",
    "AttentionCall",
    "Recorder",
    "attached",
    "installed_backends",
    "tap",
    "weight_errors",
]


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
    sampled_weights: list[Tensor] | None = None  # per batch item: [head, sample rows, key_pos] (weight_mode "sample")
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


def weight_errors(call: AttentionCall, weights: Tensor, lengths: list[int] | None) -> tuple[Tensor, Tensor]:
    """[batch, head] max errors (and max |model|) of the call's recomputed weights against the
    backend's ``weights``, over each item's real query rows (``lengths``; None: every row) — so a
    capture can drop the n×n weights at once (``weight_mode="compare"``)."""
    batch, heads = weights.shape[0], weights.shape[1]
    err = torch.zeros(batch, heads, device=weights.device)  # kept where the weights are: nothing waits for them
    scale = torch.zeros(batch, heads, device=weights.device)
    for b in range(batch):
        item = call.item(b)
        n = lengths[b] if lengths is not None else item["q"].shape[-2]
        for r, _keys, _, ours in attention_output(
            item["q"],
            item["k"],
            item["v"],
            rows=torch.arange(n),
            scale=item["scale"],
            causal=item["causal"],
            window=item["window"],
            mask=item["mask"],
            bias=item["bias"],
            sinks=item["sinks"],
            softcap=item["softcap"],
            all_keys=True,
        ):
            theirs = weights[b][:, r.to(weights.device)].to(ours.device, torch.float32)
            err[b] = torch.maximum(err[b], head_max(ours - theirs).to(err.device))
            scale[b] = torch.maximum(scale[b], head_max(theirs).to(err.device))
    return err, scale


@dataclass
class Recorder:
    """Collects the attention calls of one forward of one model (see :func:`tap`); a
    :class:`~attnviz.engine.listeners.Recording` listener."""

    model: nn.Module
    layers: set[int] | None = None  # None = every layer
    keep_on_device: bool = False  # False: the kept tensors are copied to the host after the forward
    # backend's weights: "keep" them, "sample": keep the rows the self-check samples (compared after the
    # forward), "compare" every row at once and keep only the errors, or "drop"
    weight_mode: str = "keep"
    lengths: dict[str, list[int]] | None = None  # per part: real query rows per batch item (right padding)
    calls: list[AttentionCall] = field(default_factory=list)
    #: a sample of rows of each kept layer's output projection output (the self-check's reference)
    projections: ProjectionWatch = field(default_factory=ProjectionWatch)
    #: whether :attr:`projections` watches the kept layers (a recorder that makes no record needs none)
    proves_projections: ClassVar[bool] = True
    #: flex BlockMasks already made dense, by id (:func:`attnviz.engine.interface.read_call` fills it)
    dense_masks: dict[int, Any] = field(default_factory=dict)
    _names: dict[int, str] = field(default_factory=dict)
    _encoder_decoder: bool = False
    _towers: dict[str, str] | None = None  # a model of two towers: path component -> part (families.TOWERS)
    _steps: dict[tuple[int, int], int] = field(default_factory=dict)  # calls so far per (module, layer)
    _where: dict[tuple[int, bool], tuple[str, int]] = field(default_factory=dict)  # (module, causal) -> part, layer
    _per_forward: int | None = None  # a shared family's attention calls per forward (families.SHARED_LAYERS)
    _calls: int = 0  # calls placed so far (a shared family's layers are counted by it)
    #: calls whose part their mask's structure tells, read after the forward: (call, module, mask)
    _structures: list[tuple[AttentionCall, nn.Module, Tensor]] = field(default_factory=list)
    #: whether this recorder reads each call inside the forward (its part, its bias), so it cannot wait
    #: until the forward is over to read them (a generation's steps, the corpus' reduction)
    reads_in_forward: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self._names = {id(m): name for name, m in self.model.named_modules()}
        config = getattr(self.model, "config", None)
        self._encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        self._towers = TOWERS.get(getattr(config, "model_type", ""))
        shared = SHARED_LAYERS.get(getattr(config, "model_type", ""))
        self._per_forward = None if shared is None else int(shared(config))

    def owns(self, module: nn.Module) -> bool:
        """Whether ``module`` is part of this recorder's model."""
        return id(module) in self._names

    def as_made(self, call: Call, result: Any) -> Seen:
        """The call as the model made it: its terms, and the output (and weights) of its ``result``."""
        out, weights = call.split(result)
        return {**call.terms(self.dense_masks), "out": out, "weights": weights}

    def record(self, call: Call, seen: Seen) -> None:
        """Record one call, as ``seen`` (:func:`attnviz.engine.listeners.dispatch` calls it)."""
        self.add(call.module, call.backend, **seen)

    def where(self, module: nn.Module, causal: bool) -> tuple[str, int]:
        """(part, layer) of ``module``'s calls, causal by design or not (looked up once per module)."""
        key = (id(module), causal)
        found = self._where.get(key)
        if found is None:  # a module's place does not change: looked up once (a generation calls it every step)
            found = self._where[key] = locate(
                self._names[id(module)],
                encoder_decoder=self._encoder_decoder,
                causal=causal,
                layer_idx=getattr(module, "layer_idx", None),
                towers=self._towers,
            )
        return found

    def place(
        self, module: nn.Module, causal: bool, mask: Tensor | None, designed_causal: bool | None = None
    ) -> tuple[str, int]:
        """(part, layer) of a call: the module's path, and whether its attention is causal by design
        (its ``is_causal``, else ``designed_causal``, else the call's causal flag or mask structure).
        Called once per call: in a family whose modules are shared by several layers
        (:data:`~attnviz.families.SHARED_LAYERS`) the layer is the call's index in its forward."""
        looks_causal = self.designed(module, causal, mask, designed_causal)
        if looks_causal is None:  # read from the mask's structure, which needs the host to wait for it
            looks_causal = _is_causal_structure(mask)  # type: ignore[arg-type]
        part, layer = self.where(module, bool(looks_causal))
        if self._per_forward:
            layer = self._calls % self._per_forward
        self._calls += 1
        return part, layer

    @staticmethod
    def designed(module: nn.Module, causal: bool, mask: Tensor | None, designed_causal: bool | None) -> bool | None:
        """Whether the module's attention is causal by design, when that can be told without reading a
        tensor (its ``is_causal``, else ``designed_causal``, else the call's causal flag or no mask);
        None: only the mask's structure tells."""
        looks_causal = getattr(module, "is_causal", None)
        if looks_causal is None:
            looks_causal = designed_causal
        if looks_causal is None and (causal or mask is None):
            looks_causal = causal
        return looks_causal

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
        structure = None  # a mask whose structure alone says whether the part is causal: read after the forward
        if self.reads_in_forward or self.designed(module, causal, mask, designed_causal) is not None:
            part, layer = self.place(module, causal, mask, designed_causal)
        else:
            part, layer = self.place(module, causal, None, False)
            structure = mask
        keep = self.layers is None or layer in self.layers
        if self.reads_in_forward and bias is not None and not bias.any():
            bias = None  # T5's cross-attention passes zeros (else seen after the forward: finish)
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
            step=self._steps.get((id(module), layer), 0),
        )
        self._steps[(id(module), layer)] = call.step + 1
        if structure is not None:
            self._structures.append((call, module, structure))
        if keep:
            call.q, call.k, call.v, call.out = q.detach(), k.detach(), v.detach(), out.detach()
            call.mask, call.key_padding = mask, key_padding
            call.bias = bias.detach() if isinstance(bias, Tensor) else None
            call.sinks = sinks.detach() if isinstance(sinks, Tensor) else None
            if isinstance(weights, Tensor) and self.weight_mode == "keep":
                call.weights = weights.detach()
            elif isinstance(weights, Tensor) and self.weight_mode == "sample":
                call.sampled_weights = self.sampled(weights.detach(), part)
            elif isinstance(weights, Tensor) and self.weight_mode == "compare":
                lengths = None if self.lengths is None else self.lengths.get(part)
                call.weight_error, call.weight_scale = weight_errors(call, weights.detach(), lengths)
            # an edited call's head outputs may change after the kernel (ablation): its projection is not proved
            if self.proves_projections and owner(module) is None:
                self.projections.arm(self.model, call.name, layer, lambda: any(r is self for r in recorders(module)))
            self.keep(call)
        else:
            self.calls.append(call)

    def sampled(self, weights: Tensor, part: str) -> list[Tensor]:
        """Each batch item's weights at the rows the self-check samples of its real queries (one gather
        per item, with an index made on the weights' device once per length)."""
        lengths = None if self.lengths is None else self.lengths.get(part)
        n = weights.shape[-2]
        return [
            weights[b].index_select(-2, self.projections.index(n if lengths is None else lengths[b], weights.device)[1])
            for b in range(weights.shape[0])
        ]

    def keep(self, call: AttentionCall) -> None:
        """Keep a call of a layer that was asked for: references only, nothing waits for the device
        (moved to the host by :meth:`finish`, after the forward, unless ``keep_on_device``)."""
        self.calls.append(call)

    def finish(self) -> None:
        """What a call's recording needed the host to read, read once the forward is over (on a GPU the
        forward ran without waiting for it): the part of a call whose mask structure says whether it is
        causal, whether a bias is all zeros (T5's cross-attention), and the kept tensors copied to the
        host — without blocking, into pinned memory, then waited for once (:class:`HostCopies`)."""
        structures: dict[int, bool] = {}
        for call, module, mask in self._structures:
            if id(mask) not in structures:  # one forward's layers share their mask
                structures[id(mask)] = _is_causal_structure(mask)
            call.part, _ = self.where(module, structures[id(mask)])
        self._structures.clear()
        biased = [c for c in self.calls if c.bias is not None]
        if biased and not self.reads_in_forward:
            nonzero = torch.stack([c.bias.any() for c in biased]).tolist()  # type: ignore[union-attr]
            for call, any_ in zip(biased, nonzero):
                call.bias = call.bias if any_ else None
        if not self.keep_on_device:
            copies = HostCopies()
            for call in self.calls:
                for name in CALL_TENSORS:
                    value = getattr(call, name)
                    if isinstance(value, Tensor):
                        setattr(call, name, copies.copy(value))
                if call.sampled_weights is not None:
                    call.sampled_weights = [copies.copy(w) for w in call.sampled_weights]
            self.projections.to_host(copies)
            copies.wait()


def _is_causal_structure(mask: Tensor) -> bool:
    """Whether a 4-D mask blocks every key after its query (the last query aligned with the last key)."""
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    allowed = allowed[0, 0]
    q, k = allowed.shape
    return q > 1 and not bool(torch.triu(allowed, diagonal=1 + k - q).any())


@contextlib.contextmanager
def attached(model: nn.Module) -> Iterator[None]:
    """attnviz where ``model`` computes attention, for the block: the AttentionInterface wrapper, or
    for a family that computes attention inline the hooks on its projections. A model attnviz
    refuses (:func:`attnviz.engine.specs.refusal`) raises :class:`UnsupportedModelError` first, as
    one without an attention implementation does (:func:`attnviz.engine.interface.backends_of`)."""
    config = getattr(model, "config", None)
    check_supported(config)
    spec = PROJECTION_SPECS.get(getattr(config, "model_type", ""))
    with contextlib.ExitStack() as stack:
        if spec is None or spec.interface_too:
            stack.enter_context(wrapped(model))
        if spec is not None:
            stack.enter_context(hooked(model, spec))
        yield


@contextlib.contextmanager
def tap(
    model: nn.Module,
    *,
    layers: set[int] | None = None,
    keep_on_device: bool = False,
    weight_mode: str = "keep",
    to_cpu: bool | None = None,
    lengths: dict[str, list[int]] | None = None,
    recorder_class: type[Recorder] = Recorder,
) -> Iterator[Recorder]:
    """Record every attention call of ``model`` made inside the ``with`` block, in this context.

    >>> with tap(model) as rec:
    ...     model(**inputs)
    >>> rec.calls[0].part, rec.calls[0].layer, rec.calls[0].q.shape   # [batch, head, query_pos, d_head]

    Every family :func:`attnviz.capture` captures: through the AttentionInterface, or, for the
    families that compute attention inline (GPT-Neo, XGLM, GPT-1, Bloom, MPT, Falcon-ALiBi, DeBERTa-v2/v3),
    through
    hooks on their projections. A family attnviz refuses, or a model without an attention
    implementation, raises :class:`UnsupportedModelError` instead of recording nothing.

    Taps nest (an inner tap on another model, or the same one, records too); an active
    :func:`attnviz.edits.editing` block's edits are recorded as they ran. The wrappers and hooks
    are removed on exit, also when the block raises; the model is not modified.

    ``keep_on_device``: leave the recorded tensors where the model computed them (default: copied to the
    host once the block's forward is over); ``to_cpu=`` is its old, inverted name (deprecated).
    """
    if to_cpu is not None:
        keep_on_device = not renamed("tap", "to_cpu", to_cpu, "keep_on_device", None)
    recorder = recorder_class(
        model, layers=layers, keep_on_device=keep_on_device, weight_mode=weight_mode, lengths=lengths
    )
    try:
        with attached(model), listening(recorder):
            yield recorder
        recorder.finish()
    finally:
        recorder.projections.remove()
