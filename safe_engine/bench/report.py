"""Benchmark records → a summary table (pandas) and figures (Plotly), written as summary.csv and report.html.

Wall-time ratios are paired: each run is divided by the drafter alone on the same example, and the
median is reported, so one slow outlier on a shared machine does not move the number.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from . import store

SUMMARY = "summary.csv"
REPORT = "report.html"
ALL_TASKS = "all"
_STYLE = "body{font-family:sans-serif} table{border-collapse:collapse;font-size:13px} td,th{padding:2px 8px}"


def results_frame(records: Sequence[dict], drafter: str) -> pd.DataFrame:
    """One row per run, plus `wall_ratio` to the drafter alone on the same example (NaN without it)."""
    df = pd.DataFrame(list(records))
    base = df[df["strategy"] == f"single:{drafter}"].set_index(["task", "id"])["wall_s"]
    keys = pd.MultiIndex.from_frame(df[["task", "id"]])
    df["wall_ratio"] = df["wall_s"].to_numpy() / base.reindex(keys).to_numpy()
    df["strategy"] = pd.Categorical(df["strategy"], categories=plan_order(df["strategy"]))
    return df


def plan_order(strategies: Sequence[str]) -> list[str]:
    """The strategies in the plan's order (the singles, per-token, SAFE, then any other), whatever order the
    rows were written in: a batched bench writes each as it finishes."""
    rank = {"per-token": 1, "safe": 2}
    return sorted(dict.fromkeys(strategies), key=lambda s: 0 if s.startswith("single:") else rank.get(s, 3))


def summary_table(records: Sequence[dict], drafter: str) -> pd.DataFrame:
    """Per task and strategy (and over all tasks when there are several): accuracy, E/T, wall ratio, tokens/s."""
    df = results_frame(records, drafter)
    both = pd.concat([df, df.assign(task=ALL_TASKS)]) if df["task"].nunique() > 1 else df
    both = both.assign(task=pd.Categorical(both["task"], categories=list(dict.fromkeys(both["task"]))))
    rows = both.groupby(["task", "strategy"], observed=True).agg(  # tasks as they came, strategies in plan order
        examples=("correct", "size"),
        accuracy=("correct", "mean"),
        mean_e_t=("e_t", "mean"),
        median_wall_ratio=("wall_ratio", "median"),
        tokens=("tokens", "sum"),
        wall_s=("wall_s", "sum"),
        oov_skips=("oov_skips", "sum"),
        consensus_skips=("consensus_skips", "sum"),
    )
    rows.insert(4, "tokens_per_s", rows["tokens"] / rows["wall_s"])
    rows.insert(5, "mean_tokens", rows.pop("tokens") / rows["examples"])
    return rows.reset_index().astype({"task": str})


def report_figures(records: Sequence[dict], drafter: str) -> dict[str, go.Figure]:
    """The report's charts, keyed by name (the app can show them one by one)."""
    df = results_frame(records, drafter)
    summary = summary_table(records, drafter)
    ensembling = summary[~summary["strategy"].astype(str).str.startswith("single:")]
    hover = ["task", "id", "answer", "gold"]
    return {
        "accuracy": px.bar(
            summary,
            x="strategy",
            y="accuracy",
            color="task",
            barmode="group",
            title="Accuracy per strategy",
            range_y=[0, 1],
        ),
        "e_t": px.bar(
            ensembling,
            x="task",
            y="mean_e_t",
            color="strategy",
            barmode="group",
            title="Tokens ensembled (E/T) per task",
            range_y=[0, 1],
            labels={"mean_e_t": "E/T"},
        ),
        "latency": px.scatter(
            df,
            x="tokens",
            y="wall_s",
            color="strategy",
            hover_data=hover,
            title="Latency vs output length",
            labels={"tokens": "output tokens", "wall_s": "wall time (s)"},
        ),
        "examples": px.scatter(
            df,
            x="e_t",
            y="wall_ratio",
            color="strategy",
            symbol="correct",
            hover_data=hover,
            title="Per example: E/T vs wall time relative to the drafter alone",
            labels={"e_t": "E/T", "wall_ratio": f"wall time / single:{drafter}"},
        ),
    }


def write_report(out_dir) -> pd.DataFrame:
    """Write summary.csv and a self-contained report.html (plotly.js inline, works offline) from the folder."""
    out = Path(out_dir)
    records, settings = store.load_results(out), store.load_settings(out)
    summary = summary_table(records, settings["drafter"])
    summary.to_csv(out / SUMMARY, index=False)
    figures = report_figures(records, settings["drafter"])
    charts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures.values())]
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>SAFE benchmark</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>SAFE benchmark</h1><p>{html.escape(_settings_line(settings))}</p>"
        f"{summary.to_html(index=False, float_format='{:.3f}'.format)}{''.join(charts)}</body></html>"
    )
    (out / REPORT).write_text(page, encoding="utf-8")
    return summary


def _settings_line(settings: dict) -> str:
    decode = settings["decode"]
    return (
        f"models {', '.join(settings['models'])}; drafter {settings['drafter']}; {settings['style']} prompts; "
        f"max {decode['max_new_tokens']} new tokens; lookahead {decode['lookahead']}; "
        f"SAFE mode {decode['safe_mode']}; ensemble {decode['ensemble']['method']}"
    )
