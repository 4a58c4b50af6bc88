"""Run view → Plotly figures, refreshed while a run streams.

Figures are built as plain dicts and wrapped without validation, an order of magnitude cheaper than the
validating API, which matters because charts are drawn in the thread that is decoding (the tests
validate every figure). An empty template keeps each figure ~1 KB and quick to remount in the browser.
Token text reaches Plotly only through `plot_label`; top-k lists ride in customdata for the hover.
"""

from __future__ import annotations

import plotly.graph_objects as go

from .text import plot_label
from .view import RunView

# Paul Tol "bright": colour-blind safe lines and markers.
BLUE, CYAN, GREEN, YELLOW, RED, PURPLE, GREY = (
    "#4477AA",
    "#66CCEE",
    "#228833",
    "#CCBB44",
    "#EE6677",
    "#AA3377",
    "#BBBBBB",
)
MODEL_COLORS = (BLUE, CYAN, GREEN, YELLOW)
PHASE_COLORS = {"draft": BLUE, "verify": CYAN, "ensemble": PURPLE, "retokenize": YELLOW}


def _figure(title: str, data: list[dict], **layout) -> go.Figure:
    base = {
        "template": {},
        "title": {"text": title, "font": {"size": 14}},
        "height": 340,
        "margin": {"l": 52, "r": 52, "t": 40, "b": 96},
        "legend": {
            "orientation": "h",
            "x": 0,
            "y": -0.3,
            "yanchor": "top",
            "entrywidthmode": "fraction",
            "entrywidth": 0.5,
        },
        "hoverlabel": {"align": "left"},
    }
    return go.Figure({"data": data, "layout": base | layout}, _validate=False)


def placeholder(title: str, note: str = "appears when a run starts") -> go.Figure:
    """A light figure to mount at page load, so the Plotly bundle is parsed before the first run."""
    hidden = {"visible": False}
    return _figure(
        title,
        [],
        xaxis=hidden,
        yaxis=hidden,
        annotations=[
            {
                "text": note,
                "showarrow": False,
                "x": 0.5,
                "y": 0.5,
                "xref": "paper",
                "yref": "paper",
                "font": {"color": "#777"},
            }
        ],
    )


def _top_k_lines(candidates: list[dict]) -> str:
    """A top-k list as hover lines: text and p, one candidate a line."""
    return "<br>".join(f"{plot_label(c['text'])}  {c['p']:.3f}" for c in candidates)


def timeline(view: RunView) -> go.Figure:
    """Per committed token: drafter p, mean p of the verify step, ensemble points and OOV-like positions."""
    if not view.tokens:
        return placeholder("Per-token timeline")
    drafted = [t for t in view.tokens if t.draft]
    verified = [t for t in view.tokens if t.verify and t.verify["mean_p"] is not None]
    ensembled = [t for t in view.tokens if t.point is not None]
    chosen = [
        view.points[t.point]["table"][0] if view.points[t.point]["table"] else {"before": 0, "after": None}
        for t in ensembled
    ]
    flagged = [t for t in view.tokens if t.oov_like_for]
    data = [
        {
            "type": "scatter",
            "name": "drafter p",
            "mode": "lines+markers",
            "line": {"color": BLUE, "width": 1.5},
            "marker": {"size": 5},
            "x": [t.index for t in drafted],
            "y": [t.draft["p"] for t in drafted],
            "customdata": [[plot_label(t.text), _top_k_lines(t.draft["top_k"])] for t in drafted],
            "hovertemplate": (
                "#%{x} %{customdata[0]}<br>drafter p %{y:.3f}<br><br>drafter top-k:<br>%{customdata[1]}<extra></extra>"
            ),
        },
        {
            "type": "scatter",
            "name": "mean p",
            "mode": "markers",
            "marker": {"color": GREEN, "symbol": "diamond", "size": 7},
            "x": [t.index for t in verified],
            "y": [t.verify["mean_p"] for t in verified],
            "customdata": [[plot_label(t.text), t.decision] for t in verified],
            "hovertemplate": "#%{x} %{customdata[0]}<br>mean p %{y:.3f}<br>%{customdata[1]}<extra></extra>",
        },
        {
            "type": "scatter",
            "name": "ensemble point",
            "mode": "markers",
            "marker": {
                "color": PURPLE,
                "symbol": ["star" if t.changed else "star-open" for t in ensembled],
                "size": 11,
                "line": {"width": 1.5, "color": PURPLE},
            },
            "x": [t.index for t in ensembled],
            "y": [r["after"] if r["after"] is not None else r["before"] for r in chosen],
            "customdata": [
                [plot_label(t.text), "replaced the draft" if t.changed else "kept the draft"] for t in ensembled
            ],
            "hovertemplate": "#%{x} %{customdata[0]}<br>ensemble p %{y:.3f}<br>%{customdata[1]}<extra></extra>",
        },
        {
            "type": "scatter",
            "name": "OOV-like",
            "mode": "markers",
            "marker": {"color": RED, "symbol": "x", "size": 9},
            "x": [t.index for t in flagged],
            "y": [0.0] * len(flagged),
            "customdata": [[plot_label(t.text), plot_label(", ".join(t.oov_like_for))] for t in flagged],
            "hovertemplate": "#%{x} %{customdata[0]}<br>OOV-like for %{customdata[1]}<extra></extra>",
        },
    ]
    consensus = {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "y0": 0.5,
        "y1": 0.5,
        "line": {"color": GREY, "dash": "dash", "width": 1},
    }
    return _figure(
        "Per-token timeline (0.5: the consensus line)",
        data,
        shapes=[consensus],
        xaxis={"title": {"text": "committed token"}},
        yaxis={"title": {"text": "probability"}, "range": [-0.05, 1.05]},
    )


