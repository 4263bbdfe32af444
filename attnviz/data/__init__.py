"""The data model: a :class:`~attnviz.data.capture.Capture` of one text (its tokens and words, a
:class:`~attnviz.data.records.LayerRecord` per part and layer), its validation report, capture
files, and what :func:`attnviz.intervene` returns. Nothing here runs a model or holds one.
"""
