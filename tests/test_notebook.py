"""The example notebook runs as a reader would run it: through a real Jupyter kernel (nbclient + ipykernel), on
the embedded pair. Its output holds the run's transcript, the page it saves reads back as a trace, and Gradio
was never imported. About 40 s on the 2-core box, most of it loading the models in the kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safe_engine.pages.traces import read_trace
from safe_engine.pages.view import RunView

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "share_a_run.ipynb"


@pytest.mark.real_models
def test_the_example_notebook_decodes_shows_and_saves_a_run(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(cell.get("outputs") for cell in notebook.cells)  # committed without outputs, so it cannot rot
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(env={**os.environ, "PYTHONPATH": str(ROOT)})  # the kernel imports this checkout
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert len(shown) == 1 and 'class="transcript"' in shown[0] and 'class="tok ' in shown[0]
    assert 'class="metrics"' in shown[0] and "<script" not in shown[0]
    saved = tmp_path / "share_a_run.html"
    view = RunView.of(read_trace(saved))
    assert view.strategy == "safe" and 1 <= len(view.tokens) <= 16
    assert shown[0].count('class="tok ') >= len(view.tokens)
    assert notebook.cells[-1].outputs[0].data["text/plain"] == "False"  # "gradio" in sys.modules
