"""The engine: what sits in an unmodified model while it runs, and is always removed after.

Listeners (recorders, editors; :mod:`~attnviz.engine.listeners`) hear each attention call through
one dispatch, whether the call goes through transformers' AttentionInterface
(:mod:`~attnviz.engine.interface`) or is computed inline and read from the projections
(:mod:`~attnviz.engine.hooks`). :func:`attnviz.tap` (:mod:`~attnviz.engine.taps`) records, the
:class:`~attnviz.engine.editor.Editor` changes calls, and :mod:`~attnviz.engine.specs` holds every
per-family fact as data. The engine imports nothing of the rest of attnviz but the SDPA and the errors.
"""
