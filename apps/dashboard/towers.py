"""The Image tab's models of two towers: a LLaVA-style vision-language model (its language model over a
prompt and the picture's tokens, part ``decoder``, and its vision tower, part ``vision``) and a joint
CLIP / SigLIP model (its text tower, part ``text``, and its vision tower, part ``vision``).

The page's model list names them as any model (a folder saved with its processor, or a hub name); what
kind a name is comes from its config alone (:func:`attnviz.models.describe_model`, no weights).
:class:`Towers` loads them through the library's loader, ``attnviz.load_model(name,
with_processor=True)`` (a VLM through ``AutoModelForImageTextToText``, a joint model with both towers,
the ``AutoProcessor`` saved beside it: the same load as a script's) — the last two kept per app. A
capture is ``attnviz.capture(model, prompt, picture, processor=…)``, kept in the page's bounded capture
cache under a key of the model, the prompt and the picture's bytes; a VLM's *Continue the text* is
``attnviz.generate(model, prompt, picture, processor=…)`` (:func:`generate_towers`), its capture cached
the same way with the number of new tokens in its key.

The tab's figures are the library's: a word's row over the picture
(:func:`attnviz.figures.image_attention`, part ``decoder``) beside its row over the text
(:func:`attnviz.figures.text_attention`: the same row at the text positions)."""

from __future__ import annotations

import contextlib
import copy
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import attnviz
import attnviz.files
from attnviz.families import vlm_spec
from attnviz.figures.helpers import MARK, new_start, text_positions
from attnviz.models import describe_model, is_joint, is_vlm, vlm_refusal

from .cache import digest_key
from .captures import FILE_PREFIX, Captures
from .generations import MAX_NEW_TOKENS

#: the prompt a vision-language model opens with (LLaVA-1.5's template; ``<image>``: the processor's token)
VLM_PROMPT = "USER: {image} What is in the picture? ASSISTANT: a cat"
JOINT_PROMPT = "a photo of a cat"
#: each kind's parts, in the order the part choice lists them, and how the page names them
PARTS = {
    "vlm": [("decoder", "language model (text + picture)"), ("vision", "vision tower")],
    "joint": [("vision", "vision tower"), ("text", "text tower")],
}
KEEP_MODELS = 2  # as attnviz.load_model: the last two models stay loaded


def tower_kind(model: str) -> str:
    """``"vlm"``, ``"joint"``, or ``"vision"`` (anything else: a vision encoder, or a model the vision path
    refuses with its own message) for a model name, from its config; a vision-language family attnviz
    refuses with a picture (:func:`attnviz.models.vlm_refusal`) raises why."""
    if model.startswith(FILE_PREFIX):
        return "vision"
    try:
        config, _ = describe_model(model)
    except attnviz.AttnvizError:
        return "vision"  # the vision path says what is wrong with the name
    refused = vlm_refusal(config)
    if refused:
        raise attnviz.UnsupportedModelError(
            f"{model} cannot be shown with a picture: {refused}. Its text alone runs in the other tabs"
        )
    if is_vlm(config):
        return "vlm"
    if is_joint(config):
        return "joint"
    return "vision"


class Towers:
    """The models of two towers one app has loaded, with their processors: at most :data:`KEEP_MODELS`."""

    def __init__(self) -> None:
        self._loaded: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._notes: dict[str, str] = {}  # what the page changed in a model's processor, said on the tab
        self._lock = threading.Lock()

    def note(self, model: str) -> str:
        """What the page reads differently from the model's own processor ("" for nothing)."""
        return self._notes.get(model, "")

    def get(self, model: str) -> tuple[Any, Any]:
        """(the model, its processor) of a name whose kind is ``vlm`` or ``joint``."""
        with self._lock:
            if model in self._loaded:
                self._loaded.move_to_end(model)
                return self._loaded[model]
            # the library's loader: the class the config names and the processor saved beside it, as
            # attnviz.capture(name, …) and scripts load the same name
            loaded, _, processor = attnviz.load_model(model, with_processor=True)
            if processor is None or getattr(processor, "image_processor", None) is None:
                raise attnviz.ModelNotFoundError(
                    f"{model} has no processor for a text and a picture; save the model's processor "
                    "(processor.save_pretrained) in the same folder"
                )
            processor, self._notes[model] = whole_pictures(loaded, processor)
            self._loaded[model] = (loaded, processor)
            while len(self._loaded) > KEEP_MODELS:
                self._loaded.popitem(last=False)
            return loaded, processor


def whole_pictures(model: Any, processor: Any) -> tuple[Any, str]:
    """(the processor the page reads a picture with, what it says about it): an Idefics3 processor that
    splits pictures into tiles, which the library refuses to map (its message says to set
    ``do_image_splitting = False``, a setting the page's user cannot reach), is copied with the picture
    read whole — the model's own computation in that mode, said on the tab. The processor loaded (and
    cached by ``attnviz.load_processor``) is left as it was."""
    images = getattr(processor, "image_processor", None)
    spec = vlm_spec(model.config)
    if spec is None or not spec.reads_tiles or not getattr(images, "do_image_splitting", False):
        return processor, ""
    processor = copy.copy(processor)
    processor.image_processor = copy.copy(images)
    processor.image_processor.do_image_splitting = False
    size = (getattr(images, "max_image_size", None) or {}).get("longest_edge")
    return processor, (
        "This Idefics3's processor splits a picture into tiles beside a downscaled whole; the page reads the "
        f"picture whole instead (do_image_splitting=False{f', at {size}×{size}' if size else ''}), so each image "
        "token stands for one block of patches of the whole picture."
    )


