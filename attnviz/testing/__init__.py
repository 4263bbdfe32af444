"""For developers and tests, not the user-facing API: the tiny random models of every family
(:mod:`attnviz.testing.tiny`), ``IdsTokenizer`` (a tokenizer whose words are token ids, "5 17 3", for those
models, which come without one) and the support sweep (:mod:`attnviz.testing.sweep`:
``python -m attnviz.testing.sweep --write``; :mod:`~attnviz.testing.sweep_table`,
:mod:`~attnviz.testing.sweep_towers`)."""

from ..workflows.capture.models import IdsTokenizer
from .tiny import tiny_families, tiny_joint, tiny_model, tiny_processor, tiny_vlm

__all__ = ["IdsTokenizer", "tiny_families", "tiny_joint", "tiny_model", "tiny_processor", "tiny_vlm"]
