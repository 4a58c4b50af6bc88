"""Benchmark harness: scorers, task loaders, the results folder, and `bench` end to end on the embedded pair."""

import json
import threading

import pandas as pd
import pytest

from safe_engine import cli
from safe_engine.bench import Bench, Example, build_prompt, load_task, runner, score, strategy_labels
from safe_engine.bench.prompts import STOPS, answer_span
from safe_engine.bench.scoring import extract_choice, extract_number, last_boxed, to_number
from safe_engine.bench.store import RESULTS, claim, load_results, open_for_append, result_key
from safe_engine.bench.tasks import builtin_tasks
from safe_engine.contract.errors import ConfigError
from safe_engine.data import TASKS_DIR
from safe_engine.strategies.decoding import DecodeConfig


# ---------------------------------------------------------------- scorers
@pytest.mark.parametrize(
    "response, gold",
    [
        ("So the total is 1,234.", "1234"),  # thousands comma, trailing period
        ("It drops to -7 degrees.", "-7"),  # negative
        ("The answer is 8. Check: 8 + 2 = 10", "8"),  # stated answer beats the last number
        ("3 + 5 = 8", "8"),  # last number
        ("Thus $\\boxed{\\frac{1}{2}}$.", "0.5"),  # boxed fraction vs decimal gold
        ("so \\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}"),  # dfrac vs frac
        ("x = \\boxed{-\\frac{3}{4}}", "-3/4"),
        ("$\\boxed{(3, \\frac{\\pi}{2})}$", "\\left( 3, \\frac{\\pi}{2} \\right)"),  # non-numeric LaTeX
        ("He pays $12.50 in total.", "12.5"),
        ("It costs 1,000,000 dollars", "1000000"),
    ],
)
def test_numeric_scorer_accepts(response, gold):
    assert score("numeric", response, gold)[1]


@pytest.mark.parametrize(
    "response, gold",
    [
        ("7-5", "-5"),  # a minus between numbers is not a sign
        ("3,4 and 5", "345"),  # a list is not a thousands separator
        ("The answer is 12, not 8.", "8"),
        ("no number here", "0"),
        ("\\boxed{7}", "17"),
        ("x2 is the variable", "2"),  # digits glued to a word are not a number
    ],
)
def test_numeric_scorer_rejects(response, gold):
    assert not score("numeric", response, gold)[1]


def test_number_parsing():
    assert to_number("1,234.50") == to_number("1234.5")
    assert to_number("\\frac12") == to_number("0.5")
    assert to_number("50\\%") == 50
    assert to_number("1/0") is None and to_number("abc") is None
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{2}{3}}") == "\\frac{2}{3}"
    assert last_boxed("\\boxed{unclosed") is None
    assert extract_number("nothing") is None


@pytest.mark.parametrize(
    "response, letter",
    [
        ("Reasoning... The answer is (C).", "C"),
        ("so the answer is (b)", "B"),
        ("The answer is: D", "D"),
        ("B", "B"),
        ("(A) Paris", "A"),
        ("C. Rome", "C"),
        ("I think (A) is wrong and (D) is right", "D"),
        ("A cat sat on the mat", None),  # an article is not an option letter
        ("the answer is a guess", None),
    ],
)
def test_choice_extraction(response, letter):
    assert extract_choice(response) == letter


def test_choice_scorer_compares_letters():
    assert score("choice", "The answer is (B)", "b") == ("B", True)
    assert score("choice", "The answer is (B)", "C") == ("B", False)


@pytest.mark.parametrize(
    "scorer, response, gold, correct",
    [
        ("exact", "  Ouagadougou.", "ouagadougou", True),
        ("exact", "The answer is: Paris!", "Paris", True),
        ("exact", "Paris is the capital", "Paris", False),
        ("contains", "The capital of France is Paris.", "Paris", True),
        ("contains", "New Delhi", "Delhi", True),
        ("contains", "At least", "east", False),  # whole words only
        ("contains", "Sydney. The answer is: Canberra", "Sydney", False),  # the stated answer counts
        ("contains", "", "Paris", False),
    ],
)
def test_text_scorers(scorer, response, gold, correct):
    assert score(scorer, response, gold)[1] is correct


def test_unknown_scorer_is_refused():
    with pytest.raises(ValueError, match="unknown scorer"):
        score("fuzzy", "a", "a")


# ---------------------------------------------------------------- prompts
def test_direct_style_reads_the_first_line_and_stops_after_it():
    assert answer_span("\n  Paris\nQuestion: What is 2 + 2?\nAnswer: 4", "direct") == "Paris"
    assert answer_span("a\nb", "cot") == "a\nb"
    assert STOPS == {"direct": ("\n",), "cot": ()}  # how the engine applies them: tests/test_levers.py