def default_prompt(kind: str, processor: Any) -> str:
    """The prompt the tab opens with: LLaVA's template around the processor's image token, or a caption."""
    if kind == "vlm":
        return VLM_PROMPT.format(image=image_token(processor))
    return JOINT_PROMPT


def image_token(processor: Any) -> str:
    """The text a vision-language processor expands into the picture's tokens (``<image>``)."""
    token = getattr(processor, "image_token", None)
    return str(token) if token else "<image>"


def placed(prompt: str, processor: Any) -> str:
    """The prompt with the picture placed: as written where it names the image token once, else the
    token put in front (the place the library's own message suggests); more than one is the library's error."""
    token = image_token(processor)
    return prompt if token in prompt else f"{token} {prompt}"


@contextlib.contextmanager
def readable(captures: Captures, picture: Any) -> Iterator[Any]:
    """What ``attnviz.capture`` reads for a picture: an upload's bytes as a file in the server's capture
    folder (removed afterwards: the library's Pillow reader checks it), a sample's array as it is."""
    if not isinstance(picture, bytes):
        yield picture
        return
    path = attnviz.files.write_bytes(captures.folder / f"{uuid.uuid4().hex}.upload", picture, what="the upload")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def picture_bytes(picture: Any) -> bytes:
    return picture if isinstance(picture, bytes) else picture.tobytes()


def capture_towers(
    captures: Captures, towers: Towers, model: str, kind: str, prompt: str, picture: Any
) -> tuple[str, attnviz.Capture]:
    """(the cache key, the capture) of ``prompt`` and ``picture`` (a file's bytes, or the sample array)
    by a model of two towers (``kind``: ``vlm`` or ``joint``)."""
    captures.check_model(model)
    loaded, processor = towers.get(model)
    text = placed(prompt or "", processor) if kind == "vlm" else prompt or ""
    if not text.replace(image_token(processor), "").strip():
        raise attnviz.InputError("the prompt is empty; write a text for the model to read with the picture")

    def capture(source: Any) -> attnviz.Capture:
        made = attnviz.capture(loaded, text, source, processor=processor)
        assert isinstance(made, attnviz.Capture)  # one text, one picture: one capture
        return made

    return _cached(captures, "towers:", [model, text], picture, capture)


def _cached(
    captures: Captures, prefix: str, parts: list[str], picture: Any, make: Callable[[Any], attnviz.Capture]
) -> tuple[str, attnviz.Capture]:
    """(the cache key, the capture) of ``make(source)`` — ``source`` the picture as the library reads it
    (:func:`readable`) — kept in the page's bounded cache under ``prefix`` and a digest of ``parts`` and
    the picture's bytes; made only when the cache does not hold it."""
    key = digest_key(prefix.encode(), *(p.encode() for p in parts), picture_bytes(picture))  # the server's key
    cap = captures.cache.get(key)
    if cap is None:
        with readable(captures, picture) as source:
            cap = make(source)
        captures.cache.put(key, cap)
    return key, cap


def generate_towers(
    captures: Captures, towers: Towers, model: str, prompt: str, picture: Any, new_tokens: int
) -> tuple[str, attnviz.Capture, list[str]]:
    """(the cache key, the capture, the new tokens) of a vision-language model continuing ``prompt``
    with ``picture`` by ``new_tokens`` greedy tokens (``attnviz.generate``): the prompt's and the new
    tokens' rows over the picture, each as the model computed it at its step."""
    captures.check_model(model)
    if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or not 1 <= new_tokens <= MAX_NEW_TOKENS:
        raise attnviz.InputError(f"give a number of new tokens from 1 to {MAX_NEW_TOKENS}")
    loaded, processor = towers.get(model)
    text = placed(prompt or "", processor)
    if not text.replace(image_token(processor), "").strip():
        raise attnviz.InputError("the prompt is empty; write a text for the model to continue with the picture")

    def generate(source: Any) -> attnviz.Capture:
        return attnviz.generate(loaded, text, source, processor=processor, max_new_tokens=new_tokens).capture

    key, cap = _cached(captures, "towers-gen:", [model, text, str(new_tokens)], picture, generate)
    start = new_start(cap, "decoder")
    return key, cap, cap.tokens[start:] if start is not None else []


def part_options(kind: str) -> list[dict]:
    return [{"label": f" {label} ", "value": part} for part, label in PARTS.get(kind, [])]


def word_options(cap: attnviz.Capture, part: str) -> list[dict]:
    """The prompt's tokens a query may be, each as the page shows it (its position after it): the text
    positions of ``part`` (none for a vision tower)."""
    names = cap.sequences(part)[0].token_labels
    start = new_start(cap, part)  # a generation's new tokens are marked as in every figure
    new = start if start is not None else len(names)
    return [{"label": f"{MARK if i >= new else ''}{names[i]} · {i}", "value": i} for i in text_positions(cap, part)]


__all__ = [
    "JOINT_PROMPT",
    "KEEP_MODELS",
    "PARTS",
    "VLM_PROMPT",
    "Towers",
    "capture_towers",
    "default_prompt",
    "generate_towers",
    "image_token",
    "part_options",
    "picture_bytes",
    "placed",
    "readable",
    "tower_kind",
    "whole_pictures",
    "word_options",
]
