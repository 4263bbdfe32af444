"""Progress while a model runs: how many attention calls a forward makes (:func:`attention_calls`) and a
recorder that reports each one it records (:func:`counting`) — ``on_progress(done, total)``, the one progress
signature of attnviz, counted in Python, so the host never waits for the device for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...engine.taps import Recorder
from .pipeline import n_layers

__all__ = ["Progress", "attention_calls", "counting"]

Progress = Callable[[int, int], None]  # on_progress(done, total): the one progress signature of attnviz


def attention_calls(config: Any, forwards: int = 1) -> int | None:
    """How many attention calls ``forwards`` forwards of a model with this config make: one per layer of
    each stack, and an encoder-decoder's decoder layers twice (self- and cross-attention); None where
    the config does not say (what :func:`counting`'s ``total`` starts from)."""
    if getattr(config, "is_encoder_decoder", False):
        encoder = next((getattr(config, n) for n in ("encoder_layers", "num_layers") if hasattr(config, n)), None)
        decoder = next(
            (getattr(config, n) for n in ("decoder_layers", "num_decoder_layers") if getattr(config, n, None)), encoder
        )
        if isinstance(encoder, int) and isinstance(decoder, int):
            return (encoder + 2 * decoder) * forwards
        return None
    layers = n_layers(config)
    return None if layers is None else layers * forwards


def counting(recorder_class: type[Recorder], on_progress: Progress | None, total: int | None) -> type[Recorder]:
    """``recorder_class``, calling ``on_progress(done, total)`` after each attention call it records
    (``recorder_class`` itself when there is none to call). A Python count, inside the forward: it reads no
    tensor, so the host never waits for the device for it. ``total``: the calls expected
    (:func:`attention_calls`); a model that makes more raises it with ``done``, so that ``done ≤ total``.
    A callback that raises stops the forward there; the taps come off as for any error in it."""
    if on_progress is None:
        return recorder_class
    report = on_progress

    class Counting(recorder_class):  # type: ignore[valid-type,misc]
        done = 0

        def record(self, call, seen) -> None:
            super().record(call, seen)
            self.done += 1
            report(self.done, max(total or 0, self.done))

    Counting.__name__ = Counting.__qualname__ = f"Counting{recorder_class.__name__}"
    return Counting
