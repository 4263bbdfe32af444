"""The process group a corpus run joined under ``torchrun`` or ``accelerate launch``: which process this is,
and ending the group when the run is over. What a script that runs :func:`attnviz.analysis.corpus_stats`,
:func:`attnviz.analysis.head_atlas` or :func:`attnviz.evaluate_probes` over processes needs around the run
(the command line's ``stats``, ``atlas`` and ``probes`` do just this):

>>> from attnviz.processes import end_processes, process_rank
>>> df = attnviz.analysis.corpus_stats("minilm", "corpus.txt")   # every process runs it; the sums are shared
>>> if process_rank() == 0:                                       # one process writes
...     df.to_csv("stats.csv")
>>> end_processes()                                               # the group closed, not left to abort at exit

- :func:`process_rank`: this process's rank (0 outside a group).
- :func:`end_processes`: close the group, if any.

Importing this module loads torch (not a model).
"""

from .workflows.corpus.processes import end_processes, process_rank

__all__ = ["end_processes", "process_rank"]
