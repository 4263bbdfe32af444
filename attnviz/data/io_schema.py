"""What a capture file's metadata must be, checked when it loads (:func:`attnviz.data.io.load`).

A capture file is data from anywhere: its JSON metadata is checked against a schema — each field's type and
bounds — and every count in it against the tensors the file holds (the tokens, ids and offsets are as many
as the records' queries or keys; each word's span lies inside the text and the tokens; each record's Q, K and
V have the ranks and head counts that its ``heads`` / ``kv_heads`` and the model's facts say; a shared
tensor names one the file has; an image's patch grid lies on its pixels). Every integer is bounded by what
the tensors hold or by a fixed limit, so nothing read from a file can ask for more memory than the file
itself. Before the JSON is parsed at all, its size and nesting depth are bounded (:func:`check_json_text`:
a depth scan, so that the parser never recurses deeply). Anything else is a
:class:`~attnviz.errors.CaptureFileError` naming the field: ``capture file 'x.attnviz': metadata field
records.decoder.3.scaling must be a positive number, got null``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..engine.specs import PARTS
from ..errors import CaptureFileError
from .capture import RECORD_TENSORS

__all__ = ["MAX_DEPTH", "MAX_META_CHARS", "RECORD_FIELDS", "check_json_text", "check_meta", "json_depth"]

#: the longest metadata a capture file may carry (characters of JSON; a 100 000-token text's is ~6 MB)
MAX_META_CHARS = 64 << 20
#: the deepest nesting of its JSON (attnviz writes 4 levels)
MAX_DEPTH = 32
#: the most layers or heads a part may claim (no model has this many; the tensors bound the rest)
MAX_COUNT = 1 << 16
#: a token id: -1 (an image's token) up to int32
MAX_TOKEN_ID = (1 << 31) - 1
#: the fields of a record's metadata (v2) besides ``shared``
RECORD_FIELDS = ("name", "scaling", "causal", "window", "softcap", "heads", "kv_heads")
_V1_FIELDS = ("name", "scaling", "causal", "window", "softcap")
_V1_TENSORS = ("q", "k", "v", "out", "weights", "mask")
_KEEP = ("q", "k", "v", "out", "norms")
_PROVENANCE: dict[str, tuple[type, ...]] = {  # attnviz.workflows.capture.provenance.FIELDS, by type
    **dict.fromkeys(
        (
            "name",
            "source",
            "revision",
            "weights_sha256",
            "tokenizer_sha256",
            "attnviz",
            "transformers",
            "torch",
            "device",
            "dtype",
            "backend",
            "edits",
            "check",
        ),
        (str,),
    ),
    "add_bos": (bool,),
    "check_passed": (bool,),
    "check_worst": (int, float),
    "check_max_abs_error": (int, float),
}
_PIECE = 1 << 20  # bytes the depth scan reads at a time


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in the JSON ``text``, found without parsing it: a bracket
    counts where it lies outside every string (a string runs from a quote to the next quote that an even run of
    backslashes precedes). Vectorised over pieces of :data:`_PIECE` bytes, the state carried from one to the
    next: linear in the length, no recursion, no regular expression that could backtrack."""
    data = text.encode("utf-8", "surrogatepass")  # a multi-byte character has no byte below 128
    depth = deepest = 0
    in_string = 0  # 1 inside a string at the end of the last piece
    run = 0  # backslashes ending the last piece
    for start in range(0, len(data), _PIECE):
        codes = np.frombuffer(data, dtype=np.uint8, count=min(_PIECE, len(data) - start), offset=start)
        index = np.arange(len(codes), dtype=np.int64)
        slash = codes == 92
        last_other = np.maximum.accumulate(np.where(slash, -1, index))  # the last byte at or before i not a backslash
        before = np.empty_like(index)  # backslashes right before each byte
        before[0] = run
        before[1:] = index[:-1] - last_other[:-1] + np.where(last_other[:-1] < 0, run, 0)
        quotes = (codes == 34) & (before % 2 == 0)
        inside = (np.cumsum(quotes, dtype=np.int64) + in_string) % 2  # at a bracket: 1 when inside a string
        steps = (np.isin(codes, (91, 123)).astype(np.int64) - np.isin(codes, (93, 125))) * (1 - inside)
        running = np.cumsum(steps) + depth
        deepest = max(deepest, int(running.max()))
        depth, in_string = int(running[-1]), int(inside[-1])
        run = int(len(codes) - 1 - last_other[-1]) + (run if last_other[-1] < 0 else 0)
    return deepest


