"""Find real prompts where per-token ensembling collapses and SAFE does not, on the embedded pair.

    python -m benchmarks.collapse_search [--max-new-tokens 160] [--limit N | --ids ID,…] [--methods gac,core,eva]
        [--out out/collapse]
    python -m benchmarks.collapse_search --report-only [--ship 4]

Runs every prompt of benchmarks/collapse_prompts.jsonl (or the `--ids` ones) through each model alone,
per-token ensembling in both commit modes (UniTE's first sub-token, and the full spelling) and SAFE, and with
each of `--methods` per-token and SAFE again (labelled `per-token:METHOD`, `safe:METHOD`); appends one line per run to
OUT/results.jsonl (rerunning resumes) and each prompt's events to OUT/traces/ID.jsonl. Then it writes a
report (default benchmarks/results/collapse_search.md) ranking prompts by how much worse per-token's
output is than both SAFE's and the single models', with the distribution of degenerate outputs per
strategy. `--ship K` copies the K clearest cases (per-token, SAFE, the drafter alone) into safe_engine/data/traces/.

Severity of one output, 0..1: the largest of the repeated 4-gram rate, the longest token run / 16, the
longest line run / 8, the whitespace share / 0.6 and 1 if it holds U+FFFD (`safe_engine.damage`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from safe_engine.contract.config import METHODS
from safe_engine.data import TRACES_DIR
from safe_engine.models.cache import load_models
from safe_engine.models.specs import DEFAULT_MODELS
from safe_engine.orchestration.comparison import comparison_plan, summarize, warm_up
from safe_engine.run.damage import degenerate
from safe_engine.strategies.decoding import DecodeConfig, decode

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = ROOT / "benchmarks" / "collapse_prompts.jsonl"
OTHER_METHODS = tuple(m for m in METHODS if m != "unite")  # UniTE's are the plain per-token and SAFE runs
REPORT = ROOT / "benchmarks" / "results" / "collapse_search.md"
SHIPPED = TRACES_DIR
PER_TOKEN = ("per-token", "per-token-full")


def severity(degeneration: dict) -> float:
    return min(
        1.0,
        max(
            degeneration["repeated_4gram_rate"],
            degeneration["longest_token_run"] / 16,
            degeneration["longest_line_run"] / 8,
            degeneration["whitespace_share"] / 0.6,
            1.0 if degeneration["replacement_chars"] else 0.0,
        ),
    )


def plan(models, config: DecodeConfig, methods: list[str] = ()):
    """Each model alone, per-token in both commit modes, SAFE; then per-token and SAFE with each of `methods`."""
    runs = comparison_plan(models, config)
    full = ("per-token-full", models, replace(config, strategy="per-token", per_token_commit="full"))
    other = [
        (
            f"{strategy}:{method}",
            models,
            replace(config, strategy=strategy, ensemble=replace(config.ensemble, method=method)),
        )
        for method in methods
        for strategy in ("per-token", "safe")
    ]
    return [run for run in runs if run[0] != "safe"] + [full] + [run for run in runs if run[0] == "safe"] + other


def collapse_prompts() -> list[dict]:
    return [json.loads(line) for line in PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()]


def search(args) -> None:
    prompts = collapse_prompts()
    prompts = [p for p in prompts if p["id"] in args.ids] if args.ids else prompts[: args.limit]
    out = Path(args.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = {(r["id"], r["label"]) for r in read(results)}
    models = load_models(list(DEFAULT_MODELS))
    config = DecodeConfig(max_new_tokens=args.max_new_tokens)
    warm_up(models, config)
    with open(results, "a", encoding="utf-8") as sink:
        for number, row in enumerate(prompts, 1):
            todo = [
                (label, run_models, run_config)
                for label, run_models, run_config in plan(models, config, args.methods)
                if (row["id"], label) not in done
            ]
            if not todo:
                continue
            with open(out / "traces" / f"{row['id']}.jsonl", "a", encoding="utf-8") as trace:
                for label, run_models, run_config in todo:
                    events = list(decode(run_models, row["prompt"], run_config))
                    trace.writelines(e.to_json() + "\n" for e in events)
                    s = summarize(events, label)
                    measures = s["damage"]["degeneration"]
                    record = {
                        "id": row["id"],
                        "kind": row["kind"],
                        "prompt": row["prompt"],
                        "label": label,
                        "tokens": s["tokens"],
                        "e_t": s["e_t"],
                        "stop_reason": s["stop_reason"],
                        "wall_s": s["wall_s"],
                        "damage": s["damage"],
                        "degenerate": degenerate(measures),
                        "severity": severity(measures),
                        "text": s["text"],
                    }
                    sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                    sink.flush()
            print(f"[{number}/{len(prompts)}] {row['id']} done", file=sys.stderr, flush=True)


def read(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if path.is_file()
        else []
    )


def by_prompt(records: list[dict]) -> dict[str, dict[str, dict]]:
    prompts: dict[str, dict[str, dict]] = {}
    for r in records:
        prompts.setdefault(r["id"], {})[r["label"]] = r
    return {pid: runs for pid, runs in prompts.items() if len(runs) >= 2 + len(PER_TOKEN) + 1}  # complete prompts only


def drafter_damage(record: dict, key: str):
    drafter = next(iter(record["damage"]["models"].values()))  # the drafter is listed first
    return drafter[key]


def ranked(prompts: dict[str, dict[str, dict]]) -> list[tuple[float, str]]:
    """Prompts where per-token damaged its drafter's context more than SAFE did first (the damage the app teaches),
    each group by per-token's severity over the worst of SAFE and the singles."""
    scores = []
    for pid, runs in prompts.items():
        singles = [r for label, r in runs.items() if label.startswith("single:")]
        worst_per_token = max(runs[label]["severity"] for label in PER_TOKEN)
        baseline = max([runs["safe"]["severity"]] + [r["severity"] for r in singles])
        context = drafter_damage(runs["per-token"], "non_canonical_max") - drafter_damage(
            runs["safe"], "non_canonical_max"
        )
        scores.append((context > 0, worst_per_token - baseline, pid))
    return [(score, pid) for _, score, pid in sorted(scores, reverse=True)]