def test_prompt_templates():
    example = Example("t", "1", "2 + 2?", "B", "choice", ("3", "4"))
    assert "(A) 3\n(B) 4" in build_prompt(example, "direct")
    assert "The answer is (X)" in build_prompt(example, "cot")
    assert "\\boxed{}" in build_prompt(Example("t", "1", "2 + 2?", "4", "numeric"), "cot")


# ---------------------------------------------------------------- loaders
def _write(tmp_path, name, rows):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def test_gsm8k_rows(tmp_path):
    path = _write(
        tmp_path,
        "gsm8k",
        [
            {"question": "Natalia sold 48 clips ...", "answer": "She sold 48/2 = <<48/2=24>>24 ...\n#### 72"},
            {"question": "Big one", "answer": "...\n#### 1,250"},
        ],
    )
    first, second = load_task(path)
    assert (first.task, first.id, first.gold, first.scorer) == ("gsm8k", "1", "72", "numeric")
    assert score(second.scorer, "It is 1250.", second.gold)[1]


def test_math500_rows(tmp_path):
    path = _write(
        tmp_path,
        "math500",
        [{"problem": "Compute $\\frac{28}{6}$.", "answer": "\\frac{14}{3}", "unique_id": "test/algebra/1.json"}],
    )
    example = load_task(path)[0]
    assert (example.id, example.question, example.scorer) == (
        "test/algebra/1.json",
        "Compute $\\frac{28}{6}$.",
        "numeric",
    )
    assert score(example.scorer, "so $\\boxed{\\dfrac{14}{3}}$", example.gold)[1]


def test_arc_and_mmlu_rows(tmp_path):
    path = _write(
        tmp_path,
        "arc",
        [
            {
                "id": "Mercury_1",
                "answerKey": "B",
                "question": {
                    "stem": "Which is a gas?",
                    "choices": [{"label": "A", "text": "ice"}, {"label": "B", "text": "steam"}],
                },
            },
            {
                "id": "NYSED_2",
                "question": "Which is hot?",
                "choices": {"label": ["1", "2", "3"], "text": ["snow", "fire", "ice"]},
                "answerKey": "2",
            },
            {"question": "Largest?", "choices": ["1", "9", "5", "3"], "answer": 1},
            {"question": "Smallest?", "choices": ["1", "9"], "answer": "A"},
        ],
    )
    examples = load_task(path)
    assert [e.gold for e in examples] == ["B", "B", "B", "A"]
    assert examples[0].choices == ("ice", "steam") and examples[1].choices == ("snow", "fire", "ice")
    assert {e.scorer for e in examples} == {"choice"}
    assert examples[1].id == "NYSED_2" and examples[2].id == "3"


def test_native_rows_and_limit(tmp_path):
    rows = [{"id": f"q{i}", "question": f"Q{i}", "answer": str(i), "scorer": "exact"} for i in range(5)]
    examples = load_task(_write(tmp_path, "mine", rows), limit=2)
    assert [e.id for e in examples] == ["q0", "q1"]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"question": "Q", "answer": "1", "scorer": "fuzzy"}, "scorer must be one of"),
        ({"question": "Q", "answer": " ", "scorer": "exact"}, "empty answer"),
        ({"text": "what"}, "unrecognised row"),
        ({"question": "Q", "choices": ["a"], "answerKey": "Z"}, "mine.jsonl:1"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    with pytest.raises(ConfigError, match=message):
        load_task(_write(tmp_path, "mine", [row]))


def test_unreadable_task_files_are_refused_with_a_reason(tmp_path):
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    with pytest.raises(ConfigError, match="cannot read"):
        load_task(str(binary))


def test_duplicate_ids_and_unknown_names_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="unique"):
        load_task(_write(tmp_path, "dup", [{"id": "x", "question": "Q", "answer": "1", "scorer": "exact"}] * 2))
    with pytest.raises(ConfigError, match="shipped task sets"):
        load_task("no-such-task")


# ---------------------------------------------------------------- shipped task sets
@pytest.mark.parametrize("name", builtin_tasks())
def test_shipped_task_sets_load_with_40_items(name):
    examples = load_task(name)
    assert len(examples) >= 40
    assert len({e.question for e in examples}) == len(examples)
    assert all(score(e.scorer, e.gold, e.gold)[1] for e in examples)  # every gold is readable by its scorer
    echoed = [e.id for e in examples if e.scorer == "contains" and score("contains", e.question, e.gold)[1]]
    assert not echoed  # repeating the question must not score


def test_task_sets_are_shipped():
    assert {"arithmetic", "completion", "copying", "facts"} <= set(builtin_tasks())
    assert TASKS_DIR.is_dir()