def _fail(path: Path, field: str, must: str, got: Any) -> CaptureFileError:
    return CaptureFileError(f"capture file {str(path)!r}: metadata field {_line(field)} {must}, got {_show(got)}")


def _line(text: str, limit: int = 120) -> str:
    """``text`` (a key read from the file) as one printable line of at most ``limit`` characters."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"shape {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    try:
        text = (
            json.dumps(value, ensure_ascii=False)
            if not isinstance(value, int) or abs(value) < 10**30
            else "a huge integer"
        )
    except (TypeError, ValueError):
        text = repr(value)
    return _line(text, 80)


def check_json_text(path: Path, text: Any) -> None:
    """Refuse metadata that is not a string, longer than :data:`MAX_META_CHARS`, or nested deeper than
    :data:`MAX_DEPTH` — before it is parsed."""
    if not isinstance(text, str):
        raise CaptureFileError(f"capture file {str(path)!r}: its metadata is not text")
    if len(text) > MAX_META_CHARS:
        raise CaptureFileError(
            f"capture file {str(path)!r}: its metadata is {len(text):,} characters, more than the "
            f"{MAX_META_CHARS:,} a capture file may carry"
        )
    depth = json_depth(text)
    if depth > MAX_DEPTH:
        raise CaptureFileError(
            f"capture file {str(path)!r}: its metadata is nested {depth} levels deep, more than the "
            f"{MAX_DEPTH} a capture file may have"
        )


class _Checker:
    """The checks of one file's metadata against its tensors; each failure names the field."""

    def __init__(self, path: Path, tensors: Mapping[str, Tensor]) -> None:
        self.path = path
        self.tensors = tensors

    def fail(self, field: str, must: str, got: Any) -> CaptureFileError:
        return _fail(self.path, field, must, got)

    # ------------------------------------------------------------------ JSON values
    def obj(self, value: Any, field: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(field, "must be an object", value)
        return value

    def items(self, value: Any, field: str, length: int | None = None) -> list:
        if not isinstance(value, list):
            raise self.fail(field, "must be a list", value)
        if length is not None and len(value) != length:
            raise self.fail(field, f"must have {length} entries, not {len(value)}", value)
        return value

    def string(self, value: Any, field: str, *, optional: bool = False) -> Any:
        if not (isinstance(value, str) or (optional and value is None)):
            raise self.fail(field, "must be a string" + (" or null" if optional else ""), value)
        return value

    def flag(self, value: Any, field: str, *, optional: bool = False) -> Any:
        if not (isinstance(value, bool) or (optional and value is None)):
            raise self.fail(field, "must be true or false" + (" or null" if optional else ""), value)
        return value

    def integer(self, value: Any, field: str, lo: int, hi: int, *, optional: bool = False) -> Any:
        if optional and value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise self.fail(field, f"must be an integer from {lo} to {hi}" + (" or null" if optional else ""), value)
        return value

    def number(self, value: Any, field: str, *, positive: bool = False, optional: bool = False) -> Any:
        if optional and value is None:
            return None
        # an int beyond a float's range would overflow where it is formatted or multiplied
        ok = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and (isinstance(value, float) or abs(value) < 1e300)
        )
        if positive:
            ok = ok and math.isfinite(value) and 0 < value < 1e300
        if not ok:
            kind = "a positive number" if positive else "a number"
            raise self.fail(field, f"must be {kind}" + (" or null" if optional else ""), value)
        return value

    # ------------------------------------------------------------------ tensors
    def tensor(self, key: str, field: str, dims: int, *, floating: bool = True) -> Tensor:
        if key not in self.tensors:
            raise self.fail(field, f"names tensor {key!r}, which the file does not have", key)
        t = self.tensors[key]
        if t.dim() != dims:
            raise self.fail(field, f"must be a tensor of {dims} dimensions ({key})", t)
        if floating and not t.is_floating_point():
            raise self.fail(field, f"must be a floating-point tensor ({key})", t)
        return t

    def shape(self, t: Tensor, field: str, expected: tuple[int | tuple[int, ...] | None, ...]) -> None:
        """``t``'s shape against ``expected``: per dimension a size, sizes allowed (a tuple), or None (any)."""
        for got, want in zip(t.shape, expected):
            if want is not None and got not in (want if isinstance(want, tuple) else (want,)):
                words = " × ".join(
                    "any" if w is None else "/".join(map(str, w)) if isinstance(w, tuple) else str(w) for w in expected
                )
                raise self.fail(field, f"must have the shape {words} (what the tokens and heads say)", t)

    # ------------------------------------------------------------------ the parts of the metadata
    def sequence(self, meta: Any, field: str) -> int:
        """A sequence's text, tokens, ids, offsets and words; returns its number of tokens."""
        meta = self.obj(meta, field) if field else meta
        at = f"{field}." if field else ""
        text = self.string(meta.get("text"), f"{at}text")
        tokens = self.items(meta.get("tokens"), f"{at}tokens")
        n = len(tokens)
        for i, token in enumerate(tokens):
            self.string(token, f"{at}tokens.{i}")
        for i, token_id in enumerate(self.items(meta.get("token_ids"), f"{at}token_ids", n)):
            self.integer(token_id, f"{at}token_ids.{i}", -1, MAX_TOKEN_ID)
        for i, span in enumerate(self.items(meta.get("offsets"), f"{at}offsets", n)):
            self.items(span, f"{at}offsets.{i}", 2)
            start = self.integer(span[0], f"{at}offsets.{i}.0", 0, len(text))
            self.integer(span[1], f"{at}offsets.{i}.1", start, len(text))
        for i, word in enumerate(self.items(meta.get("words"), f"{at}words")):
            where = f"{at}words.{i}"
            self.items(word, where, 5)
            self.string(word[0], f"{where}.0")
            start = self.integer(word[1], f"{where}.1 (its first character)", 0, len(text))
            self.integer(word[2], f"{where}.2 (its end character)", start, len(text))
            first = self.integer(word[3], f"{where}.3 (its first token)", 0, max(n - 1, 0))
            self.integer(word[4], f"{where}.4 (its end token)", first + 1, n)
        return n

    def grid(self, meta: Any, field: str, pixels_key: str) -> int:
        """An image's patch grid against its pixels; returns its number of tokens."""
        meta = self.obj(meta, field)
        pixels = self.tensor(pixels_key, field, 3, floating=False)
        if pixels.dtype != torch.uint8 or pixels.shape[2] != 3:
            raise self.fail(field, f"must come with pixels of height × width × 3 uint8 ({pixels_key})", pixels)
        height, width = int(pixels.shape[0]), int(pixels.shape[1])
        patch = self.items(meta.get("patch"), f"{field}.patch", 2)
        grid = self.items(meta.get("grid"), f"{field}.grid", 2)
        ph = self.integer(patch[0], f"{field}.patch.0", 1, max(height, 1))
        pw = self.integer(patch[1], f"{field}.patch.1", 1, max(width, 1))
        rows = self.integer(grid[0], f"{field}.grid.0 (rows of patches on {height} pixels)", 0, height // ph)
        cols = self.integer(grid[1], f"{field}.grid.1 (columns of patches on {width} pixels)", 0, width // pw)
        labels = 0
        for name in ("prefix", "suffix"):
            value = meta.get(name, []) if name == "suffix" else meta.get(name)
            for i, label in enumerate(self.items(value, f"{field}.{name}")):
                self.string(label, f"{field}.{name}.{i}")
            labels += len(value)
        return labels + rows * cols

    def part_sizes(self, parts: Any, field: str) -> dict[str, dict[str, int]]:
        parts = self.obj(parts, field)
        for part, info in parts.items():
            if part not in PARTS:
                raise self.fail(f"{field}", f"must name parts among {', '.join(PARTS)}", part)
            info = self.obj(info, f"{field}.{part}")
            for name in ("n_layers", "n_heads", "n_kv_heads", "d_head"):
                self.integer(info.get(name), f"{field}.{part}.{name}", 1, MAX_COUNT)
            if info["n_kv_heads"] > info["n_heads"]:
                raise self.fail(
                    f"{field}.{part}.n_kv_heads", f"must be at most n_heads ({info['n_heads']})", info["n_kv_heads"]
                )
        return parts

    def record(
        self,
        key: str,
        fields: Any,
        values: dict[str, Tensor | None],
        parts: dict[str, dict[str, int]],
        lengths: tuple[int, int],
        field: str,
        reads: str = "text",
    ) -> None:
        """One record's fields and tensors (``values``: each of its tensors, or None) against its part's
        sizes and the ``lengths`` (queries, keys) of the tokens it reads."""
        part, layer = key.rsplit(".", 1) if "." in key else (key, "")
        if part not in parts:
            raise self.fail(field, f"must name a part of model.parts ({', '.join(parts)}) and a layer", key)
        info = parts[part]
        if not (layer.isascii() and layer.isdigit()) or int(layer) >= info["n_layers"]:
            raise self.fail(field, f"must name a layer 0..{info['n_layers'] - 1} of {part}", key)
        self.string(fields.get("name"), f"{field}.name")
        self.number(fields.get("scaling"), f"{field}.scaling", positive=True)
        self.flag(fields.get("causal"), f"{field}.causal")
        self.integer(fields.get("window"), f"{field}.window", 1, 1 << 31, optional=True)
        self.number(fields.get("softcap"), f"{field}.softcap", positive=True, optional=True)
        n_q, n_k = lengths
        q, k, v = values["q"], values["k"], values["v"]
        if q is None or k is None or v is None:
            missing = [name for name in ("q", "k", "v") if values[name] is None]
            raise self.fail(field, "must come with its q, k and v tensors", f"no {', '.join(missing)}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() != 3 or not t.is_floating_point():
                raise self.fail(f"{field}.{name}", "must be a floating-point tensor [head, position, d_head]", t)
        h, kv = int(q.shape[0]), int(k.shape[0])
        for name, t, n, what in (("q", q, n_q, "query"), ("k", k, n_k, "key")):
            if t.shape[1] != n:
                raise self.fail(
                    f"{field}.{name}", f"must have one {what} position per token of the {reads} ({n} tokens)", t
                )
        if q.shape[2] != info["d_head"]:
            raise self.fail(f"{field}.q", f"must be {info['d_head']} wide (model.parts.{part}.d_head)", q)
        heads, kv_heads = fields.get("heads"), fields.get("kv_heads")
        if heads is None:
            if h != info["n_heads"]:
                raise self.fail(
                    f"{field}.q", f"must stack the part's {info['n_heads']} heads (model.parts.{part}.n_heads)", q
                )
        else:
            self.items(heads, f"{field}.heads", h)
            for i, head in enumerate(heads):
                self.integer(head, f"{field}.heads.{i}", 0, info["n_heads"] - 1)
            if h == 0 or len(set(heads)) != h:
                raise self.fail(f"{field}.heads", "must name distinct heads, at least one", heads)
        if kv_heads is None and heads is None:
            if kv != info["n_kv_heads"]:
                raise self.fail(
                    f"{field}.k",
                    f"must stack the part's {info['n_kv_heads']} key/value heads (model.parts.{part}.n_kv_heads)",
                    k,
                )
        elif kv_heads is None:
            if kv == 0 or h % kv:
                raise self.fail(f"{field}.k", f"must stack a number of heads that divides q's {h}", k)
        else:
            self.items(kv_heads, f"{field}.kv_heads", h)
            for i, head in enumerate(kv_heads):
                self.integer(head, f"{field}.kv_heads.{i}", 0, info["n_kv_heads"] - 1)
            if kv != len(set(kv_heads)):
                raise self.fail(f"{field}.k", f"must stack the {len(set(kv_heads))} key/value heads kv_heads names", k)
        self.shape(k, f"{field}.k", (None, n_k, q.shape[2]))
        self.shape(v, f"{field}.v", (kv, n_k, None))
        d_v = int(v.shape[2])
        optional: dict[str, tuple[int, tuple[int | tuple[int, ...] | None, ...]]] = {
            "out": (3, (h, n_q, d_v)),
            "weights": (3, (h, n_q, n_k)),
            "bias": (3, ((h, 1), (n_q, 1), n_k)),
            "relative_bias": (2, ((h, 1), n_q + n_k - 1)),
            "sinks": (1, (h,)),
            "weight_error": (1, (h,)),
            "weight_scale": (1, (h,)),
            "value_dots": (3, (h, n_k, None)),
            "projection_check": (1, (3,)),
            "lse": (2, (h, n_q)),
        }
        for name, (dims, shape) in optional.items():
            given = values[name]
            if given is None:
                continue
            if given.dim() != dims or not given.is_floating_point():
                raise self.fail(f"{field}.{name}", f"must be a floating-point tensor of {dims} dimensions", given)
            self.shape(given, f"{field}.{name}", shape)
            if name == "value_dots" and given.shape[2] == 0:
                raise self.fail(f"{field}.{name}", "must hold at least one column", given)
        mask = values["mask"]
        if mask is not None:
            if mask.dim() not in (2, 3) or not (mask.is_floating_point() or mask.dtype == torch.bool):
                raise self.fail(f"{field}.mask", "must be a bool or floating-point tensor of 2 or 3 dimensions", mask)
            self.shape(mask, f"{field}.mask", (n_q, n_k) if mask.dim() == 2 else ((h, 1), n_q, n_k))

    def model(self, model: Any, version: int) -> dict[str, dict[str, int]]:
        """The model's facts, provenance and check results: the types every reader of ``cap.model`` relies on."""
        model = self.obj(model, "model")
        for name in ("name", "model_type", "class", "backend", "dtype", "device", "check"):
            if name in model:
                self.string(model[name], f"model.{name}", optional=name not in ("dtype",))
        for name in ("encoder_decoder",):
            if name in model:
                self.flag(model[name], f"model.{name}")
        for name in ("d_model", "max_positions"):
            if name in model:
                self.integer(model[name], f"model.{name}", 1, 1 << 40, optional=True)
        if "check_error" in model:
            self.number(model["check_error"], "model.check_error")
        if "kept" in model:
            kept = self.items(model["kept"], "model.kept")
            for i, name in enumerate(kept):
                if name not in _KEEP:
                    raise self.fail(f"model.kept.{i}", f"must be one of {', '.join(_KEEP)}", name)
        if "edits" in model:
            for i, edit in enumerate(self.items(model["edits"], "model.edits")):
                self.string(edit, f"model.edits.{i}")
        if model.get("provenance") is not None:
            provenance = self.obj(model["provenance"], "model.provenance")
            for name, value in provenance.items():
                kinds = _PROVENANCE.get(name, (str, int, float, bool))
                ok = value is None or (isinstance(value, kinds) and not (bool not in kinds and isinstance(value, bool)))
                if not ok:
                    kind = {(str,): "a string", (bool,): "true or false", (int, float): "a number"}.get(
                        kinds, "a string, number or true/false"
                    )
                    raise self.fail(f"model.provenance.{name}", f"must be {kind} or null", value)
        if version < 2:
            return self.v1_sizes(model)
        return self.part_sizes(model.get("parts"), "model.parts")

    def v1_sizes(self, model: dict) -> dict[str, dict[str, int]]:
        if "parts" in model:
            raise self.fail(
                "model.parts", "is not part of a format-1 file (its sizes are model.n_layers, …)", model["parts"]
            )
        info = {}
        for name in ("n_layers", "n_heads", "n_kv_heads", "d_head"):
            info[name] = self.integer(model.get(name), f"model.{name}", 1, MAX_COUNT)
        return {"v1": info}

    def generation(self, model: dict, n_sequence: int) -> None:
        if "generation" not in model:
            return
        gen = self.obj(model["generation"], "model.generation")
        self.integer(gen.get("prompt_length"), "model.generation.prompt_length", 0, n_sequence)
        self.string(gen.get("text"), "model.generation.text")
        self.string(gen.get("stopped"), "model.generation.stopped", optional=True)
        for i, step in enumerate(self.items(gen.get("steps"), "model.generation.steps")):
            self.integer(step, f"model.generation.steps.{i}", 0, n_sequence)


def check_meta(path: Path, meta: Any, tensors: Mapping[str, Tensor], version_now: int) -> int:
    """Check a parsed capture file's metadata against its tensors (see the module's docstring); returns its
    format version. Raises :class:`~attnviz.errors.CaptureFileError` naming the first field that is wrong."""
    c = _Checker(path, tensors)
    if not isinstance(meta, dict):
        raise CaptureFileError(f"capture file {str(path)!r}: its metadata must be a JSON object, got {_show(meta)}")
    version = c.integer(meta.get("version", 0), "version", 0, 1 << 31)
    if version > version_now:
        return version  # the loader says: written by a newer attnviz
    if version < 2:
        for name in ("target", "image", "vision"):
            if meta.get(name) is not None:
                raise c.fail(name, "is not part of a format-1 file (one text, one part)", meta[name])
    n_source = c.sequence(meta, "")
    n_target = None if meta.get("target") is None else c.sequence(meta["target"], "target")
    grids = {}
    for name in ("image", "vision"):
        if meta.get(name) is not None:
            pixels = f"{name}.pixels" if name == "image" or "vision.pixels" in tensors else "image.pixels"
            grids[name] = c.grid(meta[name], name, pixels)
    parts = c.model(meta.get("model"), version)
    if "image" in grids and ("vision" in grids or "vision" not in parts) and grids["image"] != n_source:
        # the picture the text's tokens sit on (a vision encoder's, a VLM's language model's); a joint model's
        # picture is its vision part's own (checked against that part's records below)
        raise c.fail("image", f"must have as many tokens as the text ({n_source}), not {grids['image']}", meta["image"])
    if version < 2:
        layers = c.obj(meta.get("layers"), "layers")
        for key, fields in layers.items():
            fields = c.obj(fields, f"layers.{key}")
            _known(c, fields, _V1_FIELDS, f"layers.{key}")
            values = {
                name: tensors.get(f"layers.{key}.{name}") if name in _V1_TENSORS else None for name in RECORD_TENSORS
            }
            c.record(f"v1.{key}", fields, values, parts, (n_source, n_source), f"layers.{key}", "text (tokens)")
        c.generation(meta["model"], n_source)
        return version
    records = c.obj(meta.get("records"), "records")
    vision = grids.get("vision", grids.get("image"))
    for key, fields in records.items():
        field = f"records.{key}"
        fields = c.obj(fields, field)
        _known(c, fields, (*RECORD_FIELDS, "shared"), field)
        shared = c.obj(fields.get("shared", {}), f"{field}.shared")
        for name, target in shared.items():
            if name not in RECORD_TENSORS:
                raise c.fail(f"{field}.shared", f"must name tensors among {', '.join(RECORD_TENSORS)}", name)
            if not isinstance(target, str) or target not in tensors:
                raise c.fail(f"{field}.shared.{name}", "must name a tensor the file has", target)
        values = {name: tensors.get(shared.get(name, f"records.{key}.{name}")) for name in RECORD_TENSORS}
        part = key.rsplit(".", 1)[0]
        if part == "vision":
            if vision is None:
                raise c.fail(field, "is of a vision part, which needs the picture's grid (image or vision)", None)
            lengths, reads = (vision, vision), "picture's grid"
        elif n_target is None or part in ("encoder", "text"):
            lengths, reads = (n_source, n_source), "text (tokens)"
        elif part == "decoder":
            lengths, reads = (n_target, n_target), "target (target.tokens)"
        else:
            lengths, reads = (n_target, n_source), "target (queries) and the text (keys)"
        c.record(key, fields, values, parts, lengths, field, reads)
    c.generation(meta["model"], n_source if n_target is None else n_target)
    return version


def _known(c: _Checker, fields: dict, names: tuple[str, ...], field: str) -> None:
    for name in fields:
        if name not in names:
            raise c.fail(field, f"may have the fields {', '.join(names)} only", name)
