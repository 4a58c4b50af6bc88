"""How large a self-contained page is and how long it takes to render and write, for the issue's yardstick: a
comparison of four runs that each reach 160 tokens (each model alone, per-token and SAFE on the embedded pair).

    python -m benchmarks.page_size [--tokens 160] [--ids ID ...] [--repeats 5] [--out benchmarks/results/page_size.json]

Decodes comparisons on the collapse search's prompts (--ids: only these, in this order) until one has all four
runs reach --tokens (greedy, so the same prompt gives the same runs; many prompts end a run early, so naming one
known to run long saves minutes per prompt skipped), then prints the page's bytes (split into plotly.js, the
trace, the pre-rendered token details, the figures and the rest) and the median seconds to render and write it,
as `compare --html` does; the same for the shipped collapse trace's pair page and one run's page. Writes the
figures as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

from safe_engine import DEFAULT_MODELS, DecodeConfig, load_models, run_comparison
from safe_engine.data import TRACES_DIR
from safe_engine.orchestration.comparison import warm_up
from safe_engine.pages.page import comparison_page, run_page, trace_page
from safe_engine.pages.traces import read_trace, split_runs
from safe_engine.pages.view import RunView

PROMPTS = Path(__file__).with_name("collapse_prompts.jsonl")
PARTS = {  # what each part of a page is, found by its markup
    "plotly.js": re.compile(r"<script>/\*\*\n\* plotly\.js.*?</script>", re.DOTALL),
    "trace": re.compile(r'<script type="application/x-ndjson".*?</script>', re.DOTALL),
    "token details": re.compile(r"<template .*?</template>", re.DOTALL),
    "figures": re.compile(r'<script type="application/json" id="safe-figures">.*?</script>', re.DOTALL),
}


def long_comparison(tokens: int, ids: list[str] | None) -> tuple[str, dict[str, list]]:
    """The first collapse-search prompt (of `ids`, in their order, if given) whose four runs all reach `tokens`
    committed tokens."""
    rows = {row["id"]: row for row in map(json.loads, PROMPTS.read_text(encoding="utf-8").splitlines())}
    unknown = [i for i in ids or [] if i not in rows]
    if unknown:
        raise SystemExit(f"no collapse prompt with the id {', '.join(unknown)}; the ids are: {', '.join(rows)}")
    models = load_models(DEFAULT_MODELS)
    config = DecodeConfig(strategy="safe", max_new_tokens=tokens)
    warm_up(models, config)
    for row in [rows[i] for i in ids] if ids else rows.values():
        prompt = row["prompt"]
        runs: dict[str, list] = {}
        for label, event in run_comparison(models, prompt, config):
            runs.setdefault(label, []).append(event)
        reached = {label: len(RunView.of([e.to_dict() for e in events]).tokens) for label, events in runs.items()}
        print(f"{row['id']} {prompt[:60]!r}: {reached}", flush=True)
        if min(reached.values()) >= tokens:
            return prompt, runs
    raise SystemExit(f"no prompt had all four runs reach {tokens} tokens")


def measure(build, repeats: int) -> dict:
    """Bytes of the page by part, and the median seconds to build, render and write it (what --html does)."""
    folder = Path(tempfile.mkdtemp(prefix="page-size-"))
    seconds = []
    for i in range(repeats):
        started = time.perf_counter()
        path = build().save(folder / f"page-{i}.html")
        seconds.append(time.perf_counter() - started)
    html = path.read_text(encoding="utf-8")
    parts = {name: sum(len(m.group(0).encode()) for m in pattern.finditer(html)) for name, pattern in PARTS.items()}
    total = len(html.encode())
    return {"bytes": total, "parts": parts | {"the rest": total - sum(parts.values())}, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--ids", nargs="+", help="collapse prompt ids to try, in order (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/page_size.json")
    args = parser.parse_args()
    prompt, runs = long_comparison(args.tokens, args.ids)
    collapse = read_trace(TRACES_DIR / "01-why-per-token-fails-spell-08.jsonl")
    pages = {
        f"comparison, 4 runs × {args.tokens} tokens": lambda: comparison_page(runs),
        "collapse trace, per-token beside SAFE": lambda: trace_page(collapse),
        "one run (SAFE, from the comparison)": lambda: run_page(runs["safe"]),
    }
    results = {"prompt": prompt, "pages": {}}
    for name, build in pages.items():
        measured = measure(build, args.repeats)
        results["pages"][name] = measured
        parts = ", ".join(f"{part} {size / 1e6:.2f}" for part, size in measured["parts"].items())
        print(
            f"{name}: {measured['bytes'] / 1e6:.2f} MB ({parts}); "
            f"median {statistics.median(measured['seconds']):.2f} s to render and write (of {args.repeats})"
        )
    results["runs"] = {label: len(RunView.of([e.to_dict() for e in run]).tokens) for label, run in runs.items()}
    results["collapse_runs"] = [RunView.of(run).label for run in split_runs(collapse)]
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
