"""Who listens to a model's attention calls: recorders and editors, installed for a block, in this context.

Two kinds of listener, one protocol each:

- a :class:`Recording` listener (:class:`attnviz.engine.taps.Recorder`) is told every call of the
  modules it owns, as the call ran;
- an :class:`Editing` listener (:class:`attnviz.engine.editor.Editor`) may run a call in the model's
  place: the innermost editor active in the calling context that owns the module (:func:`owner`)
  computes the call and says what the recorders should see.

Both places attnviz sits in a model — the AttentionInterface wrapper
(:mod:`attnviz.engine.interface`) and the projection hooks of the families that compute attention
inline (:mod:`attnviz.engine.hooks`) — wrap each attention call as a :class:`Call` and hand it to
:func:`dispatch`: one function, one pass per call, whatever the family.

The listeners active in a context live in one ``ContextVar``, private to this module: other
threads and contexts see none of them, and :func:`listening` removes its listener on exit, also
when the block raises.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

__all__ = [
    "Call",
    "Editing",
    "Listener",
    "Recording",
    "Seen",
    "dispatch",
    "listened",
    "listeners",
    "listening",
    "owner",
]

#: one call as the recorders should see it: :meth:`attnviz.engine.taps.Recorder.add`'s keyword
#: arguments — ``q``, ``k``, ``v``, ``out`` ``[batch, query_pos, head, d_head_v]``, ``weights``, and
#: the terms the kernel applied (``mask``, ``key_padding``, ``bias``, ``sinks``, ``scaling``,
#: ``causal``, ``window``, ``softcap``, …)
Seen = dict[str, Any]


class Call(Protocol):
    """One attention call of one module, as the wrapper or the hooks caught it."""

    module: nn.Module  # the attention module that made the call
    backend: str  # the kernel's name in the AttentionInterface, or "projection hooks"

    @property
    def dtype(self) -> Any:
        """The dtype of the attention output the model expects."""

    def terms(self, dense_masks: dict[int, Any], *, unfold: bool = False) -> dict[str, Any]:
        """Q, K, V ``[batch, head, pos, d]`` and what the kernel applies (:data:`Seen` but ``out`` and
        ``weights``). ``dense_masks``: the caller's cache of masks made dense. ``unfold``: an additive
        term a mask carries on every key it lets through moves into the bias (for an edit that
        unblocks keys, :func:`attnviz.engine.hooks.projection_read`)."""

    def own(self) -> Any:
        """Run the call as the model would (its result in the model's own form)."""

    def split(self, result: Any) -> tuple[Tensor, Tensor | None]:
        """(out ``[batch, query_pos, head, d_head_v]``, weights or None) of a result in the model's form."""

    def join(self, out: Tensor, weights: Tensor | None) -> Any:
        """An output ``[batch, query_pos, head, d_head_v]`` (and weights) in the form the model expects."""


class Recording(Protocol):
    """A listener that records the calls of the modules it owns."""

    def owns(self, module: nn.Module) -> bool:
        """Whether ``module`` belongs to the model this listener listens to."""

    def as_made(self, call: Call, result: Any) -> Seen:
        """The call as the model made it (``result``: what :meth:`Call.own` returned)."""

    def record(self, call: Call, seen: Seen) -> None:
        """Record one call, as ``seen``."""


@runtime_checkable
class Editing(Protocol):
    """A listener that may compute the calls of the modules it owns in the model's place."""

    def owns(self, module: nn.Module) -> bool:
        """Whether ``module`` belongs to the model this listener edits."""

    def run(self, call: Call, *, recorded: bool) -> tuple[Any, Seen | None]:
        """(what the model gets, the call as the recorders should see it — None when not ``recorded``)."""


Listener = Recording | Editing

#: the listeners active in this context, in the order they were entered: (recorders, editors)
_ACTIVE: contextvars.ContextVar[tuple[tuple[Recording, ...], tuple[Editing, ...]]] = contextvars.ContextVar(
    "attnviz_listeners", default=((), ())
)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """``listener`` hears the attention calls of its model made in this context, for the block."""
    recorders, editors = _ACTIVE.get()
    if isinstance(listener, Editing):
        token = _ACTIVE.set((recorders, (*editors, listener)))
    else:
        token = _ACTIVE.set(((*recorders, listener), editors))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def listeners() -> tuple[Listener, ...]:
    """Every listener active in this context: recorders, then editors (for tests and debugging)."""
    recorders, editors = _ACTIVE.get()
    return (*recorders, *editors)


def recorders(module: nn.Module) -> list[Recording]:
    """The recorders active in this context that own ``module``, outermost first."""
    return [r for r in _ACTIVE.get()[0] if r.owns(module)]


def owner(module: nn.Module) -> Editing | None:
    """The innermost editor active in this context that owns ``module``, or None."""
    return next((e for e in reversed(_ACTIVE.get()[1]) if e.owns(module)), None)


def listened(module: nn.Module) -> bool:
    """Whether any listener active in this context owns ``module``."""
    recording, editing = _ACTIVE.get()
    return any(r.owns(module) for r in recording) or any(e.owns(module) for e in editing)


def dispatch(call: Call) -> Any:
    """Run one attention call with its listeners: the owning editor (if any) computes it and says
    what the recorders should see, else the model's own computation runs; then every owning
    recorder records it. Returns what the model gets."""
    recording = recorders(call.module)
    editor = owner(call.module)
    seen: Seen | None
    if editor is None:
        result = call.own()
        seen = recording[0].as_made(call, result) if recording else None
    else:
        result, seen = editor.run(call, recorded=bool(recording))
    for recorder in recording:
        assert seen is not None, "an editor said nothing of a call the recorders wait for"
        recorder.record(call, seen)
    return result


@functools.cache
def compiled_dispatch() -> Callable[[Call], Any]:
    """:func:`dispatch` as the taps call it: under ``torch.compiler.disable``, so a compiled model breaks its
    graph at each attention call and runs it as written (no recompile per layer). Made when the first tap is
    installed, not at import: ``torch._dynamo``, which it needs, takes about a second to import, and
    ``import attnviz`` (every CLI start, every early refusal) no longer pays it."""
    return torch.compiler.disable(dispatch)
