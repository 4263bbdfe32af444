"""For developers and tests, not the user-facing API: the tiny random models of every family
(:mod:`attnviz.testing.tiny`) and the support sweep (:mod:`attnviz.testing.sweep`:
``python -m attnviz.testing.sweep --write``; :mod:`~attnviz.testing.sweep_table`,
:mod:`~attnviz.testing.sweep_towers`)."""

from .tiny import tiny_families, tiny_joint, tiny_model, tiny_processor, tiny_vlm

__all__ = ["tiny_families", "tiny_joint", "tiny_model", "tiny_processor", "tiny_vlm"]
