"""Applications built on the attnviz library (the Dash dashboard lives in apps.dashboard)."""
