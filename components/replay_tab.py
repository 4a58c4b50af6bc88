"""The "Replay" tab: a recorded or uploaded JSONL trace, stepped through event by event with no model."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from .panel import RunPanel
from .text import esc
from .transcript import status_html
from .view import RunView, TraceError, read_trace, split_runs

MANIFEST = "index.json"


def shipped_traces(folder: Path) -> list[tuple[Path, str]]:
    """(trace, caption) in the order of the folder's index.json (a list of {"file", "caption"}), so the
    telling traces come first; every .jsonl file, sorted and without captions, when there is no manifest."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return [(path, "") for path in sorted(folder.glob("*.jsonl"))]
    return [(folder / entry["file"], entry["caption"]) for entry in json.loads(manifest.read_text(encoding="utf-8"))]


def caption_html(caption: str) -> str:
    return f'<p class="caption">{esc(caption)}</p>' if caption else ""


class ReplayTab:
    def __init__(self, traces: list[tuple[Path, str]]):
        choices = [(path.stem, str(path)) for path, _ in traces]
        self.captions = {str(path): caption for path, caption in traces}
        runs = split_runs(read_trace(traces[0][0])) if traces else []
        with gr.Tab("Replay", id="replay"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    shipped = gr.Dropdown(
                        choices,
                        value=choices[0][1] if choices else None,
                        label="Recorded trace (embedded pair)",
                        elem_id="replay-trace",
                    )
                    self.caption = gr.HTML(caption_html(traces[0][1]) if traces else "", elem_id="replay-caption")
                    upload = gr.File(
                        label="…or a trace of your own (JSONL, from Download trace or --trace)",
                        file_types=[".jsonl"],
                        elem_id="replay-upload",
                    )
                    self.pick = gr.Dropdown(
                        _run_choices(runs),
                        value=0,
                        label="Run in this trace",
                        elem_id="replay-run",
                        visible=len(runs) > 1,
                    )
                    self.step = gr.Slider(
                        1,
                        max(len(runs[0]), 2) if runs else 2,
                        len(runs[0]) if runs else 1,
                        step=1,
                        label="Events replayed",
                        elem_id="replay-step",
                    )
                with gr.Column(scale=3):
                    self.status = gr.HTML(
                        status_html("A recorded run: drag the slider to step through it. No model is needed."),
                        elem_id="replay-status",
                    )
                    self.panel = RunPanel("replay", RunView.of(runs[0]) if runs else None)
            self.runs = gr.State(runs)  # inside the Tab: a stray child of gr.Tabs shows up as a phantom tab
        opened = [self.runs, self.pick, self.step, self.status, self.caption, *self.panel.outputs]
        shipped.input(self.open, [shipped], opened, api_visibility="private")
        upload.upload(self.open, [upload], opened, api_visibility="private")
        self.pick.input(
            self.select, [self.runs, self.pick], [self.step, self.status, *self.panel.outputs], api_visibility="private"
        )
        self.step.input(
            self.at,
            [self.runs, self.pick, self.step],
            [self.status, *self.panel.outputs],
            api_visibility="private",
            trigger_mode="always_last",
        )

    def open(self, path: str | None):
        if not path:
            return {}
        try:
            runs = split_runs(read_trace(path))
        except TraceError as exc:
            gr.Warning(str(exc))
            return {self.status: status_html(f"Could not open the trace: {exc}.", "warn")}
        return {
            self.runs: runs,
            self.pick: gr.Dropdown(choices=_run_choices(runs), value=0, visible=len(runs) > 1),
            self.caption: caption_html(self.captions.get(path, "")),
        } | self.select(runs, 0)

    def select(self, runs: list[list[dict]], index: int):
        events = runs[index]
        return {self.step: gr.Slider(maximum=max(len(events), 2), value=len(events))} | self.at(
            runs, index, len(events)
        )

    def at(self, runs: list[list[dict]], index: int, step: int):
        events = runs[index][: int(step)]
        view = RunView.of(events)
        where = f"Event {len(events)} of {len(runs[index])}: {events[-1]['kind'].replace('_', ' ')}."
        return {self.status: status_html(where)} | self.panel.fresh(view)


def _run_choices(runs: list[list[dict]]) -> list[tuple[str, int]]:
    return [(f"{i + 1}: {RunView.of(run[:1]).label}", i) for i, run in enumerate(runs)]
