"""Where a capture came from: ``cap.model["provenance"]``, a flat dict of JSON values every capture records.

It names the model (``name``, the folder or hub name it was read from — ``source`` —, the hub ``revision``
when transformers knows it), the bytes of the weights actually used (``weights_sha256``: sha256 over every
parameter and buffer in name order — name, dtype, shape and bytes), the tokenizer (``tokenizer_sha256``:
its serialised vocabulary, merges and added tokens), the versions of attnviz, transformers and torch, where
and how it ran (``device``, ``dtype``, ``backend``, ``add_bos``), any ``edits`` (:func:`attnviz.intervene`'s
capture after them) and the self-check's verdict (``check``, ``check_passed``, ``check_worst`` — the worst
error over its tolerance, ≤ 1 passes —, ``check_max_abs_error``). ``FIELDS`` says what each is.

Hashing 135 M float32 weights costs about half a second on a CPU, so it is done once per model object
and its weights' state: the digest is kept in a :class:`weakref.WeakKeyDictionary` keyed by the model
(nothing is set on the model, and a model that is dropped is forgotten), beside a fingerprint of each
tensor's storage and in-place version counter, so a weight changed in place or replaced (``load_state_dict``,
``p.copy_``, ``p.data = …``) is hashed again. It is computed after the forward, never inside it.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "FIELDS",
    "add_check",
    "capture_provenance",
    "tokenizer_hash",
    "weights_hash",
]

#: each field of ``cap.model["provenance"]`` and what it is (the docs' table and ``attnviz info`` read it)
FIELDS: dict[str, str] = {
    "name": "the model as it was asked for: an embedded alias, a hub name or a folder",
    "source": "where transformers read it from (config._name_or_path: a hub name or a local folder)",
    "revision": "the hub commit the files came from (config._commit_hash; None for a local folder)",
    "weights_sha256": "sha256 over every parameter and buffer in name order (name, dtype, shape, bytes)",
    "tokenizer_sha256": "sha256 of the tokenizer serialised (vocabulary, merges, added tokens); None without one",
    "attnviz": "the attnviz version that captured",
    "transformers": "the transformers version",
    "torch": "the torch version",
    "device": "where the model ran",
    "dtype": "the dtype of its attention's Q",
    "backend": "the attention backend that ran (eager, sdpa, flash_attention_2, …)",
    "add_bos": "whether a BOS token was prepended (None: not a text's capture, e.g. ids or a picture)",
    "edits": "the edits applied (attnviz.intervene's capture after them), '; '-separated; None without",
    "check": "the self-check asked for: sample, full or off",
    "check_passed": "whether the self-check reproduced the model (None when it did not run)",
    "check_worst": "the self-check's worst error over its tolerance (≤ 1 passes)",
    "check_max_abs_error": "the self-check's largest absolute error",
}

# model -> (fingerprint of its tensors, digest); weak keys: the model is never kept alive by the cache
_WEIGHTS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, str]] = weakref.WeakKeyDictionary()
_TOKENIZERS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _named_tensors(model: nn.Module) -> list[tuple[str, Tensor]]:
    """Every parameter and buffer of ``model`` by name, in name order (a tied weight once, by its first name)."""
    seen: set[int] = set()
    named = []
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        named.append((name, t))
    return sorted(named, key=lambda item: item[0])


def _fingerprint(named: Iterable[tuple[str, Tensor]]) -> tuple:
    """What changes when a tensor is replaced or written in place: its storage, its version, its layout."""
    return tuple(
        (name, t.data_ptr() if t.device.type != "meta" else 0, t._version, t.dtype, tuple(t.shape), str(t.device))
        for name, t in named
    )


_SAME_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size → an integer dtype


def weights_hash(model: nn.Module) -> str:
    """sha256 (hex) over ``model``'s parameters and buffers in name order: each one's name, dtype, shape
    and bytes (a tensor on the ``meta`` device — offloaded — by its name, dtype and shape alone).

    Cached per model object while its tensors are the same storages at the same in-place versions, so a
    second capture with the same model pays nothing. A write through ``param.data`` bypasses the version
    counter and is not seen: change weights with ``param.copy_`` under ``torch.no_grad()`` (as
    ``load_state_dict`` does), or assign a new tensor."""
    named = _named_tensors(model)
    fingerprint = _fingerprint(named)
    cached = _WEIGHTS.get(model)
    if cached is not None and cached[0] == fingerprint:
        return cached[1]
    digest = hashlib.sha256()
    for name, t in named:
        digest.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{list(t.shape)}\n".encode())
        if t.device.type == "meta":
            continue
        # one tensor at a time to the host (after the forward: the copy's wait costs nothing there)
        raw = t.detach().to("cpu").contiguous().reshape(-1)
        # its bytes through an integer view of the same width: as many elements as the tensor (a uint8 view
        # would be a tensor of 4× a float32 weight's elements), numpy's buffer the same bytes
        raw = raw.view(_SAME_WIDTH.get(raw.element_size(), torch.uint8))
        digest.update(raw.numpy().data)
    result = digest.hexdigest()
    _WEIGHTS[model] = (fingerprint, result)
    return result


def tokenizer_hash(tokenizer: Any) -> str | None:
    """sha256 (hex) of the tokenizer serialised — a fast tokenizer's ``backend_tokenizer.to_str()`` (its
    vocabulary, merges, normaliser, pre-tokeniser and added tokens), else its vocabulary and added tokens
    as sorted JSON; None without a tokenizer (a vision encoder). Cached per tokenizer object."""
    if tokenizer is None:
        return None
    try:
        cached = _TOKENIZERS.get(tokenizer)
    except TypeError:  # an object that cannot be weakly referenced: hashed every time
        cached = None
    if cached is not None:
        return cached
    inner = getattr(tokenizer, "tokenizer", None)  # a processor: its tokenizer
    target = tokenizer if hasattr(tokenizer, "get_vocab") or inner is None else inner
    backend = getattr(target, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    elif hasattr(target, "get_vocab"):
        added = getattr(target, "added_tokens_decoder", {}) or {}
        text = json.dumps(
            {
                "class": type(target).__name__,
                "vocab": sorted(target.get_vocab().items()),
                "added": sorted((int(i), str(t)) for i, t in added.items()),
            },
            ensure_ascii=False,
        )
    else:
        return None
    result = hashlib.sha256(text.encode()).hexdigest()
    try:
        _TOKENIZERS[tokenizer] = result
    except TypeError:
        pass
    return result


def capture_provenance(
    model: nn.Module, tokenizer: Any, name: str, *, device: str, dtype: str, backend: str, check: str
) -> dict[str, Any]:
    """The provenance of a capture ``model`` (loaded as ``name``) made (``add_bos`` and ``edits`` None until
    the workflow that knows them sets them; the check's verdict by :func:`add_check`)."""
    import transformers  # deferred: importing attnviz does not import transformers

    from ... import __version__  # deferred: the package's __init__ imports this module's workflows

    config = getattr(model, "config", None)
    return {
        "name": name,
        "source": str(getattr(config, "_name_or_path", "") or "") or None,
        "revision": getattr(config, "_commit_hash", None),
        "weights_sha256": weights_hash(model),
        "tokenizer_sha256": tokenizer_hash(tokenizer),
        "attnviz": __version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": device,
        "dtype": dtype,
        "backend": backend,
        "add_bos": None,
        "edits": None,
        "check": check,
        "check_passed": None,
        "check_worst": None,
        "check_max_abs_error": None,
    }


def add_check(provenance: dict[str, Any], rows: list[dict], passed: bool) -> None:
    """The self-check's verdict into ``provenance``: passed, the worst error over its tolerance, the largest error."""
    provenance["check_passed"] = bool(passed)
    provenance["check_worst"] = max((float(r["max_abs_error"] / r["tolerance"]) for r in rows), default=0.0)
    provenance["check_max_abs_error"] = max((float(r["max_abs_error"]) for r in rows), default=0.0)
