"""Figures and HTML of captures, one module per kind of figure; :mod:`attnviz.figures` is their
public face. Pure functions: a capture (or a report, a table) and plain selections in, a plotly
figure out — the same in notebooks and in the dashboard. Nothing here runs a model.
"""
