"""What a capture keeps, chosen by its caller and applied once the self-check has used everything: the
parts of each layer (``keep=``: :data:`KEEP`, :func:`check_keep`, :func:`drop_unkept`) and the query heads
(``heads=``: :func:`check_heads` against the config's :func:`n_heads`, then :func:`keep_heads` narrowing each
record — before the copy to the host, where :func:`~attnviz.workflows.capture.build.captures` calls it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ...data.capture import Capture
from ...errors import ArgumentTypeError, InputError, OutOfRangeError

__all__ = ["KEEP", "HeadChoice", "check_heads", "check_keep", "drop_unkept", "keep_heads", "n_heads"]

#: what a capture can keep of each layer (:func:`attnviz.capture`'s ``keep``): its queries and keys (every
#: map is recomputed from them, so they are always kept), its values, the kernel's output, and the value
#: dot products what a head moves is read from
KEEP = ("q", "k", "v", "out", "norms")


def check_keep(keep: Iterable[str] | str | None, option: str = "keep=") -> frozenset[str]:
    """The names of :data:`KEEP` that ``keep`` asks for (None: all of them); anything else refused, the
    message naming ``option`` (the command line's ``--keep``)."""
    if keep is None:
        return frozenset(KEEP)
    if isinstance(keep, str):  # "q,k" or "q k", as the command line writes it
        keep = keep.replace(",", " ").split()
    try:
        names = set(keep)
    except TypeError as err:
        raise ArgumentTypeError(
            f"{option} takes names among {', '.join(KEEP)} (a tuple, or a string such as 'q,k'), "
            f"got {type(keep).__name__}"
        ) from err
    unknown = sorted(str(n) for n in names - set(KEEP))
    if unknown:
        raise InputError(f"{option} names {', '.join(unknown)}; a capture keeps {', '.join(KEEP)} (or a subset)")
    missing = [n for n in ("q", "k") if n not in names]
    if missing:
        raise InputError(
            f"{option} leaves out {' and '.join(missing)}: every map is recomputed from the queries and keys, so a "
            "capture keeps them; leave out v, out or norms to keep less"
        )
    return frozenset(names)


def drop_unkept(made: list[Capture], keep: frozenset[str]) -> None:
    """What ``keep`` does not name let go of every record, after the self-check has used it: V becomes a
    zero-width tensor of its own (weights are recomputed as before; A·V cannot be), ``out`` and the value
    dot products None — and Q and K are copied when they share storage with what was let go (GPT-2's
    fused projection), so that it is freed. ``cap.model["kept"]`` names what was kept."""
    for cap in made:
        cap.model["kept"] = [name for name in KEEP if name in keep]
        if keep == frozenset(KEEP):
            continue
        for rec in cap.records.values():
            if "v" not in keep:
                rec.v = rec.v.new_empty(*rec.v.shape[:-1], 0)
            if "out" not in keep:
                rec.out = None
            if "norms" not in keep:
                rec.value_dots = None
            for name in ("q", "k"):
                t = getattr(rec, name)
                if t.untyped_storage().nbytes() > t.numel() * t.element_size():
                    setattr(rec, name, t.clone())


#: the query heads a capture keeps (:func:`check_heads`): the same of every layer (a tuple), or per layer (a
#: dict; a layer it does not name keeps every head); None: every head
HeadChoice = tuple[int, ...] | dict[int, tuple[int, ...]] | None


def _head_list(heads: Any, option: str, n: int | None) -> tuple[int, ...]:
    if isinstance(heads, int) and not isinstance(heads, bool):
        heads = [heads]
    if isinstance(heads, str):  # "3,7", as the command line writes it
        try:
            heads = [int(h) for h in heads.replace(",", " ").split()]
        except ValueError as err:
            raise InputError(f"{option} takes head numbers such as 3,7, got {heads!r}") from err
    try:
        wanted = list(heads)
    except TypeError as err:
        raise ArgumentTypeError(
            f"{option} takes a list of head numbers (or a dict layer → list), got {type(heads).__name__}"
        ) from err
    if not wanted:
        raise InputError(f"{option} names no head: give some, like [3, 7], or leave it None to keep every head")
    for head in wanted:
        if not isinstance(head, int) or isinstance(head, bool):
            raise ArgumentTypeError(f"{option} takes ints (the model's head numbers), got {head!r}")
        if head < 0 or (n is not None and head >= n):
            top = f"0..{n - 1}" if n is not None else "≥ 0"
            raise OutOfRangeError(f"{option}: head {head} is out of range: this model has heads {top}")
    return tuple(sorted(set(wanted)))


def check_heads(heads: Any, n_heads: int | None = None, option: str = "heads=") -> HeadChoice:
    """The query heads ``heads`` asks a capture to keep, by the model's numbers, sorted: a list (or
    ``"3,7"``) for every layer, a dict ``{layer: [heads]}`` per layer (a layer it does not name keeps
    every head), None for every head; wrong types, an empty list and heads outside ``0..n_heads - 1``
    refused, the message naming ``option`` (the command line's ``--heads``)."""
    if heads is None:
        return None
    if isinstance(heads, dict):
        choice: dict[int, tuple[int, ...]] = {}
        for layer, chosen in heads.items():
            if not isinstance(layer, int) or isinstance(layer, bool):
                raise ArgumentTypeError(f"{option} as a dict maps layers (ints) to heads, got the key {layer!r}")
            choice[layer] = _head_list(chosen, f"{option} (layer {layer})", n_heads)
        if not choice:
            raise InputError(f"{option} is an empty dict: name layers and their heads, or leave it None")
        return choice
    return _head_list(heads, option, n_heads)


def n_heads(config) -> int | None:
    """The most query heads a layer of the model has, as its config says (None: it does not say)."""
    counts = [
        getattr(config, name, None)
        for name in (
            "num_attention_heads",
            "n_head",
            "num_heads",
            "n_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
        )
    ]
    found = [c for c in counts if isinstance(c, int) and not isinstance(c, bool)]
    return max(found) if found else None


def _heads_of(choice: HeadChoice, layer: int) -> tuple[int, ...] | None:
    if choice is None or isinstance(choice, tuple):
        return choice
    return choice.get(layer)


class _Narrowed:
    """``narrow(t, heads)``: ``t``'s rows ``heads`` along its first dimension (a copy), each tensor once per choice."""

    def __init__(self) -> None:
        self.done: dict[tuple[int, tuple[int, ...]], Tensor] = {}

    def __call__(self, t: Tensor, heads: tuple[int, ...]) -> Tensor:
        key = (id(t), heads)
        if key not in self.done:
            self.done[key] = t.index_select(0, torch.tensor(heads, device=t.device))
        return self.done[key]


def keep_heads(made: list[Capture], heads: HeadChoice) -> None:
    """Every record narrowed to the query heads ``heads`` keeps (:func:`check_heads`), after the
    self-check has used every head and before the records are copied to the host: each ``[head, …]``
    tensor indexed once where it is (a copy: the whole stack is freed), K and V to the key/value heads
    those heads read (GQA: a group's, once), and ``LayerRecord.heads`` / ``kv_heads`` set to the model's
    numbers. A head beyond a part's heads (an encoder-decoder's may differ) is refused.
    ``cap.model["heads"]`` says what was asked (a list, or ``{layer: list}``)."""
    if heads is None:
        return
    for cap in made:
        cap.model["heads"] = list(heads) if isinstance(heads, tuple) else {str(k): list(v) for k, v in heads.items()}
        narrow = _Narrowed()  # a tensor shared by layers (T5's bias) narrowed once

        for (part, layer), rec in cap.records.items():
            chosen = _heads_of(heads, layer)
            if chosen is None or rec.heads is not None:
                continue
            n, n_kv = rec.q.shape[0], rec.k.shape[0]
            if chosen[-1] >= n:
                raise OutOfRangeError(
                    f"heads= names head {chosen[-1]}, but the {part} layers of {cap.model.get('name')} have "
                    f"heads 0..{n - 1}"
                )
            group = n // n_kv
            reads = [h // group for h in chosen]
            kv = sorted(set(reads))
            rec.q = narrow(rec.q, chosen)
            rec.k, rec.v = narrow(rec.k, tuple(kv)), narrow(rec.v, tuple(kv))
            for name in ("out", "weights", "relative_bias", "sinks", "weight_error", "weight_scale", "value_dots"):
                t = getattr(rec, name)
                if t is not None:
                    setattr(rec, name, narrow(t, chosen))
            for name in ("mask", "bias", "lse", "sampled_weights"):  # [head or 1, …]: a per-head one narrowed
                t = getattr(rec, name)
                if t is not None and (name in ("lse", "sampled_weights") or (t.dim() == 3 and t.shape[0] == n > 1)):
                    setattr(rec, name, narrow(t, chosen))
            rec.heads, rec.kv_heads = list(chosen), reads
