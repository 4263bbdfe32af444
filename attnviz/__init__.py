"""attnviz: see what attention does in unmodified Hugging Face models.

>>> import attnviz
>>> cap = attnviz.capture("smollm2", "The cat sat on the mat because it was tired.")
>>> cap.attention(3, head=8)          # [query_pos, key_pos], recomputed by attnviz's own SDPA
>>> print(cap.validate())             # recomputed vs the model's own, per layer and head

Importing attnviz loads no model, patches nothing and does not import dash.
"""

from . import edits as edits  # the edits of intervene(): attnviz.edits.knockout(…)
from . import models as models  # a model's facts before its weights: attnviz.models.describe_model(…)
from .attention import scaled_dot_product
from .data.capture import Capture, LayerRecord, TokenSequence
from .data.io import load
from .data.predictions import Intervention, Prediction
from .data.validate import ValidationReport, validate
from .data.words import Word
from .engine.taps import tap
from .errors import (
    ArgumentTypeError,
    AttnvizError,
    CaptureFileError,
    CaptureMismatchError,
    EmptyTextError,
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
from .workflows.generation import generate
from .workflows.generation_result import Generation, GenerationStep
from .workflows.intervene import head_importance, intervene
from .workflows.models import EMBEDDED_MODELS, load_model
from .workflows.probing import evaluate_probes
from .workflows.runner import capture
from .workflows.tiny import tiny_families, tiny_model, tiny_processor

__version__ = "0.1.0"

_SUBMODULES = ("analysis", "figures")  # imported on first use: they bring pandas and plotly


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'attnviz' has no attribute {name!r}")


__all__ = [
    "ArgumentTypeError",
    "AttnvizError",
    "Capture",
    "CaptureFileError",
    "CaptureMismatchError",
    "EMBEDDED_MODELS",
    "EmptyTextError",
    "Generation",
    "GenerationStep",
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
    "TokenSequence",
    "UnsupportedModelError",
    "ValidationError",
    "ValidationReport",
    "Word",
    "capture",
    "evaluate_probes",
    "generate",
    "head_importance",
    "intervene",
    "load",
    "load_model",
    "scaled_dot_product",
    "tap",
    "tiny_families",
    "tiny_model",
    "tiny_processor",
    "validate",
]
