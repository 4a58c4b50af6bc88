"""Command line: ``python -m safe_engine generate|compare|export|bench|sweep|tokdiff|lm-eval|serve ...`` (installed: the
``safe-ensemble`` command). Bad input: one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from .analysis.tokdiff import corpus_scan, load_vocabs, pair_view, visible, word_agreement
from .bench import DEFAULT_BATCH_SIZE, DEFAULT_STRATEGIES, STYLES, Bench, builtin_tasks, load_task, strategy_labels
from .bench.grid import GridSweep, SweepPlan
from .contract.errors import SafeEngineError
from .contract.events import TextCommitted, write_jsonl
from .data import TRACES_DIR
from .models.cache import load_models
from .models.specs import DEFAULT_MODELS, resolve_spec
from .options import (
    DEFAULT_MAX_POINTS,
    GRID_AXES,
    OptionParser,
    UsageError,
    add_decoding_options,
    decoding_config,
    grid_points,
    load_options,
    model_specs,
)
from .orchestration.comparison import ratios, rows_per_pass, run_comparison, run_together, summarize, warm_up
from .pages.traces import find_trace, read_trace, shipped_traces
from .strategies.decoding import STRATEGIES, decode

PAGE_HELP = (
    "write one self-contained HTML page (no server, no network; the trace inside it): transcript, details on "
    "hover and click, charts"
)
SHARED_TIMES = (
    "Ran together (--together): the runs shared forward passes, so each wall time includes the other runs' work "
    "and the ratios below are not each strategy's own cost (run without --together for that). Runs per pass: "
)


def build_parser() -> argparse.ArgumentParser:
    prog = "safe-ensemble" if os.path.basename(sys.argv[0]) == "safe-ensemble" else "python -m safe_engine"
    parser = OptionParser(prog=prog, description="SAFE token-level LLM ensembling")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OptionParser)
    gen = sub.add_parser("generate", help="decode one prompt with one strategy")
    add_decoding_options(gen, with_strategy=True)
    gen.add_argument("--trace", metavar="FILE.jsonl", help="write every event as a JSON line")
    gen.add_argument("--html", metavar="FILE.html", help=PAGE_HELP)
    cmp_ = sub.add_parser("compare", help="each single model, per-token and SAFE on one prompt")
    add_decoding_options(cmp_, with_strategy=False)
    cmp_.add_argument("--trace", metavar="FILE.jsonl", help="write every run's events, one after the other")
    cmp_.add_argument("--html", metavar="FILE.html", help=PAGE_HELP + ": every run side by side")
    cmp_.add_argument(
        "--together",
        action="store_true",
        help="run the strategies at once, sharing forward passes (faster in all; each wall time then includes "
        "the other runs' work). Default: one after the other, each timed alone",
    )
    export = sub.add_parser("export", help="a trace as one self-contained HTML page (no model is loaded)")
    export.add_argument(
        "trace",
        metavar="TRACE",
        help=f"a JSONL trace or a page holding one, or a shipped trace's name: {', '.join(_shipped_names())}",
    )
    export.add_argument(
        "--html",
        metavar="FILE.html",
        required=True,
        help=PAGE_HELP + ": two runs side by side when "
        "the trace holds several (per-token beside SAFE when it holds both)",
    )
    bench = sub.add_parser("bench", help="accuracy, E/T and speed of each strategy on task files")
    _bench_arguments(bench, "out/bench", "writes results.jsonl, summary.csv, report.html; rerunning resumes")
    sweep = sub.add_parser("sweep", help="bench over a grid of decoding options: fronts of accuracy vs cost")
    sweep.add_argument(
        "--grid",
        action="append",
        required=True,
        metavar="KEY=V1,V2,...",
        help=f"an axis (repeatable; the grid is their product): a decoding option ({', '.join(GRID_AXES)}, "
        "or method) and its values; a list value (weights) with | between items, e.g. weights=1|1,2|1",
    )
    sweep.add_argument(
        "--max-points",
        type=int,
        default=DEFAULT_MAX_POINTS,
        metavar="N",
        help="refuse a grid of more points (default %(default)s)",
    )
    _bench_arguments(
        sweep,
        "out/sweep",
        "writes sweep.json, runs/ (one bench folder per setting), sweep.csv and report.html; rerunning resumes",
    )
    tok = sub.add_parser("tokdiff", help="where the models' tokenizers disagree on a text (no weights loaded)")
    source = tok.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to compare")
    source.add_argument("--file", metavar="PATH", help="a UTF-8 text file to compare")
    tok.add_argument(
        "--models",
        nargs="+",
        default=list(DEFAULT_MODELS),
        metavar="SPEC",
        help="two or more specs (default: the embedded pair)",
    )
    tok.add_argument("--json", action="store_true", help="print one JSON result on stdout")
    _integration_parsers(sub)
    return parser


def _bench_arguments(parser: argparse.ArgumentParser, out: str, out_help: str) -> None:
    """What `bench` and `sweep` share: the examples, the strategies, the output folder, batching and Ray."""
    parser.add_argument(
        "--tasks",
        nargs="+",
        required=True,
        metavar="FILE|NAME",
        help=f"JSONL task files or shipped sets: {', '.join(builtin_tasks())}",
    )
    parser.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help="comma-separated: single (the drafter alone), singles, single:NAME, per-token, safe",
    )
    parser.add_argument(
        "--style",
        choices=STYLES,
        default="direct",
        help="direct: answer only, its first line is scored; cot: step-by-step reasoning",
    )
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N examples of each task")
    parser.add_argument("--out", default=out, metavar="DIR", help=out_help)
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help=f"(example, strategy) runs at once, sharing forward passes (default {DEFAULT_BATCH_SIZE}; 1: one after "
        "the other, as before; not with --ray). Wall times then include the other runs' work",
    )
    add_decoding_options(parser, with_strategy=False, one_prompt=False)
    parser.add_argument("--ray", action="store_true", help="run the items on Ray replicas of the model set")
    parser.add_argument("--replicas", type=int, default=1, metavar="N", help="with --ray: copies of the model set")
    parser.add_argument("--replica-cpus", type=float, default=1.0, metavar="C", help="with --ray: CPUs per replica")
    parser.add_argument("--replica-gpus", type=float, default=0.0, metavar="G", help="with --ray: GPUs per replica")


def _progress(message: str) -> None:
    print(f"[safe] {message}", file=sys.stderr, flush=True)


def _load(args):
    if args.ray_address:
        from .distributed.ray_cluster import connect  # needs Ray, an optional dependency

        connect(args.ray_address)
    return load_models(model_specs(args), load_options(args), _progress)


def _generate(args) -> int:
    config = decoding_config(args)
    with contextlib.ExitStack() as stack:
        trace, page = _output(stack, args.trace), _output(stack, args.html)
        models = _load(args)
        events = decode(models, args.prompt, config)
        if trace:
            events = write_jsonl(events, trace)
        collected = []
        for event in events:
            collected.append(event)
            if not args.json and isinstance(event, TextCommitted):
                print(event.delta, end="", flush=True)
        if page:
            from .pages.page import run_page  # Plotly loads only for a page

            _write_page(page, lambda: run_page(collected))
    summary = summarize(collected)
    if args.json:
        print(
            json.dumps(
                {k: v for k, v in summary.items() if k != "stats"} | {"stats": summary["stats"]}, ensure_ascii=False
            )
        )
    else:
        print()
        print(_summary_line(summary), file=sys.stderr)
    return 0


def _summary_line(s: dict) -> str:
    return (
        f"{s['label']}: {s['tokens']} tokens, E/T {s['e_t']:.1%}, OOV-like skips {sum(s['oov_skips'].values())}, "
        f"consensus skips {sum(s['consensus_skips'].values())}, {s['wall_s']:.2f} s, {s['tokens_per_s']:.1f} tok/s"
    )


def _compare(args) -> int:
    config = decoding_config(args, "safe")
    runs: dict[str, list] = {}
    with contextlib.ExitStack() as stack:
        trace, page = _output(stack, args.trace), _output(stack, args.html)
        models = _load(args)
        warm_up(models, config)
        for label, event in (run_together if args.together else run_comparison)(models, args.prompt, config):
            runs.setdefault(label, []).append(event)
            if trace:
                trace.write(event.to_json() + "\n")
        if page:
            from .pages.page import comparison_page  # Plotly loads only for a page

            _write_page(page, lambda: comparison_page(runs))
    summaries = [summarize(events, label) for label, events in runs.items()]
    drafter = summaries[-1]["drafter"]
    ratio = ratios(summaries, drafter)
    shared = {s["label"]: rows_per_pass(s) for s in summaries}
    if args.json:
        print(
            json.dumps(
                {"runs": summaries, "ratios": ratio, "together": args.together, "rows_per_pass": shared},
                ensure_ascii=False,
            )
        )
        return 0
    for s in summaries:
        print(f"== {s['label']}\n{s['text'].strip()}\n{_summary_line(s)}\n")
    if args.together:
        print(SHARED_TIMES + ", ".join(f"{k} {v:.1f}" for k, v in shared.items()))
    print("wall time / drafter alone: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    return 0


def _output(stack: contextlib.ExitStack, path: str | None):
    """A file to write (--trace, --html), opened before any model loads so a bad path fails at once."""
    if path is None:
        return None
    try:
        return stack.enter_context(open(path, "w", encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_page(handle, build) -> None:
    """Render (`build` makes the Page) and write it, saying how large it is and how long that took."""
    started = time.perf_counter()
    handle.write(build().html())
    _progress(f"wrote {handle.name}: {handle.tell() / 1e6:.1f} MB in {time.perf_counter() - started:.2f} s")


def _shipped_names() -> list[str]:
    return [path.stem for path, _ in shipped_traces(TRACES_DIR)]


def _export(args) -> int:
    from .pages.page import trace_page  # Plotly loads only for a page

    path = Path(args.trace)
    if not path.is_file():
        path = find_trace(args.trace, [TRACES_DIR])
    events = read_trace(path)
    captions = {p.resolve(): caption for p, caption in shipped_traces(TRACES_DIR)}
    title, caption = path.name.removesuffix(".jsonl"), captions.get(path.resolve(), "")
    with contextlib.ExitStack() as stack:
        _write_page(_output(stack, args.html), lambda: trace_page(events, title, caption))
    return 0


def _bench_plan(args, strategy: str | None):
    """(examples, strategy labels, config) of `bench`'s and `sweep`'s shared arguments, checked before any model
    loads; `strategy`: the config's (None: safe when an ensemble is asked for, else single)."""
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if args.batch_size is not None and (args.batch_size < 1 or args.ray and args.batch_size > 1):
        raise UsageError("--batch-size must be at least 1 (and 1 with --ray, whose replicas run one job each)")
    requested = [name.strip() for name in args.strategies.split(",") if name.strip()]
    config = decoding_config(args, strategy or ("safe" if {"per-token", "safe"} & set(requested) else "single"))
    labels = strategy_labels(requested, [resolve_spec(spec).short_name for spec in args.models], config.drafter)
    tasks = [load_task(name, args.limit) for name in args.tasks]
    names = [task[0].task for task in tasks]
    if len(set(names)) < len(names):
        raise UsageError(f"two task files share a name: {', '.join(names)}")
    return [e for task in tasks for e in task], labels, config


