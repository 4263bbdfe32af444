"""The example notebook runs top to bottom in a real Jupyter kernel, showing HTML reprs and figures."""

from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parent.parent / "examples" / "tour.ipynb"


@pytest.mark.slow
def test_the_example_notebook_runs_and_shows_its_figures(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(EXAMPLE, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    streams = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "IProgress" not in streams and "TqdmWarning" not in streams, streams
    # to_html's cell ends in a print: the page is written, never shown (to_html returns its path)
    assert not [h for o in outputs for h in [o.get("data", {}).get("text/plain", "")] if "<!DOCTYPE" in h]
    mimes = [m for o in outputs for m in o.get("data", {})]
    assert mimes.count("application/vnd.plotly.v1+json") == 2  # the two figures the cells show
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("attnviz Capture" in h for h in html) and any("attnviz validation" in h for h in html)
    assert any("attnviz coreference" in h for h in html)
    assert (tmp_path / "attnviz-tour.html").stat().st_size > 3_000_000