# ---------------------------------------------------------------- strategies and the results folder
def test_strategy_labels():
    names = ["gemma", "smol"]
    assert strategy_labels(["safe", "single"], names, 0) == ["single:gemma", "safe"]
    assert strategy_labels(["singles", "per-token"], names, 1) == ["single:gemma", "single:smol", "per-token"]
    assert strategy_labels(["single"], names, 1) == ["single:smol"]
    assert strategy_labels(["safe", "byte-level"], names, 0) == ["byte-level", "safe"]
    with pytest.raises(ConfigError, match="unknown strategy nope"):
        strategy_labels(["safe", "nope"], names, 0)


def test_half_written_last_line_is_ignored_then_cut(tmp_path):
    record = {"task": "t", "id": "1", "strategy": "safe"}
    (tmp_path / RESULTS).write_text(json.dumps(record) + "\n" + '{"task": "t", "id": "2", "str')
    assert load_results(tmp_path) == [record]
    with open_for_append(tmp_path) as handle:
        handle.write(json.dumps(record | {"id": "3"}) + "\n")
    assert [r["id"] for r in load_results(tmp_path)] == ["1", "3"]


def test_a_folder_keeps_its_settings(tmp_path):
    claim(tmp_path, {"style": "direct", "decode": {"max_new_tokens": 12}})
    claim(tmp_path, {"style": "direct", "decode": {"max_new_tokens": 12}})
    with pytest.raises(ConfigError, match="other settings \\(decode\\)"):
        claim(tmp_path, {"style": "direct", "decode": {"max_new_tokens": 24}})


# ---------------------------------------------------------------- end to end on the embedded pair
MINI = [
    {"id": "add", "question": "What is 2 + 3?", "answer": "5", "scorer": "numeric"},
    {"id": "capital", "question": "What is the capital of France?", "answer": "Paris", "scorer": "contains"},
    {"id": "copy", "question": "Copy this word exactly: quixotic", "answer": "quixotic", "scorer": "exact"},
]
PLAN = ["single:gemma-3-270m", "single:smollm2-135m-instruct", "per-token", "safe"]


@pytest.mark.real_models
def test_bench_writes_three_files_and_resumes_after_a_kill(tmp_path, monkeypatch, embedded_pair):
    monkeypatch.setattr(cli, "load_models", lambda specs, options, progress: embedded_pair)
    real_decode, calls = runner.decode, []

    def killed_during_second_run(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(runner, "decode", killed_during_second_run)
    out = tmp_path / "out"
    argv = ["bench", "--tasks", _write(tmp_path, "mini", MINI), "--max-new-tokens", "12", "--out", str(out)]
    argv += ["--batch-size", "1"]  # one run after the other: the kill lands during the second (test_bench_batch)
    assert cli.main(argv) == 130
    first = (out / RESULTS).read_text(encoding="utf-8").splitlines()
    assert len(first) == 1 and (out / "summary.csv").is_file()  # an interrupted run still reports what it has

    monkeypatch.setattr(runner, "decode", real_decode)
    assert cli.main(argv) == 0
    lines = (out / RESULTS).read_text(encoding="utf-8").splitlines()
    assert lines[0] == first[0]  # the finished run was kept, not redone
    records = [json.loads(line) for line in lines]
    assert sorted(result_key(r) for r in records) == sorted(("mini", row["id"], s) for row in MINI for s in PLAN)
    assert all(
        {"prediction", "gold", "correct", "e_t", "oov_skips", "consensus_skips", "wall_s", "tokens"} <= r.keys()
        for r in records
    )
    assert all(r["e_t"] == 1.0 for r in records if r["strategy"] == "per-token")
    assert all(r["e_t"] == 0.0 for r in records if r["strategy"].startswith("single:"))

    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["strategy"]) == PLAN and set(summary["examples"]) == {3}
    assert summary.set_index("strategy").loc["single:gemma-3-270m", "median_wall_ratio"] == 1.0
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "Accuracy per strategy" in page and "Latency vs output length" in page
    assert "<script src" not in page and "Plotly.newPlot" in page  # plotly.js is inline: works offline

    assert cli.main(argv) == 0  # a finished folder: nothing left to run, nothing added
    assert (out / RESULTS).read_text(encoding="utf-8").splitlines() == lines


@pytest.mark.real_models
def test_a_stopped_bench_writes_nothing(tmp_path, embedded_pair):
    examples = load_task(_write(tmp_path, "mini", MINI[:1]))
    bench = Bench(embedded_pair, examples, DecodeConfig(max_new_tokens=4), ["safe"], tmp_path / "out")
    stop = threading.Event()
    stop.set()
    assert list(bench.run(stop)) == [] and bench.done == 0
    assert load_results(tmp_path / "out") == []