def _run_all(job, desc: str, write, written: str) -> int:
    """Run a bench or a sweep to the end with a progress bar over its runs (those resumed included), then
    `write` its folder's table and report, also when stopped, and print the table."""
    if job.done:
        _progress(f"resuming {job.out_dir}: {job.done} of {job.total} runs already done")
    try:
        with tqdm(total=job.total, initial=job.done, unit="run", file=sys.stderr, desc=desc) as bar:
            for record in job.run():
                bar.set_postfix_str(f"{record['task']}/{record['id']} {record['strategy']}", refresh=False)
                bar.update()
    finally:
        table = write(job.out_dir) if job.done else None
    print(table.to_string(index=False, float_format="{:.3f}".format))
    _progress(f"wrote {written} in {job.out_dir}")
    return 0


def _ray_resources(args) -> dict:
    return dict(replicas=args.replicas, cpus=args.replica_cpus, gpus=args.replica_gpus, address=args.ray_address)


def _batch_size(args) -> int:
    return DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size


def _bench(args) -> int:
    from .bench.report import write_report  # pandas and Plotly load only for this command

    examples, labels, config = _bench_plan(args, None)
    if args.ray:
        from .distributed.ray_bench import RayBench  # needs Ray, an optional dependency

        ray = _ray_resources(args)
        bench = RayBench(model_specs(args), load_options(args), examples, config, labels, args.out, args.style, **ray)
    else:
        bench = Bench(_load(args), examples, config, labels, args.out, args.style, _batch_size(args))
    return _run_all(bench, "bench", write_report, "results.jsonl, summary.csv and report.html")


