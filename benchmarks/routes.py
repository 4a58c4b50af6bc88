"""The same rows three ways: our `bench`, lm-eval through the `safe-ensemble` model, lm-eval through our
OpenAI-compatible server (its `local-chat-completions` model), one strategy, the embedded pair by default.

    python -m benchmarks.routes [--task facts] [--limit 10] [--strategy safe] [--out out/routes.json]

All three build the bench's direct prompt and let each model apply its own chat template (lm-eval with
``--apply_chat_template``; the server's chat endpoint), greedy, stop at the answer's line, 64 new tokens.
Printed per route: examples, accuracy (the bench's scorer), wall seconds (lm-eval's include its task
indexing), and how many generations equal the bench's word for word (they should all: the routes differ in
plumbing, not in decoding).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from pathlib import Path

from safe_engine.bench import load_task, run_example
from safe_engine.cli import build_parser
from safe_engine.contract.config import DecodeConfig
from safe_engine.integrations import LM_EVAL_TASKS_DIR
from safe_engine.models.cache import load_models
from safe_engine.models.specs import DEFAULT_MODELS
from safe_engine.orchestration.comparison import warm_up

TASKS = str(LM_EVAL_TASKS_DIR)


def bench_route(models, examples, strategy):
    config = DecodeConfig(strategy=strategy)
    started = time.perf_counter()
    records = [run_example(e, strategy, models, config, "direct") for e in examples]
    return [r["prediction"].split("\n")[0] for r in records], [r["correct"] for r in records], started


def lm_eval_route(model, task, limit):
    import lm_eval
    from lm_eval.tasks import TaskManager

    started = time.perf_counter()
    results = lm_eval.simple_evaluate(
        model=model, tasks=[task], limit=limit, apply_chat_template=True, task_manager=TaskManager(include_path=TASKS)
    )
    samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
    return [s["resps"][0][0] for s in samples], [bool(s["bench_correct"]) for s in samples], started


def serve(models, strategy):
    import uvicorn

    from safe_engine.options import decoding_values
    from safe_engine.server.app import Settings, create_app

    args = build_parser().parse_args(["serve", "--models", *[m.spec.spec for m in models]])
    app = create_app(models, Settings(decoding_values(args), strategy=strategy))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}/v1/chat/completions"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="facts", help="one of our shipped bench sets")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--strategy", default="safe", choices=["safe", "per-token", "single"])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--out", help="also write the rows as JSON here")
    args = parser.parse_args()

    from lm_eval.models.openai_completions import LocalChatCompletion

    from safe_engine.integrations.lm_eval import SafeEnsembleLM

    models = load_models(args.models)
    warm_up(models)
    examples = load_task(args.task, args.limit)
    task = f"safe_{args.task}"
    routes = {}
    texts, correct, started = bench_route(models, examples, args.strategy)
    routes["bench"] = (texts, correct, time.perf_counter() - started)
    model = SafeEnsembleLM(models="|".join(args.models), strategy=args.strategy)
    texts, correct, started = lm_eval_route(model, task, args.limit)
    routes["lm-eval: safe-ensemble"] = (texts, correct, time.perf_counter() - started)
    server, url = serve(models, args.strategy)
    client = LocalChatCompletion(base_url=url, model="+".join(m.name for m in models), eos_string="</s>", max_retries=1)
    texts, correct, started = lm_eval_route(client, task, args.limit)
    routes["lm-eval: local-chat-completions → serve"] = (texts, correct, time.perf_counter() - started)
    server.should_exit = True

    reference = [t.strip() for t in routes["bench"][0]]
    rows = []
    print(f"{args.task}, {len(examples)} rows, {args.strategy}, {' + '.join(args.models)}")
    print(f"{'route':42} {'examples':>8} {'accuracy':>8} {'wall_s':>8} {'same text as bench':>18}")
    for name, (texts, correct, wall) in routes.items():
        same = sum(t.strip() == r for t, r in zip(texts, reference))
        rows.append(
            {
                "route": name,
                "examples": len(texts),
                "accuracy": sum(correct) / len(correct),
                "wall_s": wall,
                "same_text": same,
            }
        )
        print(f"{name:42} {len(texts):8} {rows[-1]['accuracy']:8.3f} {wall:8.1f} {same:>14}/{len(texts)}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
