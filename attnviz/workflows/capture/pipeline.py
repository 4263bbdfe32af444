"""The one pipeline every workflow runs: a model and encoded inputs, then the taps, then checked Captures.

1. :func:`resolve`: a name loaded (or a model object checked), in eval mode, a family attnviz
   supports; its position limit and the layers asked for (:class:`Resolved`).
2. :func:`forward_inputs`: encoded texts (:mod:`attnviz.workflows.capture.inputs`) as the forward's
   padded ids and masks, ids the embedding has no row for refused.
3. :func:`tapped`: the forward (or a whole generation loop, given as a callable) under the taps,
   then the checks on what they recorded (:func:`check_calls`; some asked-for layer ran).
4. :func:`~attnviz.workflows.capture.build.captures` (in :mod:`~attnviz.workflows.capture.build`): the records of
   each text (:func:`attnviz.workflows.capture.call_records.build_records`), the metadata, the :class:`Capture`, the
   self-check; :func:`~attnviz.workflows.capture.build.run_captures` is steps 3 and 4 as every capture runs them.
   The progress a caller asks for (``on_progress``) is counted by the recorder (:mod:`~attnviz.workflows.capture.progress`).

:func:`attnviz.capture`, :func:`attnviz.generate`, :func:`attnviz.intervene`,
:func:`attnviz.evaluate_probes` enter it here; the corpus path
(:class:`~attnviz.workflows.corpus.batched.BatchReducer`) reduces the calls instead of keeping records
and shares steps 1 to 3. Each step and each of its errors is written here once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from ...engine.specs import ENCODER_DECODER_PARTS, check_supported, supported_families
from ...engine.taps import AttentionCall
from ...errors import (
    ArgumentTypeError,
    InputError,
    ModelInTrainingModeError,
    OutOfRangeError,
    UnsupportedModelError,
)
from ...families import RESERVED_POSITIONS
from .inputs import Encoded, check_vocabulary, padded
from .models import alias_of, load_model, resolve_dtype

__all__ = [
    "CHECKS",
    "Resolved",
    "check_calls",
    "check_layers",
    "check_mode",
    "model_class",
    "compiled",
    "forward_inputs",
    "max_positions",
    "n_layers",
    "resolve",
    "tapped",
    "weight_mode_for",
]

#: the self-checks a capture can run (see :func:`attnviz.capture`'s ``check``)
CHECKS = ("sample", "full", "off")
R = TypeVar("R")
T = TypeVar("T")


def weight_mode_for(check: str, keep_weights: bool = False, *, after_forward: bool = True) -> str:
    """What the taps do with an eager backend's own n×n weights (their ``weight_mode``), the one rule:
    ``"keep"`` them (``keep_weights``); ``"drop"`` them when nothing is checked; at the default check
    (``"sample"``) keep the rows it samples and compare them after the forward, where the records are
    checked (``after_forward``: :func:`captures`; a recorder that builds its records inside the forward,
    a generation's steps, compares at once instead); at a full check ``"compare"`` them while capturing
    and keep only the errors."""
    check_mode(check)
    if keep_weights:
        return "keep"
    if check == "off":
        return "drop"
    return "sample" if check == "sample" and after_forward else "compare"


def check_mode(check: str) -> str:
    """``check`` if it is one of :data:`CHECKS`, else :class:`InputError`."""
    if check not in CHECKS:
        raise InputError(f"check must be one of {', '.join(CHECKS)}, got {check!r}")
    return check


def max_positions(config) -> int | None:
    """How many tokens a model with this config reads at most (None: no limit it states)."""
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value - RESERVED_POSITIONS.get(getattr(config, "model_type", ""), 0)
    return None


def n_layers(config) -> int | None:
    """The number of layers of the model's deepest stack (None: the config does not say)."""
    counts = [
        getattr(config, name, None)
        for name in (
            "num_hidden_layers",
            "n_layer",
            "num_layers",
            "encoder_layers",
            "decoder_layers",
            "num_decoder_layers",
        )
    ]
    found = [c for c in counts if isinstance(c, int)]
    return max(found) if found else None


def check_layers(layers: Iterable[int] | None, n_layers: int | None) -> set[int] | None:
    """The layers asked for as a set (None: every layer); wrong types and layers out of range refused."""
    if layers is None:
        return None
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    try:
        wanted = set(layers)
    except TypeError as err:
        raise ArgumentTypeError(f"layers must be a list of ints or None, got {type(layers).__name__}") from err
    if not wanted:
        raise InputError("layers=[] would capture nothing; leave layers=None to capture every layer")
    for layer in wanted:
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise ArgumentTypeError(f"layers must be ints, got {layer!r}")
        if layer < 0 or (n_layers is not None and layer >= n_layers):
            top = f"0..{n_layers - 1}" if n_layers is not None else "≥ 0"
            raise OutOfRangeError(f"layer {layer} is out of range: this model has layers {top}")
    return wanted


# ---------------------------------------------------------------- 1. the model
@dataclass(frozen=True)
class Resolved:
    """A model ready to run: in eval mode, of a supported family, with its tokenizer (or None) and
    the name its captures record."""

    model: nn.Module
    tokenizer: Any
    name: str

    @property
    def limit(self) -> int | None:
        """The most tokens the model reads (:func:`max_positions`)."""
        return max_positions(self.model.config)

    @property
    def encoder_decoder(self) -> bool:
        return bool(getattr(self.model.config, "is_encoder_decoder", False))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def layers(self, layers: Iterable[int] | None) -> set[int] | None:
        """The layers asked for, checked against this model (:func:`check_layers`)."""
        return check_layers(layers, n_layers(self.model.config))

    def require_tokenizer(self) -> Any:
        """The tokenizer, or the error that says how to give one."""
        if self.tokenizer is None:
            source = getattr(self.model.config, "_name_or_path", "") or "the model's name or folder"
            raise InputError(f"pass tokenizer= with a model object (e.g. AutoTokenizer.from_pretrained({source!r}))")
        if not callable(self.tokenizer):
            raise ArgumentTypeError(f"tokenizer must be a transformers tokenizer, got {type(self.tokenizer).__name__}")
        return self.tokenizer


def resolve(
    model: str | Path | nn.Module | Resolved,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    attn_implementation: str | None = None,
) -> Resolved:
    """A name (embedded alias, hub name, folder) loaded on ``device`` in ``dtype``, or a model object
    checked: it must be in eval mode, a transformers model of a family attnviz supports, already on
    the ``device`` and in the ``dtype`` given."""
    if isinstance(model, Resolved):
        return model
    name = None
    if isinstance(model, (str, Path)):
        name = str(model)
        model, loaded_tokenizer = load_model(name, device=device, dtype=dtype, attn_implementation=attn_implementation)
        tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
    elif isinstance(model, nn.Module):
        _check_model_placement(model, device, dtype, attn_implementation)
    else:
        raise ArgumentTypeError(f"model must be a name, a path or a transformers model, got {type(model).__name__}")
    if model.training:
        raise ModelInTrainingModeError(
            f"{type(model).__name__} is in training mode: dropout would make every capture different. "
            "Call model.eval() first."
        )
    config = model.config
    source = getattr(config, "_name_or_path", "")
    name = name or alias_of(source) or source or model_class(model)  # an embedded model by its alias
    check_supported(config)
    return Resolved(model, tokenizer, name)


def _check_model_placement(model: nn.Module, device, dtype, attn_implementation) -> None:
    param = next(model.parameters(), None)
    if param is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no parameters; is it a transformers model?")
    if not hasattr(model, "config"):
        raise UnsupportedModelError(f"{type(model).__name__} has no .config; attnviz captures transformers models")
    wanted_dtype = resolve_dtype(dtype)
    if device is not None and torch.device(device).type != param.device.type:
        raise InputError(
            f"the model is on {param.device} but device={device!r} was given; move it yourself "
            f"(model.to({str(device)!r})) or pass a model name so attnviz loads it there"
        )
    if wanted_dtype is not None and wanted_dtype != param.dtype:
        raise InputError(
            f"the model is in {param.dtype} but dtype={dtype!r} was given; convert it yourself "
            "or pass a model name so attnviz loads it in that dtype"
        )
    if attn_implementation is not None and attn_implementation != getattr(model.config, "_attn_implementation", None):
        raise InputError(
            "attn_implementation only applies when attnviz loads the model; for a model object use "
            "model.set_attn_implementation(...) yourself (attnviz captures every backend anyway)"
        )


# ---------------------------------------------------------------- 2. the inputs
def forward_inputs(
    resolved: Resolved, encoded: list[Encoded], decoded: list[Encoded] | None = None, what: str = "input_ids"
) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """(the forward's keyword arguments, each part's real query rows per text): the texts right-padded
    into one batch (the decoder's too, for an encoder-decoder), the cache off."""
    model = resolved.model
    check_vocabulary(model, encoded, what)
    ids, attention_mask = padded(encoded, resolved.device)
    # the mask passed even without padding: some families read a mask they build themselves another way
    # (DeBERTa's all-ones float mask is kept as a custom mask); passing it costs no sync in transformers ≥ 5.24
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": attention_mask}
    lengths = {"encoder": [len(e[0]) for e in encoded], "decoder": [len(e[0]) for e in encoded]}
    if resolved.encoder_decoder:
        assert decoded is not None
        get_decoder: Any = getattr(model, "get_decoder", None)
        check_vocabulary(get_decoder() if get_decoder is not None else model, decoded, "decoder input")
        dec_ids, dec_mask = padded(decoded, resolved.device)
        kwargs.update(decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
        lengths.update(decoder=[len(d[0]) for d in decoded], cross=[len(d[0]) for d in decoded])
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False
    return kwargs, lengths


# ---------------------------------------------------------------- 3. the taps
def tapped(
    resolved: Resolved,
    taps: AbstractContextManager[R],
    run: Callable[[R], T],
    layers: set[int] | None,
    forward_calls: Callable[[R], list[AttentionCall]] | None = None,
) -> tuple[R, T]:
    """(the recorder, what ``run`` returned): ``run(recorder)`` (a forward, a generation loop) inside
    ``taps`` (a tap context manager of :mod:`attnviz.engine`) without gradients, then the calls of one
    forward (``forward_calls(recorder)``, default ``recorder.calls``) checked (:func:`check_calls`) and
    some asked-for layer among them. The taps are gone afterwards, also if ``run`` raises."""
    with torch.no_grad(), taps as recorder:
        output = run(recorder)
    calls: list[AttentionCall] = forward_calls(recorder) if forward_calls is not None else recorder.calls  # type: ignore[attr-defined]
    check_calls(resolved.model, calls, resolved.encoder_decoder)
    if not any(layers is None or c.layer in layers for c in calls):
        raise OutOfRangeError(
            f"none of layers {sorted(layers or [])} ran; this model has {len(calls)} attention layers"
        )
    return recorder, output


def check_calls(model: nn.Module, calls: list[AttentionCall], encoder_decoder: bool) -> None:
    """Refuse what would show an incomplete or mislabelled picture: no call at all, a layer that ran
    twice in one forward (or two modules at one layer), an encoder-decoder part that bypassed the taps."""
    family = f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')})"
    if not calls and compiled(model):
        raise UnsupportedModelError(
            f"{family} is compiled with torch.compile and its compiled code ran without attnviz's hooks: "
            "dynamo does not guard on module hooks, so a graph compiled before the capture skips them. "
            "Capture the model before running it compiled, or call torch.compiler.reset() first"
        )
    if not calls:
        raise UnsupportedModelError(
            f"{family} ran no attention that attnviz could tap (backend "
            f"{getattr(model.config, '_attn_implementation', None)!r}), so nothing was captured. "
            f"attnviz supports {supported_families()}. GPT-2 with reorder_and_upcast_attn under "
            "eager bypasses the interface: load with attn_implementation='sdpa'."
        )
    seen: dict[tuple[str, int], str] = {}
    for call in calls:
        key = (call.part, call.layer)
        if key in seen:
            what = "ran its attention twice" if seen[key] == call.name else f"and {seen[key]} both sit at"
            raise UnsupportedModelError(
                f"{family}: {call.name} {what} {call.part} layer {call.layer} in one forward (shared or "
                "nested attention modules with no entry in attnviz.families.SHARED_LAYERS); attnviz keys each "
                "layer by the module that ran it and will not guess which is which"
            )
        seen[key] = call.name
    if encoder_decoder:
        missing = [p for p in ENCODER_DECODER_PARTS if p not in {c.part for c in calls}]
        if missing:
            raise UnsupportedModelError(
                f"{family}: the {' and '.join(missing)} attention did not go through transformers' "
                "AttentionInterface, so a capture would show only part of the model"
            )


def model_class(model: nn.Module) -> str:
    """The model's class name — the compiled model's own, not torch.compile's wrapper (``OptimizedModule``)."""
    return type(getattr(model, "_orig_mod", model)).__name__


def compiled(model: nn.Module) -> bool:
    """Whether torch.compile wraps the model, its call or the forward of one of its modules
    (``torch.compile(model)``, ``model.compile()``, ``module.forward = torch.compile(module.forward)``)."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile(model): an OptimizedModule around it
    return inner is not model or any(
        getattr(m, "_compiled_call_impl", None) is not None
        or hasattr(getattr(m, "forward", None), "_torchdynamo_orig_callable")
        for m in inner.modules()
    )
