"""A capture as the input of another forward of the model that made it (``intervene(model, cap, …)``).

The capture's ids, offsets and tokens (its :class:`~attnviz.TokenSequence`, and the decoder's for an
encoder-decoder) become the :class:`~attnviz.workflows.capture.runner.TextInputs` of the pipeline again, so
nothing is tokenized a second time (:func:`capture_inputs`). Before anything is read from it, the
capture is proved to be this model's: the same class, then one forward of its ids with one layer
tapped whose Q and output must be the capture's (:func:`verified_forward`) — a capture of another
checkpoint of the same architecture is refused too. That forward's output (the logits) is what the
capture lacks; a generation's capture (rows computed step by step with a KV cache) is refused.

Where the capture records its provenance (``cap.model["provenance"]``), the hash of the weights that made
it is compared with this model's (:func:`~attnviz.workflows.capture.provenance.weights_hash`): a refusal
names both hashes, and weights whose bytes differ but that compute the capture's numbers within the
tolerance (another dtype's rounding of a buffer, an edit below it) are a :class:`OtherWeightsWarning`.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import Tensor

from ...data.capture import Capture
from ...errors import ArgumentTypeError, CaptureMismatchError, OtherWeightsWarning
from .pipeline import Resolved
from .provenance import weights_hash
from .runner import TextInputs, capture_forward

__all__ = ["capture_inputs", "verified_forward", "weights_note"]

#: what to do about a capture of another model, the end of each message that refuses one
FIX = "pass the model that made the capture (in the dtype it ran in), or the text, to capture it with this one"


def capture_inputs(resolved: Resolved, cap: Capture, what: str) -> TextInputs:
    """The inputs that made ``cap``, for ``what`` (the function's name, for the messages): its own ids,
    offsets and tokens; a generation's capture or one of another kind of model refused."""
    if not isinstance(cap, Capture):
        raise ArgumentTypeError(f"{what} takes a text or an attnviz.Capture, got {type(cap).__name__}")
    if "generation" in cap.model:
        raise CaptureMismatchError(
            f"this capture is of a generation (its rows were computed one step at a time, with a KV cache); "
            f"{what} runs one forward of a text. Capture the prompt with its continuation, "
            f"attnviz.capture(model, gen.capture.text), and pass that capture (or the text)"
        )
    model = resolved.model
    theirs = (cap.model.get("class"), cap.model.get("model_type"))
    ours = (type(model).__name__, getattr(model.config, "model_type", None))
    if theirs != ours:
        raise CaptureMismatchError(
            f"this capture was made by {cap.model.get('name')!r} ({theirs[0]}, {theirs[1]}), not by this "
            f"{ours[0]} ({ours[1]}); {FIX}: {what}(model, cap.text, …)"
        )
    source = (list(cap.token_ids), list(cap.offsets), list(cap.tokens))
    add_bos = cap.model.get("provenance", {}).get("add_bos")
    if cap.target is None:
        return TextInputs([cap.text], [source], None, [], add_bos)
    t = cap.target
    decoded = [(list(t.token_ids), list(t.offsets), list(t.tokens))]
    return TextInputs([cap.text], [source], [t.text], decoded, add_bos)


def weights_note(resolved: Resolved, cap: Capture) -> str | None:
    """None when ``cap`` records no weights hash or the same as this model's; else what a message says:
    both hashes (the capture's, this model's)."""
    theirs = cap.model.get("provenance", {}).get("weights_sha256")
    if theirs is None:
        return None
    ours = weights_hash(resolved.model)
    if ours == theirs:
        return None
    return f"the capture's weights are sha256 {theirs[:16]}…, this model's {ours[:16]}…"


def verified_forward(resolved: Resolved, cap: Capture, inputs: TextInputs, tolerance: float) -> Any:
    """The model's own output (logits…) for ``cap``'s ids, from one forward that taps one layer of
    the capture (its deepest) and proves it: that layer's Q and output must be the capture's within
    ``tolerance`` (max |Δ|), else :class:`CaptureMismatchError` — the capture is another model's, naming
    both weights' hashes where they differ; hashes that differ over numbers that agree warn
    (:class:`OtherWeightsWarning`)."""
    note = weights_note(resolved, cap)
    hashes = "" if note is None else f"; {note}"
    deepest = max(layer for _, layer in cap.records)
    [probe], output = capture_forward(resolved, inputs, layers={deepest}, check="off")
    for fact in ("parts", "dtype"):
        if probe.model.get(fact) != cap.model.get(fact):
            raise CaptureMismatchError(
                f"this capture's {fact} ({cap.model.get(fact)}) is not this model's ({probe.model.get(fact)}){hashes}; "
                f"{FIX}"
            )
    for key in sorted(set(probe.records) & set(cap.records)):
        ours, theirs = probe.records[key], cap.records[key]
        q, out = ours.q, ours.out
        if theirs.heads is not None:  # a capture of some heads (capture(heads=)): the same heads of this forward
            q = q[theirs.heads]
            out = None if out is None else out[theirs.heads]
        pairs = [(q, theirs.q)] + ([(out, theirs.out)] if out is not None and theirs.out is not None else [])
        error = max(_difference(a, b) for a, b in pairs)
        if not error <= tolerance:
            raise CaptureMismatchError(
                f"this capture was not made by this model from these tokens: at {key[0]} layer {key[1]} this model "
                f"computes other numbers (max |Δ| {error:.2e}, tolerance {tolerance:.0e}; captured by "
                f"{cap.model.get('name')!r} in {cap.model.get('dtype')}){hashes}; {FIX}"
            )
    if note is not None:
        warnings.warn(
            f"{note}: other weights than the capture's, though they compute its numbers within {tolerance:.0e} "
            f"at the layer compared; results from it are this model's, not the capture's",
            OtherWeightsWarning,
            stacklevel=4,
        )
    return output


def _difference(ours: Tensor, theirs: Tensor) -> float:
    if ours.shape != theirs.shape:
        return float("inf")
    return float((ours.float().cpu() - theirs.float().cpu()).abs().max())
