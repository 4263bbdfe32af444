"""Saving and loading captures: one safetensors file, JSON metadata in its header, never pickle.

Format version 2 keys each record by part and layer (``records.decoder.3.q``) and stores the
decoder's tokens of encoder-decoder captures; version-1 files (one part, ``layers.3.q``) still load.
Tensors shared between records (T5's one position bias for all layers) are written once. A vision
encoder's capture keeps its picture (``image.pixels``, uint8) and its patch grid (``image`` in the
metadata); files without them load as text captures. The capture's provenance (``model.provenance``: the
weights' and tokenizer's hashes, versions, device, the self-check's verdict) is part of the model's metadata;
files written before it existed load with none (``cap.provenance == {}``).

A file is data from anywhere: :mod:`attnviz.data.io_schema` checks its metadata (size and depth before it is
parsed, then every field's type and bounds and every count against the tensors) and anything else is a
:class:`~attnviz.errors.CaptureFileError` naming the field. A save is atomic
(:func:`attnviz.files.atomic_path`): stopped or failing part way, it leaves the previous file whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import CaptureFileError, CaptureWriteError, FileWriteError
from ..files import atomic_path
from . import io_schema
from .capture import RECORD_TENSORS, Capture, LayerRecord, TokenSequence
from .images import ImageGrid
from .io_schema import RECORD_FIELDS, check_json_text, check_meta
from .words import Word

__all__ = ["load", "save"]

FORMAT = "attnviz-capture"
VERSION = 2


def _sequence_meta(seq: TokenSequence) -> dict:
    return {
        "text": seq.text,
        "tokens": seq.tokens,
        "token_ids": seq.token_ids,
        "offsets": [list(o) for o in seq.offsets],
        "words": [[w.text, w.char_start, w.char_end, w.token_start, w.token_stop] for w in seq.words],
    }


def _sequence(meta: dict) -> TokenSequence:
    return TokenSequence(
        meta["text"],
        list(meta["tokens"]),
        list(meta["token_ids"]),
        [tuple(o) for o in meta["offsets"]],
        [Word(*w) for w in meta["words"]],
    )


def save(cap: Capture, path: str | Path) -> Path:
    """Write ``cap`` to ``path`` (safetensors; texts, tokens, words and model facts as JSON metadata),
    atomically (:func:`attnviz.files.atomic_path`): a save that fails or is stopped leaves the previous file
    as it was and no temporary file; a failure is a :class:`CaptureWriteError`."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {}
    records_meta = {}
    written: dict[int, str] = {}  # id of a tensor -> the key it was written under
    for (part, layer), rec in cap.records.items():
        fields = {name: getattr(rec, name) for name in RECORD_FIELDS}
        shared = {}
        for name in RECORD_TENSORS:
            t = getattr(rec, name)
            if t is None:
                continue
            if id(t) in written:
                shared[name] = written[id(t)]
                continue
            key = f"records.{part}.{layer}.{name}"
            tensors[key] = t.detach().to("cpu").contiguous().clone()
            written[id(t)] = key
        records_meta[f"{part}.{layer}"] = {**fields, "shared": shared}
    if cap.image is not None:
        tensors["image.pixels"] = cap.image.pixels.detach().to("cpu").contiguous().clone()
    if cap.vision is not None and (cap.image is None or cap.vision.pixels is not cap.image.pixels):
        tensors["vision.pixels"] = cap.vision.pixels.detach().to("cpu").contiguous().clone()
    meta = {
        "format": FORMAT,
        "version": VERSION,
        **_sequence_meta(cap.source),
        "target": None if cap.target is None else _sequence_meta(cap.target),
        "model": cap.model,
        "records": records_meta,
        "image": None if cap.image is None else cap.image.meta(),
        "vision": None if cap.vision is None else cap.vision.meta(),
    }
    header = {"attnviz": json.dumps(meta, ensure_ascii=False)}
    if len(header["attnviz"]) > io_schema.MAX_META_CHARS:  # a file that load would refuse is not written
        raise CaptureWriteError(
            f"cannot write the capture {str(path)!r}: its metadata (tokens, words, model facts) is "
            f"{len(header['attnviz']):,} characters, more than the {io_schema.MAX_META_CHARS:,} a capture file may carry; "
            "capture a shorter text"
        )
    try:
        with atomic_path(path, what="the capture") as tmp:
            try:
                save_file(tensors, str(tmp), metadata=header)
            except SafetensorError as err:  # safetensors' own error for a failed write (a full disk): not an OSError
                raise CaptureWriteError(
                    f"cannot write the capture {str(path)!r}: {' '.join(str(err).split())} (the disk may be full; the previous file, if "
                    "any, is unchanged)"
                ) from err
    except CaptureWriteError:
        raise
    except FileWriteError as err:
        raise CaptureWriteError(str(err)) from err
    return path