def _sweep(args) -> int:
    from .pages.fronts import write_report as write_sweep_report  # pandas loads only for this command

    examples, labels, base = _bench_plan(args, "safe")
    points = grid_points(args.grid, args, args.max_points)
    defaults = {axis: getattr(args, axis) for axis in points[0].values}
    common = [examples, base, defaults, points, labels, args.out, args.style]
    if args.ray:
        from .distributed.ray_sweep import RaySweep  # needs Ray, an optional dependency

        specs, options = model_specs(args), load_options(args)
        names = [resolve_spec(spec).short_name for spec in specs]
        plan = SweepPlan(names, specs, [options.chat_template] * len(specs), *common)
        sweep = RaySweep(specs, options, plan, base, **_ray_resources(args))
    else:
        models = _load(args)
        chat = [m.use_chat_template for m in models]
        plan = SweepPlan([m.name for m in models], [m.spec.spec for m in models], chat, *common)
        sweep = GridSweep(models, plan, _batch_size(args))
    return _run_all(sweep, "sweep", write_sweep_report, "sweep.csv and report.html")


def _tokdiff(args) -> int:
    text = args.text
    if args.file:
        try:
            with open(args.file, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {args.file}: {exc}") from exc
    if not text:
        raise UsageError("the text is empty")
    vocabs = load_vocabs(args.models, progress=_progress)
    view = pair_view(text, vocabs)
    scan, agreement = corpus_scan(view), word_agreement(vocabs)
    if args.json:
        result = view.to_dict() | {"agreement": agreement.rate, "oov_rate": scan.oov_rate}
        print(json.dumps(result | {"breaks": [vars(row) for row in scan.spans]}, ensure_ascii=False))
        return 0
    for name, tokens in view.tokens.items():
        print(f"== {name}: {len(tokens)} tokens\n" + "|".join(visible(t.text) for t in tokens))
    counts = view.counts()
    print(f"\nshared boundaries: {counts['shared_boundaries']} ({counts['shared_ratio']:.1%} of all boundaries)")
    for key, tokens in view.oov_like.items():
        examples = " ".join(visible(t.text) for t in tokens[:20])
        print(f"OOV-like {key}: {len(tokens)} ({scan.oov_rate[key]:.1%})  {examples}")
    for row in scan.spans[:10]:
        print(f"breaks {row.breaks}/{row.count}  {row.span!r}: " + "  vs  ".join(row.pieces.values()))
    print(f"word-list agreement: {agreement.rate:.1%} of {agreement.words} common English words split identically")
    return 0


# ---------------------------------------------------------------- integrations: lm-eval's model and the OpenAI server
# Their modules sit beside the engine and are imported only when their subcommand runs (optional dependencies).


def _integration_parsers(sub) -> None:
    sub.add_parser(
        "lm-eval",
        add_help=False,
        help="lm-evaluation-harness's own CLI with the safe-ensemble model registered (every argument passes through)",
    )
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on every request")
    serve.add_argument("--strategy", choices=STRATEGIES, default="safe", help="what the pair's own model id runs")
    serve.add_argument("--concurrency", type=int, default=8, metavar="N", help="runs decoding at the same time")
    serve.add_argument("--queue", type=int, default=32, metavar="N", help="requests waiting beyond those (then 429)")
    add_decoding_options(serve, with_strategy=False, one_prompt=False)


def _lm_eval(argv: Sequence[str]) -> int:
    try:
        from .integrations.lm_eval import run_cli
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"{exc.name} is not installed: pip install 'safe-ensemble-studio[eval]' "
            "(from a checkout: pip install -r requirements-integrations.txt)"
        ) from exc

    return run_cli(argv)


def _serve(args) -> int:
    from .server.launch import serve

    return serve(args, _progress)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["lm-eval"]:
            return _lm_eval(argv[1:])
        args = build_parser().parse_args(argv)
        commands = {
            "generate": _generate,
            "compare": _compare,
            "export": _export,
            "bench": _bench,
            "sweep": _sweep,
            "tokdiff": _tokdiff,
            "serve": _serve,
        }
        return commands[args.command](args)
    except SafeEngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
