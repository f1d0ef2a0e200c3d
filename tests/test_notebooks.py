"""The notebooks in docs/, executed as a reader runs them: every cell without an error, and what they show."""
from pathlib import Path

import pytest

from tests.conftest import decode

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.bundled
@pytest.mark.slow
def test_the_head_card_notebook_runs_and_draws_its_figures_inline():
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(ROOT / "docs" / "head-card.ipynb", as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.name == "stdout")
    assert printed.startswith("L23 H3 of HuggingFaceTB/SmolLM2-135M-Instruct: ")
    tables = [o for o in outputs if "text/html" in o.get("data", {})]
    assert any("snippet" in o.data["text/html"] for o in tables) and any("recovered" in o.data["text/html"] for o in tables)
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 2
    atlas = figures[0].data["application/vnd.plotly.v1+json"]
    assert sum(len(decode(t["x"])) for t in atlas["data"] if t.get("name") != "this head") == 270  # every head
