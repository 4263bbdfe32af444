"""Analyses over captures (never over models): head statistics, pattern detectors, coreference
rankings and probe sets, attention rollout, one head's query–key space over many texts (:func:`qk_space`), the long-text overview, the cost tables, and :func:`summarize`: one pass over a
capture's heads for the thumbnails, statistics, rollout and validation the heavy views need.

What runs a model lives in :mod:`attnviz.workflows`: :func:`corpus_stats` (re-exported here, the
statistics of :func:`head_stats` over a corpus), :func:`head_atlas` (re-exported here: each head's roles over a corpus) and :func:`attnviz.evaluate_probes`. Their files are read and written here too
(:func:`read_texts`, :func:`check_corpus`, :func:`read_table`, :func:`write_table`, re-exported on first use),
and :func:`check_statistics` refuses a statistic :func:`corpus_stats` cannot compute before a model loads."""

from .atlas import ROLES
from .coref import STOP_WORDS, CorefRanking, propose_candidates, rank_heads
from .cost import cost_tables
from .layer_reduction import check_statistics
from .moved import moved_shares, row_shares
from .overview import MODES as OVERVIEW_MODES
from .overview import block_edges
from .probe_result import head_label
from .probes import PROBE_FORMATS, PROBE_SETS, Probe, ProbeResult, ProbeSet, UnusableProbe, load_probes
from .qk_space import METHODS as QK_SPACE_METHODS
from .qk_space import QKVectors, qk_space, qk_vectors
from .rollout import ROLLOUT_CELLS, rollout, rollout_blocks, rollout_rows
from .stats import DETECTORS, MOVED_STATISTICS, STATISTICS, detect_heads, head_stats, moved_name
from .summary import Summary, summarize

__all__ = [
    "CorefRanking",
    "DETECTORS",
    "MOVED_STATISTICS",
    "OVERVIEW_MODES",
    "PROBE_FORMATS",
    "PROBE_SETS",
    "Probe",
    "ProbeResult",
    "ProbeSet",
    "QKVectors",
    "QK_SPACE_METHODS",
    "ROLES",
    "ROLLOUT_CELLS",
    "STATISTICS",
    "STOP_WORDS",
    "UnusableProbe",
    "Summary",
    "block_edges",
    "check_corpus",
    "check_statistics",
    "corpus_stats",
    "head_atlas",
    "cost_tables",
    "detect_heads",
    "head_label",
    "head_stats",
    "load_probes",
    "moved_name",
    "moved_shares",
    "propose_candidates",
    "qk_space",
    "qk_vectors",
    "rank_heads",
    "read_table",
    "read_texts",
    "rollout",
    "rollout_blocks",
    "rollout_rows",
    "row_shares",
    "summarize",
    "write_table",
]


def __getattr__(name: str):
    # corpus_stats runs a model (attnviz.workflows.corpus.corpus), whose reduction imports this package's
    # statistics: imported on first use, so that the analyses never import the workflows.
    if name == "corpus_stats":
        from ..workflows.corpus.corpus import corpus_stats

        return corpus_stats
    if (
        name == "head_atlas"
    ):  # runs a model too (attnviz.workflows.corpus.atlas): imported on first use, as corpus_stats
        from ..workflows.corpus.atlas import head_atlas

        return head_atlas
    if name in {
        "check_corpus",
        "read_texts",
        "read_table",
        "write_table",
    }:  # corpus_stats' files (workflows.corpus.corpus): imported on first use, as it
        from ..workflows.corpus import corpus

        return getattr(corpus, name)
    raise AttributeError(f"module 'attnviz.analysis' has no attribute {name!r}")
