"""The ray: model spec parses without Ray, and the engine never imports Ray (it is optional)."""

import subprocess
import sys

import pytest

from safe_engine.cli import build_parser
from safe_engine.contract.errors import ModelSpecError
from safe_engine.distributed.ray_spec import RayPlacement, parse_ray_spec
from safe_engine.models.specs import resolve_spec


def test_a_ray_spec_names_the_inner_model_under_the_full_spec():
    resolved = resolve_spec(" ray:embedded:gemma-3-270m ")
    assert (resolved.spec, resolved.kind, resolved.short_name) == (
        "ray:embedded:gemma-3-270m",
        "embedded",
        "gemma-3-270m",
    )
    assert parse_ray_spec("ray:embedded:gemma-3-270m") == (RayPlacement(), "embedded:gemma-3-270m")


def test_placement_options_come_before_the_inner_spec():
    placement, inner = parse_ray_spec("ray:gpus=0.5,cpus=4,timeout=30,restarts=0:org/model")
    assert inner == "org/model"
    assert placement == RayPlacement(gpus=0.5, cpus=4.0, timeout_s=30.0, restarts=0)
    assert placement.threads == 4 and placement.describe() == "0.5 GPU"
    assert RayPlacement(cpus=0).threads == 1 and RayPlacement(cpus=0).describe() == "0 CPU"
    assert parse_ray_spec("ray:/models/a=b")[1] == "/models/a=b"  # no colon after it: a path, not options


@pytest.mark.parametrize(
    "spec, message",
    [
        ("ray:gpu=1:org/model", "unknown Ray option 'gpu'"),
        ("ray:gpus=one:org/model", "not a number"),
        ("ray:timeout=0:org/model", "at least"),
        ("ray:cpus=-1:org/model", "at least"),
        ("ray:ray:org/model", "nests"),
        ("ray:embedded:nope", "unknown embedded model"),
    ],
)
def test_bad_ray_specs_say_why(spec, message):
    with pytest.raises(ModelSpecError, match=message):
        resolve_spec(spec)


def test_placement_ray_and_the_sweep_options_parse():
    args = build_parser().parse_args(["bench", "--tasks", "facts", "--ray", "--replicas", "2", "--placement", "ray"])
    assert (args.ray, args.replicas, args.replica_cpus, args.replica_gpus, args.placement) == (True, 2, 1.0, 0.0, "ray")


def test_the_engine_and_ray_spec_parsing_never_import_ray():
    code = (
        "import sys, safe_engine.cli, safe_engine.bench.runner\n"
        "from safe_engine.models.specs import resolve_spec\n"
        "resolve_spec('ray:cpus=2:embedded:gemma-3-270m')\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
