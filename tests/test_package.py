"""The installable package (pyproject.toml's [project]): the tested pins stay inside its ranges, and the built wheel
works from outside the checkout.

- Every ``==`` pin of requirements*.txt satisfies its package's range in [project] (dependencies or an extra), every
  other line has a range, and every declared range is installed by a requirements file: the two cannot drift.
  requirements-nodeps.txt (installed with --no-deps) must stay out of [project].
- The wheel (``pip wheel --no-deps --no-build-isolation``) holds every file of safe_engine/, components/ (as
  safe_studio/) and assets/ (as safe_studio/assets/), and no other top-level package.
- Installed with --no-deps into a fresh venv over this machine's packages (--system-site-packages), from a folder
  outside the repository: ``import safe_engine`` is the installed copy; ``safe-ensemble bench --tasks arithmetic``
  finds its shipped set; ``safe-ensemble export NAME --html`` writes a shipped trace's page with the installed page
  files; ``safe-ensemble lm-eval ls tasks`` lists the shipped tasks from the installed YAMLs;
  ``safe-studio`` serves its stylesheet and Replay opens a shipped trace; ``safe-ensemble generate`` runs the
  embedded pair (real_models).

Cost on the 2-core CPU box, measured twice: 79 and 90 s. Wheel and venv 2-4 s, the import check 6-8 s, bench
11-14 s (tiny models), lm-eval 32-38 s (its listing indexes and reads all ~14,700 of lm-eval's task YAMLs), the app
7-8 s, generate 17-19 s.
"""

from __future__ import annotations

import ast
import html
import json
import os
import shutil
import site
import subprocess
import sys
import tomllib
import urllib.request
import zipfile
from importlib.util import find_spec
from pathlib import Path

import pytest
from ci import skip_or_fail
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from servers import free_port, stop, wait_until_serving
from tiny_pair import tiny_pair_folders

from safe_engine.pages.traces import read_trace

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
NAME = canonicalize_name(PROJECT["name"])
NO_DEPS = "requirements-nodeps.txt"  # installed with --no-deps for the file it ships: never a dependency
INSTALLED_BY = {  # where the README's set-up (scripts/setup.sh) installs each group of [project]'s ranges
    "dependencies": "requirements.txt",
    "eval": "requirements-integrations.txt",
    "ray": "requirements-ray.txt",
    "notebook": "requirements-notebook.txt",
    "test": "requirements.txt",
}
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "safe_engine", "components", "assets")
IN_WHEEL = {"safe_engine": "safe_engine", "components": "safe_studio", "assets": "safe_studio/assets"}


# ---------------------------------------------------------------- pins and ranges
def _requirements(path: Path) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [Requirement(line) for line in lines if line]


def _ranges() -> dict[str, dict[str, Requirement]]:
    """{group: {package: its requirement}}, groups being "dependencies" and each extra (self-references left out)."""
    groups = {"dependencies": PROJECT["dependencies"], **PROJECT["optional-dependencies"]}
    return {
        group: {canonicalize_name(r.name): r for r in map(Requirement, lines) if canonicalize_name(r.name) != NAME}
        for group, lines in groups.items()
    }


def test_every_pin_satisfies_its_range_in_the_project():
    ranges: dict[str, list[Requirement]] = {}
    for declared in _ranges().values():
        for name, requirement in declared.items():
            ranges.setdefault(name, []).append(requirement)
    files = sorted(ROOT.glob("requirements*.txt"))
    assert {path.name for path in files} >= set(INSTALLED_BY.values()) | {NO_DEPS}
    checked = 0
    for path in files:
        for pin in _requirements(path):
            name = canonicalize_name(pin.name)
            if path.name == NO_DEPS:
                assert name not in ranges, f"{path.name}: {pin} is installed with --no-deps, not a dependency"
                continue
            assert name in ranges, f"{path.name}: {pin} has no range in pyproject.toml's [project]"
            for spec in pin.specifier:
                if spec.operator == "==":
                    for requirement in ranges[name]:
                        assert requirement.specifier.contains(spec.version), f"{path.name}: {pin} not in {requirement}"
                    checked += 1
    assert checked >= 20  # torch, transformers, ... lm-eval, ray, pytest: the pins are there to check


def test_every_range_is_installed_by_the_requirements_files():
    for group, declared in _ranges().items():
        listed = {canonicalize_name(r.name) for r in _requirements(ROOT / INSTALLED_BY[group])}
        missing = sorted(set(declared) - listed)
        assert not missing, f"[project] {group} declares {missing}, which {INSTALLED_BY[group]} does not install"


