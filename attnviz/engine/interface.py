"""The recording wrapper in transformers' AttentionInterface, installed for the length of a tap.

The wrapper sits in the interface mapping under the backend name the model uses (``"sdpa"``,
``"eager"``, ``"flash_attention_2"``, a registered custom one) and calls exactly the function the
caller would have got: the mapped backend, or for ``"eager"`` — which transformers resolves to the
``default`` each call site passes to ``get_interface`` — that default, read from the calling frame's
code. It is installed once per backend and reference-counted across threads; it records only into
the :class:`~attnviz.engine.taps.Recorder` objects active in the calling context that own the module.
An :class:`~attnviz.edits.Editor` active in the calling context replaces the call for the layers it
edits (:func:`attnviz.workflows.intervene`); the recorders then see the edited call.
"""

from __future__ import annotations

import contextlib
import contextvars
import dis
import sys
import threading
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from torch import nn

from ..errors import UnsupportedModelError
from .specs import supported_families

if TYPE_CHECKING:
    from ..edits import Editor
    from .taps import Recorder

__all__ = ["backends_of", "installed_backends"]

#: the recorders active in this context (a tuple: taps nest)
_ACTIVE: contextvars.ContextVar[tuple[Recorder, ...]] = contextvars.ContextVar("attnviz_recorders", default=())
#: the editors active in this context: the innermost one that owns a module runs its calls
_EDITORS: contextvars.ContextVar[tuple[Editor, ...]] = contextvars.ContextVar("attnviz_editors", default=())


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
        def attnviz_tap(module, *args, **kwargs):
            fn = original
            if fn is None:  # "eager": the caller's own default, as get_interface would have returned it
                fn = _caller_default(sys._getframe(1)) or _module_eager(module)
            recorders = [r for r in _ACTIVE.get() if r.owns(module)]
            editor = next((e for e in reversed(_EDITORS.get()) if e.owns(module)), None)
            if editor is None:
                result = seen = fn(module, *args, **kwargs)
            else:  # the editor computes the call (or lets fn do it) and says what the recorders should see
                result, (args, kwargs, seen) = editor.call(backend, module, fn, args, kwargs)
            for recorder in recorders:
                recorder.record(backend, module, args, kwargs, seen)
            return result

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
    try:
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