def report(args) -> None:
    records = read(Path(args.out) / "results.jsonl")
    prompts = by_prompt(records)
    if not prompts:
        raise SystemExit(f"no complete prompts in {args.out}/results.jsonl: run the search first")
    labels = list(next(iter(prompts.values())))
    lines = [
        f"# Collapse search: where per-token ensembling breaks ({len(prompts)} prompts)",
        "",
        "Produced by `python -m benchmarks.collapse_search` on the embedded pair (Gemma-3-270M drafts, "
        f"SmolLM2-135M verifies), greedy, at most {args.max_new_tokens} new tokens per run. "
        "A run is *degenerate* when its longest token run ≥ 8, longest line run ≥ 4, "
        "repeated 4-gram rate ≥ 0.5 or whitespace share ≥ 0.3 (`safe_engine/run/damage.py`).",
        "",
        "| strategy | degenerate | median severity | median repeated 4-grams "
        "| drafter's non-canonical context (most in a run): mean / runs ≥ 20 / runs ≥ 100 "
        "| median KL (nats) | outputs with U+FFFD |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in labels:
        runs = [p[label] for p in prompts.values()]
        kls = [drafter_damage(r, "kl_mean") for r in runs if drafter_damage(r, "kl_mean") is not None]
        context = [drafter_damage(r, "non_canonical_max") for r in runs]
        kl = f"{statistics.median(kls):.3f} ({len(kls)} runs measured)" if kls else "—"
        lines.append(
            f"| {label} | {sum(r['degenerate'] for r in runs)} of {len(runs)} "
            f"| {statistics.median(r['severity'] for r in runs):.2f} | "
            f"{statistics.median(r['damage']['degeneration']['repeated_4gram_rate'] for r in runs):.2f} | "
            f"{statistics.mean(context):.1f} / {sum(c >= 20 for c in context)} / {sum(c >= 100 for c in context)} "
            f"| {kl} | "
            f"{sum(r['damage']['degeneration']['replacement_chars'] > 0 for r in runs)} |"
        )
    kinds = sorted({runs["safe"]["kind"] for runs in prompts.values()})
    lines += [
        "",
        "Degenerate outputs per kind of prompt:",
        "",
        "| kind | prompts | " + " | ".join(labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    for kind in kinds:
        group = [runs for runs in prompts.values() if runs["safe"]["kind"] == kind]
        lines.append(
            f"| {kind} | {len(group)} | "
            + " | ".join(str(sum(g[label]["degenerate"] for g in group)) for label in labels)
            + " |"
        )
    order = ranked(prompts)
    lines += [
        "",
        (
            "Clearest cases: first where per-token left its drafter more non-canonical context than SAFE did, "
            "each group by "
            "score = per-token severity minus the worst of SAFE and the singles:"
        ),
        "",
        "| prompt | kind | score | per-token | per-token-full | SAFE | singles "
        "| drafter non-canonical: per-token / SAFE |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for score, pid in order[:15]:
        runs = prompts[pid]
        singles = " / ".join(f"{r['severity']:.2f}" for label, r in runs.items() if label.startswith("single:"))
        lines.append(
            f"| {pid}: {runs['safe']['prompt'][:60]} | {runs['safe']['kind']} | {score:+.2f} "
            f"| {runs['per-token']['severity']:.2f} | "
            f"{runs['per-token-full']['severity']:.2f} | {runs['safe']['severity']:.2f} | {singles} | "
            f"{drafter_damage(runs['per-token'], 'non_canonical_max')} "
            f"/ {drafter_damage(runs['safe'], 'non_canonical_max')} |"
        )
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    if args.ship:
        ship(args, prompts, [pid for _, pid in order[: args.ship]])


def ship(args, prompts: dict[str, dict[str, dict]], chosen: list[str]) -> None:
    """Copy the per-token, SAFE and drafter-alone runs of each chosen prompt into safe_engine/data/traces/."""
    for rank, pid in enumerate(chosen, 1):
        runs = [[]]
        for line in (Path(args.out) / "traces" / f"{pid}.jsonl").read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            if event["kind"] == "run_started":
                runs.append([])
            runs[-1].append(event)
        finished = {
            _label(run[0]): run for run in runs[1:] if run[-1]["kind"] == "run_finished"
        }  # a resumed search left broken runs
        drafter = finished["safe"][0]["drafter"]
        keep = [finished[label] for label in ("per-token", "safe", f"single:{drafter}")]  # Replay opens on the first
        target = SHIPPED / f"0{rank}-why-per-token-fails-{pid}.jsonl"
        target.write_text(
            "".join(json.dumps(e, ensure_ascii=False) + "\n" for run in keep for e in run), encoding="utf-8"
        )
        p = prompts[pid]
        print(
            f"shipped {target.name}: per-token severity {p['per-token']['severity']:.2f}, "
            f"SAFE {p['safe']['severity']:.2f}",
            file=sys.stderr,
        )


def _label(started: dict) -> str:
    if started["strategy"] == "single":
        return f"single:{started['drafter']}"
    method = started["config"]["ensemble"]["method"]
    if method != "unite":
        return f"{started['strategy']}:{method}"
    if started["strategy"] == "per-token" and started["config"].get("per_token_commit") == "full":
        return "per-token-full"
    return started["strategy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--limit", type=int, help="only the first N prompts")
    parser.add_argument("--ids", type=lambda text: text.split(","), help="only these prompts (comma-separated ids)")
    parser.add_argument(
        "--methods",
        type=lambda text: text.split(","),
        default=[],
        help=f"also run per-token and SAFE with each of these ensemble methods ({', '.join(OTHER_METHODS)})",
    )
    parser.add_argument("--out", default="out/collapse")
    parser.add_argument("--report", default=str(REPORT))
    parser.add_argument("--report-only", action="store_true", help="rank what OUT/results.jsonl holds; run nothing")
    parser.add_argument(
        "--ship", type=int, default=0, metavar="K", help="copy the K clearest cases into safe_engine/data/traces/"
    )
    args = parser.parse_args()
    unknown = sorted(set(args.methods) - set(OTHER_METHODS))
    if unknown:
        parser.error(f"unknown ensemble method {', '.join(unknown)}: one of {', '.join(OTHER_METHODS)}")
    missing = sorted(set(args.ids or ()) - {row["id"] for row in collapse_prompts()})
    if missing:
        parser.error(f"no prompt {', '.join(missing)} in {PROMPTS.name}")
    if not args.report_only:
        search(args)
    report(args)


if __name__ == "__main__":
    main()
