"""Old names that keep working for one release: each use warns with a :class:`DeprecationWarning` that
names the new one (:func:`renamed`). A name passed under both its old and its new spelling is refused."""

from __future__ import annotations

import warnings
from typing import Any, TypeVar

from .errors import ArgumentTypeError

__all__ = ["renamed", "warn_renamed"]

T = TypeVar("T")


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated and ``new`` is its name now."""
    warnings.warn(
        f"{old} is deprecated and goes in the next release; use {new}", DeprecationWarning, stacklevel=stacklevel
    )


def renamed(where: str, old: str, old_value: Any, new: str, new_value: T) -> T:
    """The value of the argument ``new`` of ``where``, or — given under its old name ``old`` only — the old
    one, with a warning that names the new name. Both given: :class:`ArgumentTypeError`."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ArgumentTypeError(f"{where}: pass {new}= only ({old}= is its old name)")
    warn_renamed(f"{where}({old}=…)", f"{new}=", stacklevel=4)
    return old_value
