"""The "Replay" tab: a recorded or uploaded JSONL trace, stepped through event by event with no model; a
trace that holds several runs of one prompt (a comparison, a shipped collapse) can show two of them side by
side on one slider, by committed tokens, each with its damage line and both on one damage chart."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from safe_engine.pages import charts
from safe_engine.pages.page import trace_page
from safe_engine.pages.text import esc
from safe_engine.pages.traces import ALONE, TraceError, default_pair, find_trace, read_trace, split_runs
from safe_engine.pages.transcript import status_html
from safe_engine.pages.view import RunView

from .downloads import page_file
from .panel import RunPanel

READY = "A recorded run: drag the slider to step through it. No model is needed."
READY_PAIR = "Two runs of one prompt side by side: drag the slider to step through both. No model is needed."


def caption_html(caption: str) -> str:
    return f'<p class="caption">{esc(caption)}</p>' if caption else ""


def token_count(events: list[dict]) -> int:
    return sum(len(e["tokens"]) for e in events if e["kind"] == "text_committed")


def up_to_token(events: list[dict], count: int) -> list[dict]:
    """A run's events until it has committed `count` tokens (with that commit's damage event); all of them,
    its end included, once it has no more tokens than that."""
    if count >= token_count(events):
        return events
    committed = 0
    for i, event in enumerate(events):
        if committed >= count and event["kind"] != "damage":
            return events[:i]
        if event["kind"] == "text_committed":
            committed += len(event["tokens"])
    return events


def steps(runs: list[list[dict]], index: int, beside: int) -> tuple[int, str]:
    """The slider's length and label: one run steps by events, two by committed tokens (the longer run's)."""
    if beside == ALONE:
        return len(runs[index]), "Events replayed"
    return max(token_count(runs[index]), token_count(runs[beside])), "Tokens replayed (both runs)"


def views_at(runs: list[list[dict]], index: int, beside: int, step: int) -> list[RunView]:
    """What the slider at `step` shows: the run's first `step` events, or both runs at `step` tokens."""
    if beside == ALONE:
        return [RunView.of(runs[index][:step])]
    return [RunView.of(up_to_token(runs[i], step)) for i in (index, beside)]


def _paired(runs: list[list[dict]], index: int, beside: int) -> int:
    """`beside`, or ALONE where it names no other run of the trace."""
    return beside if beside != index and 0 <= beside < len(runs) else ALONE