def progress(view: RunView) -> go.Figure:
    """E/T and tokens/s as the run goes (traces carry each commit's elapsed time)."""
    if not view.commits:
        return placeholder("E/T and tokens/s")
    data = [
        {
            "type": "scatter",
            "name": "E/T",
            "line": {"color": PURPLE},
            "x": [c["tokens"] for c in view.commits],
            "y": [c["ensembled"] / c["tokens"] if c["tokens"] else 0 for c in view.commits],
            "hovertemplate": "%{x} tokens: E/T %{y:.1%}<extra></extra>",
        }
    ]
    timed = [c for c in view.commits if c["elapsed"]]
    if timed:
        data.append(
            {
                "type": "scatter",
                "name": "tokens/s",
                "yaxis": "y2",
                "line": {"color": BLUE, "dash": "dot"},
                "x": [c["tokens"] for c in timed],
                "y": [c["tokens"] / c["elapsed"] for c in timed],
                "hovertemplate": "%{x} tokens: %{y:.2f} tok/s<extra></extra>",
            }
        )
    return _figure(
        "Running E/T and tokens/s",
        data,
        xaxis={"title": {"text": "tokens committed"}},
        yaxis={"title": {"text": "E/T"}, "range": [0, 1.05], "tickformat": ".0%"},
        yaxis2={"title": {"text": "tokens/s"}, "overlaying": "y", "side": "right", "rangemode": "tozero"},
    )


def union(view: RunView, point: int | None = None) -> go.Figure:
    """One ensemble point (default: the latest): each model's p over the union, ensemble before/after sharpening."""
    if not view.points:
        return placeholder("Ensemble point", "no ensemble point yet")
    p = view.points[-1 if point is None else point]
    rows = p["table"][:10]
    # Plotly merges equal category labels; zero-width non-joiners keep repeated strings apart.
    labels = [plot_label(r["text"]) + "\u200c" * i for i, r in enumerate(rows)]
    data = [
        {
            "type": "bar",
            "name": plot_label(name),
            "marker": {"color": MODEL_COLORS[i % len(MODEL_COLORS)]},
            "x": labels,
            "y": [r["per_model"][name] for r in rows],
        }
        for i, name in enumerate(rows[0]["per_model"] if rows else [])
    ]
    data.append(
        {
            "type": "bar",
            "name": "ensemble",
            "marker": {"color": GREY, "line": {"color": "#333", "width": 1}},
            "x": labels,
            "y": [r["before"] for r in rows],
        }
    )
    if p["sharpening"]:
        data.append(
            {
                "type": "bar",
                "name": f"after {p['sharpening']} sharpening",
                "marker": {"color": PURPLE, "pattern": {"shape": "/"}},
                "x": labels,
                "y": [r["after"] for r in rows],
            }
        )
    if p["drafted"] is None:
        title = f"chose {plot_label(p['chosen'])}"
    elif p["changed"]:
        title = f"chose {plot_label(p['chosen'])} over draft {plot_label(p['drafted'])}"
    else:
        title = f"kept draft {plot_label(p['drafted'])}"
    return _figure(
        f"Ensemble at position {p['position']}: {title}",
        data,
        barmode="group",
        yaxis={"title": {"text": "p (over the union)"}, "range": [0, 1.05]},
    )


def time_split(view: RunView) -> go.Figure:
    """Where the wall time went: the engine's phases, and forward-pass seconds per model."""
    if not view.finished:
        return placeholder("Time split", "appears when the run finishes")
    stats = view.finished["stats"]
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": phase,
            "y": ["phases"],
            "x": [seconds],
            "marker": {"color": PHASE_COLORS.get(phase, GREY)},
            "hovertemplate": f"{phase}: %{{x:.2f}} s<extra></extra>",
        }
        for phase, seconds in stats["time_split"].items()
    ]
    forward = stats.get("forward", {})
    data.append(
        {
            "type": "bar",
            "orientation": "h",
            "name": "forward passes",
            "y": [plot_label(name) for name in forward],
            "x": [f["seconds"] for f in forward.values()],
            "customdata": [f["passes"] for f in forward.values()],
            "marker": {"color": GREY, "pattern": {"shape": "."}},
            "hovertemplate": "%{y}: %{x:.2f} s in %{customdata} passes<extra></extra>",
        }
    )
    return _figure(
        f"Time split ({stats['wall_s']:.1f} s wall)",
        data,
        barmode="stack",
        xaxis={"title": {"text": "seconds"}},
        margin={"l": 150, "r": 52, "t": 40, "b": 96},
    )


