"""The Benchmark tab's Sweep section: the bench form's task sets, strategies, limit, length and style over a
grid of decoding options (one axis per line, as ``sweep --grid`` takes them) × strategies, with a progress bar
over the grid's runs, the front (accuracy against cost per token) drawn as points finish, and the report and
table to download; or an earlier ``sweep --out`` folder shown. The folder is the CLI's, so either resumes the
other's sweep.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import pandas as pd

from safe_engine.bench.fronts import TABLE, sweep_table
from safe_engine.bench.grid import GridPoint, GridSweep, SweepPlan, load_manifest
from safe_engine.contract.errors import ConfigError, SafeEngineError
from safe_engine.options import DEFAULT_MAX_POINTS, GRID_AXES, grid_points
from safe_engine.pages.fronts import REPORT, front_chart, write_report
from safe_engine.pages.text import esc
from safe_engine.pages.transcript import status_html

from . import settings
from .benchmark_tab import Plan, folder, plan, progress_line, report_files
from .run_stream import MODELS_QUEUE, Runner, problem

DEFAULT_GRID = "lookahead=3,5\nconsensus_threshold=0.5,0.7"
DEFAULT_OUT = "out/sweep-app"
READY = "Give the grid, one axis per line, then press Run sweep; or show a folder `sweep --out` wrote."


@dataclass(frozen=True)
class SweepPlanned:
    bench: Plan
    points: list[GridPoint]
    defaults: dict[str, object]


def plan_sweep(
    tasks, upload, strategies, limit, max_new_tokens, style, grid: str, max_points, out_dir, live: settings.RunSettings
) -> SweepPlanned:
    """The bench form, the grid and the Live tab's settings, checked before anything loads (SafeEngineError)."""
    bench = plan(tasks, upload, strategies, limit, max_new_tokens, style, out_dir, live)
    if max_points is None or max_points != int(max_points) or max_points < 1:
        raise ConfigError("the most points must be a whole number of at least 1")
    base = settings.options(live)
    base.max_new_tokens = bench.config.max_new_tokens
    axes = [line.strip() for line in (grid or "").splitlines() if line.strip()]
    points = grid_points(axes, base, int(max_points))
    return SweepPlanned(bench, points, {axis: getattr(base, axis) for axis in points[0].values})


def progress_html(done: int, total: int, line: str) -> str:
    return f'<progress max="{total}" value="{done}"></progress> {esc(line)}'


