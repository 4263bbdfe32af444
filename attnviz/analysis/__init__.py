"""Analyses over captures (never over models): head statistics, pattern detectors, coreference
rankings and probe sets, attention rollout."""

from .coref import CorefRanking, Probe, ProbeResult, evaluate_probes, load_probes, propose_candidates, rank_heads
from .rollout import rollout
from .stats import DETECTORS, detect_heads, head_stats

__all__ = [
    "CorefRanking",
    "DETECTORS",
    "Probe",
    "ProbeResult",
    "detect_heads",
    "evaluate_probes",
    "head_stats",
    "load_probes",
    "propose_candidates",
    "rank_heads",
    "rollout",
]
