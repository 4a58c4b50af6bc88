"""A sweep's table as one self-contained page (``report.html``): SVG charts drawn here, no server, no network.

Accuracy against cost per token with the Pareto front and the 95 % intervals as bars; accuracy against the
share of tokens ensembled; for each axis, accuracy and cost as that knob moves with the others at their
defaults (or, when a default is not on the grid, its first value); the single models (and a strategy with
one setting, per-token when no axis moves it) as reference lines. Hovering or focusing a point shows its
settings and numbers; the table sorts by the column clicked. Every string (model names, task names, grid
values) is escaped here; the page's Content-Security-Policy runs only its own script and fetches nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pandas as pd

from ..bench.fronts import cell, write_table
from ..bench.grid import load_manifest
from .page import csp
from .text import esc

REPORT = "report.html"
HERE = Path(__file__).resolve().parent
WIDTH, HEIGHT = 560, 340
LEFT, RIGHT, TOP, BOTTOM = 58, 16, 30, 50
COLOURS = {"per-token": "#d9822b", "safe": "#2b6cd9"}
SINGLE_COLOURS = ("#555555", "#999999", "#333333", "#bbbbbb")
STYLE = """
body{margin:0;color:#222;background:#fff;font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif}
main{max-width:1500px;margin:0 auto;padding:12px 20px 40px}
h1{font-size:22px;margin:4px 0} h2{font-size:17px;margin:18px 0 6px} p{margin:2px 0;font-size:14px}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:10px}
svg{font-size:11px} svg text.title{font-size:13px;font-weight:600}
.axis line,.axis path{stroke:#888} .grid{stroke:#eee}
.mark{stroke:#fff;stroke-width:1} .mark.front{stroke:#000;stroke-width:2} .mark:focus{outline:none;stroke:#000}
.bar{stroke-width:1.5} .front-line{fill:none;stroke:#000;stroke-dasharray:2 3}
.ref{stroke-dasharray:6 4;stroke-width:1.2} .series{fill:none;stroke-width:1.5}
#tip{position:absolute;z-index:9;white-space:pre-line;background:#fffbe6;border:1px solid #aaa;padding:4px 8px;
font-size:12px;pointer-events:none;max-width:420px}
table{border-collapse:collapse;font-size:13px} th,td{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}
th{cursor:pointer;user-select:none;background:#f4f4f4} th[data-sorted=ascending]::after{content:" ▲"}
th[data-sorted=descending]::after{content:" ▼"} td.text{text-align:left} .wrap{overflow-x:auto}
.key span{display:inline-block;margin-right:14px} .key i{display:inline-block;width:10px;height:10px;margin-right:4px}
footer{margin-top:24px;font-size:12px;opacity:.75}
"""


@cache
def _script() -> str:
    return (HERE / "fronts.js").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Mark:
    """One drawn point: where, its interval (None: none), its colour, its hover text, on the front or not."""

    x: float
    y: float
    colour: str
    tip: str
    low: float | None = None
    high: float | None = None
    front: bool = False
    series: str = ""  # marks of one series are joined by a line (per-axis charts)


@dataclass(frozen=True)
class Reference:
    label: str
    y: float
    colour: str


def _finite(*values) -> bool:
    return all(v is not None and isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    span = (high - low) or 1.0
    raw = span / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if raw <= step * m)
    first = math.ceil(low / step) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step + 1e-9) + 1)]


def _number(value: float) -> str:
    return f"{value:.4g}"


def chart(
    title: str,
    x_label: str,
    y_label: str,
    marks: Sequence[Mark],
    references: Sequence[Reference] = (),
    categories: Sequence[str] | None = None,
    y_range: tuple[float, float] | None = None,
    front: bool = False,
    key: str = "",
) -> str:
    """One SVG chart. `categories`: x is a category index (a knob's values, in grid order), else a number;
    `front`: join the marks on the Pareto front, cheapest first."""
    marks = [m for m in marks if _finite(m.x, m.y)]
    ys = [v for m in marks for v in (m.y, m.low, m.high) if _finite(v)] + [r.y for r in references]
    y0, y1 = y_range or (0.0, max(ys, default=1.0) * 1.1 or 1.0)
    if categories is not None:
        x0, x1 = -0.5, len(categories) - 0.5
    else:
        x0, x1 = 0.0, max((m.x for m in marks), default=1.0) * 1.1 or 1.0

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (WIDTH - LEFT - RIGHT)

    def py(y: float) -> float:
        return HEIGHT - BOTTOM - (y - y0) / (y1 - y0) * (HEIGHT - TOP - BOTTOM)

    parts = [f'<text class="title" x="{LEFT}" y="18">{esc(title)}</text>']
    for tick in _ticks(y0, y1):
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(tick):.1f}" y2="{py(tick):.1f}"/>'
            f'<text x="{LEFT - 6}" y="{py(tick) + 4:.1f}" text-anchor="end">{_number(tick)}</text>'
        )
    xs = list(enumerate(categories)) if categories is not None else [(t, _number(t)) for t in _ticks(x0, x1)]
    for x, label in xs:
        parts.append(f'<text x="{px(x):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{esc(str(label))}</text>')
    parts.append(
        f'<g class="axis"><line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM}"/>'
        f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{HEIGHT - BOTTOM}"/></g>'
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 10}" text-anchor="middle">{esc(x_label)}</text>'
        f'<text transform="translate(14 {(TOP + HEIGHT - BOTTOM) / 2}) rotate(-90)" text-anchor="middle">'
        f"{esc(y_label)}</text>"
    )
    for ref in references:
        parts.append(
            f'<line class="ref" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(ref.y):.1f}" y2="{py(ref.y):.1f}" '
            f'stroke="{ref.colour}"><title>{esc(ref.label)}</title></line>'
            f'<text x="{WIDTH - RIGHT - 4}" y="{py(ref.y) - 4:.1f}" text-anchor="end" fill="{ref.colour}">'
            f"{esc(ref.label)}</text>"
        )
    series: dict[tuple[str, str], list[Mark]] = {}
    for m in marks:
        if m.series:
            series.setdefault((m.series, m.colour), []).append(m)
    for (_, colour), joined in series.items():
        points = " ".join(f"{px(m.x):.1f},{py(m.y):.1f}" for m in sorted(joined, key=lambda m: m.x))
        parts.append(f'<polyline class="series" stroke="{colour}" points="{points}"/>')
    if front:
        on_front = sorted((m for m in marks if m.front), key=lambda m: m.x)
        points = " ".join(f"{px(m.x):.1f},{py(m.y):.1f}" for m in on_front)
        parts.append(f'<polyline class="front-line" points="{points}"><title>Pareto front</title></polyline>')
    for m in marks:
        if _finite(m.low, m.high):
            parts.append(
                f'<line class="bar" x1="{px(m.x):.1f}" x2="{px(m.x):.1f}" y1="{py(m.low):.1f}" '
                f'y2="{py(m.high):.1f}" stroke="{m.colour}"/>'
            )
    for m in marks:
        parts.append(
            f'<circle class="mark{" front" if m.front else ""}" cx="{px(m.x):.1f}" cy="{py(m.y):.1f}" r="5.5" '
            f'fill="{m.colour}" tabindex="0" data-tip="{esc(m.tip)}"><title>{esc(m.tip)}</title></circle>'
        )
    return (
        f'<svg class="chart" data-chart="{esc(key)}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" role="img" aria-label="{esc(title)}">{"".join(parts)}</svg>'
    )


# ---------------------------------------------------------------- the sweep's rows as marks
def _colour(strategy: str, singles: Sequence[str]) -> str:
    if strategy in singles:
        return SINGLE_COLOURS[singles.index(strategy) % len(SINGLE_COLOURS)]
    return COLOURS.get(strategy, "#7a3cc2")


def _blank(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _settings(row: dict, axes: Sequence[str]) -> str:
    given = [f"{axis} = {row[axis]}" for axis in axes if not _blank(row[axis])]
    return ", ".join(given) or "every point"


def _tip(row: dict, axes: Sequence[str]) -> str:
    def interval(name: str) -> str:
        return f"{row[name]:.3f} [{row[name + '_low']:.3f}, {row[name + '_high']:.3f}]"

    return "\n".join(
        [
            f"{row['strategy']} · {_settings(row, axes)}",
            f"accuracy {interval('accuracy')} over {row['n']} examples",
            f"gain vs the best single {interval('gain_vs_best_single')}",
            f"tokens ensembled {row['e_t']:.1%} · OOV-like skips {row['oov_skips']} · replaced {row['replaced']}",
            f"{row['s_per_token'] * 1000:.1f} ms per token · {row['ratio_to_drafter']:.2f}× the drafter's time"
            + (" · on the Pareto front" if row["pareto"] else ""),
        ]
    )


def _mark(row: dict, x: float, y: float, axes, singles, interval: bool = True, series: str = "") -> Mark:
    low, high = (row["accuracy_low"], row["accuracy_high"]) if interval else (None, None)
    colour = _colour(row["strategy"], singles)
    return Mark(x, y, colour, _tip(row, axes), low, high, bool(row["pareto"]), series)


def _axis_charts(rows: list[dict], manifest: dict, singles: Sequence[str]) -> str:
    """Per axis: the rows whose other axes sit at their anchors (the default when on the grid, else the first
    value; a blank cell, a knob the strategy does not read, matches any) as marks along the axis, and those that
    do not read this axis either (the singles; per-token for SAFE's knobs) as reference lines."""
    axes, values = manifest["axes"], _grid_values(manifest)
    anchors = {
        axis: cell(manifest["defaults"][axis] if manifest["defaults"][axis] in values[axis] else values[axis][0])
        for axis in axes
    }
    html = []
    for axis in axes:
        cells = [cell(v) for v in values[axis]]
        matching = [r for r in rows if all(_blank(r[a]) or r[a] == anchors[a] for a in axes if a != axis)]
        moved = [r for r in matching if not _blank(r[axis]) and r[axis] in cells]
        refs = [
            Reference(r["strategy"], r["accuracy"], _colour(r["strategy"], singles))
            for r in matching
            if _blank(r[axis]) and _finite(r["accuracy"])
        ]
        others = ", ".join(f"{a} = {anchors[a]}" for a in axes if a != axis)
        accuracy = [_mark(r, cells.index(r[axis]), r["accuracy"], axes, singles, series=r["strategy"]) for r in moved]
        cost = [
            _mark(r, cells.index(r[axis]), r["s_per_token"] * 1000, axes, singles, False, r["strategy"]) for r in moved
        ]
        title = axis + (f" (others: {others})" if others else "")
        html.append(
            f'<h2>As {esc(axis)} moves</h2><div class="charts">'
            + chart(f"Accuracy · {title}", axis, "accuracy", accuracy, refs, cells, (0, 1), key=f"axis-{axis}")
            + chart(f"Cost · {title}", axis, "ms per token", cost, (), cells, key=f"axis-cost-{axis}")
            + "</div>"
        )
    return "".join(html)


def _grid_values(manifest: dict) -> dict[str, list]:
    values: dict[str, list] = {axis: [] for axis in manifest["axes"]}
    for point in manifest["points"]:
        for axis, value in point["values"].items():
            if value not in values[axis]:
                values[axis].append(value)
    return values


def _table(rows: list[dict], columns: Sequence[str], axes: Sequence[str]) -> str:
    head = "".join(f'<th scope="col">{esc(c)}</th>' for c in columns)

    def cell(column: str, value) -> str:
        if _blank(value):
            return '<td data-value=""></td>'
        if isinstance(value, bool):
            return f'<td class="text">{"yes" if value else ""}</td>'
        if isinstance(value, float):
            return f'<td data-value="{value!r}">{value:.3f}</td>'
        css = ' class="text"' if column in axes or column == "strategy" else ""
        return f'<td{css} data-value="{esc(str(value))}">{esc(str(value))}</td>'

    body = "".join("<tr>" + "".join(cell(c, row[c]) for c in columns) + "</tr>" for row in rows)
    return (
        f'<div class="wrap"><table class="sortable" id="sweep-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _rows(table: pd.DataFrame) -> list[dict]:
    return table.astype(object).where(table.notna(), None).to_dict("records")


def _single_references(rows: list[dict], singles: Sequence[str]) -> list[Reference]:
    return [
        Reference(r["strategy"], r["accuracy"], _colour(r["strategy"], singles))
        for r in rows
        if r["strategy"] in singles
    ]


def front_chart(table: pd.DataFrame, manifest: dict) -> str:
    """Accuracy against cost per token, the Pareto front joined and the intervals as bars (the app draws it as
    a sweep's points finish)."""
    rows, axes, singles = _rows(table), manifest["axes"], manifest["singles"]
    marks = [_mark(r, r["s_per_token"] * 1000, r["accuracy"], axes, singles) for r in rows]
    references = _single_references(rows, singles)
    return chart(
        "Accuracy vs cost per token",
        "ms per generated token",
        "accuracy",
        marks,
        references,
        None,
        (0, 1),
        True,
        "front",
    )


def sweep_page(table: pd.DataFrame, manifest: dict) -> str:
    """The report's HTML for a sweep's table and manifest."""
    rows, axes, singles = _rows(table), manifest["axes"], manifest["singles"]
    accuracy_share = [_mark(r, r["e_t"], r["accuracy"], axes, singles) for r in rows]
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    key = "".join(f'<span><i style="background:{_colour(s, singles)}"></i>{esc(s)}</span>' for s in strategies)
    grid = "; ".join(f"{axis}: {', '.join(map(str, v))}" for axis, v in _grid_values(manifest).items())
    script = _script()
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp([script])}">'
        "<title>SAFE sweep</title>"
        f"<style>{STYLE}</style></head><body><main><h1>SAFE sweep: when to ensemble, for this pair</h1>"
        f"<p>Models {esc(', '.join(manifest['models']))}; drafter {esc(manifest['drafter'])}; "
        f"{len(manifest['examples'])} examples; grid {esc(grid)}.</p>"
        "<p>Bars: 95 % bootstrap intervals over examples. A ringed point is on the Pareto front (no other row is "
        "both more accurate and cheaper per token). Hover or focus a point for its settings and numbers; click "
        "a column to sort the table.</p>"
        f'<p class="key">{key}</p>'
        '<div class="charts">'
        + front_chart(table, manifest)
        + chart(
            "Accuracy vs share of tokens ensembled",
            "share of tokens ensembled (E/T)",
            "accuracy",
            accuracy_share,
            _single_references(rows, singles),
            y_range=(0, 1),
            key="share",
        )
        + "</div>"
        + _axis_charts(rows, manifest, singles)
        + "<h2>The table (sweep.csv)</h2>"
        + _table(rows, list(table.columns), axes)
        + "<footer>Made with SAFE Ensemble Studio. This file needs no server and no network.</footer></main>"
        f'<div id="tip" hidden></div><script>{script}</script></body></html>'
    )


def write_report(out_dir) -> pd.DataFrame:
    """Write the sweep folder's ``sweep.csv`` and ``report.html``; return the table."""
    table = write_table(out_dir)
    (Path(out_dir) / REPORT).write_text(sweep_page(table, load_manifest(out_dir)), encoding="utf-8")
    return table