class SweepSection:
    def __init__(self, runner: Runner, form: settings.Form, bench_inputs: list):
        self.runner, self.form = runner, form
        with gr.Accordion("Sweep: a grid of settings, the front of accuracy against cost", open=False):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    grid = gr.Textbox(
                        DEFAULT_GRID,
                        lines=3,
                        label="Grid (one axis per line: KEY=V1,V2,...)",
                        info=f"Keys: {', '.join(GRID_AXES)}, method. The task sets, strategies, limit, length "
                        "and style above hold for every point; the other settings come from the Ensemble live tab.",
                        elem_id="sweep-grid",
                    )
                    max_points = gr.Number(
                        DEFAULT_MAX_POINTS, label="At most this many points", precision=0, elem_id="sweep-max"
                    )
                    self.out = gr.Textbox(DEFAULT_OUT, label="Sweep folder (a rerun resumes it)", elem_id="sweep-out")
                    with gr.Row():
                        run = gr.Button("Run sweep", variant="primary", elem_id="sweep-run")
                        stop = gr.Button("Stop", variant="stop", elem_id="sweep-stop")
                    show = gr.Button("Show this sweep folder", elem_id="sweep-show")
                    with gr.Row():
                        self.html = gr.DownloadButton("Report (HTML)", interactive=False, elem_id="sweep-report")
                        self.csv = gr.DownloadButton("Table (CSV)", interactive=False, elem_id="sweep-csv")
                with gr.Column(scale=3):
                    self.status = gr.HTML(status_html(READY), elem_id="sweep-status")
                    self.progress = gr.HTML("", elem_id="sweep-progress")
                    self.front = gr.HTML("", elem_id="sweep-front")
                    self.table = gr.Dataframe(label="The sweep's table", interactive=False, elem_id="sweep-table")
        results = [self.status, self.progress, self.front, self.table, self.html, self.csv]
        run.click(
            self.run,
            [*bench_inputs, grid, max_points, self.out, *form.inputs],
            results,
            api_name="sweep",
            **MODELS_QUEUE,
        )
        runner.stop_button(stop, api_visibility="private")
        show.click(self.show, [self.out], results, api_visibility="private")

    def show(self, out_dir: str) -> dict:
        try:
            out = folder(out_dir)
            update = self._drawn(out)
        except SafeEngineError as exc:
            return problem(self.status, exc, "show the sweep folder")
        return {self.status: status_html(f"Showing the sweep in {out}.")} | update | self._downloads(out)

    def run(
        self, request: gr.Request, tasks, upload, strategies, limit, max_new, style, grid, max_points, out_dir, *values
    ):
        sweep: GridSweep | None = None
        resumed, started = 0, 0.0

        def check():
            chosen = plan_sweep(
                tasks, upload, strategies, limit, max_new, style, grid, max_points, out_dir, self.form.read(values)
            )
            return chosen.bench.specs, chosen

        def start(models, chosen: SweepPlanned, flag):
            nonlocal sweep, resumed, started
            bench = chosen.bench
            names, specs = [m.name for m in models], [m.spec.spec for m in models]
            chat = [m.use_chat_template for m in models]
            common = (bench.examples, bench.config, chosen.defaults, chosen.points, bench.labels, bench.out_dir)
            sweep = GridSweep(models, SweepPlan(names, specs, chat, *common, bench.style))
            resumed, started = sweep.done, time.monotonic()
            first = {
                self.status: status_html("Running the sweep…", "busy"),
                self.progress: progress_html(sweep.done, sweep.total, progress_line(sweep.done, sweep.total, 0, 0)),
                self.html: gr.DownloadButton(interactive=False),
                self.csv: gr.DownloadButton(interactive=False),
            }
            return sweep.run(flag), first

        def step(record: dict, pace) -> dict:
            line = progress_line(sweep.done, sweep.total, sweep.done - resumed, time.monotonic() - started)
            update = {self.progress: progress_html(sweep.done, sweep.total, line)}
            return update | (self._drawn(sweep.out_dir) if pace.charts() else {})

        def finish(broke_off: str | None, stopped: bool) -> dict:
            where = sweep.out_dir
            if broke_off is None:
                outcome = status_html(
                    f"{'Stopped' if stopped else 'Done'}: {sweep.done} of {sweep.total} runs in {where}."
                )
            else:
                outcome = status_html(f"The sweep broke off: {broke_off}. Finished runs are kept in {where}.", "error")
            if not sweep.done:
                return {self.status: outcome}
            write_report(where)
            done = progress_html(sweep.done, sweep.total, f"{sweep.done} of {sweep.total} runs")
            return {self.status: outcome, self.progress: done} | self._drawn(where) | self._downloads(where)

        yield from self.runner.stream(request.session_hash, self.status, "start the sweep", check, start, step, finish)

    def _drawn(self, out: Path) -> dict:
        """The front and the table of what the folder holds so far."""
        try:
            manifest, table = load_manifest(out), sweep_table(out)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{out} is not a readable sweep folder ({type(exc).__name__}: {exc})") from exc
        front = front_chart(table, manifest) if len(table) else ""
        return {self.front: front, self.table: table.round(3) if len(table) else pd.DataFrame()}

    def _downloads(self, out: Path) -> dict:
        html, csv = report_files(out, (REPORT, TABLE))
        return {
            self.html: gr.DownloadButton(value=html, interactive=html is not None),
            self.csv: gr.DownloadButton(value=csv, interactive=csv is not None),
        }