def compare_bars(rows: list[dict]) -> go.Figure:
    """Wall time and E/T of each strategy in a comparison."""
    if not rows:
        return placeholder("Latency and E/T", "appears as the comparison runs")
    labels = [plot_label(r["label"]) for r in rows]
    data = [
        {
            "type": "bar",
            "name": "wall time (s)",
            "marker": {"color": BLUE},
            "offsetgroup": "wall",
            "x": labels,
            "y": [r["wall_s"] for r in rows],
            "hovertemplate": "%{x}: %{y:.2f} s<extra></extra>",
        },
        {
            "type": "bar",
            "name": "E/T",
            "marker": {"color": PURPLE, "pattern": {"shape": "/"}},
            "offsetgroup": "et",
            "yaxis": "y2",
            "x": labels,
            "y": [r["e_t"] for r in rows],
            "hovertemplate": "%{x}: E/T %{y:.1%}<extra></extra>",
        },
    ]
    return _figure(
        "Latency and E/T per strategy",
        data,
        barmode="group",
        yaxis={"title": {"text": "wall time (s)"}, "rangemode": "tozero"},
        yaxis2={"title": {"text": "E/T"}, "overlaying": "y", "side": "right", "range": [0, 1.05], "tickformat": ".0%"},
    )


RUN_STYLES = (
    (BLUE, "circle", "solid"),
    (CYAN, "square", "dot"),
    (RED, "x", "dash"),
    (GREEN, "diamond", "solid"),
    (PURPLE, "triangle-up", "dashdot"),
    (YELLOW, "star", "longdash"),
)  # colour, marker and dash: never colour alone


def damage(runs: list[tuple[str, RunView]]) -> go.Figure:
    """Per run, after each commit: the drafter's non-canonical context tokens (top) and the conditioning KL
    where it was measured (bottom), on one committed-token axis. Runs without damage events are left out."""
    measured = [(label, view) for label, view in runs if view.damage]
    if not measured:
        return placeholder("Drafter context damage", "appears when a run has committed tokens")
    data = []
    for i, (label, view) in enumerate(measured):
        color, symbol, dash = RUN_STYLES[i % len(RUN_STYLES)]
        drafter, name = view.started["drafter"], plot_label(label)
        own = [(d["tokens"], d["models"][drafter]) for d in view.damage]
        kl = [(x, m["kl"]) for x, m in own if m["kl"] is not None]
        data.append(
            {
                "type": "scatter",
                "name": name,
                "legendgroup": name,
                "mode": "lines+markers",
                "line": {"color": color, "dash": dash, "shape": "hv", "width": 1.5},
                "marker": {"color": color, "symbol": symbol, "size": 6},
                "x": [x for x, _ in own],
                "y": [m["non_canonical"] for _, m in own],
                "hovertemplate": (
                    f"{name}<br>%{{x}} tokens: %{{y}} non-canonical in {plot_label(drafter)}'s context<extra></extra>"
                ),
            }
        )
        data.append(
            {
                "type": "scatter",
                "name": f"{name} KL",
                "legendgroup": name,
                "showlegend": False,
                "mode": "markers",
                "xaxis": "x2",
                "yaxis": "y2",
                "marker": {"color": color, "symbol": symbol, "size": 8},
                "x": [x for x, _ in kl],
                "y": [v for _, v in kl],
                "hovertemplate": f"{name}<br>%{{x}} tokens: KL %{{y:.3f}} nats<extra></extra>",
            }
        )
    notes = []
    if not any(trace["x"] for trace in data[1::2]):
        notes.append(
            {
                "text": "no KL measured: it is measured only where the drafter's context is non-canonical",
                "showarrow": False,
                "xref": "paper",
                "yref": "y2 domain",
                "x": 0.5,
                "y": 0.5,
                "font": {"color": "#777"},
            }
        )
    return _figure(
        "Drafter's context damage after each commit",
        data,
        height=440,
        annotations=notes,
        xaxis={"anchor": "y", "matches": "x2", "showticklabels": False},
        yaxis={"domain": [0.5, 1], "title": {"text": "non-canonical tokens"}, "rangemode": "nonnegative"},
        xaxis2={"anchor": "y2", "title": {"text": "tokens committed"}},
        yaxis2={"domain": [0, 0.38], "title": {"text": "KL (nats)"}, "rangemode": "nonnegative"},
        legend={"orientation": "h", "x": 0, "y": -0.22, "yanchor": "top"},
    )
