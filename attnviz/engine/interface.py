"""The AttentionInterface side of the engine: the wrapper installed for the length of a tap or an
edit, and the reading of the calls it catches.

The wrapper sits in the interface mapping under the backend name the model uses (``"sdpa"``,
``"eager"``, ``"flash_attention_2"``, a registered custom one) and calls exactly the function the
caller would have got: the mapped backend, or for ``"eager"`` — which transformers resolves to the
``default`` each call site passes to ``get_interface`` — that default, read from the calling frame's
code. It is installed once per backend and reference-counted across threads. Each call it catches
goes, as a :class:`KernelCall`, to :func:`attnviz.engine.listeners.dispatch`: the listeners active
in the calling context that own the module hear it (an editor may compute it, the recorders record
it); every other call passes straight through.

:func:`read_call` reads what a call computes from its arguments: Q, K, V, the mask in every form the
interface passes (4-D, flash's 2-D padding, flex's BlockMask), the scaling, causal flag, window,
bias, sinks and soft-cap. An argument it does not understand refuses the call
(:class:`UnsupportedModelError`), so a map is never silently missing a term.
"""

from __future__ import annotations

import contextlib
import dis
import sys
import threading
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from .listeners import compiled_dispatch
from .specs import INERT_ARGUMENTS, INTERPRETED_ARGUMENTS, supported_families

__all__ = ["KernelCall", "backends_of", "installed_backends", "read_call", "wrapped"]


_DEFAULTS: dict[CodeType, list[tuple[int, str, str]]] = {}


def _defaults_in(code: CodeType) -> list[tuple[int, str, str]]:
    """(offset, kind, name) of the ``default`` argument of every ``get_interface(…)`` call in ``code``."""
    found = []
    after = None
    last: tuple[str, str] | None = None
    for ins in dis.get_instructions(code):
        if ins.argval == "get_interface" and ins.opname in {"LOAD_ATTR", "LOAD_METHOD"}:
            after, last = ins.offset, None
        elif after is not None:
            if ins.opname in {"LOAD_GLOBAL", "LOAD_NAME"}:
                last = ("global", ins.argval)
            elif ins.opname in {"LOAD_DEREF", "LOAD_FAST", "LOAD_FAST_BORROW"}:
                last = ("local", ins.argval)
            elif ins.opname.startswith(("CALL", "PRECALL")):
                if last is not None:
                    found.append((ins.offset, *last))
                after = None
    return found


def _caller_default(frame: FrameType | None) -> Callable | None:
    """The ``default`` the calling frame passed to its last ``get_interface`` call, or None."""
    if frame is None:
        return None
    code = frame.f_code
    if code not in _DEFAULTS:
        _DEFAULTS[code] = _defaults_in(code)
    before = [d for d in _DEFAULTS[code] if d[0] <= frame.f_lasti]
    if not before:
        return None
    _, kind, name = before[-1]
    fn = frame.f_globals.get(name) if kind == "global" else frame.f_locals.get(name)
    return fn if callable(fn) else None


def _module_eager(module: nn.Module) -> Callable:
    """The eager function of the module's own modeling file (only when the call site is unreadable)."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        raise UnsupportedModelError(
            f"{type(module).__name__} runs eager attention through a call attnviz cannot read; "
            "load the model with attn_implementation='sdpa'"
        )
    return fn


class _Installer:
    """Reference-counted wrappers in the attention mapping, one per backend name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: dict[str, int] = {}
        self._saved: dict[str, tuple[bool, Any]] = {}  # backend -> (had a local override, it)

    def _wrapper(self, backend: str, original: Callable | None) -> Callable:
        dispatch = compiled_dispatch()

        def attnviz_tap(module, *args, **kwargs):
            fn = original
            if fn is None:  # "eager": the caller's own default, as get_interface would have returned it
                fn = _caller_default(sys._getframe(1)) or _module_eager(module)
            return dispatch(KernelCall(backend, module, fn, args, kwargs))

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


def _attention_interface():
    try:  # deferred on purpose: transformers' modeling_utils is heavy, and importing attnviz loads no model code
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError as err:  # pragma: no cover - transformers is a hard dependency
        raise UnsupportedModelError(
            "attnviz needs transformers ≥ 4.48 (the AttentionInterface); install it with pip install -U transformers"
        ) from err
    return ALL_ATTENTION_FUNCTIONS


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


def installed_backends() -> dict[str, int]:
    """Backends currently wrapped, with how many captures hold each (for tests and debugging)."""
    return dict(_INSTALLER._count)


@contextlib.contextmanager
def wrapped(model: nn.Module) -> Iterator[None]:
    """The wrapper in front of every backend ``model`` uses, for the block (removed in ``finally``)."""
    installed: list[str] = []
    try:
        for backend in sorted(backends_of(model)):
            _INSTALLER.acquire(backend)
            installed.append(backend)
        yield
    finally:
        for backend in installed:
            _INSTALLER.release(backend)


class KernelCall:
    """One call of an attention-interface function (see :class:`attnviz.engine.listeners.Call`)."""

    def __init__(self, backend: str, module: nn.Module, fn: Callable, args: tuple, kwargs: dict) -> None:
        self.backend, self.module, self.fn, self.args, self.kwargs = backend, module, fn, args, kwargs
        self._terms: dict[str, Any] | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.args[2].dtype  # the value's: kernels return A·V in it

    def terms(self, dense_masks: dict[int, Any], *, unfold: bool = False) -> dict[str, Any]:
        if self._terms is None:  # read once, whoever asks first (an editor, the recorders)
            self._terms = read_call(self.backend, self.module, self.args, self.kwargs, dense_masks)
        return self._terms

    def own(self) -> Any:
        return self.fn(self.module, *self.args, **self.kwargs)

    def split(self, result: Any) -> tuple[Tensor, Tensor | None]:
        return result if isinstance(result, tuple) else (result, None)

    def join(self, out: Tensor, weights: Tensor | None) -> Any:
        return out, weights


def read_call(
    backend: str, module: nn.Module, args: tuple, kwargs: dict, dense_masks: dict[int, Any]
) -> dict[str, Any]:
    """What one attention-interface call computes, as :meth:`attnviz.engine.taps.Recorder.add`'s
    keyword arguments (all but ``out`` and ``weights``): Q, K, V, the normalised mask and the
    scaling, causal flag, window, bias, sinks and soft-cap the kernel applies. Refuses an argument
    it cannot interpret. ``dense_masks``: flex BlockMasks already made dense, by id (filled here)."""
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
    mask, key_padding = _normalise_mask(family, mask, query, key, dense_masks)
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
    family: str, mask: Any, query: Tensor, key: Tensor, dense_masks: dict[int, Any]
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
    if type(mask).__name__ == "BlockMask":  # flex attention: one BlockMask serves every layer of a forward
        cached = dense_masks.get(id(mask))
        if cached is None or cached[0] is not mask:  # (the mask kept with it: its id is not reused meanwhile)
            cached = dense_masks[id(mask)] = (mask, _dense_block_mask(mask, query, key))
        return cached[1], None
    raise UnsupportedModelError(
        f"{family} passed a {type(mask).__name__} mask "
        f"{tuple(mask.shape) if isinstance(mask, Tensor) else ''} that attnviz cannot read; "
        "load the model with attn_implementation='sdpa' or 'eager'"
    )


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
