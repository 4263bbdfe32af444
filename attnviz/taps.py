"""Taps: record what each attention kernel of an unmodified model receives and returns.

transformers' attention modules call
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)``
with Q and K *as the kernel sees them* (after RoPE, before GQA expansion), V, the mask, the
scaling and the backend's own kwargs (sliding window, soft-cap, causal flag). For the duration of
a capture, :func:`tap` puts a recording wrapper in front of the model's backend through the
mapping's documented ``__setitem__`` (the same slot ``AttentionInterface.register`` fills); the
wrapper calls the very function that would have run (eager, sdpa, flash, flex, or a registered
custom one), records its inputs and result, and hands the result back unchanged. The model's
config is never touched, so the backend is not switched, and the previous mapping is restored
in ``finally`` — also when forward raises.

Several threads may capture at once, also on the same model: the wrapper is installed once
(reference-counted) and records only into the :class:`Recorder` active in the *calling* context
(a ``ContextVar``), for modules of that recorder's model; every other call passes straight
through.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from .errors import UnsupportedModelError
from .specs import ProjectionSpec, supported_families

__all__ = ["AttentionCall", "Recorder", "tap", "tap_model", "tap_projections"]

_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("attnviz_recorder", default=None)


@dataclass
class AttentionCall:
    """One call of an attention kernel, as recorded (tensors may be on the model's device)."""

    name: str  # the attention module's qualified name in the model
    q: Tensor | None  # [batch, head, query_pos, d_head]; None when the layer was not asked for
    k: Tensor | None  # [batch, kv_head, key_pos, d_head]
    v: Tensor | None  # [batch, kv_head, key_pos, d_head_v]
    out: Tensor | None  # [batch, query_pos, head, d_head_v], the kernel's own output
    weights: Tensor | None  # [batch, head, query_pos, key_pos] when the backend returned them
    mask: Tensor | None  # the mask the kernel received (bool, additive float, or None)
    scaling: float
    causal: bool  # the causal flag the kernel applies when it receives no mask
    window: int | None
    softcap: float | None
    backend: str


@dataclass
class Recorder:
    """Collects the attention calls of one forward of one model."""

    model: nn.Module
    layers: set[int] | None = None  # None = every layer
    to_cpu: bool = True
    calls: list[AttentionCall] = field(default_factory=list)
    _names: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._names = {id(m): name for name, m in self.model.named_modules()}

    def owns(self, module: nn.Module) -> bool:
        return id(module) in self._names

    def record(self, backend: str, module: nn.Module, args: tuple, kwargs: dict, result: Any) -> None:
        """Record one call of an attention-interface function (its arguments and its result)."""
        query, key, value, mask = (list(args) + [None] * 4)[:4]
        if mask is None:
            mask = kwargs.get("attention_mask")
        out, weights = result if isinstance(result, tuple) else (result, None)
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        is_causal = kwargs.get("is_causal")
        if is_causal is None:
            is_causal = bool(getattr(module, "is_causal", True))
        self.add(module, backend, query, key, value, out, weights=weights, mask=mask, scaling=float(scaling),
                 causal=is_causal, window=kwargs.get("sliding_window") or None, softcap=kwargs.get("softcap"))

    def add(
        self, module: nn.Module, backend: str, q: Tensor, k: Tensor, v: Tensor, out: Tensor, *,
        weights: Any = None, mask: Any = None, scaling: float, causal: bool, window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        """Append one layer's call; tensors of layers not asked for are dropped at once."""
        keep = self.layers is None or len(self.calls) in self.layers
        move = (lambda t: t.detach().to("cpu")) if self.to_cpu else (lambda t: t.detach())
        self.calls.append(
            AttentionCall(
                name=self._names[id(module)],
                q=move(q) if keep else None,
                k=move(k) if keep else None,
                v=move(v) if keep else None,
                out=move(out) if keep else None,
                weights=move(weights) if keep and isinstance(weights, Tensor) else None,
                mask=move(mask) if keep and isinstance(mask, Tensor) else None,
                scaling=scaling,
                causal=causal,
                window=int(window) if window is not None else None,
                softcap=softcap,
                backend=backend,
            )
        )


def _attention_interface():
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError as err:  # pragma: no cover - transformers is a hard dependency
        raise UnsupportedModelError(
            "attnviz needs transformers ≥ 4.48 (the AttentionInterface); install it with pip install -U transformers"
        ) from err
    return ALL_ATTENTION_FUNCTIONS


def _module_eager(module: nn.Module) -> Callable:
    """The eager attention function the module's own modeling file defines (its default)."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        raise UnsupportedModelError(
            f"{type(module).__name__} runs eager attention but its modeling file defines no "
            "eager_attention_forward; load the model with attn_implementation='sdpa'"
        )
    return fn


class _Installer:
    """Reference-counted wrappers in the attention mapping, one per backend name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: dict[str, int] = {}
        self._saved: dict[str, tuple[bool, Any]] = {}  # backend -> (had a local override, it)

    def _wrapper(self, backend: str, original: Callable | None) -> Callable:
        def attnviz_tap(module, *args, **kwargs):
            fn = original if original is not None else _module_eager(module)
            recorder = _ACTIVE.get()
            if recorder is None or not recorder.owns(module):
                return fn(module, *args, **kwargs)
            result = fn(module, *args, **kwargs)
            recorder.record(backend, module, args, kwargs, result)
            return result

        attnviz_tap.__wrapped__ = original
        return attnviz_tap

    def acquire(self, backend: str) -> None:
        interface = _attention_interface()
        with self._lock:
            if self._count.get(backend, 0) == 0:
                local = getattr(interface, "_local_mapping", {})
                had_local = backend in local
                self._saved[backend] = (had_local, local.get(backend))
                original = interface[backend] if backend in interface else None
                if original is None and backend != "eager":
                    raise UnsupportedModelError(
                        f"attention backend {backend!r} is not registered in transformers' AttentionInterface"
                    )
                interface[backend] = self._wrapper(backend, original)
            self._count[backend] = self._count.get(backend, 0) + 1

    def release(self, backend: str) -> None:
        interface = _attention_interface()
        with self._lock:
            self._count[backend] -= 1
            if self._count[backend] == 0:
                del self._count[backend]
                had_local, previous = self._saved.pop(backend)
                if had_local:
                    interface[backend] = previous
                else:
                    del interface[backend]


_INSTALLER = _Installer()


def backends_of(model: nn.Module) -> set[str]:
    """The attention implementations the model's (sub-)configs name."""
    names = set()
    for module in model.modules():
        config = getattr(module, "config", None)
        impl = getattr(config, "_attn_implementation", None)
        if isinstance(impl, str):
            names.add(impl)
    if not names:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no config._attn_implementation: attnviz supports {supported_families()}"
        )
    return {name.removeprefix("paged|") if name != "paged|eager" else name for name in names}


def _split_heads(x: Tensor, heads: int) -> Tensor:  # [batch, pos, head·d] -> [batch, head, pos, d]
    b, n, width = x.shape
    return x.view(b, n, heads, width // heads).transpose(1, 2)


@contextlib.contextmanager
def tap_projections(
    model: nn.Module, spec: ProjectionSpec, *, layers: set[int] | None = None, to_cpu: bool = True
) -> Iterator[Recorder]:
    """Record Q, K, V and the attention output through forward hooks on the projections.

    For families without the AttentionInterface (see :mod:`attnviz.specs`). The hooks belong to
    this capture alone, record only in this context, and are removed on exit, also on error.
    """
    recorder = Recorder(model, layers=layers, to_cpu=to_cpu)
    handles = []
    token = _ACTIVE.set(recorder)

    def mine() -> bool:
        return _ACTIVE.get() is recorder

    try:
        for attention in (m for m in model.modules() if type(m).__name__ == spec.module):
            scratch: dict[str, Tensor] = {}

            def keep_output(name, scratch=scratch):
                def hook(_module, _args, output):
                    if mine():
                        scratch[name] = output
                return hook

            def finish(_module, args, attention=attention, scratch=scratch):
                if not mine():
                    return
                heads = int(getattr(attention, spec.heads))
                if spec.fused:
                    q, k, v = scratch.pop("fused").chunk(3, dim=-1)
                else:
                    q, k, v = scratch.pop("q"), scratch.pop("k"), scratch.pop("v")
                out = args[0]
                recorder.add(
                    attention, "projection hooks", _split_heads(q, heads), _split_heads(k, heads),
                    _split_heads(v, heads), out.view(*out.shape[:2], heads, -1),
                    scaling=float(spec.scaling(attention)), causal=spec.causal, window=spec.window(attention),
                )

            parts = {"fused": spec.fused} if spec.fused else {"q": spec.q, "k": spec.k, "v": spec.v}
            for name, child in parts.items():
                handles.append(attention.get_submodule(child).register_forward_hook(keep_output(name)))
            handles.append(attention.get_submodule(spec.out).register_forward_pre_hook(finish))
        if not handles:
            raise UnsupportedModelError(
                f"{type(model).__name__} has no {spec.module} module; attnviz supports {supported_families()}"
            )
        yield recorder
    finally:
        _ACTIVE.reset(token)
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def tap(model: nn.Module, *, layers: set[int] | None = None, to_cpu: bool = True) -> Iterator[Recorder]:
    """Record every attention call of ``model`` made inside the ``with`` block, in this context.

    >>> with tap(model) as rec:
    ...     model(**inputs)
    >>> rec.calls[0].q.shape   # [batch, head, query_pos, d_head]

    The wrappers are removed on exit, also when the block raises; the model is not modified.
    """
    recorder = Recorder(model, layers=layers, to_cpu=to_cpu)
    installed: list[str] = []
    token = _ACTIVE.set(recorder)
    try:
        for backend in sorted(backends_of(model)):
            _INSTALLER.acquire(backend)
            installed.append(backend)
        yield recorder
    finally:
        _ACTIVE.reset(token)
        for backend in installed:
            _INSTALLER.release(backend)


def tap_model(model: nn.Module, *, layers: set[int] | None = None, to_cpu: bool = True):
    """The right tap for ``model``: projection hooks for the families in :data:`PROJECTION_SPECS`,
    the AttentionInterface wrapper for every other."""
    from .specs import PROJECTION_SPECS

    spec = PROJECTION_SPECS.get(getattr(getattr(model, "config", None), "model_type", ""))
    if spec is not None:
        return tap_projections(model, spec, layers=layers, to_cpu=to_cpu)
    return tap(model, layers=layers, to_cpu=to_cpu)


def installed_backends() -> dict[str, int]:
    """Backends currently wrapped, with how many captures hold each (for tests and debugging)."""
    return dict(_INSTALLER._count)
