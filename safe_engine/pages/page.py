"""Runs as one self-contained HTML page: no server, no network, the trace inside it.

A page shows a run (`run_page`), a what-if branch beside the run it branched from (`branch_page`), two runs of
one trace side by side (`pair_page`, what Replay shows) or a comparison (`comparison_page`), drawn by the same
renderers as the app: the legend, each run's metrics and coloured transcript with the hover tip on every token,
and the click-to-pin details of every token, rendered here in advance (one <template> each, shown by the page's
small script on a click or Enter) so a page and the app never drift apart. Charts are the app's Plotly figures,
drawn by plotly.js, included once. The trace rides in the page as a data block with a download link, and
`read_trace` reads it back, so Replay opens a page as it opens a JSONL trace.

Nothing from a trace runs: every string in the markup was escaped by the renderers, the data blocks are JSON with
`<` written as \\u003c, and the page's Content-Security-Policy lets only its two scripts run (by their hashes) and
lets the page fetch nothing.

`render(events)` is the one call a library user needs: one run's events give a run page, several runs give a
comparison. A `Page` shows itself compactly in Jupyter (`_repr_html_`: transcript and metrics, details on hover).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.utils import PlotlyJSONEncoder

from ..contract.events import EVENT_TYPES, Event
from ..orchestration.comparison import summarize
from . import charts
from .comparison import measured_html, metrics_frame
from .text import esc, quoted
from .traces import ALONE, TraceError, default_pair, split_runs, trace_element
from .transcript import details_html, legend_html, metrics_html, run_card_html, transcript_html
from .view import RunView, first_difference

HERE = Path(__file__).resolve().parent
STYLE = HERE / "style.css"  # the runs' rules, which the app loads too
HINT = "Hover a token for what happened to it; click it (or focus it and press Enter) to pin its details."


@cache
def _asset(name: str) -> str:
    return get_plotlyjs() if name == "plotly.js" else (HERE / name).read_text(encoding="utf-8")


def csp(scripts: Iterable[str]) -> str:
    """Only the page's own scripts run (by hash), and the page loads nothing from anywhere."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode("utf-8")).digest()).decode() + "'" for s in scripts
    )
    return (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src data: blob:; "
        "font-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'"
    )


def _data(value) -> str:
    """JSON for a data block: `<` as \\u003c (still JSON), so no string in it can end the block."""
    return json.dumps(value, cls=PlotlyJSONEncoder, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


@dataclass(frozen=True)
class Page:
    """One page: `html()` is the document, `save(path)` writes it; in Jupyter it shows its runs compactly."""

    title: str
    body: str  # the page's sections, markup made by the renderers
    summary: str  # transcript and metrics only: what a notebook shows
    events: list[dict]  # the trace the page carries
    figures: dict[str, go.Figure] = field(default_factory=dict)  # chart key → figure, drawn where data-figure names it
    caption: str = ""
    name: str = "trace"  # the downloaded trace's file name, without .jsonl

    def html(self) -> str:
        plotly, script = _asset("plotly.js"), _asset("page.js")
        figures = {key: fig.to_plotly_json() for key, fig in self.figures.items()}
        caption = f'<p class="caption">{esc(self.caption)}</p>' if self.caption else ""
        return (
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp([plotly, script])}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(self.title)}</title><style>{_asset('style.css')}{_asset('page.css')}</style></head>"
            f"<body><main><header><h1>{esc(self.title)}</h1>{caption}<p>{esc(HINT)} "
            f'<a id="trace-link" download="{esc(self.name)}.jsonl">Download the trace (JSONL)</a>: the app\'s '
            "Replay tab opens it, or this page.</p></header>"
            f"{legend_html()}{self.body}"
            "<footer>Made with SAFE Ensemble Studio. This file needs no server and no network.</footer></main>"
            f"{trace_element(self.events)}"
            f'<script type="application/json" id="safe-figures">{_data(figures)}</script>'
            f"<script>{plotly}</script><script>{script}</script></body></html>"
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.html(), encoding="utf-8")
        return path

    def _repr_html_(self) -> str:
        return f'<div class="safe-page"><style>{_asset("style.css")}</style>{legend_html()}{self.summary}</div>'


