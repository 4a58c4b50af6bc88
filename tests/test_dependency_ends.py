"""The package at both ends of what pyproject.toml admits, installed as a user installs it: two venvs that
`scripts/dependency_ends.sh` builds (`bash scripts/setup.sh --tests` runs it), one at the newest versions (uv's
`--resolution highest`: the newest torch, transformers and Python 3.13) and one at the oldest (`lowest-direct`:
every range's lower bound, torch 2.13.0, Python 3.11).

- At the lowest end every declared range sits at its lower bound, so the bound is what is tested.
- In each venv, from a copy of the tests outside the checkout (so `import safe_engine` is the venv's installed
  package, no PYTHONPATH), these pass in one pytest process: SAFE's reference tokens on all 7 prompts
  (`test_reference_texts.py`: the same ids as at the pins), the command line with all three strategies against
  their reference texts and the app through its API (`test_installed_front_doors.py`), and the example notebook
  through a real kernel (`test_notebook.py`). A venv whose transformers, gguf or torch differ from this
  interpreter's also runs the architecture matrix in fp32 (`test_architectures.py`) and converts the embedded
  models with its own transformers, into a cache of its own, as a new user's first run does; one with the same
  three computes as the pins do, so it shares the suite's converted folders and its matrix run.

The checkout's current code is put into each venv first (`uv pip install --no-deps --reinstall`), so the venvs
need rebuilding only when the dependencies change. A dependency release that breaks the package fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import Distribution
from pathlib import Path

import pytest
from ci import skip_or_fail
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.ends
ROOT = Path(__file__).resolve().parents[1]
ENDS = Path(os.environ.get("SAFE_ENDS_DIR", "/opt/safe-ends"))
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# What each venv runs, in one pytest process (the pair loads once). The reference runs: SAFE's 7 (per-token and
# each model alone are the front doors' three CLI runs there; all 28 run at the pins).
INNER = [
    "tests/test_reference_texts.py",
    "tests/test_installed_front_doors.py",
    "tests/test_notebook.py",
]
ONLY = "not (gives_the_reference_tokens and (single or per-token)) and not bfloat16"
MATRIX = "tests/test_architectures.py"  # in fp32, at an end that computes with another torch or transformers
CONVERTERS = ("transformers", "gguf", "torch")  # what the embedded models' conversion depends on


def _venv(end: str) -> Path:
    venv = ENDS / end
    if not (venv / "bin" / "python").exists():
        skip_or_fail(f"no venv at {venv}: bash scripts/dependency_ends.sh (setup.sh --tests runs it)")
    return venv


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A copy of the tests, the scripts they import, pytest.ini and the notebook, outside the checkout."""
    copy = tmp_path_factory.mktemp("outside")
    for name in ("tests", "scripts", "examples"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.html"))
    shutil.copy2(ROOT / "pytest.ini", copy / "pytest.ini")
    return copy


@pytest.fixture(scope="module")
def venv_of():
    """`venv_of(end)`: the end's venv, this checkout's code put into it on first use."""
    if shutil.which("uv") is None:
        skip_or_fail("uv is not installed (bash scripts/setup.sh --tests)")
    current: dict[str, Path] = {}

    def get(end: str) -> Path:
        if end not in current:
            venv = _venv(end)
            install = ["uv", "pip", "install", "-q", "--python", venv / "bin" / "python", "--no-deps", "--reinstall"]
            result = subprocess.run([*install, ROOT], capture_output=True, text=True, timeout=600)
            assert result.returncode == 0, result.stderr[-4000:]
            current[end] = venv
        return current[end]

    return get


def _declared() -> list[Requirement]:
    """Every range of [project]: the dependencies and each extra's (self-references left out)."""
    lines = [*PROJECT["dependencies"], *(line for extra in PROJECT["optional-dependencies"].values() for line in extra)]
    name = canonicalize_name(PROJECT["name"])
    return [r for r in map(Requirement, lines) if canonicalize_name(r.name) != name]


def _installed(venv: Path) -> dict[str, Version]:
    site = next((venv / "lib").glob("python3.*/site-packages"))
    return {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in Distribution.discover(path=[site])}


def test_the_lowest_end_sits_at_every_lower_bound():
    installed = _installed(_venv("lowest"))
    checked = 0
    for requirement in _declared():
        bounds = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        if bounds:
            version = installed[canonicalize_name(requirement.name)]
            assert Version(version.base_version) == bounds[0], f"{requirement}: {version} installed"
            checked += 1
    assert checked >= 25


def _converts_as_here(venv: Path) -> bool:
    """Whether the venv's conversion packages are this interpreter's: then it would write the same folders."""
    theirs, ours = _installed(venv), _installed(Path(sys.prefix))
    return all(theirs.get(name) == ours.get(name) for name in CONVERTERS)


@pytest.mark.parametrize("end", ["highest", "lowest"])
def test_the_installed_package_passes_at_the_end(outside, venv_of, end):
    venv = venv_of(end)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    modules = INNER
    if not _converts_as_here(venv):  # a new user's first run: converted by this end's own transformers
        env["SAFE_STUDIO_CACHE"] = str(venv / "cache")
        modules = [*INNER, MATRIX]  # the same torch and transformers as here ran the matrix already
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    env["SAFE_ENDS_INNER"] = "1"
    argv = [venv / "bin" / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *modules, "-k", ONLY]
    result = subprocess.run(argv, cwd=outside, env=env, capture_output=True, text=True, timeout=2400)
    print(result.stdout[-2000:])  # the inner summary, in the log with -rA / on failure
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
