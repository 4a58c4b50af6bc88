"""Command line: ``python -m safe_engine generate|compare|bench|tokdiff|lm-eval|serve ...``. Bad input: one line on
stderr, exit 2."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence

from tqdm import tqdm

from .bench import DEFAULT_BATCH_SIZE, DEFAULT_STRATEGIES, STYLES, Bench, builtin_tasks, load_task, strategy_labels
from .compare import load_models, ratios, rows_per_pass, run_comparison, run_together, summarize, warm_up
from .decoding import PER_TOKEN_COMMITS, SAFE_MODES, STRATEGIES, DecodeConfig, decode
from .ensemble import METHODS, SHARPENING, EnsembleConfig
from .errors import SafeEngineError
from .events import TextCommitted, write_jsonl
from .models import CPU_LINEAR_MODES, DEFAULT_MODELS, DTYPES, RAY_PREFIX, LoadOptions, resolve_spec
from .tokdiff import corpus_scan, load_vocabs, pair_view, visible, word_agreement

DEFAULTS, ENSEMBLE = DecodeConfig(), EnsembleConfig()
SAFE_MODE_HELP = (
    "exact: the paper's loop, one ensemble per round and the rest of the draft dropped; fast: keep scanning "
    "a draft the ensemble confirmed (later positions see less lookahead text, so outputs can differ; the "
    "README has the measured speed and differences)"
)
SHARED_TIMES = (
    "Ran together (--together): the runs shared forward passes, so each wall time includes the other runs' work "
    "and the ratios below are not each strategy's own cost (run without --together for that). Runs per pass: "
)
PER_TOKEN_COMMIT_HELP = (
    "first-subtoken: the drafter appends only its first sub-token of the ensemble's string, as UniTE "
    "does; full: its whole spelling (a gentler baseline)"
)


class UsageError(SafeEngineError):
    pass


def _forced(value: str) -> tuple[int, str]:
    """INDEX:TEXT, the text taken verbatim after the first colon (leading spaces count)."""
    index, sep, text = value.partition(":")
    if not sep or not index.strip().isdigit() or not text:
        raise argparse.ArgumentTypeError(f"{value!r} is not INDEX:TEXT (e.g. 12: Paris)")
    return int(index), text


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line instead of usage + message
        raise UsageError(message)


def add_loading_options(parser: argparse.ArgumentParser) -> None:
    """How the models load: devices, dtypes, the CPU's linear layers, remote code, chat templates. The
    commands here and the app (`python app.py`) share these flags; `load_options(args)` reads them."""
    parser.add_argument(
        "--cpu-int8",
        action="store_true",
        help="int8 weights and activations on the CPU: faster, less accurate, tokens differ from the reference",
    )
    parser.add_argument(
        "--cpu-linear",
        choices=CPU_LINEAR_MODES,
        default="streamed",
        help="linear layers on the CPU: streamed (default: fp32, the same weights, faster products and a packed "
        "copy of them; the reference's tokens), torch (transformers' own fp32 layers, no second copy), int8-head "
        "(int8 weights for the output layer and bf16 logits: about 10%% faster, but tokens may differ from the "
        "reference where two candidates nearly tie); the docs have the measured speed, accuracy and memory",
    )
    parser.add_argument(
        "--devices",
        "--device",
        nargs="+",
        default=["auto"],
        metavar="DEVICE",
        help="one for all models or one per model: auto (several GPUs: spread by size; else cuda, mps or cpu), "
        "cpu, cuda, cuda:N, mps",
    )
    parser.add_argument(
        "--dtype",
        nargs="+",
        default=["auto"],
        choices=DTYPES,
        help="one for all models or one per model (auto: bfloat16 or float16 on a GPU, float32 on the CPU)",
    )
    parser.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model folder")
    parser.add_argument("--no-chat-template", action="store_true", help="plain-text prompts for every model")


def _decoding_options(parser: argparse.ArgumentParser, with_strategy: bool, one_prompt: bool = True) -> None:
    if one_prompt:
        parser.add_argument("--prompt", required=True, help="the user prompt")
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(DEFAULT_MODELS),
        metavar="SPEC",
        help="embedded:NAME, a local folder, a .gguf file or a hub id (default: the embedded pair)",
    )
    parser.add_argument("--drafter", metavar="SPEC", help="which of --models drafts (default: the first)")
    if with_strategy:
        parser.add_argument("--strategy", choices=STRATEGIES, default="safe")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens)
    parser.add_argument("--lookahead", type=int, default=DEFAULTS.lookahead, help="drafted tokens per SAFE round (n)")
    parser.add_argument("--top-k", type=int, default=ENSEMBLE.top_k, help="each model's candidates in the union")
    parser.add_argument("--ensemble-method", choices=METHODS, default=ENSEMBLE.method)
    parser.add_argument(
        "--gate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ensemble only where the drafter's top p < 0.5 (default: on for gac, as the paper runs GaC)",
    )
    parser.add_argument("--sharpen", choices=SHARPENING, default=ENSEMBLE.sharpen)
    parser.add_argument("--sharpen-lambda", type=float, default=ENSEMBLE.sharpen_lambda)
    parser.add_argument("--weights", type=float, nargs="+", metavar="W", help="one weight per model, in --models order")
    parser.add_argument("--safe-mode", choices=SAFE_MODES, default=DEFAULTS.safe_mode, help=SAFE_MODE_HELP)
    parser.add_argument(
        "--per-token-commit", choices=PER_TOKEN_COMMITS, default=DEFAULTS.per_token_commit, help=PER_TOKEN_COMMIT_HELP
    )
    parser.add_argument(
        "--temperature", type=float, default=DEFAULTS.temperature, help="0: greedy (the paper's setting)"
    )
    parser.add_argument(
        "--top-p", type=float, default=DEFAULTS.top_p, help="nucleus sampling mass (with --temperature)"
    )
    parser.add_argument("--seed", type=int, help="sampling seed (default: a fresh one, reported in the output)")
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="end the run at this text (repeatable; not inside the response's leading whitespace)",
    )
    parser.add_argument(
        "--draft-gate",
        type=float,
        default=DEFAULTS.draft_gate,
        metavar="TAU",
        help="SAFE: end a draft right after a token the drafter gives p < TAU "
        "(default %(default)s; 0: the paper's full drafts; see README)",
    )
    parser.add_argument(
        "--damage-kl-steps",
        type=int,
        default=DEFAULTS.damage_kl_steps,
        metavar="N",
        help="measure the conditioning-damage KL at most N times (one extra forward pass each; 0: off)",
    )
    parser.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="SAFE: verifiers' passes at once and the next draft during verification (the same output; "
        "default: on only when every model has its own GPU)",
    )
    add_loading_options(parser)
    parser.add_argument("--placement", choices=["local", "ray"], default="local", help="ray: each model in a Ray actor")
    parser.add_argument("--ray-address", metavar="ADDR", help="an existing Ray cluster (default: start a local one)")
    if one_prompt:
        parser.add_argument(
            "--force",
            action="append",
            type=_forced,
            default=[],
            metavar="INDEX:TEXT",
            help="what-if: commit TEXT as token INDEX (0-based) instead of what the strategy picks; repeatable",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON result on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m safe_engine", description="SAFE token-level LLM ensembling")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gen = sub.add_parser("generate", help="decode one prompt with one strategy")
    _decoding_options(gen, with_strategy=True)
    gen.add_argument("--trace", metavar="FILE.jsonl", help="write every event as a JSON line")
    cmp_ = sub.add_parser("compare", help="each single model, per-token and SAFE on one prompt")
    _decoding_options(cmp_, with_strategy=False)
    cmp_.add_argument("--trace", metavar="FILE.jsonl", help="write every run's events, one after the other")
    cmp_.add_argument(
        "--together",
        action="store_true",
        help="run the strategies at once, sharing forward passes (faster in all; each wall time then includes "
        "the other runs' work). Default: one after the other, each timed alone",
    )
    bench = sub.add_parser("bench", help="accuracy, E/T and speed of each strategy on task files")
    bench.add_argument(
        "--tasks",
        nargs="+",
        required=True,
        metavar="FILE|NAME",
        help=f"JSONL task files or shipped sets: {', '.join(builtin_tasks())}",
    )
    bench.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help="comma-separated: single (the drafter alone), singles, single:NAME, per-token, safe",
    )
    bench.add_argument(
        "--style",
        choices=STYLES,
        default="direct",
        help="direct: answer only, its first line is scored; cot: step-by-step reasoning",
    )
    bench.add_argument("--limit", type=int, metavar="N", help="only the first N examples of each task")
    bench.add_argument(
        "--out",
        default="out/bench",
        metavar="DIR",
        help="writes results.jsonl, summary.csv, report.html; rerunning resumes",
    )
    bench.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help=f"(example, strategy) runs at once, sharing forward passes (default {DEFAULT_BATCH_SIZE}; 1: one after "
        "the other, as before; not with --ray). Wall times then include the other runs' work",
    )
    _decoding_options(bench, with_strategy=False, one_prompt=False)
    bench.add_argument("--ray", action="store_true", help="run the items on Ray replicas of the model set")
    bench.add_argument("--replicas", type=int, default=1, metavar="N", help="with --ray: copies of the model set")
    bench.add_argument("--replica-cpus", type=float, default=1.0, metavar="C", help="with --ray: CPUs per replica")
    bench.add_argument("--replica-gpus", type=float, default=0.0, metavar="G", help="with --ray: GPUs per replica")
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


def _config(args, strategy: str) -> DecodeConfig:
    """Check everything that needs no model, so bad input fails before minutes of loading."""
    if "prompt" in args and not args.prompt.strip():
        raise UsageError("the prompt is empty")
    specs = list(args.models)
    for spec in specs:
        resolve_spec(spec)
    drafter = 0
    if args.drafter:
        matches = [i for i, spec in enumerate(specs) if args.drafter in (spec, resolve_spec(spec).short_name)]
        if not matches:
            raise UsageError(f"--drafter {args.drafter} is not one of --models")
        drafter = matches[0]
    ensemble = EnsembleConfig(
        method=args.ensemble_method,
        top_k=args.top_k,
        weights=tuple(args.weights) if args.weights else None,
        sharpen=args.sharpen,
        sharpen_lambda=args.sharpen_lambda,
        gate=args.gate,
    )
    config = DecodeConfig(
        strategy=strategy,
        max_new_tokens=args.max_new_tokens,
        lookahead=args.lookahead,
        drafter=drafter,
        safe_mode=args.safe_mode,
        per_token_commit=args.per_token_commit,
        ensemble=ensemble,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        force=tuple(getattr(args, "force", [])),
        damage_kl_steps=args.damage_kl_steps,
        stop=tuple(args.stop),
        draft_gate=args.draft_gate,
        overlap=args.overlap,
    )
    config.validate(len(specs))
    for values, flag in ((args.devices, "--devices"), (args.dtype, "--dtype")):
        if len(values) not in (1, len(specs)):
            raise UsageError(f"give one {flag} for all models or one per model ({len(specs)}), not {len(values)}")
    return config


def _progress(message: str) -> None:
    print(f"[safe] {message}", file=sys.stderr, flush=True)


def load_options(args) -> LoadOptions:
    """The loader's options of parsed decoding options (a device and a dtype per model, or one for all)."""
    return LoadOptions(
        tuple(args.devices),
        tuple(args.dtype),
        args.trust_remote_code,
        not args.no_chat_template,
        cpu_int8=args.cpu_int8,
        cpu_linear=args.cpu_linear,
    )