def test_the_ui_imports_itself_relatively_and_nothing_edits_sys_path():
    """components/ installs as safe_studio, so it never names itself; no module reaches the tree via sys.path."""
    for path in sorted((ROOT / "components").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module]
            assert not any(n.split(".")[0] == "components" for n in names), f"{path.name}:{node.lineno}"
    for folder in ("safe_engine", "components", "benchmarks", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "node_modules" not in path.parts and path != Path(__file__).resolve():
                assert "sys.path" not in path.read_text(encoding="utf-8"), path.relative_to(ROOT)
    assert "sys.path" not in (ROOT / "app.py").read_text(encoding="utf-8")


# ---------------------------------------------------------------- the wheel, installed in a venv
def _run(argv: list, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, argv))} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if find_spec("setuptools") is None:  # the build backend, used without build isolation (offline)
        skip_or_fail("setuptools is not installed (bash scripts/setup.sh)")
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in BUILD_INPUTS:  # a copy, so the build's build/ and *.egg-info stay out of the checkout
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif (ROOT / name).is_file():
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    _run([*pip, "-w", str(out), str(source)])
    (built,) = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel; its dependencies are this interpreter's packages (--system-site-packages,
    and a .pth naming this interpreter's site-packages, for when the tests run inside a venv themselves)."""
    folder = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(folder)])
    python = folder / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (purelib / "_outer_site.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)])
    return folder


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> dict:
    """subprocess.run arguments for a command run from a folder outside the repository, the venv's bin first."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    assert ROOT not in cwd.parents
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["GRADIO_ANALYTICS_ENABLED"] = "False"
    env["GRADIO_TEMP_DIR"] = str(tmp_path_factory.mktemp("gradio"))
    return {"cwd": cwd, "env": env}


def _within(path: str | Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    expected = {
        f"{IN_WHEEL[folder]}/{path.relative_to(ROOT / folder).as_posix()}"
        for folder in IN_WHEEL
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert sorted(expected - names) == [], "files the wheel leaves out (pyproject.toml's packages / package-data)"
    assert {name.split("/")[0] for name in names - expected} == {entry_points.split("/")[0]}
    assert "safe-ensemble = safe_engine.cli:main" in scripts and "safe-studio = safe_studio.studio:main" in scripts


def test_the_installed_package_is_the_one_imported(venv, outside):
    code = (
        "import json, safe_engine, safe_studio.studio as studio; from safe_engine.data import TASKS_DIR, TRACES_DIR;"
        "from safe_engine.integrations import LM_EVAL_TASKS_DIR;"
        "print(json.dumps([safe_engine.__file__, studio.__file__, str(studio.asset('style.css')), str(TASKS_DIR),"
        " str(TRACES_DIR), str(LM_EVAL_TASKS_DIR)]))"
    )
    paths = json.loads(_run([venv / "bin" / "python", "-c", code], **outside).stdout)
    assert all(_within(path, venv) for path in paths), paths
    assert Path(paths[2]).read_text(encoding="utf-8") == (ROOT / "assets" / "style.css").read_text(encoding="utf-8")


def test_installed_bench_finds_its_shipped_task_set(venv, outside, tmp_path):
    specs = tiny_pair_folders(tmp_path / "pair")
    argv = [venv / "bin" / "safe-ensemble", "bench", "--tasks", "arithmetic", "--limit", "1", "--out", tmp_path / "b"]
    _run([*argv, "--models", *specs, "--max-new-tokens", "4", "--strategies", "single,safe"], **outside)
    rows = [json.loads(line) for line in (tmp_path / "b" / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert {row["task"] for row in rows} == {"arithmetic"} and {row["strategy"] for row in rows} == {
        "single:tiny-llama",
        "safe",
    }


def test_installed_export_reaches_a_shipped_trace_by_name(venv, outside, tmp_path):
    name = "01-why-per-token-fails-spell-08"
    _run([venv / "bin" / "safe-ensemble", "export", name, "--html", tmp_path / "collapse.html"], **outside)
    page = (tmp_path / "collapse.html").read_text(encoding="utf-8")
    assert page.count('<section class="run" data-run=') == 2 and "Plotly" in page  # per-token beside SAFE
    assert read_trace(tmp_path / "collapse.html") == read_trace(
        ROOT / "safe_engine" / "data" / "traces" / f"{name}.jsonl"
    )


def test_installed_lm_eval_front_door_lists_the_shipped_tasks(venv, outside):
    if find_spec("lm_eval") is None:
        pytest.skip("lm-eval is not installed (pip install 'safe-ensemble-studio[eval]', or requirements-integrations)")
    shipped = {
        line.split(":", 1)[1].strip(): path.name
        for path in (ROOT / "safe_engine" / "integrations" / "lm_eval_tasks").glob("*.yaml")
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("task:")
    }
    assert len(shipped) >= 7
    listing = _run([venv / "bin" / "safe-ensemble", "lm-eval", "ls", "tasks"], **outside).stdout
    rows = {cells[0]: cells[1] for line in listing.splitlines() if len(cells := line.strip("|").split("|")) >= 2}
    rows = {task.strip(): location.strip() for task, location in rows.items()}
    for task, yaml_name in shipped.items():
        assert task in rows, f"{task} is not listed"
        assert _within(rows[task], venv) and Path(rows[task]).name == yaml_name, rows[task]


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read().decode("utf-8")


def _event(base: str, fn_index: int, trigger: int, data: list, session: str) -> list:
    """Run one of the page's events over HTTP, as the page does (Gradio's queue), and return its outputs."""
    body = json.dumps({"data": data, "fn_index": fn_index, "trigger_id": trigger, "session_hash": session}).encode()
    request = urllib.request.Request(f"{base}/gradio_api/queue/join", body, {"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).close()
    with urllib.request.urlopen(f"{base}/gradio_api/queue/data?session_hash={session}", timeout=120) as stream:
        for line in stream:
            if line.startswith(b"data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    assert message["success"], message
                    return message["output"]["data"]
    raise AssertionError("the event never completed")


def test_installed_studio_serves_its_css_and_replays_a_shipped_trace(venv, outside, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "studio.log", "w") as log:
        app = subprocess.Popen(
            [venv / "bin" / "safe-studio", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, **outside
        )
    try:
        wait_until_serving(f"{base}/gradio_api/info", app, tmp_path / "studio.log")
        status, _, page = _get(f"{base}/")
        assert status == 200 and 'rel="stylesheet"' in page
        # Gradio 6 links its own stylesheet and hands the app's CSS (css_paths) to the page in /config.
        status, _, raw = _get(f"{base}/config")
        config = json.loads(raw)
        for stylesheet in (ROOT / "assets" / "style.css", ROOT / "safe_engine" / "pages" / "style.css"):
            assert status == 200 and stylesheet.read_text(encoding="utf-8").strip() in config["css"]
        status, kind, _ = _get(f"{base}/theme.css")
        assert status == 200 and kind.startswith("text/css")

        components = {c["id"]: c for c in config["components"]}
        by_elem = {c.get("props", {}).get("elem_id"): c for c in config["components"]}
        picker = by_elem["replay-trace"]
        traces = {Path(path).name: path for _, path in picker["props"]["choices"]}
        manifest = json.loads((ROOT / "safe_engine" / "data" / "traces" / "index.json").read_text(encoding="utf-8"))
        assert [entry["file"] for entry in manifest] == list(traces) and all(_within(p, venv) for p in traces.values())
        assert picker["props"]["value"] == traces[manifest[0]["file"]]  # Replay opens on the first shipped trace
        assert html.unescape(by_elem["replay-caption"]["props"]["value"]).find(manifest[0]["caption"]) >= 0

        (opening,) = [d for d in config["dependencies"] if [picker["id"], "input"] in d["targets"]]
        entry = next(e for e in manifest if e["file"] == "1-safe-factorial.jsonl")
        outputs = _event(base, opening["id"], picker["id"], [traces[entry["file"]]], "package-test")
        shown = {components[i].get("props", {}).get("elem_id"): value for i, value in zip(opening["outputs"], outputs)}
        assert entry["caption"] in html.unescape(shown["replay-caption"])
        assert "Event " in shown["replay-status"] and 'class="tok' in shown["replay-transcript"]
        # The button comes back as an update (its value and interactive=True); the value is the page's file.
        page = Path(shown["replay-page"]["value"]["path"]).read_text(encoding="utf-8")  # the installed page files
        assert page.count("<template id=") == 40 and "Plotly" in page
    finally:
        stop(app)


@pytest.mark.real_models
def test_installed_generate_runs_the_embedded_pair(venv, outside):
    argv = [venv / "bin" / "safe-ensemble", "generate", "--prompt", "Hi", "--max-new-tokens", "4", "--json"]
    result = json.loads(_run(argv, timeout=900, **outside).stdout)
    assert result["models"] == ["gemma-3-270m", "smollm2-135m-instruct"] and 0 < result["tokens"] <= 4
