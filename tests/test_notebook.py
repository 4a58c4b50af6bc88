"""The example notebook runs as a reader would run it: through a real Jupyter kernel (nbclient + ipykernel) started
where the notebook lies, as Jupyter starts it, with no PYTHONPATH: the installed package (the Quick start's editable
install, or a venv at either end of the dependency ranges) is what it imports. On the embedded pair, its output
holds the run's transcript, the page it saves beside it reads back as a trace, and Gradio was never imported.
About 40 s on the 2-core box, most of it loading the models in the kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safe_engine.pages.traces import read_trace
from safe_engine.pages.view import RunView

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "share_a_run.ipynb"


@pytest.fixture
def saved():
    """The page the notebook saves beside itself (git ignores it), removed afterwards."""
    path = NOTEBOOK.parent / "share_a_run.html"
    path.unlink(missing_ok=True)
    yield path
    path.unlink(missing_ok=True)


@pytest.mark.real_models
def test_the_example_notebook_decodes_shows_and_saves_a_run(saved):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(cell.get("outputs") for cell in notebook.cells)  # committed without outputs, so it cannot rot
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute(env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert len(shown) == 1 and 'class="transcript"' in shown[0] and 'class="tok ' in shown[0]
    assert 'class="metrics"' in shown[0] and "<script" not in shown[0]
    view = RunView.of(read_trace(saved))
    assert view.strategy == "safe" and 1 <= len(view.tokens) <= 16
    assert shown[0].count('class="tok ') >= len(view.tokens)
    assert notebook.cells[-1].outputs[0].data["text/plain"] == "False"  # "gradio" in sys.modules
