"""The layers contract (scripts/check_layers.py) holds on this tree, and it catches what it is for: an upward
import hidden in a function, a cycle inside one layer, a UI import in the engine, a module in no layer."""

import shutil
from pathlib import Path

import pytest

from scripts.check_layers import PACKAGES, breaches, main, table

ROOT = Path(__file__).resolve().parents[1]


def test_the_tree_keeps_its_layers(capsys):
    assert main([str(ROOT)]) == 0, capsys.readouterr().out


@pytest.fixture
def tree(tmp_path):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    assert breaches(tmp_path) == []
    return tmp_path


def _append(path: Path, code: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + code + "\n", encoding="utf-8")


def test_a_lazy_upward_import_is_caught(tree):
    _append(tree / "safe_engine/contract/errors.py", "def _late():\n    from ..models.loading import LoadedModel\n")
    problems = breaches(tree)
    assert any("safe_engine.contract.errors (layer 0) imports safe_engine.models.loading" in p for p in problems)


def test_a_type_checking_import_counts(tree):
    """The runtime serving a loaded model it names only for its types was the two-way seam issue 32 removed."""
    _append(
        tree / "safe_engine/runtime/session.py",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..models.loading import LoadedModel\n",
    )
    problems = breaches(tree)
    assert any("safe_engine.runtime.session (layer 2) imports safe_engine.models.loading" in p for p in problems)


def test_a_model_host_subclassing_the_loaded_model_is_caught(tree):
    _append(
        tree / "safe_engine/remote/openai_models.py",
        "class ServedModel(LoadedModel):\n    pass\n",
    )
    problems = breaches(tree)
    assert any("ServedModel subclasses LoadedModel, sealed to safe_engine.models" in p for p in problems), problems


def test_a_cycle_inside_one_layer_is_caught(tree):
    _append(tree / "safe_engine/models/specs.py", "def _late():\n    from .cache import load_models\n")
    assert any(p.startswith("import cycle:") and "safe_engine.models.specs" in p for p in breaches(tree))


def test_the_engine_may_not_import_the_ui(tree):
    _append(tree / "safe_engine/run/stats.py", "def _late():\n    import gradio\n")
    assert breaches(tree) == ["safe_engine/run/stats.py: the engine imports gradio, a UI package"]


def test_a_module_outside_every_layer_is_caught(tree):
    (tree / "safe_engine/stray.py").write_text('"""A module nobody placed."""\n', encoding="utf-8")
    assert breaches(tree) == ["safe_engine/stray.py: belongs to no layer (add it to LAYERS)"]


def test_the_architecture_page_holds_the_checks_own_table():
    page = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    assert table(ROOT) in page, "docs/architecture.md: paste `python -m scripts.check_layers --table` over its table"


def test_the_table_follows_a_new_layer(tree):
    assert "`tokdiff.py`" in table(tree) and "`extra.py`" not in table(tree)
    (tree / "safe_engine/analysis/extra.py").write_text('"""A module the page does not list yet."""\n')
    assert "`extra.py`" in table(tree) and table(tree) != table(ROOT)
