"""A sweep folder → its table (pandas), one row per grid point × strategy, written as ``sweep.csv``.

The singles are the reference: each appears once per runs folder, its grid columns holding the values every
point that shares it agrees on (blank where they differ). Every interval comes from `intervals`, over the
sweep's examples that a row has; the gain and the wall-time ratio are paired, on the examples the row and its
reference share. Cost is wall time per generated token; `pareto` is the Pareto flag over accuracy and cost.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import store
from .grid import RUNS, load_manifest
from .intervals import bootstrap_interval, median_ratio, paired_interval, pareto

TABLE = "sweep.csv"
COLUMNS = (
    "strategy",
    "n",
    "accuracy",
    "accuracy_low",
    "accuracy_high",
    "gain_vs_best_single",
    "gain_vs_best_single_low",
    "gain_vs_best_single_high",
    "e_t",
    "oov_skips",
    "replaced",
    "s_per_token",
    "ratio_to_drafter",
    "pareto",
)


def _runs(out_dir: Path, manifest: dict) -> dict[tuple[str, str], pd.DataFrame]:
    """Each (runs folder, strategy)'s rows on the sweep's examples, indexed and sorted by (task, id)."""
    wanted = {tuple(key) for key in manifest["examples"]}
    folders = {name for point in manifest["points"] for name in point["runs"].values()}
    found = {}
    for name in sorted(folders):
        rows = [r for r in store.load_results(out_dir / RUNS / name) if (r["task"], r["id"]) in wanted]
        if not rows:
            continue
        df = pd.DataFrame(rows).set_index(["task", "id"]).sort_index()
        for label, part in df.groupby("strategy"):
            found[(name, str(label))] = part.astype({"correct": float})
    return found


def _row(rows: pd.DataFrame, singles: dict[str, pd.DataFrame], drafter: str) -> dict:
    correct = rows["correct"]
    low, high = bootstrap_interval(correct.to_numpy())
    row = {"n": len(rows), "accuracy": correct.mean(), "accuracy_low": low, "accuracy_high": high}
    gain = low_gain = high_gain = ratio = float("nan")
    if singles:
        best = max(singles.values(), key=lambda s: s["correct"].mean())  # the first of equals, in plan order
        shared = rows.index.intersection(best.index)
        gain, low_gain, high_gain = paired_interval(correct[shared].to_numpy(), best["correct"][shared].to_numpy())
    if drafter in singles:
        shared = rows.index.intersection(singles[drafter].index)
        ratio = median_ratio(rows["wall_s"][shared].to_numpy(), singles[drafter]["wall_s"][shared].to_numpy())
    tokens = rows["tokens"].sum()
    return row | {
        "gain_vs_best_single": gain,
        "gain_vs_best_single_low": low_gain,
        "gain_vs_best_single_high": high_gain,
        "e_t": rows["e_t"].mean(),
        "oov_skips": int(rows["oov_skips"].sum()),
        "replaced": int(rows["replaced"].sum()),
        "s_per_token": rows["wall_s"].sum() / tokens if tokens else float("nan"),
        "ratio_to_drafter": ratio,
    }


def sweep_table(out_dir) -> pd.DataFrame:
    """The sweep's table: the grid's axes, then `COLUMNS`; the singles first, then each point's strategies in
    grid order. Rows with nothing scored yet are left out."""
    out = Path(out_dir)
    manifest = load_manifest(out)
    axes, points = manifest["axes"], manifest["points"]
    runs = _runs(out, manifest)
    drafter = f"single:{manifest['drafter']}"
    entries: dict[tuple[str, str], list[dict]] = {}  # (runs folder, strategy) → the points it serves
    for point in points:
        for label, name in point["runs"].items():
            entries.setdefault((name, label), []).append(point)
    ordered = sorted(entries, key=lambda key: not key[1].startswith("single:"))  # stable: grid order within
    table = []
    for name, label in ordered:
        if (name, label) not in runs:
            continue
        served = entries[(name, label)]
        reference = served[0]["runs"]
        singles = {s: runs[(reference[s], s)] for s in manifest["singles"] if (reference[s], s) in runs}
        shared = {
            axis: served[0]["values"][axis]
            if all(p["values"][axis] == served[0]["values"][axis] for p in served)
            else None
            for axis in axes
        }
        values = {axis: cell(value) for axis, value in shared.items()}
        table.append(values | {"strategy": label} | _row(runs[(name, label)], singles, drafter))
    df = pd.DataFrame(table, columns=[*axes, *COLUMNS])
    for axis in axes:  # as given (5 stays 5, not 5.0, beside a blank)
        df[axis] = pd.Series([row[axis] for row in table], dtype=object)
    df["pareto"] = pareto(df["accuracy"].fillna(-1), df["s_per_token"].fillna(float("inf")))
    return df


def cell(value: object) -> object:
    """A grid value as a table cell: a list (weights) as its items between ``|``, as `--grid` takes it."""
    return "|".join(map(str, value)) if isinstance(value, list) else value


def write_table(out_dir) -> pd.DataFrame:
    """Write ``sweep.csv`` into the sweep folder and return the table."""
    df = sweep_table(out_dir)
    df.to_csv(Path(out_dir) / TABLE, index=False)
    return df