class ReplayTab:
    """`traces` are listed (with their captions) in the picker; `folders` are where a link's ``?trace=NAME`` may
    find one (`follow_links`)."""

    def __init__(self, traces: list[tuple[Path, str]], folders: list[Path]):
        choices = [(path.stem, str(path)) for path, _ in traces]
        self.captions = {str(path): caption for path, caption in traces}
        self.folders = folders
        runs = split_runs(read_trace(traces[0][0])) if traces else []
        source = (traces[0][0].stem, traces[0][1]) if traces else ("", "")
        first, beside = default_pair(runs) if runs else (0, ALONE)
        total, label = steps(runs, first, beside) if runs else (1, "Events replayed")
        views = views_at(runs, first, beside, total) if runs else [RunView()]
        pair = len(views) == 2
        with gr.Tab("Replay", id="replay"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    self.shipped = shipped = gr.Dropdown(
                        choices,
                        value=choices[0][1] if choices else None,
                        label="Recorded trace (embedded pair)",
                        elem_id="replay-trace",
                    )
                    self.caption = gr.HTML(caption_html(traces[0][1]) if traces else "", elem_id="replay-caption")
                    upload = gr.File(
                        label="…or a trace of your own (JSONL from Download trace or --trace, or a page from "
                        "Download page)",
                        file_types=[".jsonl", ".html"],
                        elem_id="replay-upload",
                    )
                    several = len(runs) > 1
                    self.pick = gr.Dropdown(
                        _run_choices(runs),
                        value=first,
                        label="Run in this trace",
                        visible=several,
                        elem_id="replay-run",
                    )
                    self.beside = gr.Dropdown(
                        _beside_choices(runs),
                        value=beside,
                        label="Beside it, on the same slider",
                        visible=several,
                        elem_id="replay-run-b",
                    )
                    self.step = gr.Slider(1, max(total, 2), total, step=1, label=label, elem_id="replay-step")
                    self.page = gr.DownloadButton(
                        "Download page (HTML)",
                        value=_page(runs, first, beside, source) if runs else None,
                        interactive=bool(runs),
                        elem_id="replay-page",
                    )
                with gr.Column(scale=3):
                    self.status = gr.HTML(status_html(READY_PAIR if pair else READY), elem_id="replay-status")
                    with gr.Row():
                        with gr.Column():
                            self.panel = RunPanel("replay", views[0], charts_apart=True)
                        with gr.Column(visible=pair) as self.other_box:
                            self.other = RunPanel("replay-b", views[-1] if pair else None, plots=False)
                    self.damage = gr.Plot(
                        charts.damage([(v.label, v) for v in views]),
                        visible=pair,
                        show_label=False,
                        elem_id="replay-damage",
                    )
                    with gr.Column(visible=not pair) as self.charts_box:
                        self.panel.charts()
            self.runs = gr.State(runs)  # inside the Tab: a stray child of gr.Tabs shows up as a phantom tab
            self.source = gr.State(source)  # the trace's name and caption, for its page
        shown = [self.status, *self.panel.outputs, *self.other.outputs, self.damage]
        selected = [self.pick, self.beside, self.step, self.other_box, self.charts_box, self.page, *shown]
        self.opened = [self.runs, self.source, self.caption, *selected]
        shipped.input(self.open, [shipped], self.opened, api_visibility="private")
        upload.upload(self.open, [upload], self.opened, api_visibility="private")
        for choice in (self.pick, self.beside):
            choice.input(
                self.select, [self.runs, self.pick, self.beside, self.source], selected, api_visibility="private"
            )
        self.step.input(
            self.at,
            [self.runs, self.pick, self.beside, self.step],
            shown,
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
        caption = self.captions.get(path, "")
        source = (Path(path).name.removesuffix(".jsonl"), caption)
        opened = {self.runs: runs, self.source: source, self.caption: caption_html(caption)}
        return opened | self.select(runs, *default_pair(runs), source)

    def select(self, runs: list[list[dict]], index: int, beside: int, source: tuple[str, str]) -> dict:
        beside = _paired(runs, index, beside)
        total, label = steps(runs, index, beside)
        several = len(runs) > 1
        return {
            self.pick: gr.Dropdown(choices=_run_choices(runs), value=index, visible=several),
            self.beside: gr.Dropdown(choices=_beside_choices(runs), value=beside, visible=several),
            self.step: gr.Slider(minimum=1, maximum=max(total, 2), value=total, label=label),
            self.other_box: gr.Column(visible=beside != ALONE),
            self.charts_box: gr.Column(visible=beside == ALONE),
            self.page: gr.DownloadButton(value=_page(runs, index, beside, source), interactive=True),
        } | self.at(runs, index, beside, total)

    def follow_links(self, demo: gr.Blocks, tabs: gr.Tabs) -> None:
        """``?trace=NAME`` in the page's address opens that trace (shipped, or in --traces) in this tab."""
        self.tabs = tabs
        demo.load(
            self.open_link,
            None,
            [tabs, self.shipped, *self.opened],
            api_visibility="private",
            show_progress="hidden",  # every visit asks; most carry no trace and change nothing
        )

    def open_link(self, request: gr.Request):
        name = dict(request.query_params).get("trace")
        if name is None:
            return gr.skip()
        shown = {self.tabs: gr.Tabs(selected="replay")}
        try:
            path = str(find_trace(name, self.folders))
        except TraceError as exc:
            return shown | {self.status: status_html(f"Could not open the link's trace: {exc}.", "warn")}
        return shown | {self.shipped: path} | self.open(path)

    def at(self, runs: list[list[dict]], index: int, beside: int, step: int) -> dict:
        beside, step = _paired(runs, index, beside), int(step)
        views = views_at(runs, index, beside, step)
        if beside == ALONE:
            events = views[0].events
            where = f"Event {len(events)} of {len(runs[index])}: {events[-1]['kind'].replace('_', ' ')}."
            return {self.status: status_html(where), self.damage: gr.Plot(visible=False)} | self.panel.fresh(views[0])
        total, _ = steps(runs, index, beside)
        counts = " · ".join(
            f"{v.label} {len(v.tokens)} of {token_count(runs[i])}" for v, i in zip(views, (index, beside))
        )
        return (
            {
                self.status: status_html(f"Token {min(step, total)} of {total}, side by side: {counts}."),
                self.damage: gr.Plot(charts.damage([(v.label, v) for v in views]), visible=True),
            }
            | self.panel.fresh(views[0], with_charts=False)
            | self.other.fresh(views[1])
        )


def _page(runs: list[list[dict]], index: int, beside: int, source: tuple[str, str]) -> str:
    """The page of the runs shown, carrying the whole trace (the slider's step is not kept: a page shows runs
    whole)."""
    name, caption = source
    events = [event for run in runs for event in run]
    return page_file(trace_page(events, name or None, caption, (index, beside)), name or "replay")


def _run_choices(runs: list[list[dict]]) -> list[tuple[str, int]]:
    return [(f"{i + 1}: {RunView.of(run[:1]).label}", i) for i, run in enumerate(runs)]


def _beside_choices(runs: list[list[dict]]) -> list[tuple[str, int]]:
    return [("nothing: this run alone", ALONE), *_run_choices(runs)]
