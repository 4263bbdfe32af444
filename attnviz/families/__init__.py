"""The model families attnviz knows, one module each, collected into one registry.

Each module of this package (but :mod:`~attnviz.families.facts`, the types) defines ``FACTS``, a
:class:`~attnviz.families.facts.Facts`: everything its family needs — model types, where its
attention is, its projection spec and argument readers, biases, refusals, its tiny test config, its
vision / VLM / tower facts, its support-table rows. The modules are found by :func:`pkgutil.iter_modules`
when this package is imported, so adding a family is one new file (and its test); a family defined
elsewhere joins with :func:`register`. The engine and the workflows read the tables below, which the
registry keeps in step with what is registered (the same objects, changed in place):

:data:`FAMILIES` (the support table's rows), :data:`PROJECTION_SPECS`, :data:`SHARED_LAYERS`,
:data:`CAUSAL_LM_TYPES`, :data:`RESERVED_POSITIONS`, :data:`VISION_SPECS`, :data:`TOWERS`,
:data:`VLMS`, :data:`REFUSED_VLMS`, :data:`TINY`, :data:`TINY_PAIRS`, :data:`RESIDUAL_SPECS` — each keyed by
``config.model_type`` (the tiny ones by the tiny family's name).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from ..errors import InputError
from .facts import Facts, Family, ProjectionSpec, ResidualSpec, Tiny, TinyPair, VisionSpec, VlmSpec

__all__ = [
    "CAUSAL_LM_TYPES",
    "FAMILIES",
    "PROJECTION_SPECS",
    "REFUSED_VLMS",
    "RESERVED_POSITIONS",
    "RESIDUAL_SPECS",
    "SHARED_LAYERS",
    "TINY",
    "TINY_PAIRS",
    "TOWERS",
    "VISION_SPECS",
    "VLMS",
    "Facts",
    "register",
    "discover",
    "registered",
    "unregister",
    "vision_spec",
    "vlm_spec",
]

FAMILIES: list[Family] = []  # the support table's rows, by the families' rank
PROJECTION_SPECS: dict[str, ProjectionSpec] = {}
SHARED_LAYERS: dict[str, Callable[[Any], int]] = {}
CAUSAL_LM_TYPES: set[str] = set()
RESERVED_POSITIONS: dict[str, int] = {}
VISION_SPECS: dict[str, VisionSpec] = {}
TOWERS: dict[str, dict[str, str]] = {}
VLMS: dict[str, VlmSpec] = {}
REFUSED_VLMS: dict[str, str] = {}
TINY: dict[str, Tiny] = {}
TINY_PAIRS: dict[str, TinyPair] = {}
RESIDUAL_SPECS: dict[str, ResidualSpec] = {}  # where qk_attribution reads the residual stream

_REGISTERED: list[Facts] = []
#: each keyed table and the field of Facts that fills it
_TABLES: tuple[tuple[dict, str], ...] = (
    (PROJECTION_SPECS, "projection_specs"),
    (SHARED_LAYERS, "shared_layers"),
    (RESERVED_POSITIONS, "reserved_positions"),
    (VISION_SPECS, "vision_specs"),
    (TOWERS, "towers"),
    (VLMS, "vlms"),
    (REFUSED_VLMS, "refused_vlms"),
    (TINY, "tiny"),
    (TINY_PAIRS, "tiny_pairs"),
    (RESIDUAL_SPECS, "residual"),
)


def _rebuild() -> None:
    """Every table again from the registered facts, in rank order, in place (importers hold these objects)."""
    ordered = sorted(_REGISTERED, key=lambda f: f.rank)  # stable: equal ranks keep their registration order
    FAMILIES[:] = [row for facts in ordered for row in facts.rows]
    CAUSAL_LM_TYPES.clear()
    CAUSAL_LM_TYPES.update(t for facts in ordered for t in facts.causal_lm_types)
    for table, name in _TABLES:
        table.clear()
        for facts in ordered:
            table.update({key: dict(v) if name == "towers" else v for key, v in getattr(facts, name).items()})


def register(facts: Facts) -> None:
    """Add a family's facts to the registry: from now on attnviz captures, builds tiny and lists its
    model types as they say. A model type (or tiny family) another family registered already is refused."""
    if not isinstance(facts, Facts):
        raise InputError(f"register takes an attnviz.families.facts.Facts, got {type(facts).__name__}")
    if any(facts is f for f in _REGISTERED):
        return
    for table, name in _TABLES:
        taken = sorted(set(table) & set(getattr(facts, name)))
        if taken:
            raise InputError(f"{', '.join(map(repr, taken))} is registered already ({name}); unregister it first")
    _REGISTERED.append(facts)
    _rebuild()


def unregister(facts: Facts) -> None:
    """Remove a family's facts that :func:`register` added."""
    _REGISTERED[:] = [f for f in _REGISTERED if f is not facts]
    _rebuild()


class registered:  # noqa: N801 — used as a context manager, like contextlib's
    """``with registered(facts): …``: the family registered for the block, unregistered after it."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts

    def __enter__(self) -> Facts:
        register(self.facts)
        return self.facts

    def __exit__(self, *exc: object) -> None:
        unregister(self.facts)


def vision_spec(config: Any) -> VisionSpec | None:
    """The :class:`~attnviz.families.facts.VisionSpec` of a config's family (None: not a vision encoder attnviz knows)."""
    return VISION_SPECS.get(getattr(config, "model_type", "") or "")


def vlm_spec(config: Any) -> VlmSpec | None:
    """The :class:`~attnviz.families.facts.VlmSpec` of a config's family (None: not a VLM attnviz captures)."""
    return VLMS.get(getattr(config, "model_type", "") or "")


def discover() -> None:
    """Register every module of this package (every folder of its ``__path__``) that is not registered yet: what
    importing the package does; call it again after adding a folder to ``__path__``."""
    for info in pkgutil.iter_modules(__path__):
        if info.name == "facts" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        facts = getattr(module, "FACTS", None)
        if facts is None:
            raise InputError(f"attnviz.families.{info.name} defines no FACTS; every module of the package is a family")
        register(facts)


discover()
