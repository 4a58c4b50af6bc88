"""A sweep: the points of a grid of decoding options × strategies over the same examples, each run through the
bench's own folders (`runner.Bench`), so prompts, scoring, batching and resuming are the bench's.

A sweep folder holds ``sweep.json`` (the grid, the examples and which runs folder holds each point's rows)
and ``runs/<group>-<hash>/``, one bench folder per distinct setting of a group of strategies. The singles
and per-token ignore some of SAFE's knobs (`IGNORED`), so points that differ only there share their runs:
the singles run once as the reference of every point (the gain over the best single model and the wall-time
ratio to the drafter alone need them), whatever strategies were asked for. Rerunning adds only what is
missing; an interrupted sweep keeps every row written.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..contract.config import DecodeConfig
from ..contract.errors import ConfigError
from ..models.loading import LoadedModel
from .runner import Bench, bench_settings
from .tasks import Example

MANIFEST = "sweep.json"
RUNS = "runs"
SINGLES = "singles"
# The config fields a group of strategies does not read: points that differ only there share its runs.
IGNORED = {
    SINGLES: (
        "lookahead",
        "safe_mode",
        "per_token_commit",
        "ensemble",
        "draft_gate",
        "consensus_threshold",
        "overlap",
        "byte_combine",
    ),
    "per-token": ("lookahead", "safe_mode", "draft_gate", "consensus_threshold", "overlap", "byte_combine"),
    "safe": ("per_token_commit", "byte_combine"),
    "byte-level": ("lookahead", "safe_mode", "per_token_commit", "draft_gate", "consensus_threshold", "overlap"),
}


@dataclass(frozen=True)
class GridPoint:
    """One point of a sweep's grid: each axis's value (as the option table parsed it) and the checked config."""

    values: dict[str, object]
    config: DecodeConfig


def group_of(label: str) -> str:
    return SINGLES if label.startswith("single:") else label


@dataclass(frozen=True)
class Runs:
    """One runs folder of a sweep: the config and the strategies of its rows."""

    name: str
    config: DecodeConfig
    labels: tuple[str, ...]


class SweepPlan:
    """A sweep's runs folders and its manifest, known before any model loads (the models' names, specs and
    chat-template use are given, so a driver that loads no model, on Ray, plans the same folders)."""

    def __init__(
        self,
        names: Sequence[str],
        specs: Sequence[str],
        chat_template: Sequence[bool],
        examples: Sequence[Example],
        base: DecodeConfig,
        defaults: dict[str, object],
        points: Sequence[GridPoint],
        labels: Sequence[str],
        out_dir,
        style: str = "direct",
    ):
        """`base`: the config without the grid (what a group's ignored fields are reset to); `defaults`: each
        axis's value in `base`, as the option table holds it (the report's "others at their defaults");
        `labels`: the strategies asked for (`runner.strategy_labels`), the singles added as the reference."""
        self.out_dir, self.examples, self.style = Path(out_dir), list(examples), style
        singles = [f"single:{name}" for name in names]
        asked = [label for label in labels if group_of(label) != SINGLES]
        drafter = names[base.drafter]
        self.runs: dict[str, Runs] = {}
        listed = []
        for point in points:
            where = {}
            for group, group_labels in [(SINGLES, singles)] + [(label, [label]) for label in asked]:
                config = replace(point.config, **{f: getattr(base, f) for f in IGNORED[group]})
                settings = bench_settings(specs, drafter, chat_template, style, config)
                digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
                name = f"{group}-{digest}"
                self.runs.setdefault(name, Runs(name, config, tuple(group_labels)))
                where |= dict.fromkeys(group_labels, name)
            listed.append({"values": point.values, "runs": where})
        self.manifest = {
            "models": list(specs),
            "drafter": drafter,
            "singles": singles,
            "strategies": asked,
            "axes": list(points[0].values),
            "defaults": defaults,
            "examples": [[e.task, e.id] for e in examples],
            "points": listed,
        }

    def folder(self, name: str) -> Path:
        return self.out_dir / RUNS / name

    def write_manifest(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / MANIFEST).write_text(json.dumps(self.manifest, indent=1) + "\n", encoding="utf-8")


class GridSweep:
    """Every grid point × strategy of a plan, in this process: one `Bench` per runs folder, run in turn."""

    def __init__(self, models: Sequence[LoadedModel], plan: SweepPlan, batch_size: int = 1):
        self.out_dir = plan.out_dir
        self.benches = [
            Bench(models, plan.examples, runs.config, runs.labels, plan.folder(runs.name), plan.style, batch_size)
            for runs in plan.runs.values()
        ]
        plan.write_manifest()

    @property
    def done(self) -> int:
        return sum(bench.done for bench in self.benches)

    @property
    def total(self) -> int:
        return sum(bench.total for bench in self.benches)

    def run(self, stop: threading.Event | None = None) -> Iterator[dict]:
        """Run what is left, folder by folder, yielding each record once it is on disk."""
        for bench in self.benches:
            yield from bench.run(stop)
            if stop is not None and stop.is_set():
                return


def load_manifest(out_dir) -> dict:
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise ConfigError(f"{out_dir} holds no sweep ({MANIFEST} is missing)")
    return json.loads(path.read_text(encoding="utf-8"))
