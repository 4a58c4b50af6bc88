"""The "Benchmark" tab: shipped or uploaded task sets × strategies through the bench harness, with progress,
a summary table and the report's charts updating as runs finish; or a previous ``bench --out`` folder shown.

The folder is the same one the CLI writes (results.jsonl, run.json, summary.csv, report.html), so a run
here resumes one started there and the other way round.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr
import pandas as pd

from safe_engine.bench import (
    STYLES,
    Bench,
    Example,
    builtin_tasks,
    load_results,
    load_settings,
    load_task,
    strategy_labels,
)
from safe_engine.bench.report import REPORT, SUMMARY, report_figures, summary_table, write_report
from safe_engine.contract.errors import ConfigError, SafeEngineError
from safe_engine.models.specs import resolve_spec
from safe_engine.pages import charts
from safe_engine.pages.transcript import status_html
from safe_engine.strategies.decoding import DecodeConfig

from . import settings
from .option_widgets import widget
from .run_stream import MODELS_QUEUE, Runner, problem

STRATEGIES = ("singles", "single", "byte-level", "per-token", "safe")
FIGURES = {
    "accuracy": "Accuracy per strategy",
    "e_t": "Tokens ensembled (E/T) per task",
    "latency": "Latency vs output length",
    "examples": "Per example: E/T vs relative wall time",
}
MAX_LIMIT = 1000
DEFAULT_OUT = "out/bench-app"
READY = "Pick task sets and strategies, then press Run; or show a folder an earlier run (here or `bench --out`) wrote."


@dataclass(frozen=True)
class Plan:
    specs: list[str]
    config: DecodeConfig
    labels: list[str]
    examples: list[Example]
    out_dir: Path
    style: str


def plan(
    tasks: list[str] | None,
    upload: str | None,
    strategies: list[str] | None,
    limit,
    max_new_tokens,
    style: str,
    out_dir: str,
    live: settings.RunSettings,
) -> Plan:
    """The bench form plus the Live tab's (whose strategy and length this tab sets itself), checked before
    anything loads; raises a SafeEngineError the page can show as is."""
    sources = [*(tasks or []), *([upload] if upload else [])]
    if not sources:
        raise ConfigError("no task set chosen: pick a shipped one or upload a JSONL file")
    if not strategies:
        raise ConfigError("no strategy chosen")
    if limit is None or limit != int(limit) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigError(f"the limit must be a whole number from 1 to {MAX_LIMIT}")
    strategy = "safe" if {"per-token", "safe"} & set(strategies) else "single"
    specs, config = settings.decoding(replace(live, strategy=strategy, max_new_tokens=max_new_tokens))
    labels = strategy_labels(strategies, [resolve_spec(spec).short_name for spec in specs], config.drafter)
    examples = [e for source in sources for e in load_task(source, int(limit))]
    names = list(dict.fromkeys(e.task for e in examples))
    if len(names) < len(sources):
        raise ConfigError("two task sets share a name: rename the uploaded file")
    return Plan(specs, config, labels, examples, folder(out_dir), style)


def folder(text: str | None) -> Path:
    """The folder a path typed in the page names (relative to where the app runs)."""
    if not (text or "").strip():
        raise ConfigError("the output folder is empty")
    return Path(text.strip()).expanduser()


def folder_view(out: Path) -> tuple[pd.DataFrame, dict, str]:
    """A bench folder → (summary table, figures, one-line description); ConfigError when it is not one."""
    if not out.is_dir():
        raise ConfigError(f"there is no folder {str(out)!r}")
    try:
        records, drafter = load_results(out), load_settings(out).get("drafter")
        if not records or not drafter:
            raise ConfigError(f"{out} holds no benchmark results (results.jsonl and run.json)")
        table, figures = summary(records, drafter), report_figures(records, drafter)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{out} is not a readable benchmark folder ({type(exc).__name__}: {exc})") from exc
    return table, figures, f"{len(records)} runs in {out}, drafter {drafter}"


def summary(records: list[dict], drafter: str) -> pd.DataFrame:
    return summary_table(records, drafter).round(3)


def progress_line(done: int, total: int, finished_here: int, elapsed_s: float) -> str:
    """'n of total runs' and, once a run finished in this session, an ETA from their mean duration."""
    line = f"{done} of {total} runs"
    if finished_here and done < total:
        line += f", about {_duration(elapsed_s / finished_here * (total - done))} left"
    return line


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def report_files(out_dir: Path, names: tuple[str, str] = (REPORT, SUMMARY)) -> tuple[str | None, str | None]:
    """Copies of the folder's report and table (a bench's report.html and summary.csv by default) in a temp
    folder, which Gradio always serves; None for one not there."""
    copies = Path(tempfile.mkdtemp(prefix="safe-bench-"))
    paths = []
    for name in names:
        source = out_dir / name
        paths.append(shutil.copy(source, copies / name) if source.is_file() else None)
    return paths[0], paths[1]


class BenchmarkTab:
    def __init__(self, runner: Runner, form: settings.Form, *sections: Callable):
        """`sections`: more of the tab, each called inside it with (runner, form, the bench form's inputs:
        task sets, upload, strategies, limit, max new tokens, style), as the Sweep section is."""
        self.runner, self.form = runner, form
        names = builtin_tasks()
        with gr.Tab("Benchmark", id="bench"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    tasks = gr.Dropdown(
                        names, value=names[:1], multiselect=True, label="Shipped task sets", elem_id="bench-tasks"
                    )
                    upload = gr.File(
                        label="…and/or a task file (JSONL: native, GSM8K, MATH500, ARC or MMLU rows)",
                        file_types=[".jsonl"],
                        elem_id="bench-upload",
                    )
                    strategies = gr.CheckboxGroup(
                        list(STRATEGIES),
                        value=["singles", "per-token", "safe"],
                        label="Strategies",
                        info="single: the drafter alone; singles: each model alone",
                        elem_id="bench-strategies",
                    )
                    limit = gr.Number(
                        5, label=f"Examples per task set (1–{MAX_LIMIT})", precision=0, elem_id="bench-limit"
                    )
                    max_new = widget("max_new_tokens", number=True, value=24, elem_id="bench-max-new")
                    style = gr.Radio(
                        list(STYLES),
                        value="direct",
                        label="Prompt style",
                        info="direct: answer only, its first line is scored; cot: step by step",
                        elem_id="bench-style",
                    )
                    self.out = gr.Textbox(
                        DEFAULT_OUT,
                        label="Output folder (a rerun resumes it)",
                        elem_id="bench-out",
                        info="Models and decoding settings come from the Ensemble live tab.",
                    )
                    with gr.Row():
                        run = gr.Button("Run", variant="primary", elem_id="bench-run")
                        stop = gr.Button("Stop", variant="stop", elem_id="bench-stop")
                    show = gr.Button("Show this folder's report", elem_id="bench-show")
                    with gr.Row():
                        self.html = gr.DownloadButton("Report (HTML)", interactive=False, elem_id="bench-report")
                        self.csv = gr.DownloadButton("Summary (CSV)", interactive=False, elem_id="bench-csv")
                with gr.Column(scale=3):
                    self.status = gr.HTML(status_html(READY), elem_id="bench-status")
                    with gr.Column(visible=False) as self.tables:  # opened when there are results to show
                        self.table = gr.Dataframe(
                            label="Summary per task and strategy", interactive=False, elem_id="bench-table"
                        )
                    self.plots = {}
                    for pair in (("accuracy", "e_t"), ("latency", "examples")):
                        with gr.Row():
                            for name in pair:
                                self.plots[name] = gr.Plot(
                                    charts.placeholder(FIGURES[name], "appears when runs finish"),
                                    show_label=False,
                                    elem_id=f"bench-{name.replace('_', '-')}",
                                )
            for section in sections:
                section(runner, form, [tasks, upload, strategies, limit, max_new, style])
        results = [self.status, self.tables, self.table, *self.plots.values(), self.html, self.csv]
        run.click(
            self.run,
            [tasks, upload, strategies, limit, max_new, style, self.out, *form.inputs],
            results,
            api_name="bench",
            **MODELS_QUEUE,
        )
        runner.stop_button(stop, api_visibility="private")
        show.click(self.show, [self.out], results, api_visibility="private")

    def show(self, out_dir: str) -> dict:
        try:
            out = folder(out_dir)
            table, figures, where = folder_view(out)
        except SafeEngineError as exc:
            return problem(self.status, exc, "show the folder")
        return {self.status: status_html(f"Showing {where}.")} | self._shown(table, figures) | self._downloads(out)

    def run(self, request: gr.Request, tasks, upload, strategies, limit, max_new, style, out_dir, *values):
        records: list[dict] = []
        bench: Bench | None = None
        resumed, started = 0, 0.0  # runs already in the folder; when this session's runs began

        def check():
            chosen = plan(tasks, upload, strategies, limit, max_new, style, out_dir, self.form.read(values))
            return chosen.specs, chosen

        def start(models, chosen: Plan, flag):
            nonlocal bench, resumed, started
            bench = Bench(models, chosen.examples, chosen.config, chosen.labels, chosen.out_dir, chosen.style)
            records.extend(load_results(chosen.out_dir))
            resumed, started = bench.done, time.monotonic()
            first = {
                self.status: status_html(f"Running: {progress_line(bench.done, bench.total, 0, 0)}…", "busy"),
                self.html: gr.DownloadButton(interactive=False),
                self.csv: gr.DownloadButton(interactive=False),
            }
            return bench.run(flag), first

        def step(record: dict, pace) -> dict:
            records.append(record)
            line = progress_line(bench.done, bench.total, bench.done - resumed, time.monotonic() - started)
            figures = report_figures(records, bench.drafter) if pace.charts() else None
            running = f"Running: {line}. Last: {record['task']}/{record['id']} {record['strategy']}."
            return {self.status: status_html(running, "busy")} | self._shown(summary(records, bench.drafter), figures)

        def finish(broke_off: str | None, stopped: bool) -> dict:
            where = bench.out_dir
            if broke_off is None:
                outcome = status_html(
                    f"{'Stopped' if stopped else 'Done'}: {bench.done} of {bench.total} runs in {where}."
                )
            else:
                outcome = status_html(
                    f"The benchmark broke off: {broke_off}. Finished runs are kept in {where}.", "error"
                )
            if not records:
                return {self.status: outcome}
            write_report(where)
            table, figures, _ = folder_view(where)
            return {self.status: outcome} | self._shown(table, figures) | self._downloads(where)

        yield from self.runner.stream(
            request.session_hash, self.status, "start the benchmark", check, start, step, finish
        )

    def _shown(self, table: pd.DataFrame, figures: dict | None) -> dict:
        return {self.tables: gr.Column(visible=True), self.table: table} | (
            {self.plots[name]: figures[name] for name in self.plots} if figures else {}
        )

    def _downloads(self, out_dir: Path) -> dict:
        html, csv = report_files(out_dir)
        return {
            self.html: gr.DownloadButton(value=html, interactive=html is not None),
            self.csv: gr.DownloadButton(value=csv, interactive=csv is not None),
        }