# ---------------------------------------------------------------- sections
def _details(key: str, view: RunView, heading: str = "") -> str:
    """Every token's pinned details, rendered now; the page shows one when its token is clicked."""
    return "".join(
        f'<template id="{key}-t{t.index}"' + ("" if t.point is None else f' data-point="{t.point}"') + ">"
        f"{heading}{details_html(view, t.index)}</template>"
        for t in view.tokens
    )


def _chart(key: str, figure: go.Figure, figures: dict) -> str:
    figures[key] = figure
    return f'<div class="chart" id="{key}" data-figure="{key}"></div>'


def _run(key: str, view: RunView, heading: str, figures: dict, with_charts: bool = True) -> str:
    """One run as the app's panel shows it: metrics, transcript, pinned details and (`with_charts`) the four
    charts, the union chart following the pinned token's ensemble point."""
    attrs = f'class="run" data-run="{key}" data-details="{key}-details"'
    drawn = ""
    if with_charts:
        for point in range(len(view.points)):
            figures[f"{key}-u{point}"] = charts.union(view, point)
        attrs += f' data-union="{key}-union"'
        drawn = (
            '<div class="charts">'
            + _chart(f"{key}-timeline", charts.timeline(view), figures)
            + _chart(f"{key}-progress", charts.progress(view), figures)
            + _chart(f"{key}-union", charts.union(view), figures)
            + _chart(f"{key}-split", charts.time_split(view), figures)
            + "</div>"
        )
    return (
        f"<section {attrs}><h2>{esc(heading)}</h2>{metrics_html(view)}"
        f'<div class="transcript">{transcript_html(view)}</div>'
        f'<div class="run-details" id="{key}-details">{details_html(view, None)}</div>'
        f"{_details(key, view)}{drawn}</section>"
    )


def _summary(views: Iterable[tuple[str, RunView]]) -> str:
    return "".join(
        f"<h3>{esc(heading)}</h3>{metrics_html(view)}"
        f'<div class="transcript">{transcript_html(view, pinnable=False)}</div>'
        for heading, view in views
    )


# ---------------------------------------------------------------- events in, pages out
def _dicts(events: Iterable[Event | dict]) -> list[dict]:
    return [e.to_dict() if isinstance(e, Event) else e for e in events]


def _title(view: RunView) -> str:
    return f"{view.label} · {len(view.tokens)} tokens"


def run_page(events: Iterable[Event | dict], title: str | None = None, caption: str = "") -> Page:
    """One run (a Live run, a single-run trace) with its four charts."""
    events = _dicts(events)
    view = RunView.of(events)
    figures: dict = {}
    body = _run("r0", view, view.label, figures)
    title = title or _title(view)
    return Page(title, body, _summary([(view.label, view)]), events, figures, caption, f"{view.label}-trace")


def pair_page(
    first: Iterable[Event | dict],
    second: Iterable[Event | dict],
    title: str | None = None,
    caption: str = "",
    headings: tuple[str, str] | None = None,
    mark_difference: bool = False,
    name: str = "pair-trace",
) -> Page:
    """Two runs side by side with one damage chart (Replay's pair); `mark_difference` marks the first token
    where they differ in both transcripts (a what-if branch and its origin)."""
    events = [_dicts(first), _dicts(second)]
    views = [RunView.of(run) for run in events]
    if mark_difference:
        views[0].diverge = views[1].diverge = first_difference(*views)
    headings = headings or (views[0].label, views[1].label)
    figures: dict = {}
    body = (
        '<div class="runs">'
        + "".join(_run(f"r{i}", v, h, figures, with_charts=False) for i, (v, h) in enumerate(zip(views, headings)))
        + "</div>"
        + _chart("damage", charts.damage(list(zip(headings, views))), figures)
    )
    title = title or " beside ".join(f"{h} ({len(v.tokens)} tokens)" for h, v in zip(headings, views))
    summary = _summary(zip(headings, views))
    return Page(title, body, summary, events[0] + events[1], figures, caption, name)


