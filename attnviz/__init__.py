"""attnviz: see what attention does in unmodified Hugging Face models.

>>> import attnviz
>>> cap = attnviz.capture("smollm2", "The cat sat on the mat because it was tired.")
>>> cap.attention(3, head=8)          # [query_pos, key_pos], recomputed by attnviz's own SDPA
>>> print(cap.validate())             # recomputed vs the model's own, per layer and head

Importing attnviz loads no model, patches nothing and does not import dash.
"""

from . import edits as edits  # the edits of intervene(): attnviz.edits.knockout(…)
from . import models as models  # a model's facts before its weights: attnviz.models.describe_model(…)
from .analysis.alignment import HeadAlignment
from .attention import scaled_dot_product
from .data import reprs as _reprs
from .data.attribution import QKAttribution
from .data.capture import Capture, LayerRecord, TokenSequence
from .data.io import load
from .data.predictions import Intervention, Prediction
from .data.validate import ValidationReport, validate
from .data.words import Word
from .deprecation import warn_renamed as _warn_renamed  # private here: not a name of attnviz
from .engine.taps import tap
from .errors import (
    ArgumentTypeError,
    AttnvizError,
    CaptureFileError,
    CaptureMismatchError,
    CaptureWriteError,
    EmptyTextError,
    FileWriteError,
    HeadNotKeptError,
    ImageFileError,
    InputError,
    InputTooLongError,
    Interrupted,
    ModelInTrainingModeError,
    ModelNotFoundError,
    NotAVisionModelError,
    OutOfRangeError,
    UnsupportedModelError,
    ValidationError,
)
from .workflows.capture.models import EMBEDDED_MODELS, load_model
from .workflows.capture.runner import capture
from .workflows.corpus.align import align_heads
from .workflows.corpus.probing import evaluate_probes
from .workflows.corpus.timeline import head_timeline
from .workflows.generation import generate
from .workflows.generation_result import Generation, GenerationStep
from .workflows.intervene import head_importance, intervene
from .workflows.qk_attribution import qk_attribution

__version__ = "0.1.0"

# imported on first use: analysis and figures bring pandas and plotly; testing (the tiny models, the
# support sweep) is for developers and tests, not the user-facing API
_SUBMODULES = ("analysis", "figures", "families", "testing")
#: names that moved out of the user-facing API, kept one release with a DeprecationWarning: old → new
_MOVED = {
    "tiny_families": "attnviz.testing.tiny_families",
    "tiny_model": "attnviz.testing.tiny_model",
    "tiny_processor": "attnviz.testing.tiny_processor",
}


def _load_html_views() -> None:
    """Import the views that register the HTML notebooks show (:mod:`attnviz.data.reprs`)."""
    from .views import (
        html,  # noqa: F401  deferred: it brings plotly, and only a notebook's repr needs it
        report_page,  # noqa: F401  deferred, the same: only Capture.report needs it
    )


_reprs.load_with(_load_html_views)  # the data model and the analyses ask data.reprs, never the views


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name in _MOVED:
        import importlib

        _warn_renamed(f"attnviz.{name}", _MOVED[name])
        return getattr(importlib.import_module(f"{__name__}.testing"), name)
    raise AttributeError(f"module 'attnviz' has no attribute {name!r}")


__all__ = [
    "ArgumentTypeError",
    "AttnvizError",
    "Capture",
    "CaptureFileError",
    "CaptureMismatchError",
    "CaptureWriteError",
    "EMBEDDED_MODELS",
    "EmptyTextError",
    "FileWriteError",
    "Generation",
    "GenerationStep",
    "HeadAlignment",
    "HeadNotKeptError",
    "ImageFileError",
    "InputError",
    "InputTooLongError",
    "Interrupted",
    "Intervention",
    "LayerRecord",
    "ModelInTrainingModeError",
    "ModelNotFoundError",
    "NotAVisionModelError",
    "OutOfRangeError",
    "Prediction",
    "QKAttribution",
    "TokenSequence",
    "UnsupportedModelError",
    "ValidationError",
    "ValidationReport",
    "Word",
    "align_heads",
    "capture",
    "evaluate_probes",
    "generate",
    "head_importance",
    "head_timeline",
    "intervene",
    "load",
    "load_model",
    "qk_attribution",
    "scaled_dot_product",
    "tap",
    "validate",
]
