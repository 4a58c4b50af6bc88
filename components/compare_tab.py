"""The "Compare" tab: one prompt through each model alone, per-token and SAFE, side by side, with the
drafter's context damage charted per commit, a metrics table with damage and degeneration (CSV download),
a latency / E/T chart, how the mechanism works, and what this comparison measured, in its own numbers."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import gradio as gr

from safe_engine.orchestration.comparison import run_comparison, summarize
from safe_engine.pages import charts
from safe_engine.pages.comparison import measured_html, metrics_frame
from safe_engine.pages.page import comparison_page
from safe_engine.pages.traces import save_trace
from safe_engine.pages.transcript import compare_html, legend_html, status_html
from safe_engine.pages.view import RunView
from safe_engine.strategies.decoding import DecodeConfig

from . import settings
from .downloads import page_file
from .examples import Examples, gallery
from .run_stream import MODELS_QUEUE, Runner

DEFAULTS = DecodeConfig()
EXPLANATION = f"""
### Why per-token ensembling can fail, and what SAFE checks

**Different tokenizers cut the same text differently.** A rare name may be one token for one model
and several pieces for another. Per-token ensembling commits *one* piece at every step and makes every
other model continue from it. If that piece ends where a model's own tokenizer would never end a
token, the model has to predict from a position that is not one of its token boundaries (an
**OOV-like** prediction; dashed outline in the per-token column). The drafter keeps the ids it
appended, so its context can become **non-canonical**: ids its own tokenizer would never produce for
that text. How far that moves its next-token distribution is the **KL** to the distribution after its
own tokenization. Where this damage piles up, outputs can drift or repeat (the degeneration columns).

**SAFE ensembles only where it is safe and needed.** The drafter drafts a few tokens (by default up to
{DEFAULTS.lookahead}, stopping right after one it gave p < {DEFAULTS.draft_gate}, the draft gate). Then, for
each drafted token, SAFE checks two things:

1. **Is it safe?** Every verifier's own tokenization of the same text must have a token boundary
   just before the drafted token. If not, ensembling there would be an OOV-like prediction, so SAFE
   skips it (dashed outline).
2. **Is it needed?** If every verifier's top choice is its own next token (unanimity), or the models'
   mean probability is above the consensus threshold ({DEFAULTS.consensus_threshold} unless set; from ½ up a greedy
   ensemble could not change the token), SAFE keeps the draft (green).