def branch_page(original: Iterable[Event | dict], branch: Iterable[Event | dict], caption: str = "") -> Page:
    """A what-if branch beside the run it branched from, the first difference marked in both."""
    original, branch = _dicts(original), _dicts(branch)
    forced = next((t for t in RunView.of(branch).tokens if t.decision == "forced"), None)
    before = RunView.of(original).tokens
    if forced is not None and forced.index < len(before):
        title = (
            f"What-if: {quoted(forced.text)} at token #{forced.index} instead of {quoted(before[forced.index].text)}"
        )
    else:
        title = "What-if branch beside its original run"
    return pair_page(original, branch, title, caption, ("original", "what-if"), True, "what-if-trace")


def comparison_page(
    runs: Mapping[str, Iterable[Event | dict]] | Iterable[Iterable[Event | dict]],
    title: str | None = None,
    caption: str = "",
) -> Page:
    """Every run of a comparison side by side (a click pins a token's details below them), the damage chart,
    what the comparison measured, the metrics of each finished run and its latency / E/T chart."""
    runs = runs.values() if isinstance(runs, Mapping) else runs
    events = [_dicts(run) for run in runs]
    views = {}
    for run in events:
        view = RunView.of(run)
        views[view.label] = view
    figures: dict = {}
    cards = "".join(
        f'<div data-run="r{i}" data-details="cmp-details">{run_card_html(view, pinnable=True)}'
        f"{_details(f'r{i}', view, f'<h3>{esc(label)}</h3>')}</div>"
        for i, (label, view) in enumerate(views.items())
    )
    body = (
        f'<div class="cmp-grid">{cards}</div>'
        f'<div class="run-details" id="cmp-details">{details_html(RunView(), None)}</div>'
        + _chart("damage", charts.damage(list(views.items())), figures)
    )
    finished = [run for run in events if any(e["kind"] == "run_finished" for e in run)]
    summaries = [
        summarize([_event(e) for e in run if e["kind"] in ("run_started", "run_finished")], RunView.of(run).label)
        for run in finished
    ]
    if summaries:
        drafter = summaries[-1]["drafter"]
        table = metrics_frame(summaries, views, drafter).drop(columns="text")
        body += (
            measured_html(summaries, views, drafter)
            + '<div class="table-wrap">'
            + table.to_html(index=False, escape=True, na_rep="—", classes="metrics-table", border=0)
            + "</div>"
            + _chart("bars", charts.compare_bars(summaries), figures)
        )
    title = title or "Comparison: " + ", ".join(views)
    return Page(
        title, body, _summary(views.items()), [e for run in events for e in run], figures, caption, "comparison-trace"
    )


def _event(event: dict) -> Event:
    """A trace's dict as the engine's event again (`summarize` reads events)."""
    return EVENT_TYPES[event["kind"]](**{k: v for k, v in event.items() if k != "kind"})


def trace_page(
    events: Iterable[Event | dict],
    title: str | None = None,
    caption: str = "",
    shown: tuple[int, int] | None = None,
) -> Page:
    """A trace as Replay shows it: the runs `shown` (a run index, and the one beside it or ALONE), by default
    its one run, or two side by side (per-token beside SAFE when it holds both, else its first two). The page
    carries the whole trace, every run of it."""
    events = _dicts(events)
    runs = split_runs(events)
    first, second = shown or default_pair(runs)
    if second == ALONE:
        page = run_page(runs[first], title, caption)
    else:
        page = pair_page(runs[first], runs[second], title, caption)
    return replace(page, events=events, name="trace")


def render(events: Iterable[Event | dict | tuple[str, Event]], title: str | None = None, caption: str = "") -> Page:
    """The page of a run's events (from `decode`, or a trace's dicts), or of several runs' (a trace of a
    comparison, or `run_comparison`'s (label, event) pairs): a comparison page."""
    items = list(events)
    if items and isinstance(items[0], tuple):
        grouped: dict[str, list] = {}
        for label, event in items:
            grouped.setdefault(label, []).append(event)
        return comparison_page(grouped, title, caption)
    runs = split_runs(_dicts(items))
    if not runs:
        raise TraceError("there are no events to render")
    return run_page(runs[0], title, caption) if len(runs) == 1 else comparison_page(runs, title, caption)