def model_specs(args) -> list[str]:
    """--models, each in a Ray actor with --placement ray."""
    on_ray = args.placement == "ray"
    return [RAY_PREFIX + spec if on_ray and not spec.startswith(RAY_PREFIX) else spec for spec in args.models]


def _load(args):
    if args.ray_address:
        from .distributed.ray_cluster import connect  # needs Ray, an optional dependency

        connect(args.ray_address)
    return load_models(model_specs(args), load_options(args), _progress)


def _generate(args) -> int:
    config = _config(args, args.strategy)
    models = _load(args)
    with contextlib.ExitStack() as stack:
        events = decode(models, args.prompt, config)
        if args.trace:
            events = write_jsonl(events, stack.enter_context(open(args.trace, "w", encoding="utf-8")))
        collected = []
        for event in events:
            collected.append(event)
            if not args.json and isinstance(event, TextCommitted):
                print(event.delta, end="", flush=True)
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
    config = _config(args, "safe")
    models = _load(args)
    warm_up(models, config)
    runs: dict[str, list] = {}
    with contextlib.ExitStack() as stack:
        trace = stack.enter_context(open(args.trace, "w", encoding="utf-8")) if args.trace else None
        for label, event in (run_together if args.together else run_comparison)(models, args.prompt, config):
            runs.setdefault(label, []).append(event)
            if trace:
                trace.write(event.to_json() + "\n")
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


