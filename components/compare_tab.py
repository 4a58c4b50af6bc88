"""The "Compare" tab: one prompt through each model alone, per-token and SAFE, side by side, with the
drafter's context damage charted per commit, a metrics table with damage and degeneration (CSV download),
a latency / E/T chart, how the mechanism works, and what this comparison measured, in its own numbers."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
import pandas as pd

from safe_engine.orchestration.comparison import ratios, run_comparison, summarize
from safe_engine.pages import charts
from safe_engine.pages.text import esc
from safe_engine.pages.transcript import compare_html, degeneration_text, legend_html, status_html
from safe_engine.pages.view import RunView, save_trace
from safe_engine.run.damage import degenerate
from safe_engine.strategies.decoding import DecodeConfig

from . import settings
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
   mean probability is above 0.5, a greedy ensemble could not change the token, so SAFE keeps the
   draft (green).

Only the remaining positions are ensembled (blue, or yellow where the ensemble replaced the draft).
What that costs and what it avoids on *this* prompt is measured on the right, under the columns.
"""


NOT_MEASURED = (
    '<p class="empty-state">What this comparison measured and a table of metrics per run appear here as the runs '
    "finish.</p>"
)


class CompareTab:
    def __init__(self, runner: Runner, form: settings.Form, examples: list[dict]):
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
                    gr.Examples(
                        [[e["prompt"]] for e in examples], [self.prompt], example_labels=[e["label"] for e in examples]
                    )
                    with gr.Row():
                        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
                        stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
                    with gr.Row():
                        self.csv = gr.DownloadButton("Metrics (CSV)", interactive=False, elem_id="compare-csv")
                        self.trace = gr.DownloadButton("Traces (JSONL)", interactive=False, elem_id="compare-trace")
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
            return {
                self.status: outcome,
                self.grid: compare_html(list(views.values())),
                self.trace: gr.DownloadButton(value=save_trace(events, "comparison-trace"), interactive=True),
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


def metrics_frame(summaries: list[dict], views: dict[str, RunView], drafter: str) -> pd.DataFrame:
    """One row per finished run; time relative to the drafter alone once that run is in; damage columns
    empty for runs recorded before the engine measured damage."""
    relative = ratios(summaries, drafter) if any(s["label"] == f"single:{drafter}" for s in summaries) else {}
    rows = []
    for s in summaries:
        damage = views[s["label"]].damage_summary() or {}
        degeneration = damage.get("degeneration") or {}
        kl = damage.get("kl_mean")
        rows.append(
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
                "drafter non-canonical": damage.get("non_canonical"),
                "drafter non-canonical max": damage.get("non_canonical_max"),
                "KL mean (nats)": None if kl is None else round(kl, 4),
                "OOV-like predictions": damage.get("oov_like_predictions"),
                "degenerated": None if not degeneration else ("yes" if degenerate(degeneration) else "no"),
                "repeated 4-gram rate": _rounded(degeneration.get("repeated_4gram_rate")),
                "longest token run": degeneration.get("longest_token_run"),
                "longest line run": degeneration.get("longest_line_run"),
                "whitespace share": _rounded(degeneration.get("whitespace_share")),
                "U+FFFD": degeneration.get("replacement_chars"),
                "stop": s["stop_reason"],
                "text": s["text"],
            }
        )
    return pd.DataFrame(rows)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def measured_html(summaries: list[dict], views: dict[str, RunView], drafter: str) -> str:
    """What this comparison measured, in sentences built from its numbers only (finished runs)."""
    by = {s["label"]: s for s in summaries}
    relative = ratios(summaries, drafter) if f"single:{drafter}" in by else {}
    lines = []
    for label, name in (("safe", "SAFE"), ("per-token", "Per-token")):
        if label not in by:
            continue
        s = by[label]
        line = f"<b>{name}</b> ensembled {s['ensembled']} of {s['tokens']} tokens (E/T {s['e_t']:.0%})"
        if label in relative:
            base = by[f"single:{drafter}"]["wall_s"]
            line += (
                f" and took {relative[label]:.2f}× the wall time of {esc(drafter)} alone"
                f" ({s['wall_s']:.1f} s vs {base:.1f} s)"
            )
        lines.append(line + ".")
    damage = {label: views[label].damage_summary() for label in ("per-token", "safe") if label in by}
    if len(damage) == 2 and None not in damage.values():
        lines += _damage_sentences(damage["per-token"], damage["safe"], drafter)
    if not lines:
        return ""
    items = "".join(f"<li>{line}</li>" for line in lines)
    return f'<div class="measured"><h3>What this comparison measured</h3><ul>{items}</ul></div>'


def _damage_sentences(per_token: dict, safe: dict, drafter: str) -> list[str]:
    """Per-token's and SAFE's damage side by side, then a verdict worded from how the two compare (count of
    non-canonical context tokens at the worst point plus OOV-like predictions), never a general claim."""

    def kl(d: dict) -> str:
        if d["kl_sampled"]:
            return f"{d['kl_mean']:.3f} nats (mean of {d['kl_sampled']} measured steps, max {d['kl_max']:.3f})"
        return "none, its context stayed canonical" if d["non_canonical_max"] == 0 else "not measured"

    lines = [
        f"{esc(drafter)}'s context ended with {per_token['non_canonical']} non-canonical tokens under per-token "
        f"(at most {per_token['non_canonical_max']}) and {safe['non_canonical']} under SAFE "
        f"(at most {safe['non_canonical_max']}).",
        f"Conditioning damage (KL to the canonical context): per-token {kl(per_token)}; SAFE {kl(safe)}.",
        f"OOV-like predictions: per-token {per_token['oov_like_predictions']}, SAFE {safe['oov_like_predictions']}.",
    ]
    if per_token["degeneration"] is not None and safe["degeneration"] is not None:
        lines.append(
            f"Degeneration: per-token {esc(degeneration_text(per_token['degeneration']))}; "
            f"SAFE {esc(degeneration_text(safe['degeneration']))}."
        )
    hurt = {
        name: d["non_canonical_max"] + d["oov_like_predictions"]
        for name, d in (("per-token", per_token), ("safe", safe))
    }
    if hurt["per-token"] == hurt["safe"] == 0:
        lines.append(
            "On this prompt neither ensemble left a non-canonical context or made an OOV-like prediction; "
            "prompts where the tokenizers cut words differently (rare names, code) are where they can differ."
        )
    elif hurt["safe"] == 0:
        lines.append("Here SAFE avoided the damage per-token ensembling did.")
    elif hurt["safe"] < hurt["per-token"]:
        lines.append("Here SAFE left less of this damage than per-token ensembling, but not none.")
    else:
        lines.append("Here SAFE was not less damaged than per-token ensembling.")
    return lines