Only the remaining positions are ensembled (blue, or yellow where the ensemble replaced the draft).
What that costs and what it avoids on *this* prompt is measured on the right, under the columns.
"""


NOT_MEASURED = (
    '<p class="empty-state">What this comparison measured and a table of metrics per run appear here as the runs '
    "finish.</p>"
)


class CompareTab:
    def __init__(self, runner: Runner, form: settings.Form, examples: Examples):
        self.runner, self.form = runner, form
        with gr.Tab("Compare", id="compare"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    self.prompt = gr.Textbox(
                        label="Prompt",
                        lines=3,
                        max_lines=12,
                        elem_id="compare-prompt",
                        info="Uses the models and settings of the Ensemble live tab.",
                    )
                    gallery(examples.compare, examples.cannot_show, self.prompt)
                    with gr.Row():
                        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
                        stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
                    with gr.Row():
                        self.csv = gr.DownloadButton("Metrics (CSV)", interactive=False, elem_id="compare-csv")
                        self.trace = gr.DownloadButton("Traces (JSONL)", interactive=False, elem_id="compare-trace")
                        self.page = gr.DownloadButton("Download page (HTML)", interactive=False, elem_id="compare-page")
                    gr.Markdown(EXPLANATION)
                with gr.Column(scale=3):
                    self.status = gr.HTML(
                        status_html("Press Compare to run each model alone, per-token and SAFE on one prompt."),
                        elem_id="compare-status",
                    )
                    gr.HTML(legend_html())
                    self.grid = gr.HTML(compare_html([]), elem_id="compare-grid")
                    self.damage = gr.Plot(charts.damage([]), show_label=False, elem_id="compare-damage")
                    self.measured = gr.HTML(NOT_MEASURED, elem_id="compare-measured")
                    with gr.Column(visible=False) as self.tables:  # opened when the first run finishes
                        self.table = gr.Dataframe(label="Metrics", interactive=False, elem_id="compare-table")
                    self.bars = gr.Plot(charts.compare_bars([]), show_label=False, elem_id="compare-bars")
        run.click(
            self.run,
            [self.prompt, *form.inputs],
            [
                self.status,
                self.grid,
                self.damage,
                self.measured,
                self.tables,
                self.table,
                self.bars,
                self.csv,
                self.trace,
                self.page,
            ],
            api_name="compare",
            **MODELS_QUEUE,
        )
        runner.stop_button(stop, api_visibility="private")

    def run(self, request: gr.Request, prompt: str, *values):
        runs: dict[str, list] = {}
        views: dict[str, RunView] = {}
        drafter = ""

        def start(models, config: DecodeConfig, flag):
            nonlocal drafter
            drafter = models[config.drafter].name
            first = {
                self.status: status_html("Comparing: each model alone, then per-token, then SAFE…", "busy"),
                self.grid: compare_html([]),
                self.damage: charts.damage([]),
                self.measured: NOT_MEASURED,
                self.csv: gr.DownloadButton(interactive=False),
                self.trace: gr.DownloadButton(interactive=False),
                self.page: gr.DownloadButton(interactive=False),
            }
            return _until_stopped(run_comparison(models, prompt, config, flag), flag), first

        def step(item, pace) -> dict | None:
            label, event = item
            runs.setdefault(label, []).append(event)
            views.setdefault(label, RunView()).add(event.to_dict())
            if event.kind == "run_finished":
                return {self.grid: compare_html(list(views.values()))} | self._results(runs, views, drafter)
            if event.kind == "text_committed" and pace.charts():
                return {self.grid: compare_html(list(views.values())), self.damage: charts.damage(list(views.items()))}
            return None

        def finish(broke_off: str | None, stopped: bool) -> dict:
            if broke_off is not None:
                outcome = status_html(f"The comparison broke off: {broke_off}. Finished runs are kept.", "error")
            else:
                outcome = status_html(
                    "Stopped." if stopped else "Done. Hover a token in any column for what happened to it."
                )
            events = [e.to_dict() for label_events in runs.values() for e in label_events]
            page = page_file(comparison_page(runs), "comparison-page")
            return {
                self.status: outcome,
                self.grid: compare_html(list(views.values())),
                self.trace: gr.DownloadButton(value=save_trace(events, "comparison-trace"), interactive=True),
                self.page: gr.DownloadButton(value=page, interactive=True),
            } | self._results(runs, views, drafter)

        def check():
            return settings.build(prompt, self.form.read(values))

        yield from self.runner.stream(
            request.session_hash, self.status, "start the comparison", check, start, step, finish
        )

    def _results(self, runs: dict[str, list], views: dict[str, RunView], drafter: str) -> dict:
        summaries = [summarize(events, label) for label, events in runs.items() if views[label].finished]
        if not summaries:
            return {}
        frame = metrics_frame(summaries, views, drafter)
        path = Path(tempfile.mkdtemp(prefix="safe-metrics-")) / "comparison-metrics.csv"
        frame.to_csv(path, index=False)
        return {
            self.tables: gr.Column(visible=True),
            self.table: frame,
            self.bars: charts.compare_bars(summaries),
            self.damage: charts.damage(list(views.items())),
            self.measured: measured_html(summaries, views, drafter),
            self.csv: gr.DownloadButton(value=str(path), interactive=True),
        }


def _until_stopped(items: Iterator[tuple[str, object]], flag: threading.Event) -> Iterator[tuple[str, object]]:
    """The comparison's events up to the end of the run Stop ended; the runs after it are not started."""
    for label, event in items:
        yield label, event
        if event.kind == "run_finished" and flag.is_set():
            return
