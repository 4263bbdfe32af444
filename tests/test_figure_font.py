"""Every figure names the CJK face first (``views.common.themed``), so a figure's Chinese or Japanese
labels read wherever the face is served — the dashboard, an exported page — also on a machine without
a CJK font."""

from __future__ import annotations

import ast
from pathlib import Path

import attnviz
from attnviz.views.common import FONT_FAMILY

VIEWS = Path(attnviz.__file__).parent / "views"


def figure_functions() -> list[tuple[str, ast.FunctionDef]]:
    """Each public function of attnviz/views that says it returns a plotly Figure."""
    found = []
    for path in sorted(VIEWS.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and node.returns is not None:
                if ast.unparse(node.returns).strip("'\"") == "go.Figure":
                    found.append((path.name, node))
    return found


def test_every_figure_function_is_themed():
    functions = figure_functions()
    assert len(functions) >= 20  # the scan finds the figures (heatmap, head_view, image_attention …)
    bare = [f"{name}:{node.name}" for name, node in functions if "themed" not in map(ast.unparse, node.decorator_list)]
    assert bare == [], f"figure functions without @themed (their CJK labels would be boxes): {bare}"


def test_an_image_figure_names_the_face():
    from PIL import Image

    picture = Image.new("RGB", (32, 32), (200, 30, 30))
    cap = attnviz.capture(attnviz.testing.tiny_model("vit"), picture, attnviz.testing.tiny_processor("vit"))
    for fig in (
        attnviz.figures.image_attention(cap, 0, head=0),
        attnviz.figures.image_heads(cap, 0),
        attnviz.figures.image_rollout(cap),
    ):
        assert fig.layout.font.family == FONT_FAMILY
