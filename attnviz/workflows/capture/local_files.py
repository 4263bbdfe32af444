"""What a local model folder holds, checked around its load (the command line and the dashboard get one line,
never a traceback): a symbolic link that leads out of the folder is refused before anything in it is read
(:func:`refuse_links_out`), and a weights file torch will not unpickle safely or that is not safetensors is
named in a :class:`~attnviz.errors.ModelNotFoundError` (:func:`unreadable_weights`)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from ...errors import InputError, ModelNotFoundError

__all__ = ["one_line", "refuse_links_out", "unreadable_weights", "weights_files"]


def one_line(err: BaseException) -> str:
    """A lower-level error's text on one line (transformers' own messages span several)."""
    return " ".join(str(err).split())


def refuse_links_out(folder: Path) -> None:
    """A local model folder's symbolic links that resolve outside it are refused before anything in it is
    read (``model.safetensors -> /etc/passwd``): a model's files are its folder's. A folder of the Hugging Face
    cache (``models--org--name/snapshots/REV``, whose files link to ``../../blobs``) is read within its repo's
    folder."""
    root = folder.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        root = root.parent.parent
    for where, dirs, files in os.walk(folder, followlinks=False):
        for entry in (*dirs, *files):
            link = Path(where) / entry
            if not link.is_symlink():
                continue
            target = link.resolve()
            if not target.is_relative_to(root):
                raise InputError(
                    f"{str(link)!r} is a symbolic link to {str(target)!r}, outside the model folder "
                    f"{str(folder)!r}: attnviz reads a local model's files from its own folder only; copy the file "
                    "into the folder (or remove the link)"
                )


def weights_files(source: str) -> str:
    """The weights files of a local folder (``model.safetensors``, ``pytorch_model.bin`` …), named for a message."""
    folder = Path(source)
    if not folder.is_dir():
        return repr(source)
    found = sorted(str(p) for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth", ".ckpt"))
    return ", ".join(map(repr, found)) or repr(source)


def unreadable_weights(name: str, source: str, err: BaseException) -> ModelNotFoundError | None:
    """A weights file that is unsafe (a pickle torch refuses to load with ``weights_only``) or broken (not
    safetensors) as one clear error naming the file; None for any other error."""
    try:
        from safetensors import SafetensorError  # deferred with transformers
    except ImportError:  # pragma: no cover - transformers needs safetensors
        SafetensorError = ()  # type: ignore[assignment,misc]  # noqa: N806
    why = one_line(err)
    if "WeightsUnpickler error:" in why:  # torch's reason, not its page of advice
        why = why.split("WeightsUnpickler error:", 1)[1].split(" Check the documentation", 1)[0].strip()
    if len(why) > 160:
        why = why[:157] + "…"
    if isinstance(err, pickle.UnpicklingError):
        return ModelNotFoundError(
            f"could not load the weights of {name!r} ({weights_files(source)}): a pickle that torch will not load "
            f"safely ({why}); attnviz runs no code from a weights file — use the model saved as model.safetensors "
            "(save_pretrained(..., safe_serialization=True) where you trust it)"
        )
    if isinstance(err, SafetensorError):
        return ModelNotFoundError(
            f"could not load the weights of {name!r} ({weights_files(source)}): not a readable safetensors file "
            f"({why}); the file is broken or not weights — download or save the model again"
        )
    return None
