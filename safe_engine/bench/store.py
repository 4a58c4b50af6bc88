"""A benchmark output folder: ``results.jsonl`` (one line per finished run) and ``run.json`` (settings).

Lines are appended and flushed one by one, so a run killed at any moment loses at most the line being
written; a half-written last line is ignored on reading and cut off before appending again.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..contract.errors import ConfigError

RESULTS = "results.jsonl"
SETTINGS = "run.json"


def load_results(out_dir) -> list[dict]:
    """Every complete result line of a folder (none if there is no results file yet)."""
    path = Path(out_dir) / RESULTS
    if not path.is_file():
        return []
    data = path.read_bytes()
    return [json.loads(line) for line in data[: _complete_length(data)].decode("utf-8").splitlines() if line.strip()]


def load_settings(out_dir) -> dict:
    path = Path(out_dir) / SETTINGS
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def result_key(record: dict) -> tuple[str, str, str]:
    return record["task"], record["id"], record["strategy"]


def claim(out_dir, settings: dict) -> None:
    """Make `out_dir` hold runs with `settings`; refuse a folder whose earlier runs used other settings."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = json.loads(json.dumps(settings))  # compare as stored (tuples become lists)
    earlier = load_settings(out)
    if earlier and earlier != settings:
        changed = sorted(k for k in settings.keys() | earlier.keys() if settings.get(k) != earlier.get(k))
        raise ConfigError(f"{out} holds runs with other settings ({', '.join(changed)}); use another output folder")
    (out / SETTINGS).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def open_for_append(out_dir):
    """The results file, opened for appending after cutting off a half-written last line."""
    path = Path(out_dir) / RESULTS
    if path.is_file():
        data = path.read_bytes()
        if _complete_length(data) < len(data):
            with open(path, "r+b") as handle:
                handle.truncate(_complete_length(data))
    return open(path, "a", encoding="utf-8")


def append(handle, record: dict) -> None:
    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    handle.flush()


def _complete_length(data: bytes) -> int:
    return data.rfind(b"\n") + 1
