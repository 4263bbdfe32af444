"""A GGUF model's config and tokenizer, kept once converted: what :func:`~.models.describe_model` reads.

transformers reads a GGUF file's config and its tokenizer by parsing the whole file's metadata twice
(SmolLM2's vocabulary and merges: ~3 s each on a CPU), before any weight loads — so a command-line
argument checked against them (``--layer 99``, ``--query dog``) answered in ~10 s. The first description
of a GGUF file saves both as transformers' own files (``config.json``, ``tokenizer.json`` …) in a folder
under the user's cache (``$XDG_CACHE_HOME/attnviz/gguf``, else ``~/.cache/attnviz/gguf``), named by the
file's path, size and modification time and transformers' version; later ones read that folder (a fraction
of a second). The weights are always read from the GGUF file itself. A cache that cannot be written or
read is skipped: the file is parsed as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

#: what a complete cache folder holds (the tokenizer's own files beside it)
DONE = "attnviz-complete"


def cache_root() -> Path:
    """Where converted GGUF descriptions are kept: ``$XDG_CACHE_HOME/attnviz/gguf`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnviz" / "gguf"


def cache_folder(gguf: Path) -> Path:
    """The folder of one GGUF file's description: named by its path, size and modification time and by
    transformers' version (a converter that changes makes a new one)."""
    import transformers  # deferred: importing attnviz does not import transformers

    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return cache_root() / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def read(gguf: Path) -> tuple[Any, Any] | None:
    """``(config, tokenizer)`` of ``gguf`` from its cache folder, or None (none yet, or unreadable); both
    name the GGUF file's folder as their source (``name_or_path``), as when read from the file."""
    from transformers import AutoConfig, AutoTokenizer  # deferred likewise

    try:
        folder = cache_folder(gguf)
        if not (folder / DONE).is_file():
            return None
        config, tokenizer = AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError):
        return None
    config.name_or_path = tokenizer.name_or_path = str(gguf.parent)
    return config, tokenizer


def write(gguf: Path, config: Any, tokenizer: Any) -> Path | None:
    """Save ``config`` and ``tokenizer`` (read from ``gguf``) as its cache folder: written in a temporary
    folder beside it, then renamed (two processes that describe one file at once leave one whole folder).
    None where the cache cannot be written (a read-only home): the next description parses the file again."""
    try:
        folder = cache_folder(gguf)
        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=folder.name + ".", suffix=".partial", dir=folder.parent))
    except OSError:
        return None
    try:
        config.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / DONE).write_text(str(gguf.resolve()))
        partial.rename(folder)
        return folder
    except OSError:  # another process renamed its own first, or the disk is full
        return folder if (folder / DONE).is_file() else None
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(partial)


__all__ = ["DONE", "cache_folder", "cache_root", "read", "write"]
