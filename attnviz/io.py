"""Saving and loading captures: one safetensors file, JSON metadata in its header, never pickle."""

from __future__ import annotations

import json
from pathlib import Path

from .capture import Capture, LayerRecord
from .errors import CaptureFileError
from .words import Word

__all__ = ["load", "save"]

FORMAT = "attnviz-capture"
VERSION = 1
_TENSORS = ("q", "k", "v", "out", "weights", "mask")
_FIELDS = ("name", "scaling", "causal", "window", "softcap")


def save(cap: Capture, path: str | Path) -> Path:
    """Write ``cap`` to ``path`` (safetensors; text, tokens, words and model facts as JSON metadata)."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {}
    layers_meta = {}
    for i, rec in cap.layers.items():
        layers_meta[str(i)] = {name: getattr(rec, name) for name in _FIELDS}
        for name in _TENSORS:
            t = getattr(rec, name)
            if t is not None:
                tensors[f"layers.{i}.{name}"] = t.detach().to("cpu").contiguous().clone()
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "text": cap.text,
        "tokens": cap.tokens,
        "token_ids": cap.token_ids,
        "offsets": [list(o) for o in cap.offsets],
        "words": [[w.text, w.char_start, w.char_end, w.token_start, w.token_stop] for w in cap.words],
        "model": cap.model,
        "layers": layers_meta,
    }
    save_file(tensors, str(path), metadata={"attnviz": json.dumps(meta, ensure_ascii=False)})
    return path


def load(path: str | Path) -> Capture:
    """Read a capture written by :meth:`Capture.save`."""
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
    try:
        meta = json.loads(header["attnviz"])
        if meta.get("format") != FORMAT:
            raise KeyError("format")
        if meta.get("version", 0) > VERSION:
            raise CaptureFileError(
                f"{str(path)!r} was written by a newer attnviz (format version {meta['version']}); upgrade attnviz"
            )
        layers = {}
        for key, fields in meta["layers"].items():
            i = int(key)
            parts = {name: tensors.get(f"layers.{i}.{name}") for name in _TENSORS}
            layers[i] = LayerRecord(**fields, **parts)
        return Capture(
            text=meta["text"],
            tokens=list(meta["tokens"]),
            token_ids=list(meta["token_ids"]),
            offsets=[tuple(o) for o in meta["offsets"]],
            words=[Word(*w) for w in meta["words"]],
            layers=layers,
            model=meta["model"],
        )
    except CaptureFileError:
        raise
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as err:
        raise CaptureFileError(
            f"{str(path)!r} is a safetensors file but not an attnviz capture (missing or broken metadata: {err})"
        ) from err