def _bench(args) -> int:
    from .bench.report import write_report  # pandas and Plotly load only for this command

    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if args.batch_size is not None and (args.batch_size < 1 or args.ray and args.batch_size > 1):
        raise UsageError("--batch-size must be at least 1 (and 1 with --ray, whose replicas run one job each)")
    requested = [name.strip() for name in args.strategies.split(",") if name.strip()]
    config = _config(args, "safe" if {"per-token", "safe"} & set(requested) else "single")
    labels = strategy_labels(requested, [resolve_spec(spec).short_name for spec in args.models], config.drafter)
    tasks = [load_task(name, args.limit) for name in args.tasks]
    names = [task[0].task for task in tasks]
    if len(set(names)) < len(names):
        raise UsageError(f"two task files share a name: {', '.join(names)}")
    examples = [e for task in tasks for e in task]
    if args.ray:
        from .distributed.ray_bench import RayBench  # needs Ray, an optional dependency

        ray = dict(replicas=args.replicas, cpus=args.replica_cpus, gpus=args.replica_gpus, address=args.ray_address)
        bench = RayBench(model_specs(args), load_options(args), examples, config, labels, args.out, args.style, **ray)
    else:
        batch = DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size
        bench = Bench(_load(args), examples, config, labels, args.out, args.style, batch)
    if bench.done:
        _progress(f"resuming {args.out}: {bench.done} of {bench.total} runs already done")
    try:
        with tqdm(total=bench.total, initial=bench.done, unit="run", file=sys.stderr, desc="bench") as bar:
            for record in bench.run():
                bar.set_postfix_str(f"{record['task']}/{record['id']} {record['strategy']}", refresh=False)
                bar.update()
    finally:
        summary = write_report(args.out) if bench.done else None
    print(summary.to_string(index=False, float_format="{:.3f}".format))
    _progress(f"wrote results.jsonl, summary.csv and report.html in {args.out}")
    return 0


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
    _decoding_options(serve, with_strategy=False, one_prompt=False)


def decoding_parser() -> argparse.ArgumentParser:
    """The decoding options of `generate` without a prompt: integrations read theirs (lm-eval's model args, a
    request's extra fields) through it, so they take the same names, types and checks as the command line."""
    parser = _Parser(prog="decoding options", add_help=False)
    _decoding_options(parser, with_strategy=True, one_prompt=False)
    return parser


def decoding_config(args) -> DecodeConfig:
    """The checked `DecodeConfig` of parsed decoding options (UsageError/ConfigError on bad input)."""
    return _config(args, args.strategy)


def _lm_eval(argv: Sequence[str]) -> int:
    try:
        from .integrations.lm_eval import run_cli
    except ModuleNotFoundError as exc:
        raise UsageError(f"{exc.name} is not installed: pip install -r requirements-integrations.txt") from exc

    return run_cli(argv)


def _serve(args) -> int:
    from .server.runner import serve

    return serve(args, _progress)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["lm-eval"]:
            return _lm_eval(argv[1:])
        args = build_parser().parse_args(argv)
        commands = {"generate": _generate, "compare": _compare, "bench": _bench, "tokdiff": _tokdiff, "serve": _serve}
        return commands[args.command](args)
    except SafeEngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
