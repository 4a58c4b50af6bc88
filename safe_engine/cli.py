"""Command line: ``python -m safe_engine generate|compare ...``. Bad input: one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Sequence

from .compare import load_models, ratios, run_comparison, summarize, warm_up
from .decoding import SAFE_MODES, STRATEGIES, DecodeConfig, decode
from .ensemble import METHODS, SHARPENING, EnsembleConfig
from .errors import SafeEngineError
from .events import TextCommitted, write_jsonl
from .models import DEFAULT_MODELS, LoadOptions, resolve_spec


class UsageError(SafeEngineError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line instead of usage + message
        raise UsageError(message)


def _decoding_options(parser: argparse.ArgumentParser, with_strategy: bool) -> None:
    parser.add_argument("--prompt", required=True, help="the user prompt")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), metavar="SPEC",
                        help="embedded:NAME, a local folder, a .gguf file or a hub id (default: the embedded pair)")
    parser.add_argument("--drafter", metavar="SPEC", help="which of --models drafts (default: the first)")
    if with_strategy:
        parser.add_argument("--strategy", choices=STRATEGIES, default="safe")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lookahead", type=int, default=5, help="drafted tokens per SAFE round (n)")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--ensemble-method", choices=METHODS, default="unite")
    parser.add_argument("--sharpen", choices=SHARPENING, default="heuristic")
    parser.add_argument("--sharpen-lambda", type=float, default=0.1)
    parser.add_argument("--weights", type=float, nargs="+", metavar="W", help="one weight per model")
    parser.add_argument("--safe-mode", choices=SAFE_MODES, default="fast",
                        help="exact: the paper's one-ensemble-per-round; fast: keep a draft the ensemble confirmed")
    parser.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda, cuda:1, mps")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    parser.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model folder")
    parser.add_argument("--no-chat-template", action="store_true", help="plain-text prompts for every model")
    parser.add_argument("--json", action="store_true", help="print one JSON result on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m safe_engine", description="SAFE token-level LLM ensembling")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gen = sub.add_parser("generate", help="decode one prompt with one strategy")
    _decoding_options(gen, with_strategy=True)
    gen.add_argument("--trace", metavar="FILE.jsonl", help="write every event as a JSON line")
    cmp_ = sub.add_parser("compare", help="each single model, per-token and SAFE on one prompt")
    _decoding_options(cmp_, with_strategy=False)
    return parser


def _config(args, strategy: str) -> DecodeConfig:
    """Check everything that needs no model, so bad input fails before minutes of loading."""
    if not args.prompt.strip():
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
    )
    config = DecodeConfig(strategy, args.max_new_tokens, args.lookahead, drafter, args.safe_mode, ensemble)
    config.validate(len(specs))
    return config


def _progress(message: str) -> None:
    print(f"[safe] {message}", file=sys.stderr, flush=True)


def _load(args):
    options = LoadOptions(args.device, args.dtype, args.trust_remote_code, not args.no_chat_template)
    return load_models(args.models, options, _progress)


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
        print(json.dumps({k: v for k, v in summary.items() if k != "stats"} | {"stats": summary["stats"]}, ensure_ascii=False))
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
    warm_up(models)
    runs: dict[str, list] = {}
    for label, event in run_comparison(models, args.prompt, config):
        runs.setdefault(label, []).append(event)
    summaries = [summarize(events, label) for label, events in runs.items()]
    drafter = summaries[-1]["drafter"]
    ratio = ratios(summaries, drafter)
    if args.json:
        print(json.dumps({"runs": summaries, "ratios": ratio}, ensure_ascii=False))
        return 0
    for s in summaries:
        print(f"== {s['label']}\n{s['text'].strip()}\n{_summary_line(s)}\n")
    print("wall time / drafter alone: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return {"generate": _generate, "compare": _compare}[args.command](args)
    except SafeEngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
