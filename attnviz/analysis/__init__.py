"""Analyses over captures (never over models): head statistics, pattern detectors, coreference
rankings and probe sets, attention rollout. Running a probe set through a model is
:func:`attnviz.evaluate_probes` (in :mod:`attnviz.probing`, beside the runner)."""

from .coref import (
    CorefRanking,
    Probe,
    ProbeResult,
    load_probes,
    propose_candidates,
    rank_heads,
)
from .corpus import corpus_stats
from .rollout import rollout, rollout_blocks, rollout_rows
from .stats import DETECTORS, detect_heads, head_stats

__all__ = [
    "CorefRanking",
    "DETECTORS",
    "Probe",
    "ProbeResult",
    "corpus_stats",
    "detect_heads",
    "head_stats",
    "load_probes",
    "propose_candidates",
    "rank_heads",
    "rollout",
    "rollout_blocks",
    "rollout_rows",
]
