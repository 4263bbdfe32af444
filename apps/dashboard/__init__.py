"""The attnviz Dash dashboard: ``create_app()`` builds it, ``run()`` serves it (``attnviz app``)."""

from .app import create_app, run
from .cache import CaptureCache

__all__ = ["CaptureCache", "create_app", "run"]
