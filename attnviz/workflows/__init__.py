"""What runs a model: :mod:`~attnviz.workflows.capture.pipeline`, the one path from a model and its inputs to
checked captures, and the workflows that enter it — :func:`attnviz.capture`,
:func:`attnviz.generate`, :func:`attnviz.intervene`, :func:`attnviz.evaluate_probes` and the
corpus statistics (:func:`attnviz.analysis.corpus_stats`) — with the models, the inputs and the edits.
"""
