"""Errors raised by attnviz.

Every error is an :class:`AttnvizError` and says what was wrong and what to do::

    AttnvizError
    ├── ModelNotFoundError       a name/path that is neither an embedded alias, a folder, nor cached
    ├── UnsupportedModelError    a model whose attention attnviz cannot tap
    ├── ModelInTrainingModeError dropout would make the capture non-deterministic
    ├── InputError               bad text or arguments (also a ValueError / TypeError)
    │   ├── EmptyTextError
    │   ├── InputTooLongError
    │   ├── ImageFileError       a file, array or object that is not an image attnviz can read
    │   ├── NotAVisionModelError a picture given to a model that reads no pictures (a text model)
    │   └── CaptureMismatchError a capture that is not this model's (or is a generation's) where a text's is wanted
    ├── OutOfRangeError          a layer, head or batch index that does not exist (also an IndexError)
    │   └── HeadNotKeptError     a head of the model that the capture did not keep (capture(heads=))
    ├── CaptureFileError         a file that is not a readable attnviz capture
    │   └── CaptureWriteError    a capture that could not be written (also a FileWriteError)
    ├── FileWriteError           a file that could not be written (also an OSError); the previous one is intact
    ├── Interrupted              SIGTERM/SIGINT stopped a long run after it wrote its checkpoint (carries the path)
    └── ValidationError          the recomputation does not reproduce the model (carries the report and the capture)

    OtherWeightsWarning          (a UserWarning) a capture opened against weights whose hash is not the capture's,
                                 though they compute its numbers within the tolerance
"""

from __future__ import annotations

from typing import Any


class AttnvizError(Exception):
    """Base class of every error attnviz raises on purpose.

    ``partial``: what a long run had finished when it failed, for the caller to keep — ``head_timeline``'s
    long table of the checkpoints done before the one that failed (a ``pandas.DataFrame``); None otherwise."""

    partial: Any = None


class ModelNotFoundError(AttnvizError):
    """The model name or path could not be loaded."""


class UnsupportedModelError(AttnvizError):
    """The model's attention cannot be captured."""


class ModelInTrainingModeError(AttnvizError):
    """The model is in training mode, so dropout would change every capture."""


class InputError(AttnvizError, ValueError):
    """An argument or input text is not usable."""


class ArgumentTypeError(AttnvizError, TypeError):
    """An argument has the wrong type."""


class EmptyTextError(InputError):
    """The text is empty or only whitespace."""


class InputTooLongError(InputError):
    """The text has more tokens than the model accepts."""


class ImageFileError(InputError):
    """An image input that cannot be read: not an image file, too large, or an array of the wrong shape."""


class NotAVisionModelError(InputError):
    """A picture given to a model that is not a vision encoder (nor a VLM): it reads text only."""


class CaptureMismatchError(InputError):
    """A capture given in place of a text that this model cannot start from: another model's capture,
    or a generation's."""


class OutOfRangeError(AttnvizError, IndexError):
    """A layer, head or item index outside what was captured."""


class HeadNotKeptError(OutOfRangeError):
    """A head the model has but the capture did not keep (``capture(..., heads=)``); the message names
    the heads kept."""


class CaptureFileError(AttnvizError):
    """A file that is not a readable attnviz capture."""


class FileWriteError(AttnvizError, OSError):
    """A file attnviz could not write (a folder given for a file, a missing folder, a full disk, no
    permission); the previous file at that path, if any, is unchanged (:mod:`attnviz.files`)."""


class CaptureWriteError(CaptureFileError, FileWriteError):
    """A capture that could not be written: a :class:`CaptureFileError` (what saving a capture has always
    raised) and a :class:`FileWriteError` (an ``OSError``: what every file attnviz writes raises); the
    previous file at that path, if any, is unchanged."""


class Interrupted(AttnvizError):
    """A long run (a corpus's statistics) was stopped by SIGTERM or SIGINT and wrote its checkpoint first.

    ``.checkpoint`` is the file this process wrote, ``.signal`` the signal's name (``"SIGTERM"``),
    ``.rank`` the process (0 outside torchrun); the same call with ``resume=True`` continues.
    """

    def __init__(self, message: str, checkpoint: Any = None, signal: str = "", rank: int = 0):
        super().__init__(message)
        self.checkpoint = checkpoint
        self.signal = signal
        self.rank = rank


class ValidationError(AttnvizError):
    """The recomputation does not reproduce what the model's kernel computed.

    Carries the validation report (``.report``) and the capture(s) (``.capture``), so nothing
    recorded is lost: inspect them, or capture again with ``check="off"``.
    """

    def __init__(self, message: str, report: Any = None, capture: Any = None):
        super().__init__(message)
        self.report = report
        self.capture = capture


class OtherWeightsWarning(UserWarning):
    """A capture was opened against a model whose weights' hash is not the one the capture recorded, though
    the model computes the capture's numbers within the tolerance; the message names both hashes."""
