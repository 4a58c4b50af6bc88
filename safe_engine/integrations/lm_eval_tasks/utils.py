"""Functions the offline task YAMLs name with ``!function utils.NAME`` (lm-eval imports this file by path).

Datasets load from local JSONL, never a hub: ``--metadata gsm8k_file=PATH`` (or ``math500_file``,
``arc_file``) points a task at the real file, in the format it was released in; without it the small
sample in ``data/`` runs. Our four shipped sets are the bench's own (``safe_engine/data/tasks``), with its prompts.
"""

from __future__ import annotations

import threading
from pathlib import Path

import datasets
import yaml
from math_verify import parse, verify

from safe_engine.bench import answer_span, build_prompt, load_task, score

DATA = Path(__file__).resolve().parent / "data"
MATH_VERIFY_LIMIT_S = 10.0  # our own time limit: math-verify's signal-based timeouts work only on the main thread


def _jsonl(path) -> datasets.DatasetDict:
    return datasets.load_dataset("json", data_files={"test": str(Path(path).expanduser())})


def gsm8k_dataset(gsm8k_file=None, **_) -> datasets.DatasetDict:
    return _jsonl(gsm8k_file or DATA / "gsm8k_sample.jsonl")


def math500_dataset(math500_file=None, **_) -> datasets.DatasetDict:
    return _jsonl(math500_file or DATA / "math500_sample.jsonl")


def arc_dataset(arc_file=None, **_) -> datasets.DatasetDict:
    return _jsonl(arc_file or DATA / "arc_sample.jsonl")


def bench_dataset(bench_task, **_) -> datasets.DatasetDict:
    """A shipped bench task set (or a bench JSONL file) as docs that carry the bench's direct-style prompt."""
    rows = [
        {"id": e.id, "prompt": build_prompt(e, "direct"), "gold": e.gold, "scorer": e.scorer}
        for e in load_task(bench_task)
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def gsm8k_cot_samples() -> list[dict]:
    """The few-shot exemplars of lm-eval's own ``gsm8k_cot``, read from the installed harness."""
    import lm_eval.tasks

    path = Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k-cot.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8"))["fewshot_config"]["samples"]


def process_bench(doc: dict, results: list[str]) -> dict:
    """The bench's scorer on the answer span the bench reads (the first non-empty line)."""
    _, correct = score(doc["scorer"], answer_span(results[0], "direct"), doc["gold"])
    return {"bench_correct": int(correct)}


def math_equal(gold: str, response: str, limit_s: float = MATH_VERIFY_LIMIT_S) -> bool:
    """math-verify's verdict with its own timeouts off (they need the main thread) under our time limit: the
    check runs on a daemon thread, and one that overruns counts as wrong and is left behind."""
    verdict = []

    def check():
        verdict.append(
            verify(parse(gold, parsing_timeout=None), parse(response, parsing_timeout=None), timeout_seconds=None)
        )

    worker = threading.Thread(target=check, daemon=True)
    worker.start()
    worker.join(limit_s)
    return bool(verdict and verdict[0])


def process_math(doc: dict, results: list[str]) -> dict:
    """math-verify against the reference solution (as lm-eval's minerva_math scores it) and our bench's numeric
    scorer against the answer, side by side so a difference between them shows."""
    gold = doc.get("solution") or f"${doc['answer']}$"
    _, bench = score("numeric", results[0], str(doc["answer"]))
    return {"math_verify": int(math_equal(gold, results[0])), "bench_correct": int(bench)}