def load(path: str | Path) -> Capture:
    """Read a capture written by :meth:`Capture.save` (any format version up to this one)."""
    from safetensors import SafetensorError
    from safetensors.torch import safe_open

    path = Path(path)
    if not path.is_file():
        raise CaptureFileError(f"no capture file at {str(path)!r}; save one with attnviz.capture(...).save(path)")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except (SafetensorError, OSError, ValueError) as err:
        raise CaptureFileError(f"{str(path)!r} is not an attnviz capture file (not safetensors: {err})") from err
    if "attnviz" not in header:
        raise CaptureFileError(
            f"{str(path)!r} is a safetensors file but not an attnviz capture (missing or broken metadata: no "
            "'attnviz' metadata)"
        )
    check_json_text(path, header["attnviz"])
    try:
        meta = json.loads(header["attnviz"])
    except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError; so is an int of 5000 digits
        raise CaptureFileError(
            f"{str(path)!r} is a safetensors file but not an attnviz capture (missing or broken metadata: {err})"
        ) from err
    if not isinstance(meta, dict):
        raise CaptureFileError(
            f"capture file {str(path)!r}: its metadata must be a JSON object, not a {type(meta).__name__}"
        )
    if meta.get("format") != FORMAT:
        raise CaptureFileError(
            f"{str(path)!r} is a safetensors file but not an attnviz capture (missing or broken metadata: "
            f"its format is not {FORMAT!r})"
        )
    version = check_meta(path, meta, tensors, VERSION)
    if version > VERSION:
        raise CaptureFileError(
            f"{str(path)!r} was written by a newer attnviz (format version {version}); upgrade attnviz"
        )
    records = _records_v2(meta, tensors) if version >= 2 else _records_v1(meta, tensors)
    return Capture.of(
        _sequence(meta),
        records,
        meta["model"],
        None if meta.get("target") is None else _sequence(meta["target"]),
        None if meta.get("image") is None else ImageGrid.from_meta(meta["image"], tensors["image.pixels"]),
        None
        if meta.get("vision") is None
        else ImageGrid.from_meta(meta["vision"], tensors.get("vision.pixels", tensors["image.pixels"])),
    )


def _records_v2(meta: dict, tensors: dict) -> dict[tuple[str, int], LayerRecord]:
    records = {}
    for key, fields in meta["records"].items():
        part, layer = key.rsplit(".", 1)
        fields = dict(fields)
        shared = fields.pop("shared", {})
        values: dict[str, Any] = {
            name: tensors.get(shared.get(name, f"records.{key}.{name}")) for name in RECORD_TENSORS
        }
        records[(part, int(layer))] = LayerRecord(**fields, **values)
    return records


def _records_v1(meta: dict, tensors: dict) -> dict[tuple[str, int], LayerRecord]:
    """Format 1: one part, named by whether its layers were causal; sizes moved into ``parts``."""
    records = {}
    for key, fields in meta["layers"].items():
        values: dict[str, Any] = {
            name: tensors.get(f"layers.{key}.{name}") for name in ("q", "k", "v", "out", "weights", "mask")
        }
        records[int(key)] = LayerRecord(**fields, **values)
    part = "decoder" if any(r.causal for r in records.values()) else "encoder"
    model = meta["model"]
    model.setdefault("parts", {part: {name: model[name] for name in ("n_layers", "n_heads", "n_kv_heads", "d_head")}})
    return {(part, layer): rec for layer, rec in records.items()}
