"""The "Compare" tab: one prompt through each model alone, per-token and SAFE, side by side, with a
metrics table (CSV download), a latency / E/T chart and a plain-language account of what goes wrong."""

from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr
import pandas as pd

from safe_engine.compare import ratios, run_comparison, summarize
from . import charts
from .pool import ModelPool
from .runner import ChartClock, prepare, stopper, user_message
from .stops import Stops
from .transcript import compare_html, legend_html, status_html
from .view import RunView, save_trace

EXPLANATION = """
### Why per-token ensembling fails, and what SAFE checks

**Different tokenizers cut the same text differently.** A rare name may be one token for one model
and several pieces for another. Per-token ensembling commits *one* piece at every step and makes every
other model continue from it. If that piece ends where a model's own tokenizer would never end a
token, the model is now reading a token sequence it never saw in training (an **OOV-like** state).
Its next predictions degrade, the damage piles up, and long answers drift or repeat. In the per-token
column, these positions have a dashed outline.

**SAFE ensembles only where it is safe and useful.** The strongest model drafts a few tokens. Then, for
each drafted token, SAFE checks two things:

1. **Is it safe?** Every verifier's own tokenization of the same text must have a token boundary
   just before the drafted token. If not, ensembling there would create an OOV-like state, so SAFE
   skips it (dashed outline).
2. **Is it needed?** If every verifier's top choice is its own next token (unanimity), or the models'
   mean probability is above 0.5, the ensemble could not change the outcome, so SAFE keeps the draft
   (green).

Only the remaining positions are ensembled (blue, or yellow where the ensemble replaced the draft).
That is a small share of tokens (E/T), which is why SAFE costs about as much as running the drafter alone.
"""


class CompareTab:
    def __init__(self, pool: ModelPool, stops: Stops, form: list, examples: list[dict]):
        self.pool, self.stops = pool, stops
        with gr.Tab("Compare", id="compare"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    self.prompt = gr.Textbox(label="Prompt", lines=3, max_lines=12, elem_id="compare-prompt",
                                             info="Uses the models and settings of the Ensemble live tab.")
                    gr.Examples([[e["prompt"]] for e in examples], [self.prompt], example_labels=[e["label"] for e in examples])
                    with gr.Row():
                        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
                        stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
                    with gr.Row():
                        self.csv = gr.DownloadButton("Metrics (CSV)", interactive=False, elem_id="compare-csv")
                        self.trace = gr.DownloadButton("Traces (JSONL)", interactive=False, elem_id="compare-trace")
                    gr.Markdown(EXPLANATION)
                with gr.Column(scale=3):
                    self.status = gr.HTML(status_html("Press Compare to run each model alone, per-token and SAFE on one prompt."), elem_id="compare-status")
                    gr.HTML(legend_html())
                    self.grid = gr.HTML(compare_html([]), elem_id="compare-grid")
                    self.table = gr.Dataframe(label="Metrics", interactive=False, elem_id="compare-table")
                    self.bars = gr.Plot(charts.compare_bars([]), show_label=False, elem_id="compare-bars")
        run.click(self.run, [self.prompt, *form], [self.status, self.grid, self.table, self.bars, self.csv, self.trace],
                  concurrency_id="models", concurrency_limit=1, api_name="compare")
        stop.click(stopper(stops), None, None, queue=False, api_visibility="private")

    def run(self, request: gr.Request, prompt: str, *form):
        prepared = yield from prepare(self.pool, self.stops, self.status, request.session_hash, prompt, form, "start the comparison")
        if prepared is None:
            return
        config, models, flag = prepared
        drafter = models[config.drafter].name
        runs: dict[str, list] = {}
        views: dict[str, RunView] = {}
        clock = ChartClock()
        yield {self.status: status_html("Comparing: each model alone, then per-token, then SAFE…", "busy"), self.grid: compare_html([]),
               self.csv: gr.DownloadButton(interactive=False), self.trace: gr.DownloadButton(interactive=False)}
        try:
            for label, event in run_comparison(models, prompt, config, flag):
                runs.setdefault(label, []).append(event)
                views.setdefault(label, RunView()).add(event.to_dict())
                if event.kind == "run_finished":
                    yield {self.grid: compare_html(list(views.values()))} | self._results(runs, views, drafter)
                    if flag.is_set():
                        break
                elif event.kind == "text_committed" and clock.due():
                    yield {self.grid: compare_html(list(views.values()))}
            outcome = status_html("Stopped." if flag.is_set() else "Done. Hover a token in any column for what happened to it.")
        except Exception as exc:
            outcome = status_html(f"The comparison broke off: {user_message(exc)}. Finished runs are kept.", "error")
        finally:
            self.stops.disarm(request.session_hash, flag)
        events = [e.to_dict() for label_events in runs.values() for e in label_events]
        yield {self.status: outcome, self.grid: compare_html(list(views.values())),
               self.trace: gr.DownloadButton(value=save_trace(events, "comparison-trace"), interactive=True)} | self._results(runs, views, drafter)

    def _results(self, runs: dict[str, list], views: dict[str, RunView], drafter: str) -> dict:
        summaries = [summarize(events, label) for label, events in runs.items() if views[label].finished]
        if not summaries:
            return {}
        frame = metrics_frame(summaries, views, drafter)
        path = Path(tempfile.mkdtemp(prefix="safe-metrics-")) / "comparison-metrics.csv"
        frame.to_csv(path, index=False)
        return {self.table: frame, self.bars: charts.compare_bars(summaries), self.csv: gr.DownloadButton(value=str(path), interactive=True)}


def metrics_frame(summaries: list[dict], views: dict[str, RunView], drafter: str) -> pd.DataFrame:
    """One row per finished run; time relative to the drafter alone once that run is in."""
    relative = ratios(summaries, drafter) if any(s["label"] == f"single:{drafter}" for s in summaries) else {}
    return pd.DataFrame(
        [
            {
                "run": s["label"],
                "tokens": s["tokens"],
                "E/T": round(s["e_t"], 3),
                "ensembled": s["ensembled"],
                "replaced": s["replaced"],
                "OOV-like skips": sum(s["oov_skips"].values()),
                "OOV-like damage": views[s["label"]].metrics()["damaged"],
                "consensus skips": sum(s["consensus_skips"].values()),
                "wall s": round(s["wall_s"], 2),
                "tokens/s": round(s["tokens_per_s"], 2),
                "× drafter time": round(relative[s["label"]], 2) if s["label"] in relative else None,
                "stop": s["stop_reason"],
                "text": s["text"],
            }
            for s in summaries
        ]
    )
