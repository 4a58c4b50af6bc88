"""Trace files: a run's events as JSONL (the CLI's --trace, the app's downloads) or inside a page this package
wrote; the shipped traces with their captions; and a trace named by a person (a link's ``?trace=``, the CLI's
``export NAME``), found only among the files a known folder lists, never by joining the name to a path."""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..contract.errors import SafeEngineError
from ..contract.events import EVENT_TYPES
from .view import RunView

MANIFEST = "index.json"
SUFFIX = ".jsonl"
ALONE = -1  # the second run of a pair when a trace shows one run alone
# Inside a page the trace is a data block, never a script that runs: `<` is written as \u003c (still JSON),
# so no text of the trace can close the element or open another one.
TRACE_ID = "safe-trace"
TRACE_OPEN = f'<script type="application/x-ndjson" id="{TRACE_ID}">'
TRACE_IN_PAGE = re.compile(re.escape(TRACE_OPEN) + r"(.*?)</script>", re.DOTALL)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_:-]*(?:\.[A-Za-z0-9_:-]+)*")  # a file name's stem: no path, no ".."


class TraceError(SafeEngineError):
    """A trace file that is not a JSONL list of engine events (or a page holding one), or a trace name that
    names no trace."""


def split_runs(events: list[dict]) -> list[list[dict]]:
    """A trace may hold several runs (a comparison); each starts with its run_started event."""
    runs: list[list[dict]] = []
    for event in events:
        if event["kind"] == "run_started" or not runs:
            runs.append([])
        runs[-1].append(event)
    return runs


def to_jsonl(events: list[dict]) -> str:
    return "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events)


def trace_element(events: list[dict]) -> str:
    """The trace as a page carries it (and `read_trace` finds it again)."""
    return TRACE_OPEN + to_jsonl(events).replace("<", "\\u003c") + "</script>"


def read_trace(path: str | Path) -> list[dict]:
    """The events of a JSONL trace, or of the trace inside a page this package wrote."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"could not read the trace: {exc}") from None
    if text.lstrip("\ufeff \t\r\n").startswith("<"):
        found = TRACE_IN_PAGE.search(text)
        if found is None:
            raise TraceError("this HTML file holds no trace (a page written by SAFE Ensemble Studio does)")
        text = found.group(1)
    events = []
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 may stand in a string
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            raise TraceError(f"line {number} of the trace is not JSON") from None
        if not isinstance(event, dict) or event.get("kind") not in EVENT_TYPES:
            raise TraceError(f"line {number} of the trace is not an engine event")
        events.append(event)
    if not events or events[0]["kind"] != "run_started":
        raise TraceError("the trace does not start with a run_started event")
    return events


def save_trace(events: list[dict], name: str) -> str:
    """Write events as JSONL (the CLI's --trace format) into a fresh temp folder; the path to download."""
    path = Path(tempfile.mkdtemp(prefix="safe-trace-")) / f"{name}{SUFFIX}"
    path.write_text(to_jsonl(events), encoding="utf-8")
    return str(path)


def shipped_traces(folder: Path) -> list[tuple[Path, str]]:
    """(trace, caption) in the order of the folder's index.json (a list of {"file", "caption"}), so the
    telling traces come first; every .jsonl file, sorted and without captions, when there is no manifest.
    Only files inside the folder: an entry or a symlink that leads out of it is left out."""
    manifest = folder / MANIFEST
    if manifest.is_file():
        listed = [(folder / e["file"], e["caption"]) for e in json.loads(manifest.read_text(encoding="utf-8"))]
    else:
        listed = [(path, "") for path in sorted(folder.glob(f"*{SUFFIX}"))]
    return [(path, caption) for path, caption in listed if _inside(path, folder)]


def _inside(path: Path, folder: Path) -> bool:
    target = path.resolve()
    return target.is_relative_to(folder.resolve()) and target.is_file()


def find_trace(name: str, folders: Sequence[Path]) -> Path:
    """The trace file called `name` (with or without .jsonl) among the .jsonl files the folders list, in
    order. A name that could reach anything else (a path, "..", an encoded form) is refused before any folder
    is read, and so is a listed file that resolves outside its folder (a symlink pointing out)."""
    stem = name.removesuffix(SUFFIX)
    if not NAME.fullmatch(stem):
        raise TraceError(
            f"“{name}” is not a trace name: give a trace's file name (letters, digits, '.', '_', '-'), "
            f"with or without {SUFFIX}"
        )
    known = []
    for folder in folders:
        for path in sorted(folder.glob(f"*{SUFFIX}")):
            known.append(path.stem)
            if path.stem != stem:
                continue
            if not _inside(path, folder):
                raise TraceError(f"the trace “{stem}” points outside its folder, so it is not opened")
            return path.resolve()
    listed = ", ".join(known[:12]) + (", …" if len(known) > 12 else "")
    raise TraceError(f"no trace named “{stem}”; the traces here are: {listed or 'none'}")


def default_pair(runs: list[list[dict]]) -> tuple[int, int]:
    """Per-token beside SAFE when the trace holds both (the contrast the app teaches), else its first two runs
    (a what-if branch beside its origin), else its one run alone."""
    labels = [RunView.of(run[:1]).label for run in runs]
    if "per-token" in labels and "safe" in labels:
        return labels.index("per-token"), labels.index("safe")
    return (0, 1) if len(runs) > 1 else (0, ALONE)
